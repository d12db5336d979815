"""``GenerationConfig``: how a checkpoint says it should be decoded — Hugging Face's generation_config.json
(``transformers.GenerationConfig``) in qkv's terms.

``qkv.interop.from_hf`` attaches one to the model it builds (``model.generation_config``); ``GPT.generate``
and ``Transformer.generate`` take their defaults from it, so that a loaded checkpoint decodes as Hugging
Face's ``generate`` does with no argument (Marian: beam search with its num_beams, length penalty, start,
EOS and suppressed pad; Llama 3: stop at any of its end-of-turn ids). Arguments given to ``generate`` still
win. A model built without a checkpoint has ``generation_config = None`` and decodes with generate's own defaults.

The field defaults are ``transformers.GenerationConfig``'s (greedy, one beam, length penalty 1.0, top-k 50
when sampling). Settings qkv cannot apply (repetition penalty, n-gram blocking, …) are kept as text in
``ignored`` and named in a warning at load time; they change nothing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# Settings qkv's decoding has no counterpart for, with the value that means "off" in transformers.
NEUTRAL = dict(min_length=0, min_new_tokens=None, no_repeat_ngram_size=0, repetition_penalty=1.0, num_beam_groups=1,
               diversity_penalty=0.0, encoder_no_repeat_ngram_size=0, typical_p=1.0, epsilon_cutoff=0.0,
               eta_cutoff=0.0, min_p=None, num_return_sequences=1, exponential_decay_length_penalty=None,
               sequence_bias=None, begin_suppress_tokens=None, forced_decoder_ids=None, penalty_alpha=None,
               max_time=None, stop_strings=None, constraints=None, force_words_ids=None)
IDS = dict(pad_id="pad_token_id", bos_id="bos_token_id", decoder_start_id="decoder_start_token_id",
           forced_bos_id="forced_bos_token_id", forced_eos_id="forced_eos_token_id")  # field -> HF key
SEARCH = dict(num_beams=int, length_penalty=float, early_stopping=bool, max_new_tokens=int, max_length=int,
              do_sample=bool, temperature=float, top_k=int, top_p=float)  # fields whose HF key is their name
HF_DEFAULTS = dict(num_beams=1, length_penalty=1.0, early_stopping=False, do_sample=False, temperature=1.0,
                   top_k=50, top_p=1.0)


@dataclass(frozen=True)
class GenerationConfig:
    """A checkpoint's decoding settings (Hugging Face's generation_config.json keys in brackets).

    eos_ids [eos_token_id]: one id or several (Llama 3 ends a turn at any of three); pad_id: what a finished
    row is padded with; decoder_start_id: where an encoder-decoder's target starts (Marian: its pad);
    forced_bos_id / forced_eos_id: the first / last allowed token is forced; suppress [single-token
    bad_words_ids + suppress_tokens]: never generated; renormalize [renormalize_logits]; then the search
    (num_beams, length_penalty, early_stopping), the lengths (max_new_tokens, or max_length counting the
    prompt; None: not given) and sampling (do_sample, temperature, top_k, top_p).
    """

    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    bos_id: int | None = None
    decoder_start_id: int | None = None
    forced_bos_id: int | None = None
    forced_eos_id: int | None = None
    suppress: tuple[int, ...] = ()
    renormalize: bool = False
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    max_new_tokens: int | None = None
    max_length: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float = 1.0
    ignored: tuple[str, ...] = ()  # "key=value (why)" for each setting qkv does not apply

    @property
    def eos_id(self) -> int | None:
        """The first end-of-sequence id (the one an encoder-decoder stops at), None without any."""
        return self.eos_ids[0] if self.eos_ids else None

    @classmethod
    def from_hf(cls, hf: dict, vocab_size: int | None = None) -> GenerationConfig:
        """From generation_config.json's keys (config.json's where a checkpoint has no such file). Lenient:
        a setting it cannot read or apply goes to ``ignored``, never an error (a model that loads, loads)."""
        hf, ignored = {k: v for k, v in hf.items() if v is not None}, []
        ids = {f: read_id(hf, key, vocab_size, ignored) for f, key in IDS.items()}
        eos = hf.get("eos_token_id", [])
        eos = [read_id({"eos_token_id": e}, "eos_token_id", vocab_size, ignored) for e in
               (eos if isinstance(eos, list) else [eos])]
        search = {f: read_value(hf, f, kind, ignored) for f, kind in SEARCH.items()}
        search = {k: v for k, v in search.items() if v is not None}
        if search.get("top_k") == 0:
            search["top_k"] = None  # transformers: 0 = no top-k filter
        if hf.get("early_stopping") == "never":
            ignored.append("early_stopping='never' (qkv stops beams as early_stopping=False does)")
        ignored += [f"{k}={hf[k]!r:.60}" for k, off in NEUTRAL.items() if k in hf and hf[k] != off]
        return cls(eos_ids=tuple(dict.fromkeys(e for e in eos if e is not None)), **ids,
                   suppress=suppressed(hf, vocab_size, ignored), renormalize=hf.get("renormalize_logits") is True,
                   **search, ignored=tuple(ignored))

    def to_hf(self) -> dict:
        """generation_config.json's keys for the settings that differ from transformers' defaults."""
        out = {key: getattr(self, f) for f, key in IDS.items() if getattr(self, f) is not None}
        if self.eos_ids:
            out["eos_token_id"] = self.eos_ids[0] if len(self.eos_ids) == 1 else list(self.eos_ids)
        if self.suppress:
            out["bad_words_ids"] = [[i] for i in self.suppress]
        if self.renormalize:
            out["renormalize_logits"] = True
        sampling = ("temperature", "top_k", "top_p")  # transformers refuses them without do_sample
        out |= {f: getattr(self, f) for f in SEARCH if getattr(self, f) is not None and
                getattr(self, f) != HF_DEFAULTS.get(f) and (self.do_sample or f not in sampling)}
        if self.do_sample and self.top_k is None:
            out["top_k"] = 0
        return out

    def to_dict(self) -> dict:
        """Every field, JSON-ready (tuples as lists): what ``from_dict`` reads back."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> GenerationConfig:
        """The inverse of ``to_dict``; TypeError naming an unknown key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TypeError(f"GenerationConfig has no fields {unknown} (expected some of {sorted(known)})")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def is_id(value, vocab_size: int | None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0 and (
        vocab_size is None or value < vocab_size)


def read_id(hf: dict, key: str, vocab_size: int | None, ignored: list[str]) -> int | None:
    """hf[key] as a token id (a one-element list of it too), None when absent or unusable (then noted)."""
    value = hf.get(key)
    value = value[0] if isinstance(value, list) and len(value) == 1 else value
    if value is None or is_id(value, vocab_size):
        return value
    ignored.append(f"{key}={value!r:.60} (expected one token id in [0, {vocab_size or '∞'}))")
    return None


def read_value(hf: dict, key: str, kind: type, ignored: list[str]):
    """hf[key] as ``kind`` (an int for a float is fine), None when absent or of another type (then noted)."""
    value = hf.get(key)
    if value is None or key == "early_stopping" and value == "never":
        return None
    ok = isinstance(value, bool) if kind is bool else (
        not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int))
    if not ok:
        ignored.append(f"{key}={value!r:.60} (expected {kind.__name__})")
        return None
    return kind(value)


def suppressed(hf: dict, vocab_size: int | None, ignored: list[str]) -> tuple[int, ...]:
    """Single-token bad_words_ids and suppress_tokens: the ids generate never emits."""
    bad, extra = hf.get("bad_words_ids") or [], hf.get("suppress_tokens") or []
    bad, extra = (bad if isinstance(bad, list) else [bad]), (extra if isinstance(extra, list) else [extra])
    singles = [w[0] for w in bad if isinstance(w, list) and len(w) == 1]
    if len(singles) < len(bad):
        ignored.append(f"bad_words_ids={bad!r:.60} (qkv suppresses single tokens: expected [[id], …])")
    ids = singles + extra
    wrong = [i for i in ids if not is_id(i, vocab_size)]
    if wrong:
        ignored.append(f"suppressed ids {wrong!r:.60} (expected token ids in [0, {vocab_size or '∞'}))")
    return tuple(dict.fromkeys(i for i in ids if i not in wrong))


def config_defaults(config: GenerationConfig, ids, max_new_tokens: int | None, kwargs: dict) -> tuple[int | None, dict]:
    """A decoder's ``generate`` arguments: each one given, else ``config``'s as Hugging Face's ``generate``
    uses it — eos ids, pad id, suppressed ids, greedy unless ``do_sample`` (then its temperature, top-k,
    top-p), max_new_tokens or max_length minus the prompt ids (B, T). Returns (max_new_tokens, kwargs)."""
    out = dict(kwargs)
    if config.eos_ids:
        out.setdefault("eos_id", config.eos_ids[0] if len(config.eos_ids) == 1 else list(config.eos_ids))
    if config.pad_id is not None:
        out.setdefault("pad_id", config.pad_id)
    if config.suppress:
        out.setdefault("suppress", config.suppress)
    if config.do_sample:
        out.setdefault("temperature", config.temperature)
        out.setdefault("top_k", config.top_k)
        out.setdefault("top_p", None if config.top_p >= 1.0 else config.top_p)
    else:
        out.setdefault("temperature", 0.0)
    if max_new_tokens is None and config.max_new_tokens is not None:
        max_new_tokens = config.max_new_tokens
    elif max_new_tokens is None and config.max_length is not None:
        max_new_tokens = max(0, config.max_length - ids.size(-1))  # HF's max_length counts the prompt
    return max_new_tokens, out
