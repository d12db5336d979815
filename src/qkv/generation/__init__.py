"""Decoding: sampling functions, the decode loop and its backends, and beam search for the encoder-decoder.

    sampling.py      logits → filtered logits → next token
    decode.py        generate: prefill, then one cached step per token (a sliding window past max_len)
    backends.py      eager | auto | inductor | fused | cudagraph: which code computes the steps, chosen with a reason
    paths.py         each fast path (fused, inductor, cudagraph, MoE dispatches, int8): what it accepts, why it refuses
    cuda_graph.py    the cudagraph backend: the one-token step over static buffers, recorded once as a CUDA graph
    fallback.py      BackendFallback: the warning of a backend that cannot decode a model, saying why
    streaming.py     generate(streamer=): each token handed on as it is chosen; TextStreamer writes the text
    plan.py          the decode plan: backend, cache dtype and cache (static or paged), chosen once with reasons
    paged.py         a model over a paged KV cache: block pools sized by a memory budget, rows over block tables
    blocks.py        the paged cache's block manager: reference counts, prefix caching by chained block hashes
    beam_search.py   greedy and beam search for qkv.Transformer (the paper's beam 4, length penalty 0.6)
    methods.py       the models' generate methods as functions of the model (GPT.generate, Transformer.generate)
    config.py        GenerationConfig: a checkpoint's decoding settings (generation_config.json), generate's defaults
"""
from .backends import BACKENDS, BackendFallback, choose
from .beam_search import Special, beam_search
from .config import GenerationConfig, config_defaults
from .decode import generate, generate_text
from .sampling import next_token, top_k_filter, top_p_filter
from .streaming import TextStreamer

__all__ = ["generate", "generate_text", "next_token", "top_k_filter", "top_p_filter", "BACKENDS", "BackendFallback",
           "choose", "Special", "beam_search", "TextStreamer", "GenerationConfig", "config_defaults"]
