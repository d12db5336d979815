"""Mixtral, Qwen2-MoE, Qwen3-MoE and gpt-oss through from_hf / to_hf: tiny random Hugging Face models (tests/hf_models.py MOE:
dense layers among the MoE ones, norm_topk_prob both ways, a gated shared expert, sliding windows) saved with
save_pretrained (per-expert tensors on disk) or in memory (fused), against HF eager on a left-padded batch and HF
greedy generate (auto: the fused step for Mixtral and Qwen3-MoE, windows included); to_hf exact and loadable by
transformers; per-expert checkpoint problems listed in one error; the fused decode step refuses the other families
in one line, and GGUF export all but Mixtral without a window; `qkv sample --hf` decodes one."""
import dataclasses
import re

import pytest
import torch
from test_cli_families import TEXT, fine_tune_and_export
from hf_models import (MOE, exported_again, greedy_both, hf_model, left_padded, padded_logits_gap, same_weights,
                       save_with_tokenizer, saved_and_loaded)

from qkv import cli
from qkv.interop.gguf import check_exportable
from qkv.interop.hf import from_hf, to_hf
from qkv.kernels import fused_step
from qkv.nn.moe import MixtureOfExperts

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
safetensors_torch = pytest.importorskip("safetensors.torch")

VARIANTS = {name: (name, {}) for name in MOE} | {
    "mixtral (no window)": ("mixtral", dict(sliding_window=None)),
    "qwen3_moe (window)": ("qwen3_moe", dict(use_sliding_window=True, sliding_window=6)),
    "gpt_oss (no window)": ("gpt_oss", dict(layer_types=["full_attention"] * 3)),  # to_hf still names a window
}
GGUF_REFUSES = {"mixtral": r"sliding_window=6 < context", "qwen2_moe": r"dense layers \[2\]",
                "qwen3_moe": r"dense layers \[0, 2\]", "gpt_oss": r"swiglu_limit=0.05 \(llama.cpp.s gpt-oss fixes"}
PROMPT = torch.tensor([[5, 17, 3, 42, 8, 60, 2, 11]])


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    family, change = VARIANTS[request.param]
    hf, path = hf_model(family, **change), tmp_path_factory.mktemp(family)
    return hf, saved_and_loaded(hf, path), path


@torch.no_grad()
def test_logits_match_hf_on_a_left_padded_batch(pair):
    hf, model, _ = pair
    assert padded_logits_gap(model, hf) < 1e-4
    kinds = [isinstance(b.ff, MixtureOfExperts) for b in model.blocks]
    assert any(kinds) and kinds == [type(layer.mlp).__name__.endswith(("SparseMoeBlock", "GptOssMLP"))
                                    for layer in hf.model.layers]


@torch.no_grad()
def test_greedy_equals_hf_generate(pair):
    hf, model, _ = pair
    assert torch.equal(*greedy_both(model, hf, PROMPT, 16))


@torch.no_grad()
def test_to_hf_is_exact_and_transformers_loads_it(pair, tmp_path):
    hf, model, _ = pair
    back = to_hf(model)
    assert type(back) is type(hf)
    theirs = hf.state_dict()
    assert set(back.state_dict()) == set(theirs)
    assert all(torch.equal(v, theirs[k]) for k, v in back.state_dict().items())
    back.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = left_padded()
    keep = mask.bool()  # padding rows attend to nothing: sdpa and eager differ there
    torch.testing.assert_close(again(ids, attention_mask=mask).logits[keep], hf(ids, attention_mask=mask).logits[keep],
                               atol=1e-5, rtol=1e-5)


def test_an_in_memory_model_loads_from_its_fused_experts(pair):
    hf, model, _ = pair
    again = from_hf(hf)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in again.state_dict().items())


def test_mixtral_checkpoint_names_block_sparse_moe_and_w1_w3(tmp_path):
    """Mixtral's own names on disk (block_sparse_moe, experts.{e}.w1/w2/w3) load as transformers 5's."""
    hf = hf_model("mixtral")
    hf.save_pretrained(tmp_path)
    state = safetensors_torch.load_file(tmp_path / "model.safetensors")
    names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    old = {}
    for k, v in state.items():
        k = k.replace(".mlp.", ".block_sparse_moe.")
        for new, w in names.items():
            k = k.replace(f".{new}.weight", f".{w}.weight") if ".experts." in k else k
        old[k] = v
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in old
    safetensors_torch.save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = from_hf(tmp_path)
    ids, mask = left_padded()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask=mask.bool()).logits[mask.bool()],
                                   hf(ids, attention_mask=mask).logits[mask.bool()], atol=1e-4, rtol=1e-4)


