"""What ``qkv study context``'s numbers say: the published anchors beside them, the extrapolation claims'
verdicts (which ``qkv verify`` shows) and the advice, each computed from the run's rows.

Every comparison is a ratio of loss to the loss at the training length L, as Press et al. (2022) and the
YaRN repository report perplexity: loss = ln(perplexity) (nats per token), so a perplexity ratio is read
as ln(ppl_T) / ln(ppl_L), and qkv's as bpc_T / bpc_L (bits and nats differ by a constant factor).

Rows: dicts {train_len, scheme, eval_len, bpc, ratio_to_L, …} as ``qkv.studies.context`` writes them.
"""
from __future__ import annotations

import math

from .pages import say

TOLERANCE = 1.10  # "roughly works" at a longer length: within 10 % of the loss at L (pe's sentences too)
FINE_TUNED = ("rope+PI (ft 4L)", "rope+YaRN (ft 4L)", "rope+PI (ft 4L, s = 4)", "rope+YaRN (ft 4L, s = 4)")
UNTUNED_SCALINGS = ("rope+PI", "rope+NTK", "rope+dynamic NTK")  # what YaRN claims to beat without a fine-tune

# Press et al. 2022 ("Train Short, Test Long"), Table 2: WikiText-103, trained at L = 512; perplexity at
# 512 / 1012 / 2512 tokens. qkv's nearest lengths: 2L and 4L.
PRESS = {"alibi": (19.73, 18.73, 18.41), "t5": (19.65, 18.79, 20.41), "rope": (20.07, 21.37, 31.58),
         "sinusoidal": (20.05, 43.54, 132.41)}
# The YaRN repository's Proof-pile table: Llama-2-7B fine-tuned to 8k (factor 2); perplexity at 10k and 12k.
YARN = {"rope+PI (ft 4L, s = 4)": (8.07, 23.5), "rope+YaRN (ft 4L, s = 4)": (6.05, 18.1)}
YARN_NTK = (6.24, 18.3)  # Code Llama's NTK base change, fine-tuned: no qkv row (qkv's NTK is untuned)


def loss_ratio(ppl_at_t: float, ppl_at_l: float) -> float:
    """A perplexity pair as a ratio of loss: ln(ppl_T) / ln(ppl_L)."""
    return math.log(ppl_at_t) / math.log(ppl_at_l)


