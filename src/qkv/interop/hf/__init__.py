"""Hugging Face checkpoints (GPT-2, LLaMA and the families on it, GPT-NeoX, DeepSeek, BERT, Marian) as qkv models,
and qkv models as Hugging Face ones.

A checkpoint becomes two things in qkv's terms: a ``ModelConfig`` (what the HF config
means — widths, norm, activation, positional scheme) and a table of weight ``Rule``s,
each tying one HF tensor to one or more qkv tensors with the layout change between them.
Nothing model-specific runs inside qkv's attention:

    GPT-2  learned PE · pre-LN LayerNorm · gelu_tanh · biases · tied head; Conv1D stores W
           transposed and packs Q, K, V in one c_attn (Radford et al. 2019)
    LLaMA  RoPE half-split (rope_theta) · RMSNorm · SwiGLU · grouped K/V heads · head_dim and
           attention/MLP biases as configured (Touvron et al. 2023); on it, each saying what differs:
           Qwen2/Qwen3 (q/k/v bias; QK-norm), Mistral (sliding window), Gemma 2/3 ((1 + w) sandwich
           norms, soft caps, sliding layers, local RoPE base)
    DeepSeek-V2/V3 multi-head latent attention, V3's mixture of experts (DeepSeek-AI 2024)
    Mixtral, Qwen2-MoE, Qwen3-MoE  Mistral / Qwen2 / Qwen3 with a mixture-of-experts feed-forward (qkv.nn.moe;
           Jiang et al. 2024, Qwen team 2024/2025)
    GPT-NeoX RoPE half-split on part of each head (rotary_pct) · LayerNorm · gelu · q/k/v packed by head ·
           a parallel or sequential residual (Black et al. 2022; Pythia, Biderman et al. 2023)
    BERT   learned PE + token types + embedding LayerNorm · post-LN · gelu (Devlin et al. 2019)
    Marian the paper's encoder-decoder: split-layout sinusoids · post-LN · swish · shared embeddings ·
           a logits bias (Junczys-Dowmunt et al. 2018; opus-mt, Tiedemann & Thottingal 2020)

The package, shared pieces first:

    rules       Rule (one table drives both directions) and the layout changes families share
    settings    reading a HF config (transformers 4.x and 5.x spellings) and the checks for writing one
    files       config.json, generation_config.json, safetensors (never unpickled)
    family      Family: what is particular to one model_type, as data
    families/   one module per family (gpt2, llama, qwen2, qwen3, mistral, gemma2, gemma3, deepseek, gpt_neox,
                bert, marian) and the FAMILIES registry
    load        from_hf: every problem in one ValueError, found on a meta-device skeleton
    export      to_hf
    tokenizer   the tokenizer wrapper and find_tokenizer

Shapes: C model width, F feed-forward width, V vocabulary, H heads, G key/value heads, D head width.
"""
from .export import hf_config, to_hf
from .families import FAMILIES, register_family
from .families.bert import LEGACY
from .families.marian import LEGACY as MARIAN_LEGACY
from .families.marian import UNSUPPORTED_SEARCH, marian_special
from .family import Family
from .load import from_hf, load_pretrained
from .rules import HEAD, LOGITS_BIAS, TOP_LEVEL, Rule, half_split_to_interleaved, interleaved_to_half_split
from .settings import HF_ACTIVATIONS, hf_to_qkv, qkv_to_hf
from .tokenizer import TOKENIZER_FILES, Tokenizer, find_tokenizer, load_tokenizer

# Name tables derived from qkv.nn.layers.ACTIVATIONS and FAMILIES (tests and callers read them from here).
ACTIVATIONS = hf_to_qkv(gated=False)  # HF name -> qkv activation (GPT-2, BERT, Marian)
GATED = hf_to_qkv(gated=True)  # LLaMA's hidden_act names the gate's activation
GPT2_ACT_NAME = qkv_to_hf(gated=False)  # qkv -> HF
LLAMA_ACT_NAME = qkv_to_hf(gated=True)
MARIAN_ACT_NAME = qkv_to_hf(gated=False, prefer=("swish",))
HF_TASK_MODELS = {t: f.hf_classes for t, f in FAMILIES.items() if f.export is not None}

__all__ = ["from_hf", "to_hf", "load_pretrained", "marian_special", "Tokenizer", "find_tokenizer", "load_tokenizer",
           "Rule", "Family", "FAMILIES", "register_family", "hf_config", "interleaved_to_half_split",
           "half_split_to_interleaved", "HEAD", "LOGITS_BIAS", "TOP_LEVEL", "TOKENIZER_FILES", "HF_ACTIVATIONS",
           "LEGACY", "MARIAN_LEGACY", "UNSUPPORTED_SEARCH", "ACTIVATIONS", "GATED", "GPT2_ACT_NAME", "LLAMA_ACT_NAME",
           "MARIAN_ACT_NAME", "HF_TASK_MODELS"]
