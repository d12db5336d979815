"""Sampling as small functions (logits → filtered logits → next token) and the decode loop.

Shapes: B batch, T prompt length, V vocabulary, M static-cache capacity.
``input_pos`` are static-cache slots (places in the buffers), not token positions.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import Tensor

from . import decoder_step, matvec


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (B, V); the rest become -inf."""
    k = min(k, logits.size(-1))
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set whose probability reaches p."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= p  # mass before this token already reaches p; the top token stays
    drop = drop.scatter(-1, order, drop)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def next_token(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits (B, V) -> token ids (B,). temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _check_args(ids, max_new_tokens, temperature, top_k, top_p, mask, compile) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.size(1) == 0:
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a non-empty integer tensor (B, T), got {got}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    if mask is not None and (mask.dtype != torch.bool or mask.shape != ids.shape):
        raise ValueError(f"mask must be bool with the shape of ids {tuple(ids.shape)}, got {mask.dtype} {tuple(mask.shape)}")


class _StaticCache:
    """Per-layer KV caches of fixed capacity M and ``slots`` (B, M), True where a real token sits.

    gpt-fast's static cache: every call writes at explicit slots (``input_pos``) and attends over
    all M slots under the ``slots`` mask, so a compiled step sees the same shapes every token.
    """

    def __init__(self, model, batch: int, capacity: int, *, device, compile: bool | str = False) -> None:
        self.model = model
        self.layers = model.new_kv_caches(batch, capacity, device=device)
        self.slots = torch.zeros(batch, capacity, dtype=torch.bool, device=device)  # (B, M)
        self.slot_ids = torch.arange(capacity, device=device)  # a step's input_pos is a view of this: no allocation
        # Each step's input_pos (1,) and column of slots (B,), views made once: on a CPU, after a token's
        # weights have streamed through its caches, each indexing op of a step costs 10-30 µs (measured).
        self.step_pos, self.slot_columns = self.slot_ids.split(1), self.slots.unbind(1)
        self.forward = last_logits(model)  # the prefill, and every step unless compiled
        self.step_fn = step_function(model, batch, compile)
        self.compiled = bool(compile) and not isinstance(self.step_fn, decoder_step.FusedStep)  # inductor's: guards
        self.warm = False  # this call's first compiled step has run, its guards checked

    def prefill(self, ids: Tensor, valid: Tensor) -> Tensor:
        """Refill from slot 0 with ids (B, T), valid (B, T) True on real tokens -> last logits (B, V)."""
        T = ids.size(1)
        self.slots.zero_()
        self.slots[:, :T] = valid
        input_pos = self.slot_ids[:T]  # slots 0 … T−1
        return self.forward(ids, self.slots, self.layers, input_pos)

    def step(self, tok: Tensor, slot: int) -> Tensor:
        """One new token per row, tok (B,), into ``slot`` -> its logits (B, V)."""
        self.slot_columns[slot].fill_(True)
        input_pos, tok = self.step_pos[slot], tok.view(-1, 1)  # (1,), (B, 1)
        try:
            with unguarded(self.warm):
                logits = self.step_fn(tok, self.slots, self.layers, input_pos)  # (B, V)
        except RuntimeError as e:  # dynamo found no compiled code for the step without its guards
            if not self.warm or "skip_guard_eval_unsafe" not in str(e):
                raise
            self.compiled = False  # e.g. over torch._dynamo's recompile limit: the step runs with its guards
            logits = self.step_fn(tok, self.slots, self.layers, input_pos)
        self.warm = self.compiled  # the steps after this one see the same model, buffers and shapes
        return logits

    @property
    def greedy_steps(self) -> bool:
        """Whether ``greedy`` can run: the fused step takes several greedy tokens in one call."""
        return isinstance(self.step_fn, decoder_step.FusedStep)

    def greedy(self, tok: Tensor, slot: int, n: int, eos_id: int | None, finished: Tensor) -> Tensor:
        """Up to n greedy steps, the first feeding tok (B,) into ``slot``, the tokens ``step`` and argmax
        would give one at a time (eos as ``generate``'s, ``finished`` (B,) updated) -> (B, k), k ≤ n.
        One call from Python for all of them: on a CPU, after a token's weights have streamed through its
        caches, each op of Python's loop (the argmax, the token's write) costs 10-30 µs (measured)."""
        return self.step_fn.greedy(tok.view(-1, 1), self.slots, self.layers, slot, n, eos_id, finished)


def unguarded(skip: bool):
    """A context in which a compiled step runs without evaluating its guards (``skip``) or as usual.

    Guards check that the compiled code still fits its inputs; a step costs 2 ms and its guards
    0.2 ms of it (measured). Within one ``generate`` call, once the first step's guards have passed,
    every later step sees the same model, buffers, shapes and grad mode, so they can be skipped.
    """
    if skip and hasattr(torch.compiler, "set_stance"):  # torch >= 2.6
        return torch.compiler.set_stance(skip_guard_eval_unsafe=True)
    return contextlib.nullcontext()


def _window_logits(model, ids: Tensor, valid: Tensor, cache: _StaticCache | None) -> Tensor:
    """Last logits (B, V) after the window ids (B, T): a full forward, or a cache prefill."""
    if cache is None:
        return model(ids, mask=valid, logits_to_keep=1).logits[:, -1]
    return cache.prefill(ids, valid)


@torch.no_grad()
def generate(
    model, ids: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
    top_p: float | None = None, eos_id: int | None = None, use_cache: bool = True, seed: int | None = None,
    mask: Tensor | None = None, compile: bool | str = False,
) -> Tensor:
    """Sample max_new_tokens after each prompt: prefill once, then one cached step per token.

    Args:
        ids: (B, T) prompts; a batch of different lengths is left-padded, with ``mask``
            (B, T) bool True on real tokens. Each row then gets the tokens it would alone.
        eos_id: a row that emits it is finished and padded with eos_id from then on.
        use_cache: decode with a preallocated static KV cache (same tokens as without it).
        seed: seeds a private generator, so sampling is reproducible.
        compile: compile the one-token decode step: True picks the fastest way for the model and batch
            (``step_function``); "fused" is qkv's C++ step (``qkv.decoder_step``), "inductor" is
            ``torch.compile``'s, whose shapes never change, so it compiles once, not per token.
    Returns:
        (B, T + n) ids, n ≤ max_new_tokens (fewer when every row finished).

    The model never sees more than ``config.max_len`` tokens (as in training): when the
    sequence would outgrow it, decoding continues from the last max_len // 2 tokens
    (a sliding window, re-prefilled), with or without the cache alike.
    """
    _check_args(ids, max_new_tokens, temperature, top_k, top_p, mask, compile)
    if compile and not use_cache:
        raise ValueError("compile=True compiles the cached decode step: it needs use_cache=True")
    was_training = model.training
    model.eval()
    generator = None if seed is None else torch.Generator(device=ids.device).manual_seed(seed)
    limit, (B, T) = model.config.max_len, ids.shape
    out = ids.new_empty(B, T + max_new_tokens)  # every token, preallocated: nothing grows per step
    valid = torch.ones_like(out, dtype=torch.bool)
    out[:, :T] = ids
    if mask is not None:
        valid[:, :T] = mask
    start, end = max(0, T - limit), T  # the model sees out[:, start:end]
    cache = None if not use_cache else _StaticCache(
        model, B, min(limit, end - start + max_new_tokens), device=ids.device, compile=compile)
    pick = functools.partial(next_token, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    end = _decode(model, out, valid, (start, end), max_new_tokens, cache, pick, eos_id, greedy=temperature == 0)
    model.train(was_training)
    return out[:, :end]


def _decode(model, out: Tensor, valid: Tensor, window: tuple[int, int], max_new_tokens: int, cache, pick,
            eos_id: int | None, greedy: bool) -> int:
    """``generate``'s loop: up to max_new_tokens tokens into out (B, T + n) after the window
    out[:, start:end] (what the model sees; valid marks its real tokens) -> the new end."""
    limit, (start, end) = model.config.max_len, window
    finished = torch.zeros(out.size(0), dtype=torch.bool, device=out.device)
    greedy_steps = greedy and cache is not None and cache.greedy_steps
    logits = _window_logits(model, out[:, start:end], valid[:, start:end], cache)
    new = 0  # tokens emitted
    while new < max_new_tokens:
        tok = pick(logits)  # (B,)
        if eos_id is not None:
            tok = torch.where(finished, torch.full_like(tok, eos_id), tok)
            finished |= tok == eos_id
        out[:, end] = tok
        end, new = end + 1, new + 1
        if _done(new, max_new_tokens, eos_id, finished):
            break
        if greedy_steps and end - start <= limit:  # as many steps as the window has room for, in one call
            toks = cache.greedy(tok, end - 1 - start, min(max_new_tokens - new, limit + start - end + 1), eos_id,
                                finished)  # (B, k)
            out[:, end:end + toks.size(1)] = toks
            end, new, tok = end + toks.size(1), new + toks.size(1), toks[:, -1]
            if _done(new, max_new_tokens, eos_id, finished):
                break
        if end - start > limit:  # window full: slide and re-prefill
            start = end - limit // 2
            logits = _window_logits(model, out[:, start:end], valid[:, start:end], cache)
        elif cache is not None:
            logits = cache.step(tok, end - 1 - start)  # the new token's slot
        else:
            logits = _window_logits(model, out[:, start:end], valid[:, start:end], None)
    return end


def _done(new: int, max_new_tokens: int, eos_id: int | None, finished: Tensor) -> bool:
    return new == max_new_tokens or (eos_id is not None and bool(finished.all()))


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int, **kwargs) -> str:
    """The prompt followed by ``max_new_tokens`` sampled tokens, as text (``kwargs`` as ``generate``).

    ``tokenizer`` needs ``encode(str) -> list[int]`` and ``decode(ids) -> str``; its ``eos_id``,
    if it has one, ends the sample.
    """
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character to continue from")
    ids = torch.tensor([tokenizer.encode(prompt)], device=model.lm_head.weight.device)  # (1, T)
    if ids.size(1) == 0:
        raise ValueError(f"the prompt {prompt!r} encodes to no tokens")
    kwargs.setdefault("eos_id", getattr(tokenizer, "eos_id", None))
    return tokenizer.decode(generate(model, ids, max_new_tokens, **kwargs)[0].tolist())


COMPILE_MODES = (False, True, "fused", "inductor")


def step_function(model, batch: int, compile: bool | str):
    """The one-token step ``generate`` runs, (ids (B, 1), slots (B, M), kv_caches, input_pos (1,)) -> logits (B, V).

    False: the model's own forward. True: qkv's fused C++ step (one parallel region streams every weight:
    1.40-1.80x inductor's step at batch 1, measured) where it can run the model and batch, else inductor's.
    "fused" insists (a ValueError says why it cannot), "inductor" is ``torch.compile`` always.
    """
    if not compile:
        return last_logits(model)
    reason = None if compile == "inductor" else decoder_step.unsupported(model, batch)
    if compile == "fused" and reason is not None:
        raise ValueError(f"compile='fused' cannot decode this model at batch {batch}: {reason}")
    return decoder_step.FusedStep(model) if compile != "inductor" and reason is None else _compiled_step(model)


COMPILE_BACKEND = "inductor"  # tests use "eager" (graph capture without code generation)


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


def _compiled_step(model):
    """``last_logits(model)`` compiled once per model for one-token static-cache steps.

    The function, not the module, is compiled: it returns one tensor, so each call hands back the
    logits without dynamo rebuilding the model's output object and going through the module call
    (measured: +4 % tokens/s at batch 1).
    """
    holder = model.__dict__.setdefault("_qkv_compiled_step", CompiledStep())  # not a submodule: not in state_dict
    if holder.step is None:
        matvec.available()  # built (or found missing) before tracing, which reads matvec.LOADED as a constant
        # cpp_wrapper: inductor calls the step's kernels from generated C++, not Python (measured: +20 % tok/s)
        options = {"cpp_wrapper": True} if COMPILE_BACKEND == "inductor" else None
        holder.step = torch.compile(last_logits(model), dynamic=False, backend=COMPILE_BACKEND, options=options)
    return holder.step
