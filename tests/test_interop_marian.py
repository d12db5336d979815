"""qkv.interop.hf for Marian (opus-mt): a MarianMTModel checkpoint is a qkv.Transformer with the same
numbers, the same greedy and beam-search tokens as Hugging Face's generate, and the same weights back.

No network: each HF model is random-initialised from a tiny MarianConfig (every weight randomised,
logits bias included), saved with save_pretrained beside a MarianTokenizer built here from a
SentencePiece model trained on a few sentences.
"""
import json
import pickle
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import qkv
from qkv.generation.beam_search import Special, decode
from qkv.interop import from_hf, to_hf
from qkv.interop.hf import load_pretrained, marian_special
from qkv.training.tasks.translation import translate_texts

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
spm = pytest.importorskip("sentencepiece", reason="the hf extra: pip install -e '.[hf]'")
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer  # noqa: E402

SENTENCES = ["The dog bit the man.", "The man bit the dog.", "Open the file and save it.", "Close the window now.",
             "Where is the bus stop?", "Print the document twice.", "A small frog sat on a log.",
             "Save all open files before you quit."]
EOS = 0  # Marian's vocabulary: </s> = 0, <unk> = 1, …, <pad> = the last id
SHAPES = {  # opus-mt's shape in miniature, and the settings qkv must not assume
    "opus": dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=48, decoder_ffn_dim=48, activation_function="swish", scale_embedding=True),
    "untied": dict(d_model=24, encoder_layers=1, decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=2,
                   encoder_ffn_dim=40, decoder_ffn_dim=40, activation_function="gelu", scale_embedding=False,
                   share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A MarianTokenizer (source.spm = target.spm, vocab.json) saved with save_pretrained."""
    d = tmp_path_factory.mktemp("spm")
    (d / "text.txt").write_text("\n".join(SENTENCES * 3))
    spm.SentencePieceTrainer.train(input=str(d / "text.txt"), model_prefix=str(d / "sp"), vocab_size=48,
                                   character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(d / "sp.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = {"</s>": EOS, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    vocab["<pad>"] = len(vocab)
    (d / "vocab.json").write_text(json.dumps(vocab))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        tok = MarianTokenizer(source_spm=str(d / "sp.model"), target_spm=str(d / "sp.model"), vocab=str(d / "vocab.json"))
    tok.save_pretrained(d / "tokenizer")
    return d / "tokenizer"


def vocab_size(tokenizer_dir) -> int:
    return len(json.loads((tokenizer_dir / "vocab.json").read_text()))


def marian(shape: str, seed: int, V: int, *, renormalize: bool = True) -> MarianMTModel:
    """A random MarianMTModel with opus-mt's special tokens and generation config.

    Weights ~ N(0, 0.2²), norms 1 ± 0.2; the logits bias favours EOS (so some hypotheses end early)
    and pad (so that suppressing it, and renormalising, changes which beams win).
    """
    pad = V - 1
    config = MarianConfig(vocab_size=V, max_position_embeddings=64, pad_token_id=pad, decoder_start_token_id=pad,
                          eos_token_id=EOS, forced_eos_token_id=EOS, **SHAPES[shape])
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:  # fixed sinusoids
                p.copy_((1.0 if p.dim() == 1 and name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
        bias = 0.5 * torch.randn(1, V, generator=g)
        bias[0, EOS] += 3.0
        bias[0, pad] += 3.0
        model.final_logits_bias.copy_(bias)
    model.generation_config = GenerationConfig(  # Helsinki-NLP/opus-mt-*'s generation_config.json
        bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=EOS, forced_eos_token_id=EOS,
        pad_token_id=pad, max_length=512, num_beams=4, renormalize_logits=renormalize)
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer_dir):
    """{shape: directory} of random Marian checkpoints with the tokenizer beside them."""
    dirs = {}
    for seed, shape in enumerate(SHAPES):
        dirs[shape] = tmp_path_factory.mktemp(shape)
        marian(shape, seed, vocab_size(tokenizer_dir)).save_pretrained(dirs[shape])
        for f in tokenizer_dir.iterdir():
            (dirs[shape] / f.name).write_bytes(f.read_bytes())
    return dirs


def hf_eager(directory) -> MarianMTModel:
    return MarianMTModel.from_pretrained(directory, attn_implementation="eager").eval()


def padded_batch(V: int, seed: int = 1, B: int = 5, S: int = 10):
    """Sources (B, S) ending in EOS, right-padded with pad = V − 1, and the mask of real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, S + 1, (B,), generator=g)
    lengths[0] = S
    mask = torch.arange(S) < lengths[:, None]
    src = torch.randint(2, V - 1, (B, S), generator=g).masked_fill(~mask, V - 1)
    src[torch.arange(B), lengths - 1] = EOS
    return src, mask


