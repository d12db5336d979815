"""GGUF export of DeepSeek-V2 and -V3 as llama.cpp's deepseek2 (src/qkv/interop/gguf/deepseek.py): tiny random
Hugging Face models (tests/test_interop_deepseek.py's) in widths that split into q8_0's blocks, loaded by qkv and
written with ``to_gguf`` in f32, f16 and q8_0. Read back: the tensor names deepseek2 loads (k_b and v_b for kv_b_proj,
experts only after the leading dense layers), every value, the metadata (MLA as one key/value head, the routing keys,
YaRN's with its yarn_log_multiplier), and llama.cpp's graph over the f32 file gives HF's logits
(tests/gguf_reference.py, with YaRN's ramp, cos/sin factor and kq_scale correction). What deepseek2 computes otherwise
is refused."""
import re

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install -e '.[gguf]'")
pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from gguf_reference import Graph, check_metadata, check_values, expected_names, read  # noqa: E402
from hf_models import bpe_tokenizer  # noqa: E402
from test_interop_deepseek import hf_model  # noqa: E402

from qkv.interop.gguf import check_exportable, to_gguf  # noqa: E402
from qkv.interop.hf import from_hf, load_pretrained  # noqa: E402

WIDTHS = dict(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=32,
              q_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=8, v_head_dim=16,
              moe_intermediate_size=32)  # every matrix's rows split into q8_0's blocks of 32
EXPERTS = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
               n_shared_experts=2)  # layer 0 dense, 1 and 2 experts
# DeepSeek-V3's released YaRN (V2-Lite's: mscale = mscale_all_dim = 0.707, factor 40); with R = 8 dims and base 1e4
# its ramp runs over pairs 1-3 of 4, and the scores are × (1 + 0.1 ln 40)²
V3_YARN = dict(rope_type="yarn", rope_theta=1e4, factor=40.0, mscale=1.0, mscale_all_dim=1.0, beta_fast=32.0,
               beta_slow=1.0, original_max_position_embeddings=4096)
VARIANTS = {  # name -> (tests/test_interop_deepseek.py's variant, changes)
    "v3_experts": ("v3_low_rank_q_interleaved", EXPERTS | dict(n_group=4, topk_group=2, routed_scaling_factor=2.5)),
    "v3_experts_yarn": ("v3_low_rank_q_interleaved", EXPERTS | dict(n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                                    rope_parameters=V3_YARN)),
    "v2_dense_yarn": ("v2_biases", dict(attention_bias=False, mlp_bias=False, rope_parameters=V3_YARN | dict(
        mscale=0.707, mscale_all_dim=0.707))),
    "v2_experts": ("v2_biases", EXPERTS | dict(topk_method="greedy", routed_scaling_factor=1.5, attention_bias=False,
                                               mlp_bias=False)),
    "v3_dense_halves": ("v3_plain_q_halves", {}),  # both layers dense, q_proj, rope_interleave=False
}
TYPES = {"f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0")}
ARCH, K = gguf.MODEL_ARCH.DEEPSEEK2, gguf.Keys


@pytest.fixture(scope="module", params=list(VARIANTS))
def checkpoint(request, tmp_path_factory):
    """(variant, the HF model, qkv's model and tokenizer loaded from its save_pretrained directory): routers that
    decide (no near-tie for rounding to flip), V3's correction bias away from zero."""
    variant, change = VARIANTS[request.param]
    tokenizer, path = bpe_tokenizer(), tmp_path_factory.mktemp(request.param)
    hf = hf_model(variant, **(WIDTHS | change), vocab_size=len(tokenizer))
    with torch.no_grad():
        for layer in hf.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 2.0)
                getattr(layer.mlp.gate, "e_score_correction_bias", torch.empty(0)).normal_(0, 0.3)
    tokenizer.save_pretrained(path)
    hf.save_pretrained(path)
    return request.param, hf, *load_pretrained(path)


def dense_layers(c: dict) -> int:
    return c["first_k_dense_replace"] if c.get("n_routed_experts") else c["num_hidden_layers"]


def deepseek2_names(c: dict, v3: bool) -> set[str]:
    """gguf.MODEL_TENSORS' deepseek2 kinds this model has: q low-rank or not, k_b/v_b (not kv_b), a dense MLP in the
    leading layers and experts (with V3's exp_probs_b.bias) after."""
    q = ("ATTN_Q",) if c["q_lora_rank"] else ("ATTN_Q_A", "ATTN_Q_B", "ATTN_Q_A_NORM")
    absent = ("ROPE_FREQS", "ATTN_ROT_EMBD", "ATTN_KV_B", "ATTN_K", "ATTN_V", "FFN_EXP_PROBS_B", *q)
    names = expected_names(ARCH, c["num_hidden_layers"], absent=absent, biases=("FFN_EXP_PROBS_B",) * v3)
    dense = dense_layers(c)
    def kept(name):
        moe = re.match(r"blk\.(\d+)\.(ffn_gate_inp|ffn_\w+_(exps|shexp)|exp_probs_b)\.", name)
        mlp = re.match(r"blk\.(\d+)\.ffn_(gate|up|down)\.", name)
        return not (moe and int(moe[1]) < dense) and not (mlp and int(mlp[1]) >= dense)
    return set(filter(kept, names))


