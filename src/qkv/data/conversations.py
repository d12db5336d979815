"""Conversation and preference files for chat fine-tuning (``qkv train --task sft``).

One record a line (JSONL), each record's format detected:

    messages     {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}  (OpenAI, TRL)
    sharegpt     {"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}
    alpaca       {"instruction": "...", "input": "...", "output": "...", "system": "..."}  (input and system
                 optional; instruction and input joined by a blank line, as LLaMA-Factory does)
    completion   {"prompt": ..., "completion": ...}: TRL's prompt-completion form; strings are raw text (no chat
                 template, the completion ends with the EOS), lists are messages
    preference   {"prompt": ..., "chosen": ..., "rejected": ...} as TRL takes them: all lists of messages
                 (conversational), or all strings (raw text: prompt + answer + EOS, no chat template); without
                 "prompt", the prompt is the longest common beginning of chosen and rejected (TRL's implicit prompt,
                 ``implicit_prompt``)

``--data`` is such a file, a directory of ``*.jsonl`` / ``*.json`` files, or a Hugging Face ``datasets`` folder on
disk (``save_to_disk``, or Parquet files), read through ``datasets``. Every error names the file and line.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Record:
    where: str  # "file:line", for errors
    data: dict


@dataclass(frozen=True)
class Conversation:
    """Messages ({"role", "content"}, roles in order) and where they were read. ``raw``: a prompt-completion record
    of strings (messages: the prompt as the user's, the completion as the assistant's), rendered as plain text;
    ``context_answers``: the assistant turns at the start that are the prompt's (not learnt)."""

    messages: tuple[dict, ...]
    where: str = ""
    raw: bool = False
    context_answers: int = 0


@dataclass(frozen=True)
class Preference:
    """A prompt (messages ending with the user's) and two answers (assistant messages): chosen, rejected; or, with
    ``raw``, three strings: the text before the answers and the two answers (no chat template)."""

    prompt: tuple[dict, ...] | str
    chosen: tuple[dict, ...] | str
    rejected: tuple[dict, ...] | str
    where: str = ""
    raw: bool = False


# --- reading records -------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[Record]:
    """One record a non-blank line; ValueError naming the file and line of one that is not a JSON object."""
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object (one record a line), got {type(data).__name__}")
        records.append(Record(f"{path}:{n}", data))
    return records


def read_dataset_folder(path: Path) -> list[Record]:
    """A ``datasets`` folder on disk: ``save_to_disk``'s (its first split if a DatasetDict) or Parquet files."""
    import datasets

    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            data = data[sorted(data)[0] if "train" not in data else "train"]
    else:
        files = sorted(str(p) for p in path.rglob("*.parquet"))
        data = datasets.load_dataset("parquet", data_files=files, split="train")
    return [Record(f"{path} row {i + 1}", dict(row)) for i, row in enumerate(data)]


def read_records(path: str | os.PathLike) -> list[Record]:
    """Every record of a JSONL file, a directory of them, or a ``datasets`` folder; ValueError when none."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--data {p}: no such file or directory")
    if p.is_file():
        records = read_jsonl(p)
    elif any(p.rglob("*.parquet")) or (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists():
        records = read_dataset_folder(p)
    else:
        files = sorted(q for q in p.rglob("*") if q.suffix in (".jsonl", ".json") and q.is_file())
        records = [r for f in files for r in read_jsonl(f)]
    if not records:
        raise ValueError(f"--data {p}: no records (expected JSONL: one JSON object a line)")
    return records


# --- formats ----------------------------------------------------------------------------------------

def record_format(record: Record) -> str:
    """messages | sharegpt | alpaca | completion | preference; ValueError naming the record's keys when none fits."""
    keys = set(record.data)
    if {"prompt", "completion"} <= keys and not {"chosen", "rejected"} & keys:
        return "completion"
    if {"prompt", "chosen", "rejected"} & keys and "messages" not in keys:
        return "preference"
    for name, needed in (("messages", {"messages"}), ("sharegpt", {"conversations"}),
                         ("alpaca", {"instruction", "output"})):
        if needed <= keys:
            return name
    raise ValueError(f"{record.where}: a record of no known format (keys {sorted(keys)}); expected 'messages', "
                     "'conversations' (sharegpt), 'instruction' + 'output' (alpaca), 'prompt' + 'completion' or "
                     "'chosen' + 'rejected' (preference)")


