"""Chat templates: a conversation rendered as the checkpoint's template says, and which of its tokens are the
assistant's (what supervised fine-tuning learns).

A template is a Jinja template over ``messages`` (Hugging Face's ``chat_template``), rendered here as
``transformers`` renders it (a sandbox, ``trim_blocks``, ``lstrip_blocks``, ``raise_exception``). A model trained
from scratch takes ChatML, whose two markers are special tokens of its tokenizer.

The assistant's tokens are the text inside the template's ``{% generation %}`` markers where it has them (what
transformers' ``return_assistant_tokens_mask`` marks; ChatML's here has them); otherwise they come from rendering
each prefix of the conversation: the text up to turn k with the generation prompt opened, then the text through
turn k — the difference is turn k's answer. Either way the end-of-turn marker is the answer's, so the model learns
to stop. Each piece is tokenised apart, so a mask never cuts a token.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
          "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
          "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
GENERATION_TAGS = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")  # transformers' mask markers: no text


def template_source(value: str | None) -> str | None:
    """``--chat-template``'s value as a template: "chatml", a path to a .jinja file, or the template itself."""
    if value is None or value == "":
        return None
    if value == "chatml":
        return CHATML
    if "{%" in value or "{{" in value:
        return value
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"--chat-template {value!r}: expected 'chatml', a Jinja template, or a template file; "
                         "no such file")
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=8)
def compiled(template: str):
    """The template compiled in a sandbox, its ``{% generation %}`` markers read as nothing."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(GENERATION_TAGS.sub("", template))
    except TemplateError as e:
        raise ValueError(f"the chat template does not compile: {e}") from None


def render(template: str, messages, *, add_generation_prompt: bool = False, **tokens) -> str:
    """The conversation as text; ``tokens``: the template's special-token variables (``bos_token`` …)."""
    from jinja2.exceptions import TemplateError

    try:
        return compiled(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         **tokens)
    except TemplateError as e:
        raise ValueError(f"the chat template refused the conversation: {e}") from None


OPEN, CLOSE = "\x00qkv-generation\x00", "\x00qkv-end\x00"  # where a marker stood, in the rendered text


def segments(template: str, messages, **tokens) -> list[tuple[str, bool]]:
    """The rendered conversation as pieces of text, True on each assistant answer: the text inside the template's
    ``{% generation %}`` markers where it has them (as transformers' ``return_assistant_tokens_mask``), else
    found by rendering each prefix (the module's rule)."""
    if GENERATION_TAGS.search(template):
        return marked_segments(template, messages, **tokens)
    return prefix_segments(template, messages, **tokens)


def marked_segments(template: str, messages, **tokens) -> list[tuple[str, bool]]:
    """The pieces inside and outside the ``{% generation %}`` markers, from one rendering with each marker
    replaced by a sentinel."""
    if any("\x00" in m["content"] for m in messages):
        raise ValueError("a message holds a NUL character, which the chat template's markers cannot be told from")
    marked = re.sub(r"\{%-?\s*generation\s*-?%\}", "{{ '" + OPEN + "' }}", template)
    marked = re.sub(r"\{%-?\s*endgeneration\s*-?%\}", "{{ '" + CLOSE + "' }}", marked)
    return mark_inside(render(marked, messages, **tokens))


def mark_inside(text: str) -> list[tuple[str, bool]]:
    """Text with sentinels -> [(piece, inside the markers)]."""
    pieces, inside = [], False
    for part in re.split(f"({OPEN}|{CLOSE})", text):
        if part in (OPEN, CLOSE):
            inside = part == OPEN
        elif part:
            pieces.append((part, inside))
    return pieces


