"""Decoding the encoder-decoder: greedy search and beam search, with KV caches.

The source is encoded once and its cross-attention keys and values are projected once
(``Transformer.cross_kv``); the decoder's self-attention is cached step by step (``KVCache``).

Beam search keeps K hypotheses per source. Each step scores every one-token continuation of
every beam, log p(y_1..t) = log p(y_1..t-1) + log p(y_t | y_<t, x), keeps the 2K best, moves those
that end in EOS (ranked among the first K) to the finished list scored by

    score = log p(y) / |y|^α          (length penalty α; Hugging Face's form, |y| counts EOS)

and continues with the K best unfinished ones. It stops when no running beam can beat the
worst finished one (``early_stopping=False``: judged at the current length, as Hugging Face
does), or when K hypotheses have finished (``early_stopping=True``), or at ``max_new_tokens``.
Only each beam's 2K most likely tokens can be among the 2K best continuations, so only those
K·2K are scored; the softmax's normaliser is one reduction per beam (``next_token_scores``).
The paper uses K = 4, α = 0.6 (§6.1); its penalty is GNMT's ((5 + |y|) / 6)^α — we follow
Hugging Face's |y|^α so that Marian checkpoints decode token for token as they do there.

Shapes: B sources, K beams, S source length, T target length so far, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import check_positive_int
from ..nn.kv_cache import reorder_kv
from .plan import plan_beams
from .config import GenerationConfig

NEG = -1.0e9  # "impossible", finite so that sums and comparisons stay defined


@dataclass
class Special:
    """The target side's special tokens: the decoder starts from ``start``, stops at ``eos`` and pads
    finished rows with ``pad``; ``suppress`` are never generated (e.g. Marian's pad). ``renormalize``:
    log-probabilities are renormalised over the tokens still allowed (Hugging Face's
    ``renormalize_logits``, which Marian's generation configs set: beams then compare as if the
    suppressed tokens had never been in the vocabulary)."""

    start: int
    eos: int
    pad: int
    suppress: tuple[int, ...] = ()
    force_eos_at_end: bool = False  # the last allowed step must emit EOS (Hugging Face's forced_eos_token_id)
    renormalize: bool = False
    force_bos: int | None = None  # the first generated token (Hugging Face's forced_bos_token_id: mBART, NLLB)


class Decoder:
    """One encoded batch, decoded step by step (cached or not), with rows that can be reordered."""

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, *, copies: int, capacity: int,
                 use_cache: bool) -> None:
        memory = model.encode(src_ids, src_mask=src_mask)  # (B, S, C), once per source
        self.model, self.use_cache = model, use_cache
        rows = torch.arange(src_ids.size(0), device=src_ids.device).repeat_interleave(copies)  # (B·K,)
        self.cross = reorder_kv(model.cross_kv(memory, src_ids), rows)  # (B·K, G, S, D) per layer, projected once
        self.src_mask = None if src_mask is None else src_mask.repeat_interleave(copies, 0)  # (B·K, S)
        self.caches = model.new_kv_caches(src_ids.size(0) * copies, capacity) if use_cache else None

    def logits(self, seqs: Tensor) -> Tensor:
        """seqs (N, T) -> the next token's logits (N, V), float32."""
        if self.use_cache:
            new = seqs[:, self.caches[0].pos:]  # (N, T - cached): the prompt once, then one token per step
            logits = self.model.decode(new, None, src_mask=self.src_mask, kv_caches=self.caches,
                                       cross_kv=self.cross).logits[:, -1]
        else:
            logits = self.model.decode(seqs, None, src_mask=self.src_mask, cross_kv=self.cross).logits[:, -1]
        return logits.float()  # (N, V)

    def reorder(self, rows: Tensor) -> None:
        """Row n of the self-attention caches becomes old row ``rows[n]`` (N,): beam search's survivors.

        The cross-attention keys and values stay: a beam's parent is always a copy of its own source.
        """
        if self.caches is not None:
            for cache in self.caches:
                cache.reorder(rows)


def forced(logits: Tensor, token: int) -> tuple[Tensor, Tensor]:
    """(allowed, log_z) where only ``token`` is allowed, with log p = 0."""
    allowed = torch.full_like(logits, float("-inf"))
    allowed[:, token] = 0.0
    return allowed, logits.new_zeros(logits.size(0), 1)


def next_token_scores(logits: Tensor, special: Special, *, last_step: bool,
                      first_step: bool = False) -> tuple[Tensor, Tensor]:
    """logits (N, V) -> (allowed (N, V), log_z (N, 1)) with log p(token) = allowed − log_z.

    Suppressed tokens are −inf in ``allowed``; at a forced last step only EOS is left, with log p = 0 (at
    the first step ``special.force_bos`` likewise, where set).
    log_z = log Σ exp(logits) over the vocabulary, or over the allowed tokens with ``special.renormalize``
    (what log_softmax, suppression and log_softmax again give). The searches subtract log_z only from
    the few candidates they keep instead of writing a (N, V) log_softmax.
    """
    if special.force_eos_at_end and last_step:
        return forced(logits, special.eos)
    if special.force_bos is not None and first_step:
        return forced(logits, special.force_bos)
    log_z = None if special.renormalize else logits.logsumexp(-1, keepdim=True)  # (N, 1)
    if special.suppress:
        logits[:, list(special.suppress)] = float("-inf")
    return logits, logits.logsumexp(-1, keepdim=True) if log_z is None else log_z


@torch.no_grad()
def greedy(model, src_ids: Tensor, *, src_mask: Tensor | None = None, max_new_tokens: int, special: Special,
           use_cache: bool = True) -> Tensor:
    """The most likely token at each step: (B, 1 + n) ids, starting with ``special.start``; a row that
    emitted EOS is padded with ``special.pad`` until every row has finished."""
    B = src_ids.size(0)
    dec = Decoder(model, src_ids, src_mask, copies=1, capacity=max_new_tokens + 1, use_cache=use_cache)
    seqs = torch.full((B, 1), special.start, dtype=torch.long, device=src_ids.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src_ids.device)
    for t in range(max_new_tokens):
        allowed, _ = next_token_scores(dec.logits(seqs), special, last_step=t == max_new_tokens - 1, first_step=t == 0)
        tok = torch.where(finished, special.pad, allowed.argmax(-1))  # (B,): log_z shifts a row, not its argmax
        seqs = torch.cat([seqs, tok[:, None]], 1)  # (B, T + 1)
        finished |= tok == special.eos
        if bool(finished.all()):
            break
    return seqs


@dataclass
class Beams:
    """Running and finished hypotheses of B sources, K each, over a fixed-length buffer of L slots."""

    running: Tensor  # (B, K, L) ids
    running_scores: Tensor  # (B, K) log p of each running beam
    finished: Tensor  # (B, K, L) ids
    finished_scores: Tensor  # (B, K) length-penalised scores, NEG where empty
    improvable: Tensor  # (B, 1) bool: a running beam may still beat the worst finished one


def _gather(t: Tensor, idx: Tensor) -> Tensor:
    """t (B, N, …), idx (B, M) -> t[b, idx[b]] (B, M, …)."""
    return t.gather(1, idx.view(*idx.shape, *([1] * (t.dim() - 2))).expand(*idx.shape, *t.shape[2:]))


def _top_candidates(allowed: Tensor, log_z: Tensor, running_scores: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best one-token continuations of K beams each of B sources, scored
    log p(y) + log p(token | y) = running + allowed − log_z: scores, parents and tokens, (B, n) each.

    allowed (B·K, V), log_z (B·K, 1), running_scores (B, K). The n best of a source's K·V continuations
    are among each beam's n best tokens (a beam adds one constant to all of its tokens), so only K·n
    candidates are scored.
    """
    B, K = running_scores.shape
    top, tokens = allowed.topk(min(n, allowed.size(-1)), dim=-1)  # (B·K, n'): each beam's best tokens
    total = (top - log_z + running_scores.reshape(-1, 1)).view(B, -1)  # (B, K·n')
    scores, flat = total.topk(n, dim=1)  # (B, n)
    return scores, flat // top.size(-1), tokens.view(B, -1).gather(1, flat)


def _select(beams: Beams, cand: Tensor, cand_scores: Tensor, hits_eos: Tensor, t: int, *, K: int,
            alpha: float, early_stopping: bool) -> Tensor:
    """Update ``beams`` from the 2K candidates (B, 2K, L) ending at slot t; returns the parents of the new
    running beams (B, K) as indices into the candidates."""
    # Running: the K best candidates that did not just finish.
    open_scores = cand_scores + hits_eos.float() * NEG  # (B, 2K)
    keep = open_scores.topk(K, dim=1).indices  # (B, K)
    beams.running, beams.running_scores = _gather(cand, keep), _gather(open_scores, keep)
    # Finished: candidates among the first K that just emitted EOS, if they may still count.
    rank_ok = torch.arange(cand.size(1), device=cand.device) < K  # (2K,)
    done_now = hits_eos & rank_ok  # (B, 2K)
    scores = cand_scores / (t ** alpha)  # t generated tokens, EOS included
    full = beams.finished_scores.gt(NEG / 2).all(1, keepdim=True) & early_stopping  # (B, 1)
    scores = scores + (full | ~beams.improvable).float() * NEG + (~done_now).float() * NEG
    merged = torch.cat([beams.finished, cand], 1), torch.cat([beams.finished_scores, scores], 1)
    best = merged[1].topk(K, dim=1).indices  # (B, K)
    beams.finished, beams.finished_scores = _gather(merged[0], best), _gather(merged[1], best)
    return keep


@torch.no_grad()
def beam_search(model, src_ids: Tensor, *, src_mask: Tensor | None = None, max_new_tokens: int, special: Special,
                num_beams: int = 4, length_penalty: float = 1.0, early_stopping: bool = False,
                use_cache: bool = True) -> Tensor:
    """The best of ``num_beams`` hypotheses per source: (B, 1 + n) ids starting with ``special.start``,
    padded with ``special.pad`` after EOS (n = the longest returned hypothesis)."""
    B, K, L = src_ids.size(0), num_beams, max_new_tokens + 1
    dev = src_ids.device
    dec = Decoder(model, src_ids, src_mask, copies=K, capacity=L, use_cache=use_cache)
    ids = torch.full((B, K, L), special.pad, dtype=torch.long, device=dev)
    ids[:, :, 0] = special.start
    start_scores = torch.full((B, K), NEG, device=dev)
    start_scores[:, 0] = 0.0  # identical beams at first: only one may expand
    beams = Beams(ids, start_scores, ids.clone(), torch.full((B, K), NEG, device=dev),
                  torch.ones(B, 1, dtype=torch.bool, device=dev))
    for t in range(1, L):
        allowed, log_z = next_token_scores(dec.logits(beams.running[:, :, :t].reshape(B * K, t)), special,
                                           last_step=t == L - 1, first_step=t == 1)
        cand_scores, parent, token = _top_candidates(allowed, log_z, beams.running_scores, 2 * K)  # (B, 2K) each
        cand = _gather(beams.running, parent)  # (B, 2K, L)
        cand[:, :, t] = token
        hits = (token == special.eos) | (t == L - 1)  # EOS, or the length limit reached
        keep = _select(beams, cand, cand_scores, hits, t, K=K, alpha=length_penalty, early_stopping=early_stopping)
        rows = (_gather(parent, keep) + torch.arange(B, device=dev)[:, None] * K).view(-1)  # (B·K,)
        dec.reorder(rows)
        best_running = beams.running_scores[:, :1] / (t ** length_penalty)  # (B, 1)
        worst_done = torch.where(beams.finished_scores.gt(NEG / 2), beams.finished_scores.min(1, keepdim=True)[0],
                                 torch.full_like(beams.finished_scores, NEG))  # (B, K)
        beams.improvable &= (best_running > worst_done).any(1, keepdim=True)
        all_done = beams.finished_scores.gt(NEG / 2).all() and early_stopping
        if not bool(beams.improvable.any()) or all_done or bool(hits.all()):
            break
    return _trim(beams.finished[:, 0], special)


def _trim(seqs: Tensor, special: Special) -> Tensor:
    """Drop the columns after the longest hypothesis's EOS (B, L) -> (B, 1 + n)."""
    ends = torch.where(seqs == special.eos, torch.arange(seqs.size(1), device=seqs.device), seqs.size(1) - 1)
    return seqs[:, : int(ends.min(1).values.max()) + 1]


def decode(model, src_ids: Tensor, *, src_mask: Tensor | None = None, max_new_tokens: int = 64, special: Special,
           num_beams: int = 1, length_penalty: float = 1.0, early_stopping: bool = False,
           use_cache: bool = True, backend: str = "auto") -> Tensor:
    """Greedy search when ``num_beams`` is 1, beam search otherwise; see the module docstring.

    ``backend``: "auto" serves the linears through qkv's CPU kernels (``qkv.kernels.accelerated``), "eager" runs
    the model as written; the same tokens either way."""
    check_positive_int("num_beams", num_beams)
    check_positive_int("max_new_tokens", max_new_tokens)
    if src_mask is not None and (src_mask.dtype != torch.bool or src_mask.shape != src_ids.shape):
        raise ValueError(f"src_mask must be bool with the shape of src_ids {tuple(src_ids.shape)}, "
                         f"got {src_mask.dtype} {tuple(src_mask.shape)}")
    plan = plan_beams(model, src_ids.size(0) * num_beams, max_new_tokens + 1, backend, use_cache=use_cache)
    was = model.training
    model.eval()
    try:
        with plan.speed_layer(model):
            return search(model, src_ids, src_mask=src_mask, max_new_tokens=max_new_tokens, special=special,
                          num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                          use_cache=use_cache)
    finally:
        model.train(was)


def search(model, src_ids: Tensor, *, src_mask: Tensor | None, max_new_tokens: int, special: Special, num_beams: int,
           length_penalty: float, early_stopping: bool, use_cache: bool) -> Tensor:
    """``decode`` once its arguments are checked: greedy or beam search."""
    if num_beams == 1:
        return greedy(model, src_ids, src_mask=src_mask, max_new_tokens=max_new_tokens, special=special,
                      use_cache=use_cache)
    return beam_search(model, src_ids, src_mask=src_mask, max_new_tokens=max_new_tokens, special=special,
                       num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                       use_cache=use_cache)


def special_of(config: GenerationConfig) -> Special:
    """A checkpoint's decoding tokens (``model.generation_config``) as a ``Special``: start =
    decoder_start_id, eos = the first of eos_ids, pad = pad_id; ValueError naming each missing one."""
    ids = dict(decoder_start_id=config.decoder_start_id, eos_ids=config.eos_id, pad_id=config.pad_id)
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise ValueError(f"the model's generation_config has no {', '.join(missing)}: pass "
                         "special=qkv.generation.Special(start=..., eos=..., pad=...)")
    force_eos = config.forced_eos_id is not None
    if force_eos and config.forced_eos_id != config.eos_id:
        raise ValueError(f"forced_eos_id={config.forced_eos_id} differs from eos_ids[0]={config.eos_id} "
                         "(qkv forces its EOS)")
    return Special(start=config.decoder_start_id, eos=config.eos_id, pad=config.pad_id, suppress=config.suppress,
                   force_eos_at_end=force_eos, renormalize=config.renormalize, force_bos=config.forced_bos_id)


def search_settings(config: GenerationConfig | None, *, special: Special | None, max_new_tokens: int | None,
                    num_beams: int | None, length_penalty: float | None, early_stopping: bool | None) -> dict:
    """``decode``'s keyword arguments: each one given, else the model's ``generation_config``'s (HF's
    max_length counts the decoder's start token), else greedy, length penalty 1.0, 64 new tokens."""
    if special is None and config is None:
        raise ValueError("generate needs special=qkv.generation.Special(start=..., eos=..., pad=...): "
                         "the target vocabulary's start, end and padding ids")
    config = config or GenerationConfig()
    if max_new_tokens is None:
        max_new_tokens = config.max_new_tokens or (config.max_length - 1 if config.max_length else 64)
    return dict(special=special or special_of(config), max_new_tokens=max_new_tokens,
                num_beams=config.num_beams if num_beams is None else num_beams,
                length_penalty=config.length_penalty if length_penalty is None else length_penalty,
                early_stopping=config.early_stopping if early_stopping is None else early_stopping)
