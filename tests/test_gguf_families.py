"""GGUF export of the families after LLaMA's: Mixtral (llama.cpp's llama with experts), Qwen2-MoE, Qwen3-MoE, OLMo 2,
Phi-3, SmolLM3 and gpt-oss. A tiny random Hugging Face model of each (tests/hf_models.py, in settings llama.cpp runs) is
loaded by qkv and written with ``to_gguf`` in f32, f16 and q8_0; read back with GGUFReader, the tensor names are those
``gguf.MODEL_TENSORS`` lists for the architecture, every tensor equals the HF weight in llama.cpp's layout (experts
stacked, gate and up apart), the metadata keys hold the config's values, and llama.cpp's graph for the architecture
over the f32 file gives HF's logits (tests/gguf_reference.py). What an architecture fixes otherwise is refused.
"""
import math
import re

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install -e '.[gguf]'")
pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from gguf_reference import Graph, check_metadata, check_values, expected_names, read  # noqa: E402
from hf_models import hf_model, save_with_tokenizer  # noqa: E402

from qkv.interop.gguf import ARCHES, GGUFApproximation, check_exportable, gguf_warnings, to_gguf  # noqa: E402
from qkv.interop.hf import from_hf, load_pretrained  # noqa: E402

SHORT, LONG = [1.0, 1.5, 2.0, 2.5, 3.0, 4.0], [2.0, 3.0, 5.0, 7.0, 11.0, 13.0]  # LongRoPE's, one per rotated pair
WIDTHS = dict(hidden_size=64, num_attention_heads=4, head_dim=16, intermediate_size=64)  # q8_0's rows: 32 | each
FAMILIES = {  # HF settings llama.cpp runs, gguf arch, kinds llama.cpp would load but this model has not, biases
    "mixtral": (dict(sliding_window=None), "LLAMA", ("ROPE_FREQS", "ATTN_ROT_EMBD", "FFN_GATE", "FFN_UP", "FFN_DOWN"),
                ()),
    "qwen2_moe": (dict(mlp_only_layers=[], use_sliding_window=False, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, tie_word_embeddings=True), "QWEN2MOE", (),
                  ("ATTN_Q", "ATTN_K", "ATTN_V")),  # tied: llama.cpp's qwen2moe loads output.weight all the same
    "qwen3_moe": (dict(decoder_sparse_step=1, moe_intermediate_size=32, tie_word_embeddings=True), "QWEN3MOE",
                  ("OUTPUT",), ()),
    "olmo2": (dict(attention_bias=False), "OLMO2", (), ()),
    "phi3": (dict(sliding_window=None, original_max_position_embeddings=16, rope_parameters=dict(
        rope_type="longrope", rope_theta=500.0, partial_rotary_factor=0.75, short_factor=SHORT, long_factor=LONG)),
             "PHI3", ("ATTN_[QKV]",), ()),  # RoPE on 12 of 16 dims, LongRoPE from 16 positions
    "smollm3": (dict(num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], use_sliding_window=False, attention_bias=False,
                     mlp_bias=False, tie_word_embeddings=True), "SMOLLM3", ("ROPE_FREQS", "ATTN_ROT_EMBD"), ()),
    "gpt_oss": (dict(swiglu_limit=7.0, sliding_window=4, rope_parameters=dict(  # layers 0 and 2 slide; YaRN's ramp
        rope_type="yarn", rope_theta=100.0, factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=True,  # on pairs 0-3
        original_max_position_embeddings=32)), "GPT_OSS", (),
        ("ATTN_Q", "ATTN_K", "ATTN_V", "ATTN_OUT", "FFN_GATE_INP", "FFN_GATE_EXP", "FFN_UP_EXP", "FFN_DOWN_EXP")),
}  # a tied qwen2moe or smollm3 head is written as output.weight too; a tied qwen3moe one is not
TYPES = {"f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0")}


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request, tmp_path_factory):
    """(family, the HF model, qkv's model and tokenizer loaded from its save_pretrained directory)."""
    family = request.param
    path = tmp_path_factory.mktemp(family)
    hf = save_with_tokenizer(family, path, **WIDTHS, **FAMILIES[family][0])
    if family == "gpt_oss":  # experts' gate and up past llama.cpp's fixed limit of 7: the clamp bites
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.mlp.experts.gate_up_proj.mul_(100)
        hf.save_pretrained(path)
    return family, hf, *load_pretrained(path)


