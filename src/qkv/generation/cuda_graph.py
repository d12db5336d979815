"""The "cudagraph" decode backend: the one-token step over static KV caches, recorded once as a CUDA graph and
replayed for every later token.

Shapes: B batch, M static-cache capacity, V vocabulary.

A batch-1 decode step on a GPU is a few hundred small kernels; launching them from Python costs more than
running them. A CUDA graph (``torch.cuda.CUDAGraph``) records the kernels of one step with the addresses of
their tensors and replays them in one launch. So everything a step reads must sit at the same address every
token: the caches and the ``slots`` mask (``decode.StaticCache`` allocates both once), and the step's token
ids (B, 1) and slot ``input_pos`` (1,), which ``StaticStep`` copies into buffers of its own before each call.
The logits come back in the graph's own output buffer (B, V), overwritten by the next step.

Why not ``torch.compile(mode="reduce-overhead")``: it records the same graph, but only after inductor has
compiled the step (tens of seconds for a 1 B model), and its CUDA-graph trees copy or refuse inputs that are
mutated in place, as the caches are. Recording the model's own kernels takes one eager step, and a replay runs
exactly the kernels eager runs, so the tokens are eager's.

The prefill (T tokens at once, a different shape each call) runs outside the graph, as the model's forward.
Everything here but ``GraphStep``'s capture runs on a CPU too: ``StaticStep`` is the same step without the
graph, which tests check against eager.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch import Tensor

from .fallback import BackendFallback

WARMUP_STEPS = 2  # eager steps on a side stream before recording: lazy inits and allocator pools settle first


def refuses_device(device: torch.device | str) -> str | None:
    """Why a CUDA graph cannot decode on ``device`` (a torch.device or its name), or None."""
    kind = torch.device(device).type
    if kind != "cuda":
        return f"the model is on the {kind.upper() if kind == 'cpu' else kind}; CUDA graphs need a CUDA device"
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    return None


def refuses_model(model) -> str | None:
    """Why a recorded step would not be ``model``'s step, or None: what reads a tensor's value on the host
    (which a recording cannot wait for) or changes Python state from token to token."""
    from ..nn.moe import MixtureOfExperts
    from ..nn.positional import RotaryEmbedding
    from ..nn.rope_scaling import LENGTH_DEPENDENT

    for module in model.modules():
        if isinstance(module, MixtureOfExperts):
            return "its mixture-of-experts layers count each expert's tokens on the host"
        scaling = getattr(module, "scaling", None) if isinstance(module, RotaryEmbedding) else None
        if scaling is not None and scaling.type in LENGTH_DEPENDENT:
            return f"its RoPE scaling ({scaling.type}) follows each input's length on the host"
    return None


class StaticStep:
    """A one-token step that reads its token ids and slot from buffers of its own, so that every call sees
    the same tensors: step(ids (B, 1), slots (B, M), kv_caches, input_pos (1,)) -> logits (B, V).

    ``step`` is ``backends.last_logits(model)``; the caches and ``slots`` must be the same objects every call
    (a new ``StaticCache`` makes a new ``StaticStep``)."""

    def __init__(self, step) -> None:
        self.step = step
        self.ids: Tensor | None = None  # (B, 1), made on the first call
        self.pos: Tensor | None = None  # (1,)
        self.bound = None  # (slots, kv_caches) of the first call

    def __call__(self, ids: Tensor, slots: Tensor, kv_caches, input_pos: Tensor) -> Tensor:
        if self.ids is None:
            self.ids, self.pos, self.bound = ids.clone(), input_pos.clone(), (slots, kv_caches)
        elif self.bound[0] is not slots or self.bound[1] is not kv_caches:
            raise ValueError("a static step decodes into the caches of its first call; got other caches")
        self.ids.copy_(ids)
        self.pos.copy_(input_pos)
        return self.run()

    def run(self) -> Tensor:
        """The step on the static buffers -> logits (B, V)."""
        slots, kv_caches = self.bound
        return self.step(self.ids, slots, kv_caches, self.pos)


class GraphStep(StaticStep):
    """``StaticStep`` whose first call records the step as a CUDA graph; every call replays it.

    Under autocast, ``model``'s linear weights and the caches are cast once, before recording
    (``autocast_linears``, ``autocast_caches``), rather than in every replay. If recording fails (an op that
    synchronises with the host, such as a data-dependent shape), the step stays eager — the same tokens — with
    one ``BackendFallback`` warning saying why."""

    def __init__(self, step, model=None) -> None:
        super().__init__(step)
        self.model = model
        self.graph = None
        self.out: Tensor | None = None  # (B, V), the graph's output buffer
        self.failed = False
        self.cast: list[tuple[Tensor, Tensor]] = []  # (weight, its copy in autocast's dtype) the graph reads

    def run(self) -> Tensor:
        if self.failed:
            return super().run()
        if self.graph is None:
            try:
                self.record()
            except RuntimeError as e:
                self.failed, self.graph = True, None
                warnings.warn(f"the CUDA graph could not record the step ({str(e).splitlines()[0][:120]}); "
                              "decoding with its eager steps", BackendFallback, stacklevel=2)
                return super().run()
        self.graph.replay()
        return self.out

    def record(self) -> None:
        """Warm up on a side stream, then record one step (its cache writes are redone by the first replay,
        at the same slot with the same values)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                super().run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        self.cast = autocast_linears(self.model, "cuda") if self.model is not None else []
        autocast_caches(self.bound[1], "cuda")
        with autocast_uncached(), swapped(self.cast), torch.cuda.graph(graph):
            self.out = super().run()
        self.graph = graph


def autocast_linears(model, device_type: str) -> list[tuple[Tensor, Tensor]]:
    """Under autocast on ``device_type``: the fp32 weights and biases of ``model``'s ``nn.Linear`` layers that no
    other module holds (a tied embedding looks its rows up uncast), each with its copy in autocast's dtype — the
    cast autocast makes in each of their products, made once. Outside autocast: none."""
    if not torch.is_autocast_enabled(device_type):
        return []
    dtype, linear, other = torch.get_autocast_dtype(device_type), {}, set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if isinstance(module, torch.nn.Linear):
                linear[id(p)] = p
            else:
                other.add(id(p))
    return [(p, p.detach().to(dtype)) for key, p in linear.items() if key not in other and p.dtype == torch.float32]


@contextlib.contextmanager
def swapped(pairs: list[tuple[Tensor, Tensor]]):
    """Inside, each parameter of ``pairs`` holds its cast copy (the products recorded read the copies)."""
    originals = [p.data for p, _ in pairs]
    for p, cast in pairs:
        p.data = cast
    try:
        yield
    finally:
        for (p, _), data in zip(pairs, originals):
            p.data = data


def autocast_caches(kv_caches, device_type: str) -> None:
    """Under autocast, each ``KVCache``'s and ``RingKVCache``'s fp32 keys and values kept in autocast's dtype, so
    that a step reads them as autocast would cast them (its writes cast on the way in, ``KVCache.write``) instead of
    casting every slot each step; other caches as they are."""
    from ..nn.kv_cache import KVCache, RingKVCache

    if not torch.is_autocast_enabled(device_type):
        return
    dtype = torch.get_autocast_dtype(device_type)
    for cache in kv_caches:
        if type(cache) in (KVCache, RingKVCache) and cache.k.dtype == torch.float32:
            cache.k, cache.v = cache.k.to(dtype), cache.v.to(dtype)


def autocast_uncached():
    """Autocast as it is, without its cast-weight cache (a recorded graph must not read tensors that autocast
    frees after the recording); a no-op outside autocast."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
