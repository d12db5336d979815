"""Greedy and beam search over the encoder-decoder: against brute force, cached = uncached,
a padded batch = one source at a time, num_beams=1 = greedy."""
import itertools

import pytest
import torch

from qkv.generation.beam_search import Special, decode
from qkv.models import ModelConfig, Transformer
from qkv.models.pointer import PointerTransformer

V, START, EOS = 6, 0, 1  # a tiny vocabulary: 0 = start/pad, 1 = EOS, 2..5 words
SPECIAL = Special(start=START, eos=EOS, pad=START, suppress=(START,))


ARCHITECTURES = [Transformer, PointerTransformer]  # the plain decoder and the copying one (qkv.pointer)


def model(seed: int = 0, arch: type[Transformer] = Transformer, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, d_model=16, attention=dict(num_heads=2), position=dict(kind="sinusoidal"),
                      feed_forward=dict(activation="relu"), normalization=dict(first=False, final=False),
                      num_layers=2, max_len=16, dropout=0.0).replace(**kw)
    m = arch(cfg).eval()
    with torch.no_grad():  # sharper distributions than N(0, 0.02) gives, so that searches differ
        m.lm_head.weight.mul_(40)
    return m


@torch.no_grad()
def sequence_log_prob(m, src: torch.Tensor, tgt: list[int]) -> float:
    ids = torch.tensor([[START, *tgt]])
    lp = m(src, ids[:, :-1]).logits.float().log_softmax(-1)[0]  # (T, V)
    lp[:, START] = float("-inf")  # suppressed
    return float(sum(lp[i, t] for i, t in enumerate(tgt)))


def brute_force(m, src: torch.Tensor, n: int) -> list[int]:
    """The most likely sequence of at most n tokens (ending at EOS, or cut at n)."""
    words = [t for t in range(V) if t != START]
    best, best_lp = None, float("-inf")
    for length in range(1, n + 1):
        for seq in itertools.product(words, repeat=length):
            if EOS in seq[:-1] or (length < n and seq[-1] != EOS):
                continue
            lp = sequence_log_prob(m, src, list(seq))
            if lp > best_lp:
                best, best_lp = list(seq), lp
    return best


def strip(row: torch.Tensor) -> list[int]:
    out = []
    for t in row.tolist()[1:]:
        out.append(t)
        if t == EOS:
            break
    return out


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wide_beam_finds_the_brute_force_optimum(seed, arch):
    m, src = model(seed, arch), torch.tensor([[2, 3, 4, 5]])
    got = decode(m, src, max_new_tokens=3, special=SPECIAL, num_beams=40, length_penalty=0.0)
    assert strip(got[0]) == brute_force(m, src, 3)


def test_beam_search_can_beat_greedy():
    """Over seeds, a beam of 4 never scores below greedy and beats it at least once."""
    wins = 0
    for seed in range(12):
        m, src = model(seed), torch.tensor([[2, 5, 3]])
        g = strip(decode(m, src, max_new_tokens=4, special=SPECIAL, num_beams=1)[0])
        b = strip(decode(m, src, max_new_tokens=4, special=SPECIAL, num_beams=4, length_penalty=0.0)[0])
        lg, lb = sequence_log_prob(m, src, g), sequence_log_prob(m, src, b)
        assert lb >= lg - 1e-5
        wins += lb > lg + 1e-5
    assert wins >= 1


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("num_beams", [1, 3])
def test_cached_equals_uncached(num_beams, arch):
    m, src = model(3, arch), torch.randint(2, V, (3, 5))
    a = decode(m, src, max_new_tokens=6, special=SPECIAL, num_beams=num_beams, use_cache=True)
    b = decode(m, src, max_new_tokens=6, special=SPECIAL, num_beams=num_beams, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("num_beams", [1, 4])
def test_padded_batch_equals_one_source_at_a_time(num_beams, arch):
    m = model(4, arch)
    sources = [[2, 3], [4, 5, 2, 3, 4], [5, 5, 2]]
    S = max(map(len, sources))
    src = torch.tensor([s + [START] * (S - len(s)) for s in sources])  # right padding
    mask = torch.tensor([[True] * len(s) + [False] * (S - len(s)) for s in sources])
    batch = decode(m, src, src_mask=mask, max_new_tokens=5, special=SPECIAL, num_beams=num_beams, length_penalty=0.6)
    for i, s in enumerate(sources):
        alone = decode(m, torch.tensor([s]), max_new_tokens=5, special=SPECIAL, num_beams=num_beams,
                       length_penalty=0.6)
        assert strip(batch[i]) == strip(alone[0]), i


@torch.no_grad()
def test_greedy_takes_the_argmax_and_pads_after_eos():
    m, src = model(5), torch.tensor([[2, 3, 4], [5, 4, 3]])
    out = decode(m, src, max_new_tokens=6, special=SPECIAL, num_beams=1)
    for row, s in zip(out, src):
        seq = [START]
        for _ in range(out.size(1) - 1):
            if seq[-1] == EOS or seq[-1] == START and len(seq) > 1:
                seq.append(START)
                continue
            lp = m(s[None], torch.tensor([seq])).logits[0, -1]
            lp[START] = float("-inf")
            seq.append(int(lp.argmax()))
        assert row.tolist() == seq


def test_forced_eos_and_suppressed_tokens():
    m, src = model(6), torch.tensor([[2, 3]])
    special = Special(start=START, eos=EOS, pad=START, suppress=(START, 2), force_eos_at_end=True)
    for beams in (1, 3):
        out = decode(m, src, max_new_tokens=3, special=special, num_beams=beams)
        assert 2 not in out[0, 1:].tolist() and EOS in out[0].tolist()


def test_bad_arguments_are_refused():
    m, src = model(), torch.tensor([[2, 3]])
    with pytest.raises(ValueError, match="num_beams"):
        decode(m, src, special=SPECIAL, num_beams=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode(m, src, special=SPECIAL, max_new_tokens=0)
    with pytest.raises(ValueError, match="src_mask"):
        decode(m, src, src_mask=torch.ones(1, 3, dtype=torch.bool), special=SPECIAL)