def as_messages(value, where: str, what: str) -> list[dict]:
    """A list of {"role", "content"} (or sharegpt's {"from", "value"}) as messages; ValueError otherwise."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: {what} must be a non-empty list of messages, got {type(value).__name__}")
    out = []
    for i, m in enumerate(value):
        if isinstance(m, dict) and "from" in m and "value" in m:
            role, content = SHAREGPT_ROLES.get(m["from"], m["from"]), m["value"]
        elif isinstance(m, dict) and "role" in m and "content" in m:
            role, content = m["role"], m["content"]
        else:
            raise ValueError(f"{where}: {what}[{i}] must have 'role' and 'content' (or 'from' and 'value'), got {m!r}"[:300])
        if role not in ROLES or not isinstance(content, str):
            raise ValueError(f"{where}: {what}[{i}] has role {role!r} (expected one of {ROLES}) and content of type "
                             f"{type(content).__name__} (expected str)")
        out.append({"role": role, "content": content})
    return out


def check_order(messages: list[dict], where: str, *, ends_with: str | None = None) -> None:
    """An optional system message first, then user and assistant turns in turn, starting with the user's."""
    roles = [m["role"] for m in messages]
    body = roles[1:] if roles and roles[0] == "system" else roles
    expected = ["user" if i % 2 == 0 else "assistant" for i in range(len(body))]
    if body != expected:
        bad = next(i for i, (r, e) in enumerate(zip(body, expected)) if r != e) + len(roles) - len(body)
        raise ValueError(f"{where}: roles out of order at message {bad} ({' → '.join(roles)}): expected an optional "
                         "system message, then user and assistant in turn, starting with the user")
    if ends_with is not None and (not roles or roles[-1] != ends_with):
        raise ValueError(f"{where}: expected the messages to end with the {ends_with}'s, got {' → '.join(roles)}")


def conversation(record: Record) -> Conversation:
    """The record (messages, sharegpt, alpaca or prompt-completion) as a checked conversation with at least one
    assistant turn."""
    kind, d, where = record_format(record), record.data, record.where
    if kind == "preference":
        raise ValueError(f"{where}: a preference record (prompt, chosen, rejected); --task sft takes conversations")
    if kind == "completion":
        return prompt_completion(d, where)
    if kind == "alpaca":
        user = d["instruction"] + (f"\n\n{d['input']}" if d.get("input") else "")
        messages = ([{"role": "system", "content": d["system"]}] if d.get("system") else []) + \
            [{"role": "user", "content": user}, {"role": "assistant", "content": d["output"]}]
        messages = as_messages(messages, where, "alpaca")
    else:
        messages = as_messages(d["messages" if kind == "messages" else "conversations"], where, kind)
    check_order(messages, where)
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: a conversation without an assistant turn (nothing to learn from)")
    return Conversation(tuple(messages), where)


def prompt_completion(d: dict, where: str) -> Conversation:
    """TRL's prompt-completion record: two strings (raw text), or the prompt's messages and the completion's."""
    prompt, completion = d["prompt"], d["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        return Conversation(({"role": "user", "content": prompt}, {"role": "assistant", "content": completion}),
                            where, raw=True)
    if isinstance(prompt, str) or isinstance(completion, str):
        raise ValueError(f"{where}: prompt and completion must both be strings (raw text) or both lists of messages")
    before, after = as_messages(prompt, where, "prompt"), as_messages(completion, where, "completion")
    check_order(before, where, ends_with="user")
    check_order(before + after, where)
    return Conversation(tuple(before + after), where, context_answers=sum(m["role"] == "assistant" for m in before))