def metadata(hf_config: dict, family: str) -> dict:
    """The keys beyond every architecture's: RoPE's dims (Phi-3: the first 75%), the experts' counts and widths."""
    L, out = gguf.Keys.LLM, {gguf.Keys.Rope.DIMENSION_COUNT: 12 if family == "phi3" else 16}
    if family == "phi3":
        out[gguf.Keys.Rope.SCALING_ORIG_CTX_LEN] = 16
    experts = hf_config.get("num_local_experts") or hf_config.get("num_experts")
    if experts:
        out |= {L.EXPERT_COUNT: experts, L.EXPERT_USED_COUNT: hf_config["num_experts_per_tok"]}
    if family.startswith("qwen"):
        out[L.EXPERT_FEED_FORWARD_LENGTH] = hf_config["moe_intermediate_size"]
    if family == "qwen2_moe":
        out[L.EXPERT_SHARED_FEED_FORWARD_LENGTH] = hf_config["shared_expert_intermediate_size"]
    if family == "gpt_oss":
        R, yarn = gguf.Keys.Rope, hf_config["rope_parameters"]
        out |= {L.EXPERT_FEED_FORWARD_LENGTH: hf_config["intermediate_size"],
                gguf.Keys.Attention.SLIDING_WINDOW: hf_config["sliding_window"], R.SCALING_TYPE: "yarn",
                R.SCALING_FACTOR: yarn["factor"], R.SCALING_ORIG_CTX_LEN: yarn["original_max_position_embeddings"],
                R.SCALING_YARN_BETA_FAST: yarn["beta_fast"], R.SCALING_YARN_BETA_SLOW: yarn["beta_slow"]}
    return out


