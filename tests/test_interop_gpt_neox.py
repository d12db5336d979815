"""GPT-NeoX (Pythia's architecture) in both directions: from_hf gives HF's logits and greedy tokens, the demo
preset's architecture (RoPE, LayerNorm, GELU, sequential residual) exports to a GPTNeoXForCausalLM that
transformers loads with the same logits, the weights round-trip exactly, transformers 4.x's spellings load
(rotary_pct, rotary_emb_base, embed_out, its buffers), and what has no counterpart is refused naming
expected and actual. Also the two components GPT-NeoX needed: partial RoPE and the parallel block.

No network: HF models are random-initialised from tiny configs (C = 32, H = 4, D = 8) and saved with
save_pretrained; the 4.x files are rewritten here as that version wrote them.
"""
import json
import re

import pytest
import torch

import qkv
from qkv.interop import from_hf, to_hf
from qkv.interop.hf.families import gpt_neox
from qkv.interop.hf.rules import packed_qkv_per_head
from qkv.kernels.fused_step import refuses as fused_refuses
from qkv.nn.block import ParallelTransformerBlock

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM  # noqa: E402

NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
NEOXES = {  # Pythia's settings (parallel residual, a quarter of each head rotated, untied, biases), and others
    "pythia": dict(use_parallel_residual=True, rotary_pct=0.25, tie_word_embeddings=False, attention_bias=True),
    "sequential": dict(use_parallel_residual=False, rotary_pct=1.0, tie_word_embeddings=True, attention_bias=False),
    "half": dict(use_parallel_residual=True, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}),
}


def random_neox(seed: int, **settings) -> GPTNeoXForCausalLM:
    """A tiny GPTNeoXForCausalLM, every parameter ~ N(0, 0.2²) (LayerNorm weights 1 ± 0.2)."""
    config = GPTNeoXConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, **NO_SPECIAL,
                           **{"rotary_emb_base": 500.0, **settings})
    torch.manual_seed(seed)
    model, g = GPTNeoXForCausalLM(config), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            one = p.dim() == 1 and "norm" in name and name.endswith("weight")
            p.copy_((1.0 if one else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{kind: directory} of the NEOXES written by save_pretrained."""
    dirs = {}
    for i, (kind, settings) in enumerate(NEOXES.items()):
        dirs[kind] = tmp_path_factory.mktemp(kind)
        random_neox(i, **settings).save_pretrained(dirs[kind])
    return dirs


def ids(seed: int = 1, shape=(2, 11)) -> torch.Tensor:
    return torch.randint(0, 96, shape, generator=torch.Generator().manual_seed(seed))


def logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits


def perturbed(model):
    """Every weight moved off its initial value, so that norms and biases count too."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


# --- Hugging Face -> qkv ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(NEOXES))
def test_gpt_neox_loads_with_hf_logits_and_greedy_tokens(saved, kind):
    model, hf = from_hf(saved[kind]), GPTNeoXForCausalLM.from_pretrained(saved[kind]).eval()
    ours, theirs = logits(model, ids()), logits(hf, ids())
    assert theirs.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(from_hf(hf), ids()), theirs, atol=1e-5, rtol=0)  # an in-memory model too
    prompt = ids(3, (1, 6))
    greedy = model.generate(prompt, 16, temperature=0)
    assert greedy.tolist() == hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                                          do_sample=False, pad_token_id=0).tolist()
    assert len(set(greedy[0, 6:].tolist())) > 1  # not one token repeated


def test_left_padded_batch_generates_what_hf_does(saved):
    model, hf = from_hf(saved["pythia"]), GPTNeoXForCausalLM.from_pretrained(saved["pythia"]).eval()
    x, valid = ids(4, (2, 8)), torch.ones(2, 8, dtype=torch.bool)
    valid[1, :3] = False
    ours = model.generate(x, 10, temperature=0, mask=valid)
    assert ours.tolist() == hf.generate(x, attention_mask=valid.long(), max_new_tokens=10, do_sample=False,
                                        pad_token_id=0).tolist()