def deepseek2_metadata(c: dict, v3: bool) -> dict:
    """The keys beyond every architecture's: MLA's widths, the leading dense layers, the routing; YaRN's, with
    convert_hf_to_gguf.py's 0.1 · mscale_all_dim as yarn_log_multiplier."""
    L, A, r, R = K.LLM, K.Attention, c["kv_lora_rank"], c["qk_rope_head_dim"]
    out = {A.VALUE_LENGTH: r, K.Rope.DIMENSION_COUNT: R, A.KEY_LENGTH_MLA: c["qk_nope_head_dim"] + R,
           A.VALUE_LENGTH_MLA: c["v_head_dim"], A.KV_LORA_RANK: r, L.LEADING_DENSE_BLOCK_COUNT: dense_layers(c)}
    if c["q_lora_rank"]:
        out[A.Q_LORA_RANK] = c["q_lora_rank"]
    if dense_layers(c) < c["num_hidden_layers"]:
        out |= {L.EXPERT_COUNT: c["n_routed_experts"], L.EXPERT_USED_COUNT: c["num_experts_per_tok"],
                L.EXPERT_FEED_FORWARD_LENGTH: c["moe_intermediate_size"], L.EXPERT_SHARED_COUNT: c["n_shared_experts"],
                L.EXPERT_GATING_FUNC: 2 if v3 else 1, L.EXPERT_WEIGHTS_SCALE: c["routed_scaling_factor"]}
    if v3 and dense_layers(c) < c["num_hidden_layers"]:
        out |= {L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GROUP_COUNT: 4, L.EXPERT_GROUP_USED_COUNT: 2}
    yarn, R = c["rope_parameters"], K.Rope
    if yarn["rope_type"] == "yarn":
        out |= {R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: 40.0, R.SCALING_ORIG_CTX_LEN: 4096,
                R.SCALING_YARN_BETA_FAST: 32.0, R.SCALING_YARN_BETA_SLOW: 1.0,
                R.SCALING_YARN_LOG_MUL: pytest.approx(0.1 * yarn["mscale_all_dim"])}
    return out


@pytest.mark.parametrize("dtype", list(TYPES))
def test_deepseek_as_llama_cpp_s_deepseek2_reads_it(checkpoint, tmp_path, dtype):
    name, hf, model, tok = checkpoint
    (qtype, file_type), v3 = TYPES[dtype], name.startswith("v3")
    values, types, meta = read(to_gguf(model, tok.backend, tmp_path / "model.gguf", dtype=dtype))
    c = hf.config.to_dict()
    assert set(values) == deepseek2_names(c, v3)
    check_values(values, types, hf.state_dict(), ARCH, c, getattr(gguf.GGMLQuantizationType, qtype))
    config = c | {"num_key_value_heads": 1, "head_dim": c["kv_lora_rank"] + c["qk_rope_head_dim"],
                  "rope_theta": hf.config.rope_parameters["rope_theta"]}  # MLA as one key/value head
    check_metadata(meta, ARCH, config, getattr(gguf.LlamaFileType, file_type), deepseek2_metadata(c, v3))
    if not v3:
        assert K.LLM.EXPERT_WEIGHTS_NORM.format(arch="deepseek2") not in meta  # V2 never renormalises
    if dtype != "f32":
        return  # the values were checked within a rounding step; the graph is f32's check
    ids = tok.backend("the dog bites the man and the man bites the dog").input_ids
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    got = Graph(values, meta, ARCH).logits(ids)
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("variant, change, reasons", [
    ("v3_plain_q_halves", dict(attention_bias=True), [r"attention biases on \(llama.cpp's deepseek2 has none\)"]),
    ("v3_yarn", {}, [  # mscale 0.8 ≠ mscale_all_dim 1.2: (1 + 0.08 ln 4) / (1 + 0.12 ln 4), (1 + 0.12 ln 4)² in HF
        r"YaRN factor=4.0, mscale=0.8, mscale_all_dim=1.2: cos/sin × 0.952457, scores × 1.36038 "
        r"\(llama.cpp's deepseek2 makes them × 1 and × 1.36038: its mscale is mscale_all_dim"]),
    ("v3_yarn", dict(rope_parameters=V3_YARN | dict(mscale=None, beta_fast=16.0, truncate=False)), [
        r"YaRN truncate=False \(llama.cpp's deepseek2 rounds the ramp's ends to whole dims: truncate=True\)",
        r"YaRN beta_fast=16.0, beta_slow=1.0 \(llama.cpp's deepseek2 reads no β: 32.0 and 1.0\)",
        r"YaRN factor=40.0, mscale_all_dim=1.0: cos/sin × 1.36889"]),  # no mscale: transformers' 1 + 0.1 ln s
    ("v3_yarn", dict(rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=2.0)),
     [r"RoPE scaling 'linear' \(written for llama.cpp's deepseek2: yarn\)"]),
    ("v2_biases", EXPERTS | dict(moe_intermediate_size=8, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                 mlp_bias=False), [
        r"topk_method='group_limited_greedy' with n_group=4 \(llama.cpp's deepseek2 scores a group by its two best "
        r"experts, DeepSeek-V2 by its best\)", r"attention biases on \(llama.cpp's deepseek2 has none\)"]),
])
def test_what_deepseek2_would_compute_otherwise_is_refused_in_one_error(variant, change, reasons):
    model = from_hf(hf_model(variant, **change))
    with pytest.raises(ValueError, match=r"^no GGUF counterpart for this DeepSeek-V\d model: ") as error:
        check_exportable(model)
    assert all(re.search(reason, str(error.value)) for reason in reasons), str(error.value)