# --- the numbers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_encoder_states_logits_and_attention_match_hf_on_a_padded_batch(saved, shape):
    hf, model = hf_eager(saved[shape]), from_hf(saved[shape])
    V = model.config.vocab_size
    src, mask = padded_batch(V)
    tgt = torch.randint(2, V - 1, (src.size(0), 7), generator=torch.Generator().manual_seed(2))
    tgt[:, 0] = V - 1  # decoder_start_token_id
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt, output_attentions=True)
        memory = model.encode(src, src_mask=mask)
        got = model.decode(tgt, memory, src_mask=mask, return_attention=True)
    torch.testing.assert_close(memory, want.encoder_last_hidden_state, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(got.cross_attentions, want.cross_attentions, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(got.attentions, want.decoder_attentions, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_marian_settings_become_model_config_fields(saved):
    c = from_hf(saved["opus"]).config
    assert (c.position.kind, c.position.sinusoidal_layout, c.normalization.first, c.feed_forward.activation, c.embedding.scale, c.head.bias,
            c.head.tie, c.num_layers, c.num_decoder_layers) == ("sinusoidal", "split", False, "silu", True,
                                                                      True, True, 2, 2)
    u = from_hf(saved["untied"])
    assert (u.config.head.tie, u.config.num_layers, u.config.num_decoder_layers) == (False, 1, 3)
    assert u.lm_head.weight is not u.embed.tok.weight and u.embed.tok.weight is not u.encoder.embed.tok.weight


def test_split_sinusoids_are_hugging_faces_table():
    table = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(40, 16).create_weight()
    torch.testing.assert_close(qkv.SinusoidalPositionalEncoding(16, layout="split")(40), table, atol=1e-5, rtol=0)
    interleaved = qkv.SinusoidalPositionalEncoding(16)(40)
    assert torch.equal(interleaved[:, 0::2], qkv.SinusoidalPositionalEncoding(16, layout="split")(40)[:, :8])


# --- decoding: the tokens of HF generate --------------------------------------------------------------

CASES = [(shape, seed, renormalize) for shape in SHAPES for seed in (0, 1, 2) for renormalize in (True, False)]


@pytest.mark.parametrize("shape,seed,renormalize", CASES)
def test_greedy_and_beam_search_give_hf_generates_tokens(tokenizer_dir, shape, seed, renormalize):
    hf = marian(shape, seed, vocab_size(tokenizer_dir), renormalize=renormalize)
    model = from_hf(hf)
    special = marian_special({**hf.config.to_dict(), **hf.generation_config.to_dict()})
    src, mask = padded_batch(model.config.vocab_size, seed=seed + 10, B=6)
    for num_beams in (1, 4):
        for n in (4, 12):
            want = hf.generate(input_ids=src, attention_mask=mask.long(), max_new_tokens=n, num_beams=num_beams)
            got = decode(model, src, src_mask=mask, max_new_tokens=n, special=special, num_beams=num_beams)
            assert got.tolist() == want.tolist(), (num_beams, n)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("last_step", [True, False])
def test_next_token_scores_are_hf_logits_processors(renormalize, last_step):
    """log p = allowed − log_z equals log_softmax → bad words → forced EOS [→ log_softmax] (HF's beam search)."""
    from transformers.generation import (ForcedEOSTokenLogitsProcessor, LogitNormalization, LogitsProcessorList,
                                         NoBadWordsLogitsProcessor)
    from qkv.generation.beam_search import next_token_scores

    V, pad, n = 30, 29, 5
    logits = 3 * torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    hf = LogitsProcessorList([NoBadWordsLogitsProcessor([[pad]], eos_token_id=EOS),
                              ForcedEOSTokenLogitsProcessor(n, EOS)] + ([LogitNormalization()] if renormalize else []))
    length = n - 1 if last_step else 2  # HF forces EOS when the sequence is one short of max_length
    want = hf(torch.zeros(4, length, dtype=torch.long), logits.log_softmax(-1))
    special = Special(start=pad, eos=EOS, pad=pad, suppress=(pad,), force_eos_at_end=True, renormalize=renormalize)
    allowed, log_z = next_token_scores(logits.clone(), special, last_step=last_step)
    torch.testing.assert_close(allowed - log_z, want, atol=1e-6, rtol=0)


def test_the_search_is_exercised_and_renormalising_matters(tokenizer_dir):
    """Some hypotheses end early, beam search beats greedy somewhere, and Marian's renormalize_logits
    changes some beam-search result: qkv without ``Special.renormalize`` would differ from HF there."""
    early = differs = renormalised = 0
    for seed in (0, 1, 2):
        hf = marian("opus", seed, vocab_size(tokenizer_dir))
        model, special = from_hf(hf), marian_special({**hf.config.to_dict(), **hf.generation_config.to_dict()})
        src, mask = padded_batch(model.config.vocab_size, seed=seed + 10, B=6)
        greedy = decode(model, src, src_mask=mask, max_new_tokens=12, special=special)
        beam = decode(model, src, src_mask=mask, max_new_tokens=12, special=special, num_beams=4)
        plain = Special(**{**vars(special), "renormalize": False})
        early += int((beam[:, 1:-1] == EOS).any(1).sum())
        differs += beam.shape != greedy.shape or not torch.equal(beam, greedy)
        renormalised += not torch.equal(beam, decode(model, src, src_mask=mask, max_new_tokens=12, special=plain,
                                                     num_beams=4))
    assert early and differs and renormalised


# --- round trips ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_round_trip_hf_to_qkv_to_hf_is_exact(saved, shape):
    hf = MarianMTModel.from_pretrained(saved[shape])
    again = to_hf(from_hf(saved[shape]), pad_token_id=hf.config.pad_token_id,
                  decoder_start_token_id=hf.config.decoder_start_token_id)
    a, b = hf.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("logits_bias", [True, False])
def test_round_trip_qkv_to_hf_to_qkv_is_exact(logits_bias, tmp_path):
    cfg = qkv.ModelConfig(vocab_size=50, d_model=32, attention=dict(num_heads=4),
                          position=dict(kind="sinusoidal", sinusoidal_layout="split"),
                          feed_forward=dict(d_ff=40, activation="relu"), normalization=dict(first=False, final=False),
                          embedding=dict(scale=True), head=dict(bias=logits_bias), num_layers=2, num_decoder_layers=1,
                          max_len=32)
    torch.manual_seed(0)
    model = qkv.Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    hf = to_hf(model)
    src, tgt = torch.randint(0, 50, (2, 9)), torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=src, decoder_input_ids=tgt).logits, model(src, tgt).logits,
                                   atol=1e-4, rtol=1e-4)
    hf.save_pretrained(tmp_path)
    back = from_hf(tmp_path)
    assert back.config.head.bias and back.config.num_decoder_layers == 1  # no bias = a zero final_logits_bias
    ours, theirs = model.state_dict(), back.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert logits_bias or not back.lm_head.bias.any()


def test_to_hf_names_every_setting_marian_lacks():
    cfg = qkv.ModelConfig.preset("translate", vocab_size=64, d_model=32, num_layers=1, attention=dict(num_kv_heads=2),
                                 feed_forward=dict(d_ff=32, activation="swiglu"))
    with pytest.raises(ValueError) as err:
        to_hf(qkv.Transformer(cfg))
    for part in ("no Hugging Face Marian counterpart", "position.sinusoidal_layout='interleaved'",
                 "normalization.first=True", "normalization.final=True", "attention.num_kv_heads=2",
                 "feed_forward.activation='swiglu'"):
        assert part in str(err.value)


# --- bad checkpoints: one ValueError naming every problem ---------------------------------------------

def copy_checkpoint(src, dst, edit_config=None, edit_tensors=None):
    config, tensors = json.loads((src / "config.json").read_text()), load_file(src / "model.safetensors")
    edit_config and edit_config(config)
    edit_tensors and edit_tensors(tensors)
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_unsupported_marian_settings_are_listed_together(saved, tmp_path):
    def edit(c):
        c.update(decoder_vocab_size=99, share_encoder_decoder_embeddings=False, decoder_attention_heads=2,
                 decoder_ffn_dim=64, normalize_before=True, layernorm_embedding=True, activation_function="tanh")
    copy_checkpoint(saved["opus"], tmp_path, edit_config=edit)
    with pytest.raises(ValueError) as err:
        from_hf(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"cannot load {tmp_path} as marian: ") and "\n" not in msg
    for part in ("decoder_vocab_size=99 differs from vocab_size=48", "share_encoder_decoder_embeddings=False with "
                 "tie_word_embeddings=True", "encoder_attention_heads=4 differs from decoder_attention_heads=2",
                 "encoder_ffn_dim=48 differs from decoder_ffn_dim=64", "normalize_before=True",
                 "layernorm_embedding=True", "activation_function='tanh'"):
        assert part in msg


def test_tied_copies_are_accepted_only_when_equal(saved, tmp_path):
    """Older opus-mt files store the shared embedding under all four of HF's names."""
    hf = MarianMTModel.from_pretrained(saved["opus"])
    full = {k: v.clone() for k, v in hf.state_dict().items()}  # + encoder/decoder embed_tokens, lm_head, sinusoids
    copy_checkpoint(saved["opus"], tmp_path, edit_tensors=lambda t: t.update(full))
    a, b = from_hf(tmp_path).state_dict(), from_hf(saved["opus"]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    only_head = {k: v for k, v in full.items() if k != "model.shared.weight"}  # any one tied name will do
    copy_checkpoint(saved["opus"], tmp_path, edit_tensors=lambda t: (t.clear(), t.update(only_head)))
    a = from_hf(tmp_path).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    bad = full["lm_head.weight"].clone()
    bad[3, 0] += 1
    copy_checkpoint(saved["opus"], tmp_path, edit_tensors=lambda t: t.update(full, **{"lm_head.weight": bad}))
    with pytest.raises(ValueError, match="lm_head.weight differs from the token embedding model.shared.weight"):
        from_hf(tmp_path)


def test_missing_and_misshapen_marian_keys(saved, tmp_path):
    def edit(t):
        del t["final_logits_bias"]
        t["model.decoder.layers.1.encoder_attn.k_proj.weight"] = torch.zeros(32, 31)
    copy_checkpoint(saved["opus"], tmp_path, edit_tensors=edit)
    with pytest.raises(ValueError) as err:
        from_hf(tmp_path)
    assert "1 missing keys: final_logits_bias" in str(err.value)
    assert "model.decoder.layers.1.encoder_attn.k_proj.weight torch.float32 (32, 31)" in str(err.value)


class Payload:
    """Unpickling this writes a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickled_marian_checkpoint_is_refused_without_running(saved, tmp_path):
    (tmp_path / "config.json").write_text((saved["opus"] / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(tmp_path / "pwned")))
    for load in (from_hf, load_pretrained):
        with pytest.raises(ValueError, match="pytorch_model.bin: pickle files, which qkv never unpickles"):
            load(tmp_path)
    assert not (tmp_path / "pwned").exists()


# --- the checkpoint's decoding tokens and tokenizer ------------------------------------------------------

def test_marian_special_reads_the_generation_config(saved, tmp_path):
    pad = vocab_size(saved["opus"]) - 1
    assert marian_special(saved["opus"]) == Special(start=pad, eos=EOS, pad=pad, suppress=(pad,),
                                                    force_eos_at_end=True, renormalize=True)
    (tmp_path / "config.json").write_text((saved["opus"] / "config.json").read_text())  # no generation_config.json
    assert marian_special(tmp_path) == Special(start=pad, eos=EOS, pad=pad, force_eos_at_end=True)


def test_marian_special_lists_every_problem():
    with pytest.raises(ValueError) as err:
        marian_special({"vocab_size": 10, "eos_token_id": [0, 2], "pad_token_id": 10, "forced_eos_token_id": 3,
                        "bad_words_ids": [[1, 2]], "no_repeat_ngram_size": 3})
    msg = str(err.value)
    for part in ("decoder_start_token_id=None", "eos_token_id=[0, 2]", "pad_token_id=10 (expected one token id in "
                 "[0, 10))", "bad_words_ids=[[1, 2]]", "no_repeat_ngram_size=3"):
        assert part in msg


@pytest.mark.filterwarnings("ignore:Recommended")  # sacremoses: punctuation normalisation, not needed here
def test_load_pretrained_translates_like_hf(saved):
    model, tok = load_pretrained(saved["opus"])
    assert isinstance(model, qkv.Transformer) and tok.special == marian_special(saved["opus"])
    hf, hf_tok = hf_eager(saved["opus"]), tok.backend
    assert tok.encode(SENTENCES[0]) + [EOS] == hf_tok(SENTENCES[0])["input_ids"]  # translate_texts appends EOS
    texts = SENTENCES[:5] + ["Save the dog"]
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    want = hf_tok.batch_decode(hf.generate(**batch, max_new_tokens=10, num_beams=4), skip_special_tokens=True)
    got = translate_texts(model, tok, texts, num_beams=4, length_penalty=1.0, max_new_tokens=10, batch_size=4)
    assert got == want


def test_cli_translate_explore_and_plot_a_marian_directory(saved, tmp_path, capsys):
    """`qkv translate --hf DIR` gives HF generate's translations with the checkpoint's own decoding settings;
    `qkv explore --hf` and `qkv plot attention --hf` show a real translation model's three attentions."""
    from qkv.cli import main

    d, texts = saved["opus"], SENTENCES[:3]
    hf, hf_tok = hf_eager(d), load_pretrained(d)[1].backend
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    want = hf_tok.batch_decode(hf.generate(**batch, max_new_tokens=10), skip_special_tokens=True)
    assert main(["translate", "--hf", str(d), "--max-new-tokens", "10", *texts]) == 0
    assert capsys.readouterr().out.splitlines() == [w.replace("\n", "\\n") for w in want]
    page = tmp_path / "page.html"
    assert main(["explore", "--hf", str(d), "--text", texts[0], "--out", str(page)]) == 0
    assert '"cross"' in page.read_text(encoding="utf-8")
    assert main(["plot", "attention", "--hf", str(d), "--text", texts[0], "--out", str(tmp_path)]) == 0
    assert (tmp_path / "attention.png").is_file()