def prefix_segments(template: str, messages, **tokens) -> list[tuple[str, bool]]:
    """The pieces found by rendering each prefix: up to turn k with the generation prompt, then through it."""
    pieces, done = [], ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(template, messages[:k], add_generation_prompt=True, **tokens)
        through = render(template, messages[:k + 1], **tokens)
        if not (before.startswith(done) and through.startswith(before)):
            raise ValueError("the chat template does not render a conversation as an extension of its beginning "
                             "(turn by turn), so the assistant's tokens cannot be found")
        pieces += [(before[len(done):], False), (through[len(before):], True)]
        done = through
    whole = render(template, messages, **tokens)
    if not whole.startswith(done):
        raise ValueError("the chat template renders the whole conversation unlike its turns")
    pieces.append((whole[len(done):], False))
    return [(text, answer) for text, answer in pieces if text]


def plain_ids(tokenizer, text: str) -> list[int]:
    """``text``'s ids without the special tokens a tokenizer adds by itself (the template places its own)."""
    return ids_and_offsets(tokenizer, text)[0]


def ids_and_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    """(ids, each token's (start, end) characters in ``text``, or None where the tokenizer gives none), without the
    special tokens a tokenizer adds by itself."""
    backend = getattr(tokenizer, "backend", None) or getattr(tokenizer, "tokenizer", None)  # hf's, or qkv's BPE's
    if backend is not None and hasattr(backend, "convert_ids_to_tokens"):  # a transformers tokenizer
        if not getattr(backend, "is_fast", False):
            return list(backend.encode(text, add_special_tokens=False)), None
        out = backend(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(out["input_ids"]), [tuple(o) for o in out["offset_mapping"]]
    if backend is not None:  # a tokenizers.Tokenizer (a LLaMA one would add its BOS)
        out = backend.encode(text, add_special_tokens=False)
        return out.ids, list(out.offsets)
    ids = tokenizer.encode(text)
    return ids, ([(i, i + 1) for i in range(len(text))] if len(ids) == len(text) else None)  # one id a character


def turn_ends(pieces: list[tuple[str, bool]], end_newline: bool) -> list[tuple[str, bool]]:
    """The pieces with the newlines right after each answer given to the prompt (the next piece), or with
    ``end_newline`` to the answer: the same end of turn whichever way the answer was found."""
    out = [list(p) for p in pieces] + [["", False]]
    for i in range(len(out) - 1):
        text, answer = out[i]
        if not answer or out[i + 1][1]:
            continue
        if end_newline:
            after = out[i + 1][0]
            kept = after.lstrip("\n")
            out[i][0], out[i + 1][0] = text + after[:len(after) - len(kept)], kept
        elif text.rstrip("\n"):
            kept = text.rstrip("\n")
            out[i][0], out[i + 1][0] = kept, text[len(kept):] + out[i + 1][0]
    return [(text, answer) for text, answer in out if text]


def encode_pieces(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    """(ids, trained) of the pieces' text tokenised whole: a token is trained when its characters touch a piece
    marked True (an empty one: when it stands inside one); a tokenizer without offsets tokenises piece by piece."""
    text = "".join(t for t, _ in pieces)
    ids, offsets = ids_and_offsets(tokenizer, text)
    if offsets is None:
        ids, trained = [], []
        for piece, answer in pieces:
            piece_ids = ids_and_offsets(tokenizer, piece)[0]
            ids, trained = ids + piece_ids, trained + [answer] * len(piece_ids)
        return ids, trained
    inside, at = [False] * (len(text) + 1), 0
    for piece, answer in pieces:
        inside[at:at + len(piece)] = [answer] * len(piece)
        at += len(piece)
    return ids, [any(inside[s:e]) if e > s else inside[s] for s, e in offsets]


def encode_conversation(tokenizer, template: str, messages, *, train_on_prompt: bool = False,
                        end_newline: bool = False, context_answers: int = 0, **tokens) -> tuple[list[int], list[bool]]:
    """(ids, trained): the conversation's token ids and, per token, whether the loss counts it (the assistant's
    answers but the first ``context_answers`` of them, or every token with ``train_on_prompt``)."""
    pieces, seen = [], 0
    for text, answer in turn_ends(segments(template, messages, **tokens), end_newline):
        pieces.append((text, train_on_prompt or (answer and seen >= context_answers)))
        seen += int(answer)
    return encode_pieces(tokenizer, pieces)