@pytest.mark.parametrize("dtype", list(TYPES))
def test_a_family_as_llama_cpp_reads_it(checkpoint, tmp_path, dtype):
    family, hf, model, tok = checkpoint
    _, arch, absent, biases = FAMILIES[family]
    arch, (qtype, file_type) = getattr(gguf.MODEL_ARCH, arch), TYPES[dtype]
    values, types, meta = read(to_gguf(model, tok.backend, tmp_path / "model.gguf", dtype=dtype))
    config = hf.config.to_dict() | WIDTHS | {"rope_theta": hf.config.rope_parameters["rope_theta"]}
    assert set(values) == expected_names(arch, config["num_hidden_layers"], absent=absent, biases=biases)
    check_values(values, types, hf.state_dict(), arch, config, getattr(gguf.GGMLQuantizationType, qtype))
    check_metadata(meta, arch, config, getattr(gguf.LlamaFileType, file_type), metadata(config, family))
    if family == "phi3":  # LongRoPE: both factor lists, and transformers' cos/sin scale √(1 + ln 8 / ln 16)
        factors = (values["rope_factors_short.weight"].tolist(), values["rope_factors_long.weight"].tolist())
        assert factors == (SHORT, LONG)
        assert meta["phi3.rope.scaling.attn_factor"] == pytest.approx((1 + math.log(8) / math.log(16)) ** 0.5)
    if dtype != "f32":
        return  # the values were checked within a rounding step; the graph is f32's check
    ids = tok.backend("the dog bites the man and the man bites the dog").input_ids  # longer than windows
    assert len(ids) <= 16  # within Phi-3's original context: transformers' short factors, as llama.cpp's in one
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    got = Graph(values, meta, arch).logits(ids)
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("family, change, reasons", [
    ("mixtral", dict(sliding_window=6), [r"sliding_window=6 < context 128 \(llama.cpp's llama attends to every key\)"]),
    ("qwen2_moe", dict(head_dim=12, norm_topk_prob=True, qkv_bias=False), [
        r"head_dim=12 × 6 heads = 72 ≠ hidden_size=48 \(llama.cpp's qwen2moe makes q as wide as the model\)",
        r"attention biases off \(llama.cpp's qwen2moe reads q/k/v biases\)",
        r"dense layers \[2\] among the mixture-of-experts ones \(llama.cpp's qwen2moe has experts in every layer\)",
        r"norm_topk_prob=True \(llama.cpp's qwen2moe does not renormalise the top-k weights\)"]),
    ("qwen3_moe", dict(norm_topk_prob=False, attention_bias=True), [
        r"attention biases on \(llama.cpp's qwen3moe has none\)", r"dense layers \[0, 2\]",
        r"norm_topk_prob=False \(llama.cpp's qwen3moe renormalises the top-k weights\)"]),
    ("olmo2", dict(attention_bias=True), [r"attention biases on \(llama.cpp's olmo2 has none\)",
                                          r"head_dim=12 × 6 heads = 72 ≠ hidden_size=48"]),
    ("phi3", {}, [r"sliding_window=6 < context 128 \(llama.cpp's phi3 attends to every key\)"]),
    ("gpt_oss", dict(attention_bias=False, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                     rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, beta_fast=16.0, beta_slow=1.0,
                                          attention_factor=1.0, original_max_position_embeddings=32)), [
        r"YaRN beta_fast=16.0, beta_slow=1.0 \(llama.cpp's gpt-oss reads no β: 32.0 and 1.0\)",
        r"YaRN factor=4.0, attention_factor=1.0: cos/sin × 1, scores × 1 \(llama.cpp's gpt-oss makes them × 1.13863 "
        r"and × 1: 1 \+ 0.1 ln s on cos/sin, nothing on the scores\)",
        r"layer_types=\['full_attention', 'sliding_attention', 'sliding_attention'\] \(llama.cpp's gpt-oss slides on "
        r"\['sliding_attention', 'full_attention', 'sliding_attention'\]\)",
        r"attention biases off \(llama.cpp's gpt-oss reads q/k/v biases\)",
        r"swiglu_alpha=1.702, swiglu_limit=0.05 \(llama.cpp's gpt-oss fixes α=1.702, limit=7.0\)"]),
    ("smollm3", {}, [r"no_rope_layers=\[1, 0, 1, 0\] \(llama.cpp's smollm3 skips RoPE in every 4th layer: "
                     r"\[1, 1, 1, 0\]\)", r"sliding_window=6 < context 128", r"attention biases on",
                     r"mlp_bias=True \(llama.cpp's smollm3 has none\)"]),
])
def test_what_llama_cpp_would_compute_otherwise_is_refused_in_one_error(family, change, reasons):
    """tests/hf_models.py's settings (every option away from its default), as the architecture cannot hold them."""
    model = from_hf(hf_model(family, **change))
    with pytest.raises(ValueError, match=r"^no GGUF counterpart for this \S+ model: ") as error:
        check_exportable(model)
    assert all(re.search(reason, str(error.value)) for reason in reasons), str(error.value)


def test_gpt_oss_s_released_yarn_is_written_rounded_as_llama_cpp_runs_it(tmp_path):
    """gpt-oss as released (YaRN truncate=False): llama.cpp rounds the ramp's ends (no key says otherwise), so the file
    says YaRN and a GGUFApproximation warning gives the largest change of a rotary frequency; llama.cpp's graph over
    the file with transformers' unrounded ramp gives HF's logits, so the rounding is all that differs."""
    settings = FAMILIES["gpt_oss"][0]
    settings = settings | dict(rope_parameters=settings["rope_parameters"] | dict(truncate=False))
    hf = save_with_tokenizer("gpt_oss", tmp_path / "hf", **WIDTHS, **settings)
    model, tok = load_pretrained(tmp_path / "hf")
    # D = 16, base 100, L₀ 32, s = 4: the ramp runs over pairs 0 to 16·ln(32/2π) / (2 ln 100) = 2.83, rounded 3; pair 2
    # moves most, its θ' / θ from 1 − (3/4)·(2/2.83) to 1 − (3/4)·(2/3)
    high = 16 * math.log(32 / (2 * math.pi)) / (2 * math.log(100))
    change = (1 - 0.75 * 2 / 3) / (1 - 0.75 * 2 / high) - 1
    warning = rf"^gpt-oss: YaRN truncate=False is written with the ramp's ends rounded .* pair 2 of 8 changes by " \
              rf"{100 * change:.3g}% \(the largest change\)"
    with pytest.warns(GGUFApproximation, match=warning):
        values, _, meta = read(to_gguf(model, tok.backend, tmp_path / "model.gguf", dtype="f32"))
    assert meta["gpt-oss.rope.scaling.type"] == "yarn"
    ids = tok.backend("the dog bites the man and the man bites the dog").input_ids
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    def gap(**rounding):  # the largest logit difference from HF's, relative to HF's largest logit
        got = Graph(values, meta, gguf.MODEL_ARCH.GPT_OSS, **rounding).logits(ids)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        return ((got - want).abs().max() / want.abs().max()).item()
    exact, rounded = gap(rounded_ramp=False), gap()
    assert exact < 1e-5  # the unrounded ramp: HF's logits, but for float rounding
    assert 10 * exact < rounded < 1e-4, (exact, rounded)  # what llama.cpp runs: off HF's, by little at 12 positions