def implicit_prompt(chosen, rejected) -> tuple:
    """(prompt, chosen, rejected) of a pair without a prompt, as TRL's ``extract_prompt``: the prompt is the longest
    common beginning (of the strings, or of the message lists); a space before the first difference is the
    answers'."""
    n = min(len(chosen), len(rejected))
    at = next((i for i in range(n) if chosen[i] != rejected[i]), n - 1)
    if 0 < at < n and chosen[at] != rejected[at] and chosen[at - 1] == " ":
        at -= 1
    return chosen[:at], chosen[at:], rejected[at:]


def preference(record: Record) -> Preference:
    """The record (TRL's prompt / chosen / rejected, all strings or all messages; the prompt implicit in the
    answers where absent) as a checked preference pair."""
    d, where = record.data, record.where
    missing = [k for k in ("chosen", "rejected") if k not in d]
    if missing:
        raise ValueError(f"{where}: a preference record missing {' and '.join(repr(k) for k in missing)}")
    values = (d["prompt"], d["chosen"], d["rejected"]) if "prompt" in d else implicit_prompt(d["chosen"], d["rejected"])
    if all(isinstance(v, str) for v in values):
        return Preference(*values, where, raw=True)
    if any(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: prompt, chosen and rejected must all be strings (raw text) or all lists of "
                         "messages")
    prompt = as_messages(values[0], where, "prompt")
    check_order(prompt, where, ends_with="user")
    answers = {}
    for key, value in zip(("chosen", "rejected"), values[1:]):
        answers[key] = as_messages(value, where, key)
        if any(m["role"] != "assistant" for m in answers[key]):
            raise ValueError(f"{where}: {key} must hold the assistant's answer alone")
    return Preference(tuple(prompt), tuple(answers["chosen"]), tuple(answers["rejected"]), where)


def load_conversations(path: str | os.PathLike) -> list[Conversation]:
    return [conversation(r) for r in read_records(path)]


def load_preferences(path: str | os.PathLike) -> list[Preference]:
    return [preference(r) for r in read_records(path)]


# --- conversations from the embedded data ------------------------------------------------------------------

TRANSLATE_PROMPT = "Translate to Chinese: {source}"


def catalog_conversations(target_lang: str = "zh_CN") -> tuple[list[Conversation], list[Conversation], str]:
    """(train, validation, source): the system's gettext catalogs as one-turn conversations — the user asks for
    the translation of an English UI string, the assistant answers with the catalog's — split as the translation
    task splits them (no download)."""
    from .catalogs import load_pairs

    pairs = load_pairs(target_lang=target_lang)

    def turns(split):
        return [Conversation(({"role": "user", "content": TRANSLATE_PROMPT.format(source=s)},
                              {"role": "assistant", "content": t}), f"{pairs.source} pair {i + 1}")
                for i, (s, t) in enumerate(split)]
    return turns(pairs.train), turns(pairs.val), f"{pairs.source} as conversations"


def catalog_preferences(target_lang: str = "zh_CN") -> tuple[list[Preference], list[Preference], str]:
    """(train, validation, source): each catalog pair as a preference — its own translation chosen, the next
    pair's rejected (a fluent answer to another question) — split as ``catalog_conversations``."""
    train, val, source = catalog_conversations(target_lang)

    def pairs(split: list[Conversation]) -> list[Preference]:
        return [Preference(c.messages[:1], c.messages[1:], split[(i + 1) % len(split)].messages[1:], c.where)
                for i, c in enumerate(split) if split[(i + 1) % len(split)].messages[1]["content"]
                != c.messages[1]["content"]]
    return pairs(train), pairs(val), source.replace("as conversations", "as preference pairs (another "
                                                                         "string's translation rejected)")