def test_the_config_says_what_the_checkpoint_said(saved):
    pythia, sequential, half = (from_hf(saved[k]).config for k in ("pythia", "sequential", "half"))
    assert (pythia.position.rotary_dim, pythia.feed_forward.parallel, pythia.head.tie, pythia.attention.biases) == (
        2, True, False, (True,) * 4)  # int(8 × 0.25) dims rotated
    assert (sequential.position.rotary_dim, sequential.feed_forward.parallel, sequential.head.tie,
            sequential.attention.biases, sequential.feed_forward.bias) == (None, False, True, (False,) * 4, True)
    assert (half.position.rotary_dim, half.position.base, half.normalization.kind, half.feed_forward.activation) == (4, 500.0, "layernorm",
                                                                                          "gelu")


def test_query_key_value_rows_go_by_head():
    """Row h·3D + j·D + d of query_key_value is row h·D + d of q (j = 0), k (1) or v (2): HF's view(…, H, 3D)
    then chunk(3) per head."""
    H, D, C = 4, 3, 5
    rule = packed_qkv_per_head("w", ("q", "k", "v"), H)
    packed = torch.arange(3 * H * D * C, dtype=torch.float32).reshape(3 * H * D, C)
    q, k, v = rule.to_qkv(packed)
    per_head = packed.view(H, 3 * D, C)
    for h in range(H):
        for j, part in enumerate((q, k, v)):
            assert torch.equal(part[h * D:(h + 1) * D], per_head[h, j * D:(j + 1) * D])
    assert torch.equal(rule.to_hf((q, k, v)), packed)
    bias = torch.arange(3 * H * D, dtype=torch.float32)
    assert torch.equal(rule.to_hf(rule.to_qkv(bias)), bias) and rule.to_qkv(bias)[1][0] == D


# --- qkv -> Hugging Face ----------------------------------------------------------------------------

def test_the_demo_architecture_exports_and_transformers_loads_it(tmp_path):
    demo = qkv.ModelConfig.preset("demo", vocab_size=80, d_model=32, num_layers=2, max_len=48)
    assert (demo.position.kind, demo.normalization.kind, demo.feed_forward.activation, demo.attention.biases,
            demo.feed_forward.bias, demo.head.tie) == ("rope", "layernorm", "gelu", (False,) * 4, False, True)  # the preset's architecture at a tiny size
    model = perturbed(qkv.GPT(demo))
    to_hf(model).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["model_type"], written["use_parallel_residual"], written["attention_bias"],
            written["tie_word_embeddings"], written["rope_parameters"]["partial_rotary_factor"]) == (
        "gpt_neox", False, False, True, 1.0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "GPTNeoXForCausalLM"
    assert float(hf.gpt_neox.layers[0].mlp.dense_h_to_4h.bias.detach().abs().max()) == 0.0  # no MLP bias: zeros
    torch.testing.assert_close(logits(hf, ids(shape=(2, 13)) % 80), logits(model, ids(shape=(2, 13)) % 80),
                               atol=1e-5, rtol=0)
    back = from_hf(tmp_path)
    torch.testing.assert_close(logits(back, ids() % 80), logits(model, ids() % 80), atol=1e-5, rtol=0)
    theirs, own = back.state_dict(), model.state_dict()
    assert all(torch.equal(theirs[k], t) for k, t in own.items())  # every weight as it was
    assert {k for k in theirs if k not in own} == {f"blocks.{i}.ff.{p}.bias" for i in range(2)
                                                   for p in ("up_proj", "down_proj")}


def test_parallel_and_partial_rotary_round_trip_exactly(tmp_path):
    config = qkv.ModelConfig(vocab_size=80, d_model=32, attention=dict(num_heads=4), num_layers=2, max_len=48,
                             position=dict(kind="rope", base=500.0, rotary_dim=4),
                             feed_forward=dict(d_ff=48, parallel=True), head=dict(tie=False))
    model = perturbed(qkv.GPT(config))
    assert isinstance(model.blocks[0], ParallelTransformerBlock)
    hf = to_hf(model)
    torch.testing.assert_close(logits(hf, ids() % 80), logits(model, ids() % 80), atol=1e-5, rtol=0)
    hf.save_pretrained(tmp_path)
    back = from_hf(tmp_path)
    assert back.config == config
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], t) for k, t in model.state_dict().items())


