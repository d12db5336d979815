"""The pointer-generator (qkv.pointer): a distribution that sums to 1, copies source ids, decodes
from cached source state, and lives in runs like any other architecture."""
import math

import pytest
import torch

from qkv.training import run_dir as ckpt
from qkv.generation.beam_search import Special, decode
from qkv.models import ModelConfig, Transformer, token_cross_entropy
from qkv.models.pointer import PointerTransformer, copy_attention, copy_distribution, mix_log_probs

CFG = ModelConfig(vocab_size=40, d_model=32, attention=dict(num_heads=4), position=dict(kind="sinusoidal"),
                  feed_forward=dict(activation="relu", d_ff=64), num_layers=2, max_len=32)
PAD = 0


def batch(seed: int = 0):
    """src (3, 6) right-padded with PAD, src_mask, tgt (3, 5)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (3, 6), generator=g)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:], mask[2, 2:] = False, False
    return src.masked_fill(~mask, PAD), mask, torch.randint(3, 40, (3, 5), generator=g)


def pointer(seed: int = 0) -> PointerTransformer:
    torch.manual_seed(seed)
    return PointerTransformer(CFG).eval()


def test_the_mixture_sums_to_one_and_copies_only_real_source_tokens():
    src, mask, _ = batch()
    src[0, 3] = src[0, 1]  # an id twice: its copy mass is the sum of both positions'
    scores = torch.randn(3, 5, 6)
    p_copy = copy_distribution(scores, src, mask, 40)  # (B, T, V), dense
    assert torch.allclose(p_copy.sum(-1), torch.ones(3, 5))
    for b in range(3):
        allowed = torch.zeros(40, dtype=torch.bool)
        allowed[src[b][mask[b]]] = True
        assert p_copy[b][:, ~allowed].abs().max() == 0  # padding (PAD) and absent ids get nothing
    logits = torch.randn(3, 5, 40)
    for gate, want_copy in ((-30.0, 1.0), (0.3, 1 / (1 + math.exp(0.3))), (30.0, 0.0)):
        log_p = mix_log_probs(logits, torch.full((3, 5, 1), gate), copy_attention(scores, mask), src)
        assert torch.allclose(log_p.exp().sum(-1), torch.ones(3, 5), atol=1e-5)
        mixed = want_copy * p_copy + (1 - want_copy) * logits.softmax(-1)
        assert torch.allclose(log_p.exp(), mixed, atol=1e-5)


def test_the_sparse_mixture_has_the_dense_mixtures_gradients():
    """An id twice in the source gets one gradient, as in the dense scatter_add form."""
    src, mask, _ = batch(3)
    src[0, 2] = src[0, 0]
    scores, logits, gate = (torch.randn(*shape, requires_grad=True) for shape in ((3, 5, 6), (3, 5, 40), (3, 5, 1)))
    weights = torch.rand(3, 5, 40)  # any loss that reads every entry
    sparse = mix_log_probs(logits, gate, copy_attention(scores, mask), src)
    p = torch.sigmoid(gate) * logits.softmax(-1) + torch.sigmoid(-gate) * copy_distribution(scores, src, mask, 40)
    grads = [torch.autograd.grad((x * weights).sum(), (scores, logits, gate)) for x in (sparse, p.log())]
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_loss_is_label_smoothed_cross_entropy_of_log_p():
    log_p = torch.randn(2, 4, 9).log_softmax(-1)
    targets = torch.tensor([[1, 2, -100, -100], [3, 4, 5, 6]])
    for eps in (0.0, 0.1):
        want = torch.nn.functional.cross_entropy(log_p.flatten(0, 1), targets.flatten(), label_smoothing=eps)
        assert torch.allclose(token_cross_entropy(log_p, targets, label_smoothing=eps, normalized=True), want)
    with pytest.raises(ValueError, match="targets must be an integer tensor"):
        token_cross_entropy(log_p, targets.float(), label_smoothing=0.1, normalized=True)


def test_the_model_returns_log_probabilities_and_finite_gradients():
    m, (src, mask, tgt) = pointer().train(), batch()
    out = m(src, tgt, src_mask=mask, targets=tgt, label_smoothing=0.1)
    assert torch.allclose(out.logits.exp().sum(-1), torch.ones(3, 5), atol=1e-5)
    assert torch.allclose(out.logits.log_softmax(-1), out.logits, atol=1e-5)  # idempotent: cross-entropy reads it
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    assert m.copy_gate.weight.grad.abs().sum() > 0 and m.copy_key.weight.grad.abs().sum() > 0


def test_a_sure_copier_puts_its_mass_on_the_source():
    m, (src, mask, tgt) = pointer(), batch()
    with torch.no_grad():
        m.copy_gate.bias.fill_(-40.0)  # p_gen ≈ 0
    p = m(src, tgt, src_mask=mask).logits.exp()  # (B, T, V)
    for b in range(3):
        assert torch.allclose(p[b][:, src[b][mask[b]].unique()].sum(-1), torch.ones(5), atol=1e-5)


def test_decode_reads_the_source_from_cross_kv_or_src_ids():
    m, (src, mask, tgt) = pointer(), batch()
    memory = m.encode(src, src_mask=mask)
    a = m.decode(tgt, memory, src_ids=src, src_mask=mask).logits
    b = m.decode(tgt, None, src_mask=mask, cross_kv=m.cross_kv(memory, src)).logits
    assert torch.equal(a, b) and torch.allclose(a, m(src, tgt, src_mask=mask).logits)
    with pytest.raises(ValueError, match="needs src_ids"):
        m.decode(tgt, memory, src_mask=mask)
    with pytest.raises(ValueError, match="cross_kv pairs"):
        m.decode(tgt, None, src_mask=mask, cross_kv=Transformer.cross_kv(m, memory))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_cached_decoding_equals_uncached(num_beams):
    m, (src, mask, _) = pointer(1), batch(1)
    with torch.no_grad():
        m.lm_head.weight.mul_(30)  # sharper, so that the searches could differ
    special = Special(start=1, eos=2, pad=PAD, suppress=(PAD, 1))
    kw = dict(src_mask=mask, max_new_tokens=8, special=special, num_beams=num_beams, length_penalty=0.6)
    assert torch.equal(decode(m, src, use_cache=True, **kw), decode(m, src, use_cache=False, **kw))


def test_a_run_saves_and_loads_the_pointer(tmp_path):
    from qkv.data import SPECIAL_TOKENS, BPETokenizer

    tok = BPETokenizer.train(["copy %s to --output"] * 20, 260, special_tokens=SPECIAL_TOKENS)
    torch.manual_seed(2)
    m, (src, mask, tgt) = PointerTransformer(ModelConfig(**(CFG.to_dict() | {"vocab_size": tok.vocab_size}))), batch(2)
    ckpt.save_model(tmp_path / "run", m.eval(), tok, step=1)
    loaded = ckpt.load_run(tmp_path / "run").model
    assert type(loaded) is PointerTransformer
    assert torch.equal(loaded(src, tgt, src_mask=mask).logits, m(src, tgt, src_mask=mask).logits)


def test_marian_export_refuses_the_copy_mechanism():
    from qkv.interop.hf import to_hf

    with pytest.raises(TypeError, match="no Hugging Face counterpart"):
        to_hf(pointer())
