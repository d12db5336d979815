"""Which code computes ``generate``'s steps: the backends, how one is chosen, and the one-token step of each.

    eager     the model's own forward, as written: the reference
    auto      on a CPU, the fused step for every model it accepts at batch ≤ its MAX_ROWS (``auto_fuses``);
              else the model's forward with the speed layer on top (``qkv.kernels.accelerate``: on a CPU the
              linear products go through oneDNN or qkv's matrix-vector kernel); eager's tokens (in fp32)
    inductor  the one-token step compiled by ``torch.compile`` (static shapes: once per model and cache size,
              which ``generate`` rounds up to a power of two)
    fused     qkv's C++ step (``qkv.kernels.fused_step``): one call a token, float32, bfloat16 or int8 weights,
              for the models it accepts; any other model falls back to auto (never to a compile), saying why
    cudagraph the one-token step recorded once as a CUDA graph and replayed (``qkv.generation.cuda_graph``);
              what "auto" runs for a model on a CUDA GPU; a CPU model falls back to auto, saying why
    (inductor falls back to auto for a model its path refuses: none today)
    What each step accepts, and why it refuses a model, is ``qkv.generation.paths``; ``backend_for`` asks it once.
    (int8 weights, ``qkv.kernels.quant``: the fused step reads their Q and scales, the forward and inductor
    compute torchao's own product for those linears)

``compile=`` (DESIGN.md's API) names a backend too: True is "fused", "inductor" is "inductor", and "fused" is "fused" that
raises instead of falling back.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch import Tensor

from ..kernels import accelerated, build, fused_step
from . import cuda_graph, paths
from .fallback import BackendFallback

BACKENDS = ("auto", "eager", "inductor", "fused", "cudagraph")
BACKEND_NOTES = {  # one line each, for the command to say which ran
    "auto": "the model's forward; on a CPU its linears through qkv's kernels",
    "eager": "the modules as written",
    "inductor": "the one-token step compiled by torch.compile",
    "fused": "qkv's C++ decode step",
    "cudagraph": "the one-token step replayed as a CUDA graph",
}
COMPILE_MODES = (False, True, "fused", "inductor")
COMPILE_BACKEND = "inductor"  # torch.compile's backend; tests use "eager" (graph capture without code generation)


def resolve(backend: str, compile: bool | str) -> tuple[str, bool]:
    """(the backend asked for, whether it must run or raise) from ``backend=`` and its alias ``compile=``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    if compile is False:
        return backend, False
    if backend != "auto":
        raise ValueError(f"pass backend= or compile= (the same choice), not both (got {backend!r} and {compile!r})")
    return ("inductor", False) if compile == "inductor" else ("fused", compile == "fused")


def backend_for(model, batch: int, backend: str, *, strict: bool = False) -> tuple[str, str | None]:
    """(the backend that will decode ``model`` at ``batch`` rows, why the asked one does not, or None), each fast
    path's answer from ``qkv.generation.paths``: fused, inductor and cudagraph fall back to auto (``strict``:
    raise instead); auto is cudagraph where that can run, else fused where ``auto_fuses``, else auto."""
    if backend == "auto":
        return auto_backend(model, batch), None
    rows = {"batch": batch} if backend == "fused" else {}  # what the fused step is asked besides the model
    if backend == "eager" or (reason := paths.refuses(backend, model, **rows)) is None:  # a backend is its path
        return backend, None
    at = f" at batch {batch}" if backend == "fused" else ""
    if strict:
        asked = "compile='fused'" if backend == "fused" else f"backend {backend!r}"
        raise ValueError(f"{asked} cannot decode this model{at}: {reason}")
    fallback = auto_backend(model, batch) if backend == "fused" else "auto"  # not inductor: its compile takes long
    return fallback, f"the {STEP_NAMES[backend]} cannot decode this model{at}: {reason}"


STEP_NAMES = {"fused": "fused step", "inductor": "compiled step", "cudagraph": "CUDA-graph step"}


def auto_backend(model, batch: int) -> str:
    """What "auto" runs: the CUDA-graph step where it accepts the model, else the fused step where ``auto_fuses``,
    else the model's forward under the speed layer ("auto")."""
    if paths.refuses("cudagraph", model) is None:
        return "cudagraph"
    return "fused" if auto_fuses(model, batch) else "auto"


def auto_fuses(model, batch: int) -> bool:
    """Whether "auto" runs the fused step: on a CPU, for every model the step accepts at ``batch`` rows. The
    forward calls a kernel per weight matrix, dozens a token, each starting and stopping the threads; the fused
    step streams every weight in one parallel region, one call a token (docs/speed.md has the measurements)."""
    return paths.model_device(model).type == "cpu" and paths.refuses("fused", model, batch=batch) is None


