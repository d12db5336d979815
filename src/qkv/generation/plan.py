"""The decode plan: what computes a model's steps, in which dtype its cache holds keys and values, and which cache,
chosen once, each with its reason, for ``generate`` (and ``qkv sample``/``chat``), beam search and ``qkv serve``.

    plan_decode   generate: the backend ``backends.backend_for`` chooses for the batch; a static cache (B rows × M
                  slots, contiguous: what the fused, inductor and CUDA-graph steps read), or none
    plan_beams    the encoder-decoder's greedy and beam search: auto or eager over a static cache
    plan_serving  the server: auto or eager over a paged cache sized by a memory budget (``qkv.generation.paged``),
                  where the registry's "paged" entry (``qkv.generation.paths``) accepts the model, its linears'
                  weights packed where "packed" accepts them

``str(plan)`` says it all in one line (``qkv serve`` prints it at startup).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from . import backends, paths
from .fallback import BackendFallback
from .paged import BLOCK_SIZE, plan_blocks


@dataclass(frozen=True)
class Plan:
    """backend (one of ``backends.BACKENDS``), ``why`` it and not the one asked (None: the one asked), the cache's
    ``dtype``, ``cache`` "static", "paged" or "none", ``cache_note`` its size and why, ``num_blocks`` (paged), and
    ``weights``: how the server's linears read their weights, and why (empty: as the backend says), and
    ``packed_rows``: the rows their blocked layout is packed for (0: not packed)."""

    backend: str
    why: str | None
    dtype: torch.dtype
    cache: str
    cache_note: str
    num_blocks: int = 0
    weights: str = ""
    packed_rows: int = 0

    @property
    def backend_line(self) -> str:
        """Which backend decoded, and why when not the one asked (what ``qkv sample`` prints last)."""
        return (f"{self.why + '; ' if self.why else ''}decoded with the {self.backend} backend "
                f"({backends.BACKEND_NOTES[self.backend]})")

    def __str__(self) -> str:
        why = f" ({self.why})" if self.why else ""
        weights = f"; {self.weights}" if self.weights else ""
        return (f"the {self.backend} backend ({backends.BACKEND_NOTES[self.backend]}){why}{weights}; a {self.cache} "
                f"cache in {str(self.dtype).removeprefix('torch.')}: {self.cache_note}")

    def speed_layer(self, model):
        """The context the steps run in (``backends.speed_layer``)."""
        return backends.speed_layer(model, self.backend)


def cache_dtype(model) -> torch.dtype:
    """Keys and values are kept in the weights' dtype."""
    return model.lm_head.weight.dtype


def plan_decode(model, batch: int, backend: str = "auto", compile: bool | str = False, *,
                use_cache: bool = True, capacity: int | None = None, warn: bool = True) -> Plan:
    """``generate``'s plan for ``batch`` rows: the backend that will run (a fallback warns ``BackendFallback`` unless
    ``warn`` is False: the caller says it), and a static cache of ``capacity`` slots per row (default the
    model's max_len) when ``use_cache``."""
    asked, strict = backends.resolve(backend, compile)
    if asked in ("inductor", "fused") and not use_cache:  # either, or its fallback, compiles the cached step
        raise ValueError(f"backend {asked!r} compiles the cached decode step: it needs use_cache=True")
    if asked == "auto" and not use_cache:
        chosen, why = "auto", None  # the CUDA-graph and fused steps replay a cached step
    else:
        chosen, why = backends.backend_for(model, batch, asked, strict=strict)
    if chosen == "cudagraph" and not use_cache:
        raise ValueError(f"backend {chosen!r} replays the cached decode step: it needs use_cache=True")
    if why is not None and warn:
        warnings.warn(f"{why}; decoding with the {chosen} backend", BackendFallback, stacklevel=3)
    M = capacity or model.config.max_len
    note = (f"{batch} rows × {M} slots, contiguous (the compiled and fused steps read one buffer per layer)"
            if use_cache else "every step recomputes the whole window")
    return Plan(chosen, why, cache_dtype(model), "static" if use_cache else "none", note)


def plan_beams(model, rows: int, capacity: int, backend: str = "auto", *, use_cache: bool = True) -> Plan:
    """Beam search's plan: ``backend`` auto or eager (the steps reorder their rows: no compiled step), a static
    cache of ``rows`` (sources × beams) × ``capacity`` slots."""
    if backend not in ("auto", "eager"):
        raise ValueError(f"backend must be 'auto' or 'eager' for the encoder-decoder, got {backend!r}")
    note = f"{rows} rows × {capacity} slots, rows reordered as beams are kept" if use_cache else "no cache"
    return Plan(backend, None, cache_dtype(model), "static" if use_cache else "none", note)


def plan_serving(model, *, backend: str = "auto", max_batch: int, max_model_len: int,
                 memory: int | None = None, block_size: int = BLOCK_SIZE) -> Plan:
    """The server's plan: ``backend`` auto or eager (rows of different lengths in one forward: no fused, compiled
    or CUDA-graph step reads a paged cache), a paged cache of as many blocks as ``memory`` holds
    (``paged.plan_blocks``), where the registry's "paged" entry accepts the model (else ValueError, its reason);
    auto's linears on weights in oneDNN's blocked layout where "packed" accepts them (``weights`` says which)."""
    if backend not in ("auto", "eager"):
        raise ValueError(f"the server's backend must be auto or eager, got {backend!r}")
    reason = paths.refuses("paged", model)
    if reason is not None:
        raise ValueError(f"{reason}: not served")
    num_blocks, note = plan_blocks(model, max_batch=max_batch, max_model_len=max_model_len, memory=memory,
                                   block_size=block_size)
    return Plan(backend, None, cache_dtype(model), "paged", note, num_blocks, *packing(model, backend, max_batch))


def packing(model, backend: str, rows: int) -> tuple[str, int]:
    """How the server's linears read their weights under ``backend``, and the rows they are packed for (0: not
    packed): the registry's "packed" entry, asked once."""
    if backend == "eager":
        return "weights as they are (eager)", 0
    reason = paths.refuses("packed", model)
    if reason is not None:
        return f"weights as they are: {reason}", 0
    return f"large linears' weights also in oneDNN's blocked layout for {rows} rows", rows