def table(rows: list[dict]) -> dict[tuple[int, str, int], dict]:
    """{(L, scheme, f): row} with f = T / L."""
    return {(r["train_len"], r["scheme"], r["eval_len"] // r["train_len"]): r for r in rows}


def train_lens(rows: list[dict]) -> list[int]:
    return sorted({r["train_len"] for r in rows})


def ratios(rows: list[dict], scheme: str, f: int) -> dict[str, float]:
    """{"L": loss ratio to L at f·L} for each training length that has the row."""
    by = table(rows)
    return {str(L): by[(L, scheme, f)]["ratio_to_L"] for L in train_lens(rows) if (L, scheme, f) in by}


def wins(rows: list[dict], winner: str, others: tuple[str, ...], factors) -> tuple[int, int]:
    """(how many (L, f) pairs ``winner``'s bpc is below every one of ``others``', how many pairs were compared)."""
    by, won, of = table(rows), 0, 0
    for L in train_lens(rows):
        for f in factors:
            if (L, winner, f) in by and all((L, o, f) in by for o in others):
                of += 1
                won += by[(L, winner, f)]["bpc"] < min(by[(L, o, f)]["bpc"] for o in others)
    return won, of


def verdicts(rows: list[dict], seeds: int) -> dict:
    """The extrapolation claims' verdicts (``qkv verify`` shows them): sinusoidal within 10 % at 2L (the spec),
    ALiBi within 10 % at the longest length (Press et al.), YaRN best of the RoPE scalings past L, untuned and
    fine-tuned (Peng et al.). ``holds`` is None where the run lacks the rows."""
    longest = max(r["eval_len"] // r["train_len"] for r in rows)
    factors = sorted({r["eval_len"] // r["train_len"] for r in rows} - {1})
    sin, alibi = ratios(rows, "sinusoidal", 2), ratios(rows, "alibi", longest)
    untuned = wins(rows, "rope+YaRN", UNTUNED_SCALINGS, factors)
    tuned = wins(rows, "rope+YaRN (ft 4L)", ("rope+PI (ft 4L)",), factors)
    return {"seeds": seeds, "tolerance": TOLERANCE, "longest": longest,
            "sinusoidal": {"factor": 2, "ratios": sin, "holds": all_within(sin)},
            "alibi": {"factor": longest, "ratios": alibi, "holds": all_within(alibi)},
            "yarn": {"untuned": untuned, "finetuned": tuned,
                     "holds": None if not untuned[1] else untuned[0] == untuned[1] and tuned[0] == tuned[1]}}


def all_within(found: dict[str, float]) -> bool | None:
    return None if not found else all(x <= TOLERANCE for x in found.values())


def press_text(rows: list[dict], lang: str) -> list[str]:
    """The Press et al. comparison: a table of loss ratios and a sentence on the order at the longest."""
    Ls = train_lens(rows)
    head = f"| {say('scheme', lang)} | 1012/512 | 2512/512 | " + " | ".join(f"L = {L}: 2L | L = {L}: 4L" for L in Ls)
    lines = [say("ctx.press", lang), "", head + " |", "|" + "---|" * (3 + 2 * len(Ls))]
    for scheme, ppl in PRESS.items():
        ours = [ratios(rows, scheme, f).get(str(L)) for L in Ls for f in (2, 4)]
        lines.append(f"| {scheme} | {loss_ratio(ppl[1], ppl[0]):.3f} | {loss_ratio(ppl[2], ppl[0]):.3f} | "
                     + " | ".join("–" if x is None else f"{x:.3f}" for x in ours) + " |")
    return lines + ["", press_order(rows, lang)]


def press_order(rows: list[dict], lang: str) -> str:
    """Press et al.'s order at 2512 beside qkv's at 4L (mean ratio over L), and where the two differ."""
    paper = sorted(PRESS, key=lambda s: loss_ratio(PRESS[s][2], PRESS[s][0]))
    mean = {s: sum(v) / len(v) for s in PRESS if (v := list(ratios(rows, s, 4).values()))}
    ours = sorted(mean, key=mean.get)
    pairs = [f"{b} < {a}" for i, a in enumerate(ours) for b in ours[i + 1:] if paper.index(b) < paper.index(a)]
    agree = say("ctx.differ", lang, pairs=say("sep", lang).join(pairs)) if pairs else say("ctx.agree", lang)
    return say("ctx.press order", lang, paper=" < ".join(paper), ours=" < ".join(ours), agree=agree)


def yarn_text(rows: list[dict], lang: str) -> list[str]:
    """The YaRN repository's table beside the held fine-tuned rows: the rise past the scaled length, the order."""
    held = {row: ratios_between(rows, row, 8, 4) for row in YARN}
    if not any(held.values()):
        return []
    sep = say("sep", lang)
    ours = sep.join(f"{row} " + ", ".join(f"{v:.2f} (L = {L})" for L, v in got.items()) for row, got in held.items())
    pi, yarn = YARN["rope+PI (ft 4L, s = 4)"], YARN["rope+YaRN (ft 4L, s = 4)"]
    by = table(rows)
    pairs = [(by[(L, "rope+YaRN (ft 4L)", 4)]["bpc"], by[(L, "rope+PI (ft 4L)", 4)]["bpc"], L) for L in train_lens(rows)
             if (L, "rope+YaRN (ft 4L)", 4) in by and (L, "rope+PI (ft 4L)", 4) in by]
    text = [say("ctx.yarn", lang, pi=loss_ratio(pi[1], pi[0]), ntk=loss_ratio(YARN_NTK[1], YARN_NTK[0]),
                yarn=loss_ratio(yarn[1], yarn[0]), pi10=pi[0], ntk10=YARN_NTK[0], yarn10=yarn[0], ours=ours)]
    if pairs:
        verb = say("ctx.beats" if all(y < p for y, p, _ in pairs) else "ctx.not beats", lang)
        text.append(say("ctx.yarn order", lang, verb=verb, yarn10=yarn[0], pi10=pi[0],
                        pairs=sep.join(f"L = {L}: {y:.3f} / {p:.3f} bpc" for y, p, L in pairs)))
    return text


def ratios_between(rows: list[dict], scheme: str, f: int, g: int) -> dict[int, float]:
    """{L: bpc at f·L / bpc at g·L} for the training lengths that have both."""
    by = table(rows)
    return {L: by[(L, scheme, f)]["bpc"] / by[(L, scheme, g)]["bpc"] for L in train_lens(rows)
            if (L, scheme, f) in by and (L, scheme, g) in by}


def advice(rows: list[dict], lang: str) -> list[str]:
    """For 4× and 16× L (where measured): the best row without a fine-tune and with one (mean bpc over L)."""
    out = []
    for f in (4, 16):
        mean = mean_bpc(rows, f)
        free = [s for s in mean if s not in FINE_TUNED]
        if not free:
            continue
        best_free, best = min(free, key=mean.get), min(mean, key=mean.get)
        tuned = (say("ctx.pick same", lang) if best == best_free
                 else say("ctx.pick tuned", lang, row=best, bpc=bpc_at(rows, best, f, lang)))
        out.append(say("ctx.pick", lang, f=f, free=best_free, free_bpc=bpc_at(rows, best_free, f, lang), tuned=tuned))
    return out


def mean_bpc(rows: list[dict], f: int) -> dict[str, float]:
    """{scheme: mean bpc over the training lengths at f·L}, schemes measured at f·L for every L only."""
    by, Ls = table(rows), train_lens(rows)
    schemes = dict.fromkeys(r["scheme"] for r in rows)
    return {s: sum(by[(L, s, f)]["bpc"] for L in Ls) / len(Ls) for s in schemes
            if all((L, s, f) in by and not math.isnan(by[(L, s, f)]["bpc"]) for L in Ls)}


def bpc_at(rows: list[dict], scheme: str, f: int, lang: str) -> str:
    """"2.363 bpc at L = 64, 2.543 at L = 256" for ``scheme`` at f·L, in ``lang``."""
    by = table(rows)
    return say("sep", lang).join(say("ctx.bpc at" if i == 0 else "ctx.bpc also", lang, bpc=by[(L, scheme, f)]["bpc"], L=L)
                                 for i, L in enumerate(train_lens(rows)))


def reading(rows: list[dict], lang: str) -> list[str]:
    """The page's last sections: the published anchors and which scheme to pick."""
    return [say("ctx.anchors", lang), "", *press_text(rows, lang), "", *yarn_text(rows, lang), "",
            say("ctx.advice", lang), "", *[f"- {s}" for s in advice(rows, lang)]]