def load_error(hf, path, edit) -> str:
    """from_hf's error for ``hf`` saved in ``path`` with ``edit(state dict)`` applied to the file: one line."""
    hf.save_pretrained(path)
    state = safetensors_torch.load_file(path / "model.safetensors")
    edit(state)
    safetensors_torch.save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        from_hf(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_missing_and_misshaped_experts_in_one_error(tmp_path):
    def edit(state):
        del state["model.layers.0.mlp.experts.1.gate_proj.weight"]
        state["model.layers.1.mlp.experts.2.up_proj.weight"] = torch.zeros(5, 48)
        state["model.layers.3.mlp.gate.weight"] = torch.zeros(7, 48)

    message = load_error(hf_model("qwen2_moe"), tmp_path, edit)
    for part in ("1 missing expert tensors: model.layers.0.mlp.experts.1.gate_proj.weight",
                 "experts of one layer with different shapes: model.layers.1.mlp.experts.*.up_proj.weight",
                 "model.layers.3.mlp.gate.weight torch.float32 (7, 48) (expected floating (6, 48))"):
        assert part in message


def test_moe_config_problems_in_one_error():
    config = hf_model("qwen3_moe").config.to_dict() | dict(num_experts_per_tok=9, decoder_sparse_step=0)
    family = __import__("qkv.interop.hf.families", fromlist=["x"]).FAMILIES["qwen3_moe"]
    problems = []
    fields = family.config(config, problems)
    assert problems == ["decoder_sparse_step=0 (expected a positive int)"]
    with pytest.raises(ValueError, match="top_k=9 is larger than num_experts=8"):
        __import__("qkv").ModelConfig.from_dict(fields)


@pytest.mark.parametrize("family, change, problem", [
    ("mixtral", dict(hidden_act="gelu"), "hidden_act='gelu' with mixture-of-experts layers is not supported"),
    ("qwen3_moe", dict(hidden_act="gelu_pytorch_tanh"), "hidden_act='gelu_pytorch_tanh' with mixture-of-experts"),
    ("qwen2_moe", dict(hidden_act="gelu"), "hidden_act='gelu' with mixture-of-experts layers is not supported"),
    ("qwen2_moe", dict(shared_expert_intermediate_size=0), "shared_expert_intermediate_size=0 is not supported"),
])
def test_what_qkv_cannot_compute_is_refused_naming_the_setting(family, change, problem, tmp_path):
    """transformers runs these (gelu experts; a shared expert of width 0, which adds nothing); qkv's experts gate
    with silu and its Qwen2-MoE has a shared expert: one error naming the setting, never other logits."""
    with pytest.raises(ValueError, match=rf"^cannot load \S+ as {family}: {re.escape(problem)}") as e:
        saved_and_loaded(hf_model(family, **change), tmp_path)
    assert "\n" not in str(e.value) and str(e.value).count(";") == 0


@pytest.mark.parametrize("change", [dict(hidden_act="gelu", mlp_only_layers=[0, 1, 2, 3]),
                                    dict(qkv_bias=False, decoder_sparse_step=2, mlp_only_layers=[1, 3])])
def test_a_qwen2_moe_whose_every_layer_is_dense_loads_and_is_written_back(change, tmp_path):
    """mlp_only_layers and decoder_sparse_step may leave no expert layer: dense MLPs (of any activation), and to_hf
    writes a Qwen2-MoE again (no dense family holds q/k/v without biases beside sliding and full layers)."""
    hf = hf_model("qwen2_moe", **change)
    model = from_hf(hf)
    assert not any(model.config.moe_layer(i) for i in range(4)) and padded_logits_gap(model, hf) < 1e-4
    out, again = exported_again(model, tmp_path)
    assert type(out) is type(hf) and same_weights(out, hf)
    ids, mask = left_padded()
    keep = mask.bool()
    torch.testing.assert_close(again(ids, attention_mask=mask).logits[keep], hf(ids, attention_mask=mask).logits[keep])


FUSED = {"mixtral", "qwen3_moe", "qwen2_moe"}  # softmax top-k routing, SwiGLU experts without biases, a (gated)
# shared expert without biases


def test_the_fused_step_decodes_or_refuses_and_gguf_exports_or_refuses_in_one_line(pair):
    hf, model, _ = pair
    reason = fused_step.refuses(model, 1)
    if hf.config.model_type in FUSED:
        assert reason is None
    else:
        assert reason is not None and "\n" not in reason
        c = model.config  # without its window and sinks, an experts' setting is the reason
        full = c.replace(layer_types=None, attention=dataclasses.replace(c.attention, sliding_window=None, kind="mha"))
        assert fused_step.refuses_field(full).startswith("config field moe.")
    if hf.config.model_type == "mixtral" and hf.config.sliding_window is None:  # llama.cpp's llama with experts
        assert check_exportable(model)[1].member == "LLAMA"
        return
    with pytest.raises(ValueError, match=GGUF_REFUSES[hf.config.model_type]) as error:  # tests/test_gguf_families.py
        check_exportable(model)
    assert "\n" not in str(error.value)


def test_what_a_family_lacks_is_refused_on_export(pair):
    _, model, _ = pair
    c = model.config
    sigmoid = type(model)(c.replace(moe=dataclasses.replace(c.moe, score="sigmoid")))
    with pytest.raises(ValueError, match=r"moe\.score='sigmoid' \(\S+ needs 'softmax'\)"):
        to_hf(sigmoid)
    if c.moe.d_shared is not None:  # biases in the shared expert: DeepSeek-V2's mlp_bias, not Qwen2-MoE's
        biased = type(model)(c.replace(moe=dataclasses.replace(c.moe, shared_bias=True)))
        with pytest.raises(ValueError, match=r"moe\.shared_bias=True \(Qwen2-MoE needs False\)"):
            to_hf(biased)
    if c.moe.activation == "swiglu":  # HF's experts gate with hidden_act, the dense MLPs' too
        gelu = type(model)(c.replace(feed_forward=dataclasses.replace(c.feed_forward, activation="geglu")))
        with pytest.raises(ValueError, match=r"feed_forward.activation='geglu' with a mixture of experts \(\S+'s hidden_act is "
                                             r"the experts' too, and qkv's experts are 'swiglu'\)"):
            to_hf(gelu)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family", list(MOE))
def test_a_fine_tuned_moe_run_exports_with_qkvs_logits(family, lora, tmp_path, capsys):
    """`qkv train --init-from-hf` (LoRA on the attention's projections, or every weight, experts included) and
    `qkv export --hf` round trip for each mixture-of-experts family."""
    save_with_tokenizer(family, tmp_path / "hf")
    (tmp_path / "data.txt").write_text((TEXT + ". ") * 300, encoding="utf-8")
    fine_tune_and_export(family, tmp_path, lora, tmp_path, capsys)


def test_qkv_sample_decodes_a_moe_checkpoint(tmp_path, capsys):
    save_with_tokenizer("qwen2_moe", tmp_path)
    assert cli.main(["sample", "--hf", str(tmp_path), "--prompt", "the dog", "--max-new-tokens", "8",
                     "--temperature", "0"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([tok.encode("the dog")])
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                           pad_token_id=0, eos_token_id=tok.eos_token_id)
    assert text == tok.decode(expected[0])


def test_fused_step_refuses_gpt_oss_naming_its_sinks():
    model = from_hf(hf_model("gpt_oss"))
    c = model.config
    full = c.replace(layer_types=None, attention=dataclasses.replace(c.attention, sliding_window=None))
    reason = fused_step.refuses_field(full)
    assert reason.startswith("config field attention.kind='sink'") and "\n" not in reason


def test_gpt_oss_problems_in_one_error(tmp_path):
    """A quantised checkpoint, top-k > experts and a mis-shaped expert tensor: one error, each named."""
    def edit(state):
        state["model.layers.1.mlp.experts.gate_up_proj"] = torch.zeros(4, 48, 30)
        del state["model.layers.2.mlp.experts.down_proj_bias"]

    hf = hf_model("gpt_oss")
    message = load_error(hf, tmp_path, edit)
    for part in ("model.layers.1.mlp.experts.gate_up_proj torch.float32 (4, 48, 30) (expected floating (4, 48, 32))",
                 "model.layers.2.mlp.experts.down_proj_bias"):
        assert part in message
    config = hf.config.to_dict() | dict(num_experts_per_tok=9, quantization_config=dict(quant_method="mxfp4"))
    problems = []
    fields = __import__("qkv.interop.hf.families", fromlist=["x"]).FAMILIES["gpt_oss"].config(config, problems)
    assert problems == ["quantization_config quant_method='mxfp4' (qkv loads gpt-oss with unquantised experts: "
                        "dequantise the checkpoint first)"]
    with pytest.raises(ValueError, match="top_k=9 is larger than num_experts=4"):
        __import__("qkv").ModelConfig.from_dict(fields)


def test_qkv_sample_decodes_a_gpt_oss_checkpoint(tmp_path, capsys):
    save_with_tokenizer("gpt_oss", tmp_path)
    assert cli.main(["sample", "--hf", str(tmp_path), "--prompt", "the dog", "--max-new-tokens", "8",
                     "--temperature", "0"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.tensor([tok.encode("the dog")])
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                           pad_token_id=0, eos_token_id=tok.eos_token_id)
    assert text == tok.decode(expected[0])