def choose(model, batch: int, backend: str = "auto", compile: bool | str = False, *, use_cache: bool = True) -> str:
    """The backend ``generate`` runs for these arguments; a fallback is one ``BackendFallback`` warning.
    Without the cache, "auto" stays "auto" (the CUDA-graph step replays a cached step)."""
    asked, strict = resolve(backend, compile)
    if asked == "auto" and not use_cache:
        return "auto"
    chosen, why = backend_for(model, batch, asked, strict=strict)
    if why is not None:
        warnings.warn(f"{why}; decoding with the {chosen} backend", BackendFallback, stacklevel=3)
    return chosen


def speed_layer(model, backend: str):
    """The context ``generate`` decodes in: the model as it is for "eager", else with its linears served by
    qkv's kernels on a CPU (``qkv.kernels.accelerated``); on other devices the model as it is."""
    on_cpu = next(model.parameters()).is_cpu
    return accelerated(model) if backend != "eager" and on_cpu else contextlib.nullcontext(model)


def step_function(model, batch: int, backend: bool | str):
    """The one-token step for ``backend`` (a name in ``BACKENDS``, strict, or a ``compile=`` value), (ids (B, 1),
    slots (B, M), kv_caches, input_pos (1,)) -> logits (B, V): the model's forward, qkv's fused step, or inductor's
    compiled step."""
    asked, strict = (backend, True) if backend in BACKENDS else resolve("auto", backend)
    return step_of(model, backend_for(model, batch, asked, strict=strict)[0])


def step_of(model, chosen: str):
    """The one-token step of the backend ``chosen`` (already picked: nothing is checked again)."""
    if chosen == "fused":
        return fused_step.FusedStep(model)
    if chosen == "cudagraph":
        return cuda_graph.GraphStep(last_logits(model), model)
    return compiled_step(model) if chosen == "inductor" else last_logits(model)


def last_logits(model):
    """The decode step as a function: (ids (B, L), mask (B, M), kv_caches, input_pos (L,)) -> the
    logits at the last position (B, V)."""
    def step(ids: Tensor, mask: Tensor, kv_caches, input_pos: Tensor) -> Tensor:
        return model(ids, mask=mask, kv_caches=kv_caches, input_pos=input_pos, logits_to_keep=1).logits[:, -1]
    return step


class CompiledStep:
    """Holds a model's compiled decode step, and leaves it out of the model's copies and pickles: a
    ``deepcopy`` compiles its own (the step calls the model it was made for), and ``torch.save(model)``
    does not try to pickle compiled code."""

    def __init__(self, step=None) -> None:
        self.step = step

    def __deepcopy__(self, memo) -> "CompiledStep":
        return CompiledStep()

    def __reduce__(self):
        return CompiledStep, ()


SMALLEST_COMPILED_CACHE = 256  # the compiled step's least cache size


def cache_capacity(needed: int, limit: int, backend: str) -> int:
    """The static cache's slots M for ``needed`` tokens (prompt and new) under the model's ``limit``: as many as
    needed, but for inductor, whose code fits one M, the next power of two from ``SMALLEST_COMPILED_CACHE`` (at
    most ``limit``): a new prompt length reuses the compiled step. The slots past the tokens are masked out."""
    if backend != "inductor":
        return min(limit, needed)
    return min(limit, max(SMALLEST_COMPILED_CACHE, 1 << (max(needed, 1) - 1).bit_length()))


def compiled_step(model):
    """``last_logits(model)`` compiled once per model for one-token static-cache steps.

    The function, not the module, is compiled: it returns one tensor, so each call hands back the
    logits without dynamo rebuilding the model's output object and going through the module call.
    """
    holder = model.__dict__.setdefault("_qkv_compiled_step", CompiledStep())  # not a submodule: not in state_dict
    if holder.step is None:
        on_cpu = next(model.parameters()).is_cpu
        if on_cpu:  # qkv's CPU kernels: built (or found missing) before tracing, which reads build.LOADED as a constant
            build.available()
        # cpp_wrapper: inductor calls the step's CPU kernels from generated C++, not from Python
        options = {"cpp_wrapper": True} if COMPILE_BACKEND == "inductor" and on_cpu else None
        holder.step = torch.compile(last_logits(model), dynamic=False, backend=COMPILE_BACKEND, options=options)
    return holder.step


def unguarded(skip: bool):
    """A context in which a compiled step runs without evaluating its guards (``skip``) or as usual.

    Guards check that the compiled code still fits its inputs. Within one ``generate`` call, once the
    first step's guards have passed, every later step sees the same model, buffers, shapes and grad mode,
    so they can be skipped.
    """
    if skip and hasattr(torch.compiler, "set_stance"):  # torch >= 2.6
        return torch.compiler.set_stance(skip_guard_eval_unsafe=True)
    return contextlib.nullcontext()