def test_a_share_that_rounds_below_its_dims_is_written_so_transformers_gets_them_back():
    """D = 44, R = 30: 44 · (30 / 44) is 29.999…, which transformers' int() makes 29."""
    config = qkv.ModelConfig(d_model=176, attention=dict(num_heads=4), position=dict(kind="rope", rotary_dim=30))
    problems = []
    share = gpt_neox.export(config, problems)["rotary_pct"]
    assert problems == [] and int(44 * share) == 30 and int(44 * (30 / 44)) == 29


@pytest.mark.parametrize("shape, message", [
    (dict(position=dict(interleaved=True)), r"position.interleaved=True \(needs False\)"),
    (dict(attention=dict(num_kv_heads=2)), r"attention.num_kv_heads=2 \(GPT-NeoX has none\)"),
    (dict(feed_forward=dict(activation="swiglu")), r"feed_forward.activation='swiglu' \(needs one of \['gelu', 'gelu_tanh', 'relu', 'silu'\]\)"),
    (dict(attention=dict(num_heads=4, out_bias=False)),
     r"attention biases \(q, k, v, out\) = \(True, True, True, False\) differ \(GPT-NeoX's attention_bias"),
    (dict(head=dict(bias=True)), r"head.bias=True \(needs False\)"),
])
def test_what_gpt_neox_cannot_hold_is_refused(shape, message):
    config = qkv.ModelConfig(d_model=32, num_layers=1, position=dict(kind="rope")).replace(**shape)
    with pytest.raises(ValueError, match="no Hugging Face GPT-NeoX counterpart for this model: .*" + message):
        to_hf(qkv.GPT(config))


# --- transformers 4.x's files -------------------------------------------------------------------------

def as_4x(src, dst, *, late: bool = False, **edits) -> None:
    """``src`` rewritten as transformers 4.x wrote it: rotary_pct and rotary_emb_base (``late``: rope_theta and
    partial_rotary_factor beside them, as 4.4x+ wrote), rope_scaling, torch_dtype; embed_out for the LM head
    and the causal-mask and RoPE buffers in the weights."""
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.pop("dtype", None)
    config |= dict(rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"], rope_scaling=None,
                   torch_dtype="float32", transformers_version="4.40.2")
    if late:
        config |= dict(partial_rotary_factor=rope["partial_rotary_factor"], rope_theta=rope["rope_theta"])
    dst.mkdir(exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config | edits))
    tensors = load_file(str(src / "model.safetensors"))
    if "embed_out.weight" not in tensors:
        tensors["embed_out.weight"] = tensors.pop("lm_head.weight", tensors["gpt_neox.embed_in.weight"]).clone()
    for i in range(config["num_hidden_layers"]):
        a = f"gpt_neox.layers.{i}.attention."
        tensors |= {a + "bias": torch.ones(1, 1, 64, 64, dtype=torch.bool).tril(),
                    a + "masked_bias": torch.tensor(-1e9), a + "rotary_emb.inv_freq": torch.ones(1)}
    save_file(tensors, str(dst / "model.safetensors"))


@pytest.mark.parametrize("late", [False, True])
def test_the_4x_spelling_loads_with_the_same_logits(saved, tmp_path, late):
    as_4x(saved["pythia"], tmp_path, late=late)
    assert "rope_parameters" not in json.loads((tmp_path / "config.json").read_text())
    hf = GPTNeoXForCausalLM.from_pretrained(saved["pythia"]).eval()
    model = from_hf(tmp_path)
    assert (model.config.position.rotary_dim, model.config.position.base) == (2, 500.0)
    torch.testing.assert_close(logits(model, ids()), logits(hf, ids()), atol=1e-5, rtol=0)


def test_a_4x_config_without_rope_settings_takes_gpt_neox_defaults():
    problems = []
    fields = gpt_neox.config(dict(hidden_size=64, num_attention_heads=4), problems)
    assert problems == [] and fields["position"] == dict(kind="rope", base=10000.0, rotary_dim=4)  # int(16 × 0.25)
    assert fields["feed_forward"]["parallel"] is True and fields["head"]["tie"] is False


