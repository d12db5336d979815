"""Tiny random Hugging Face causal LMs of the open families and a byte-level BPE tokenizer trained offline,
for the tests that load, train and export them (no network: random initialisation, save_pretrained).

    hf_model(family, **change)     Qwen2, Qwen3, Mistral, Gemma 2 (sliding windows), LLaMA with llama3 RoPE scaling;
                                   SmolLM3, OLMo 2, Phi-3 (DENSE); Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss (MOE: mixtures of
                                   experts)
    save_with_tokenizer(model, d)  the model and a tokenizer of its vocabulary size in directory d
    saved_and_loaded(hf, d)        qkv's from_hf of the model's save_pretrained files in d
    left_padded(length, pad)       a two-row batch, the second left-padded, and its attention mask
    padded_logits_gap(model, hf)   the largest |qkv − HF| logit at the real positions of that batch
    greedy_both(model, hf, ids, n) qkv's greedy tokens and HF generate's
"""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

SIZES = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, head_dim=12, max_position_embeddings=128, tie_word_embeddings=False,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)  # GQA 3, D ≠ C/H; no eos: 32 tokens each
FAMILIES = {  # the families with sliding-window layers
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=6,
                                                        max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(use_sliding_window=True, sliding_window=6, max_window_layers=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=6)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=6, query_pre_attn_scalar=12,
                                                          attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                                          tie_word_embeddings=True)),  # alternating, sliding first
}
LLAMA3 = ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=dict(  # Llama 3.1's scaling, from 32 positions
    rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
    original_max_position_embeddings=32)))
GEMMA3 = ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(  # two local layers to one global, each its own RoPE base
    sliding_window=6, query_pre_attn_scalar=12, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1e6),
                     "sliding_attention": dict(rope_type="default", rope_theta=1e4)}, tie_word_embeddings=True))
DEEPSEEK_V3 = ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(  # latent attention, every layer dense
    kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=12, first_k_dense_replace=3,
    num_key_value_heads=6, head_dim=4,
    rope_interleave=True))
BUILDERS = FAMILIES | {"llama3": LLAMA3, "gemma3_text": GEMMA3, "deepseek_v3": DEEPSEEK_V3}  # the dense ones
DENSE = {  # tests/test_interop_dense.py: every option of each family set away from its default
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(  # layers 1 and 3 NoPE, and those two slide
        num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0], use_sliding_window=True, sliding_window=6,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=True, rope_parameters=dict(rope_theta=5e5))),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(attention_bias=True, rms_norm_eps=1e-5)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(  # RoPE on 6 of 8 dims, LongRoPE from 16 positions, window 6
        head_dim=8, sliding_window=6, original_max_position_embeddings=16, rope_parameters=dict(
            rope_type="longrope", rope_theta=500.0, partial_rotary_factor=0.75, short_factor=[1.0, 1.5, 2.0],
            long_factor=[2.0, 3.0, 5.0]))),
}
MOE = {  # mixtures of experts, every option mattering: dense layers, norm_topk_prob both ways, a shared expert
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                            sliding_window=6)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        num_hidden_layers=4, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, mlp_only_layers=[2], norm_topk_prob=False, use_sliding_window=True,
        sliding_window=6, max_window_layers=2)),  # layer 0 slides; layer 2 dense
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_hidden_layers=4, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16, decoder_sparse_step=2,
        norm_topk_prob=True)),  # layers 1 and 3 experts, 0 and 2 dense
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(  # sinks, sliding/full alternating, YaRN untruncated
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=16, sliding_window=6, swiglu_limit=0.05,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=32))),  # the clamp at 0.05 bites
}
TEXTS = ["the dog bites the man", "the man bites the dog", "attention is all you need"] * 4


def hf_model(family: str, **change):
    """A random ``family`` model (a key of BUILDERS or MOE) of SIZES, eager attention, norms and biases moved away
    from their initial values (Gemma 2's scores and logits past its soft caps)."""
    config_name, model_name, extra = (BUILDERS | DENSE | MOE)[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**SIZES, **extra, **change}, attn_implementation="eager")
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if "norm" in name else p.uniform_(-0.5, 0.5)  # norms and biases away from start
            elif family == "gemma2" and ("q_proj" in name or "k_proj" in name):
                p.mul_(8)  # scores past the attention cap of 5
            elif family == "gemma2" and "embed_tokens" in name:
                p.mul_(10)  # logits (tied head) past the final cap of 3
            elif name.endswith(("mlp.gate.weight", "mlp.router.weight")):
                p.mul_(50)  # a router that decides: no near-tie for rounding to flip
    return model


def saved_and_loaded(hf, path):
    """qkv's ``from_hf`` of ``hf``'s save_pretrained files in ``path`` (per-expert tensors, as on the Hub)."""
    from qkv.interop.hf import from_hf

    hf.save_pretrained(path)
    return from_hf(path)


def left_padded(length: int = 12, pad: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (2, length) of SIZES' vocabulary and HF's attention_mask: row 1 left-padded by ``pad``."""
    ids = torch.randint(0, SIZES["vocab_size"], (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :pad] = 0
    return ids, mask


@torch.no_grad()
def padded_logits_gap(model, hf, length: int = 12, pad: int = 4) -> float:
    """max |qkv − HF| logit over the real positions of ``left_padded(length, pad)``."""
    ids, mask = left_padded(length, pad)
    keep = mask.bool()
    return (model(ids, mask=keep).logits[keep] - hf(ids, attention_mask=mask).logits[keep]).abs().max().item()


@torch.no_grad()
def greedy_both(model, hf, prompt: torch.Tensor, new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(qkv's greedy tokens, HF generate's) for ``new`` tokens after ``prompt`` (1, T), no early stop."""
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0)
    return model.generate(prompt, new, temperature=0.0, eos_id=None), theirs


def exported_again(model, path):
    """``to_hf(model)`` saved in ``path`` and loaded back by ``AutoModelForCausalLM`` (eager): (written, loaded)."""
    from qkv.interop.hf import to_hf

    out = to_hf(model)
    out.save_pretrained(path)
    return out, transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def same_weights(a, b) -> bool:
    """Two HF models with the same state dict keys, each tensor bit for bit."""
    mine, theirs = a.state_dict(), b.state_dict()
    return mine.keys() == theirs.keys() and all(torch.equal(v, theirs[k]) for k, v in mine.items())


def bpe_tokenizer():
    """A byte-level BPE ``transformers.PreTrainedTokenizerFast`` trained on TEXTS (256 bytes + merges + EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def save_with_tokenizer(family: str, path, **change):
    """hf_model(family) over bpe_tokenizer()'s vocabulary, saved with that tokenizer in ``path``; the model."""
    tokenizer = bpe_tokenizer()
    model = hf_model(family, vocab_size=len(tokenizer), **change)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return model