def test_the_warning_for_gpt_oss_20b_s_yarn_says_what_rounding_changes():
    """openai/gpt-oss-20b's settings (head 64, base 150000, YaRN s = 32 from L₀ = 4096 to 131072, truncate=False): the
    ramp's ends 8.09 and 17.40 become 8 and 18; pair 17 moves most (docs/checkpoints.md quotes these figures)."""
    rope = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                original_max_position_embeddings=4096)
    fields = dict(head_dim=64, rope_theta=150000.0, max_position_embeddings=131072, rope_scaling=rope)
    def end(beta):  # transformers' find_correction_dim
        return 64 * math.log(4096 / (beta * 2 * math.pi)) / (2 * math.log(150000))
    low, high = end(32), end(1)
    assert (round(low, 2), round(high, 2)) == (8.09, 17.4)
    def frequency(i, low, high):  # θ'_i: the ramp's share of θ_i / s
        ramp = min(max((i - low) / (high - low), 0), 1)
        return 150000 ** (-2 * i / 64) * (1 - ramp + ramp / 32)
    change = [frequency(i, 8, 18) - frequency(i, low, high) for i in range(32)]  # rounded − exact, rad a position
    [warning] = gguf_warnings(ARCHES["gpt_oss"], fields)
    assert f"pair 17 of 32 changes by {100 * change[17] / frequency(17, low, high):.3g}% (the largest change)" \
        in warning, warning
    assert warning.endswith(f"at position 4096 and {max(map(abs, change)) * 131072:.3g} rad at position 131072; "
                            "llama.cpp's logits differ from transformers' accordingly, more with distance"), warning
    assert gguf_warnings(ARCHES["gpt_oss"], fields | dict(rope_scaling=rope | dict(truncate=True))) == []


def test_a_mixture_of_experts_trained_here_runs_as_llama_cpp_s_llama(tmp_path, capsys):
    """A qkv run with experts in every layer: `qkv export --format gguf` writes it as Mixtral does, and llama.cpp's
    graph over the file gives the run's logits."""
    from test_gguf import LLAMA, TEXT, make_run

    from qkv.cli import main
    from qkv.data import BPETokenizer
    from qkv.training.run_dir import load_run

    run = make_run(tmp_path / "run", BPETokenizer.train(TEXT, 300), **LLAMA, moe=dict(num_experts=4, top_k=2))
    out = tmp_path / "moe.gguf"
    assert main(["export", "--run", str(run), "--format", "gguf", "--out", str(out), "--gguf-type", "f32"]) == 0
    values, _, meta = read(out)
    loaded = load_run(run)
    c, L = loaded.model.config, gguf.Keys.LLM
    assert meta["general.architecture"] == "llama"
    assert (meta[L.EXPERT_COUNT.format(arch="llama")], meta[L.EXPERT_USED_COUNT.format(arch="llama")]) == (4, 2)
    assert values["blk.1.ffn_gate_exps.weight"].shape == (4, c.moe.d_expert or c.ff_width, 64)  # (E, I, C)
    ids = loaded.tokenizer.encode("def f(x):\n    return 2 * x")
    with torch.no_grad():
        want = loaded.model(torch.tensor([ids])).logits[0]
    got = Graph(values, meta, gguf.MODEL_ARCH.LLAMA).logits(ids)
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)