@pytest.mark.parametrize("edits, message", [
    (dict(rope_scaling={"type": "linear", "factor": 2.0}),
     r"RoPE scaling 'linear' is not supported \(qkv implements plain RoPE: rope_type 'default'\)"),
    (dict(rotary_pct=0.1), r"partial_rotary_factor \(rotary_pct\)=0.1 rotates int\(8 × 0.1\) = 0 dims of each "
                           r"head \(qkv rotates pairs: expected an even number, at least 2\)"),
    (dict(rotary_pct=0.25, partial_rotary_factor=0.5),
     r"rotary_pct=0.25 and partial_rotary_factor=0.5 disagree \(transformers 4.x writes the same value"),
    (dict(hidden_act="gelu_fast"), r"hidden_act='gelu_fast' is not supported \(qkv knows \["),
    (dict(use_parallel_residual="yes"), r"feed_forward.parallel must be a bool, got 'yes'"),
])
def test_unsupported_settings_are_refused_naming_expected_and_actual(saved, tmp_path, edits, message):
    as_4x(saved["pythia"], tmp_path, **edits)
    with pytest.raises(ValueError, match=rf"cannot load {re.escape(str(tmp_path))} as gpt_neox: .*{message}"):
        from_hf(tmp_path)


def test_every_problem_is_named_at_once(saved, tmp_path):
    as_4x(saved["pythia"], tmp_path, hidden_act="gelu_fast", rope_scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="RoPE scaling 'dynamic'.*hidden_act='gelu_fast'"):
        from_hf(tmp_path)


# --- the components: partial RoPE and the parallel block ---------------------------------------------

def test_partial_rope_rotates_the_first_dims_and_passes_the_rest():
    full, partial = qkv.RotaryEmbedding(4, base=100.0), qkv.RotaryEmbedding(10, base=100.0, rotary_dim=4)
    x = torch.randn(2, 3, 7, 10)
    out = partial(x, 5)
    assert torch.equal(out[..., 4:], x[..., 4:])
    torch.testing.assert_close(out[..., :4], full(x[..., :4], 5))
    q, k = torch.randn(1, 1, 1, 10), torch.randn(1, 1, 1, 10)  # scores depend only on the positions' difference
    torch.testing.assert_close((partial(q, 9) * partial(k, 6)).sum(), (partial(q, 3) * partial(k, 0)).sum())
    for bad in (3, 12, 0):
        with pytest.raises(ValueError, match=f"rotary_dim must be a positive even int <= head_dim=10, got {bad}"):
            qkv.RotaryEmbedding(10, rotary_dim=bad)


def test_the_parallel_block_adds_both_sublayers_to_its_input():
    config = qkv.ModelConfig(d_model=16, attention=dict(num_heads=2), num_layers=1, feed_forward=dict(parallel=True))
    block = qkv.GPT(config).blocks[0].eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = x + block.attn(block.attn_norm(x), is_causal=True) + block.ff(block.ff_norm(x))
        torch.testing.assert_close(block(x, is_causal=True).hidden, want)


@pytest.mark.parametrize("build, message", [
    (lambda: qkv.ModelConfig(normalization=dict(first=False, final=False), feed_forward=dict(parallel=True)),
     r"feed_forward.parallel needs pre-norm blocks \(normalization.first=True\)"),
    (lambda: qkv.Transformer(qkv.ModelConfig(feed_forward=dict(parallel=True))),
     r"a parallel block is pre-norm without cross-attention, got norm_first=True, cross_attention=True"),
    (lambda: qkv.ModelConfig(position=dict(kind="learned", rotary_dim=4)),
     r"rotary_dim must be an even number of dims with positional 'rope', got rotary_dim=4 with positional 'learned'"),
    (lambda: qkv.ModelConfig(d_model=32, attention=dict(num_heads=4), position=dict(kind="rope", rotary_dim=10)),
     r"position.rotary_dim=10 is more than head_dim=8"),
])
def test_the_components_refuse_what_they_cannot_be(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("section", [dict(feed_forward=dict(parallel=True)),
                                     dict(position=dict(kind="rope", rotary_dim=4))])
def test_the_fused_step_refuses_both_until_it_declares_them(section):
    model = qkv.GPT(qkv.ModelConfig.preset("tiny").replace(**section))
    assert "which the fused step does not declare" in fused_refuses(model, 1)
    prompt = torch.randint(0, 64, (1, 4))
    assert model.generate(prompt, 5, temperature=0).tolist() == model.generate(
        prompt, 5, temperature=0, use_cache=False).tolist()
