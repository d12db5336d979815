"""The decode loop: prefill once, then one cached step per token, as its plan (``qkv.generation.plan``) says.

Shapes: B batch, T prompt length, V vocabulary, M static-cache capacity.
``input_pos`` are static-cache slots (places in the buffers), not token positions.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from ..checks import check_positive_int
from ..kernels import fused_step
from . import backends
from .plan import Plan, plan_decode
from .sampling import next_token
from .streaming import Streamer

STREAM_BURST = 8  # with a streamer, the fused step's greedy calls take at most this many tokens: text keeps coming
EOS_CHECK_EVERY = 8  # on an accelerator, steps between the host's looks at whether every row has finished


def check_args(ids, max_new_tokens, temperature, top_k, top_p, mask) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.size(1) == 0:
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a non-empty integer tensor (B, T), got {got}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    check_positive_int("top_k", top_k, optional=True)
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if mask is not None and (mask.dtype != torch.bool or mask.shape != ids.shape):
        raise ValueError(f"mask must be bool with the shape of ids {tuple(ids.shape)}, got {mask.dtype} {tuple(mask.shape)}")


class StaticCache:
    """Per-layer KV caches of fixed capacity M and ``slots`` (B, M), True where a real token sits.

    gpt-fast's static cache: every call writes at explicit slots (``input_pos``) and attends over
    all M slots under the ``slots`` mask, so a compiled step sees the same shapes every token.
    """

    def __init__(self, model, batch: int, capacity: int, *, device, backend: str = "eager") -> None:
        self.model = model
        self.layers = model.new_kv_caches(batch, capacity, device=device)
        self.slots = torch.zeros(batch, capacity, dtype=torch.bool, device=device)  # (B, M)
        self.slot_ids = torch.arange(capacity, device=device)  # a step's input_pos is a view of this: no allocation
        # Each step's input_pos (1,) and column of slots (B,), views made once: on a CPU, after a token's
        # weights have streamed through its caches, each small op of a step costs several times its usual time.
        self.step_pos, self.slot_columns = self.slot_ids.split(1), self.slots.unbind(1)
        self.forward = backends.last_logits(model)  # the prefill, and every step unless compiled
        self.step_fn = backends.step_of(model, backend)  # ``backend``: the plan's, chosen already
        self.compiled = backend == "inductor"  # its guards are checked once per call
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
            with backends.unguarded(self.warm):
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
        return isinstance(self.step_fn, fused_step.FusedStep)

    def greedy(self, tok: Tensor, slot: int, n: int, eos_id: int | None, finished: Tensor) -> Tensor:
        """Up to n greedy steps, the first feeding tok (B,) into ``slot``, the tokens ``step`` and argmax
        would give one at a time (eos as ``generate``'s, ``finished`` (B,) updated) -> (B, k), k ≤ n.
        One call from Python for all of them: on a CPU, after a token's weights have streamed through its
        caches, each op of Python's loop (the argmax, the token's write) costs several times its usual time."""
        return self.step_fn.greedy(tok.view(-1, 1), self.slots, self.layers, slot, n, eos_id, finished)



def window_logits(model, ids: Tensor, valid: Tensor, cache: StaticCache | None) -> Tensor:
    """Last logits (B, V) after the window ids (B, T): a full forward, or a cache prefill."""
    if cache is None:
        return model(ids, mask=valid, logits_to_keep=1).logits[:, -1]
    return cache.prefill(ids, valid)


@torch.no_grad()
def generate(
    model, ids: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
    top_p: float | None = None, eos_id: int | None = None, use_cache: bool = True, seed: int | None = None,
    mask: Tensor | None = None, backend: str = "auto", compile: bool | str = False, streamer: Streamer | None = None,
    pad_id: int | None = None, suppress: Sequence[int] = (), plan: Plan | None = None,
) -> Tensor:
    """Sample max_new_tokens after each prompt: prefill once, then one cached step per token.

    Args:
        ids: (B, T) prompts; a batch of different lengths is left-padded, with ``mask``
            (B, T) bool True on real tokens. Each row then gets the tokens it would alone.
        eos_id: a row that emits it (or any of them, given several: Llama 3's end-of-turn ids) is finished and
            padded from then on, with ``pad_id`` where given, else with the (first) eos id.
        suppress: token ids never generated (Hugging Face's single-token bad_words_ids, suppress_tokens).
        use_cache: decode with a preallocated static KV cache (same tokens as without it).
        seed: seeds a private generator, so sampling is reproducible.
        backend: what computes the steps (``qkv.generation.backends``): "auto" (the model's forward, its linears
            served by qkv's CPU kernels), "eager" (the forward as written), "inductor" (``torch.compile``'s
            step), "fused" (qkv's C++ step; other models fall back to auto with a warning saying why) or
            "cudagraph" (the step replayed as a CUDA graph: what "auto" runs for a model on a CUDA GPU).
        compile: DESIGN.md's spelling of ``backend``: True is "fused", "inductor" is "inductor", "fused" insists.
        streamer: Hugging Face's protocol (``qkv.generation.streaming``): ``put(ids)`` with the prompt (B, T),
            then each step's new tokens (B, k) as they are chosen, and ``end()`` when done (not after an
            exception: Ctrl-C leaves it as it was); ``TextStreamer`` writes the text as it grows. The tokens
            are the same with and without one.
        plan: what decodes (``qkv.generation.plan.plan_decode``), made by the caller once; default: made here
            from ``backend``, ``compile`` and ``use_cache``.
    Returns:
        (B, T + n) ids, n ≤ max_new_tokens (fewer when every row finished).

    The model never sees more than ``config.max_len`` tokens (as in training): when the
    sequence would outgrow it, decoding continues from the last max_len // 2 tokens
    (a sliding window, re-prefilled), with or without the cache alike.
    """
    check_args(ids, max_new_tokens, temperature, top_k, top_p, mask)
    stop = Stop(eos_id, pad_id, suppress, ids.device)
    plan = plan or plan_decode(model, ids.size(0), backend, compile, use_cache=use_cache,
                               capacity=min(model.config.max_len, ids.size(1) + max_new_tokens))
    if plan.cache == "paged" or (plan.cache == "static") != use_cache:
        raise ValueError(f"generate decodes over a static cache (use_cache=True) or none, as its plan says; "
                         f"got a {plan.cache} cache's plan with use_cache={use_cache}")
    was_training = model.training
    model.eval()
    try:
        with plan.speed_layer(model):
            return sample(model, ids, max_new_tokens, plan.backend, temperature=temperature, top_k=top_k, top_p=top_p,
                          stop=stop, use_cache=use_cache, seed=seed, mask=mask, streamer=streamer)
    finally:
        model.train(was_training)


def sample(model, ids: Tensor, max_new_tokens: int, backend: str, *, temperature: float, top_k, top_p, stop: Stop,
           use_cache: bool, seed: int | None, mask: Tensor | None, streamer=None) -> Tensor:
    """``generate`` once its arguments are checked and its backend chosen: (B, T) -> (B, T + n)."""
    generator = None if seed is None else torch.Generator(device=ids.device).manual_seed(seed)
    limit, (B, T) = model.config.max_len, ids.shape
    out = ids.new_empty(B, T + max_new_tokens)  # every token, preallocated: nothing grows per step
    valid = torch.ones_like(out, dtype=torch.bool)
    out[:, :T] = ids
    if mask is not None:
        valid[:, :T] = mask
    start, end = max(0, T - limit), T  # the model sees out[:, start:end]
    cache = None if not use_cache else StaticCache(
        model, B, backends.cache_capacity(end - start + max_new_tokens, limit, backend), device=ids.device,
        backend=backend)
    choose_token = functools.partial(next_token, temperature=temperature, top_k=top_k, top_p=top_p,
                                     generator=generator)
    if stop.suppress is not None:
        choose_token = functools.partial(suppressed, choose_token, stop.suppress)
    if streamer is not None:
        streamer.put(ids)
    end = decode_loop(model, out, valid, (start, end), max_new_tokens, cache, choose_token, stop,
                      greedy=temperature == 0, streamer=streamer)
    if streamer is not None:
        streamer.end()
    return out[:, :end]


def decode_loop(model, out: Tensor, valid: Tensor, window: tuple[int, int], max_new_tokens: int, cache,
                choose_token, stop: Stop, greedy: bool, streamer=None) -> int:
    """``generate``'s loop: up to max_new_tokens tokens into out (B, T + n) after the window
    out[:, start:end] (what the model sees; valid marks its real tokens) -> the new end. Each new token
    goes to ``streamer.put`` as soon as it is in ``out``."""
    limit, (start, end) = model.config.max_len, window
    emit = streamer.put if streamer is not None else lambda ids: None
    burst = STREAM_BURST if streamer is not None else max_new_tokens  # greedy tokens of one fused call
    finished = torch.zeros(out.size(0), dtype=torch.bool, device=out.device)
    watch = FinishWatch(stop, max_new_tokens, out.device, eos_check_interval(out.device, streamer is not None))
    greedy_steps = greedy and cache is not None and cache.greedy_steps and stop.plain
    logits = window_logits(model, out[:, start:end], valid[:, start:end], cache)
    new = 0  # tokens emitted
    while new < max_new_tokens:
        tok = choose_token(logits)  # (B,)
        if stop.eos is not None:
            tok = torch.where(finished, torch.full_like(tok, stop.pad), tok)
            finished |= torch.isin(tok, stop.eos)
        out[:, end] = tok
        emit(out[:, end:end + 1])  # (B, 1)
        end, new = end + 1, new + 1
        if new == max_new_tokens or watch.done(new, finished):
            break
        if greedy_steps and end - start <= limit:  # as many steps as the window has room for, in one call
            toks = cache.greedy(tok, end - 1 - start, min(max_new_tokens - new, limit + start - end + 1, burst),
                                stop.pad, finished)  # (B, k)
            out[:, end:end + toks.size(1)] = toks
            emit(toks)
            end, new, tok = end + toks.size(1), new + toks.size(1), toks[:, -1]
            if new == max_new_tokens or watch.done(new, finished):
                break
        if end - start > limit:  # window full: slide and re-prefill
            start = end - limit // 2
            logits = window_logits(model, out[:, start:end], valid[:, start:end], cache)
        elif cache is not None:
            logits = cache.step(tok, end - 1 - start)  # the new token's slot
        else:
            logits = window_logits(model, out[:, start:end], valid[:, start:end], None)
    return end - watch.overshoot(new)


def eos_check_interval(device: torch.device, streaming: bool) -> int:
    """Steps between looks at whether every row has finished. Each look waits for the device (a host sync): on a
    CPU there is nothing to wait for, and a streamer reads every token anyway, so every step; else every
    ``EOS_CHECK_EVERY`` steps, the steps past the end cut off (``FinishWatch.overshoot``)."""
    return 1 if device.type == "cpu" or streaming else EOS_CHECK_EVERY


class FinishWatch:
    """Whether every row has finished, recorded on the device each step and looked at every ``every`` steps."""

    def __init__(self, stop: Stop, max_new_tokens: int, device, every: int) -> None:
        self.every = every
        self.all_done = None if stop.eos is None else torch.zeros(max_new_tokens, dtype=torch.bool, device=device)

    def done(self, new: int, finished: Tensor) -> bool:
        """After step ``new`` (1, 2, …), finished (B,): whether to stop now (only on the steps it looks)."""
        if self.all_done is None:
            return False
        self.all_done[new - 1] = finished.all()  # (n,): step i ended with every row finished; no sync
        return new % self.every == 0 and bool(self.all_done[new - 1])

    def overshoot(self, new: int) -> int:
        """The steps of the ``new`` taken after the first at which every row had finished: what a look every
        step would not have taken (finished rows only padded them)."""
        if self.all_done is None or self.every == 1:
            return 0
        first = self.all_done[:new].nonzero()
        return new - int(first[0, 0]) - 1 if len(first) else 0


class Stop:
    """Where rows stop: ``eos`` (E,) the end ids (None: never), ``pad`` what a finished row emits from then
    on, ``suppress`` (K,) ids never generated (None: none). ``plain``: one eos that is also the padding and
    nothing suppressed, what the fused step's several greedy tokens per call handle."""

    def __init__(self, eos_id, pad_id: int | None, suppress, device) -> None:
        eos = [] if eos_id is None else [eos_id] if isinstance(eos_id, int) else list(eos_id)
        check_ids("eos_id", eos, none_ok=eos_id is None)
        check_ids("pad_id", [] if pad_id is None else [pad_id], none_ok=True)
        check_ids("suppress", list(suppress), none_ok=True)
        self.eos = torch.tensor(eos, device=device) if eos else None  # (E,)
        self.pad = (eos[0] if pad_id is None else pad_id) if eos else None  # None when rows never stop
        self.suppress = torch.tensor(list(suppress), device=device) if len(suppress) else None  # (K,)
        self.plain = self.suppress is None and (not eos or (len(eos) == 1 and self.pad == eos[0]))


def check_ids(name: str, ids: list, *, none_ok: bool) -> None:
    """ValueError unless ``ids`` are ints >= 0 (and at least one, unless ``none_ok``)."""
    if (not ids and not none_ok) or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
        raise ValueError(f"{name} must be a token id or a non-empty list of them (ints >= 0), got {ids!r:.80}")


def suppressed(choose_token, ids: Tensor, logits: Tensor) -> Tensor:
    """``choose_token`` over logits (B, V) with the ids (K,) set to −inf: they are never chosen."""
    return choose_token(logits.index_fill(1, ids, float("-inf")))


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
