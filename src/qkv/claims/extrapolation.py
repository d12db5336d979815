"""Length extrapolation (§3.3, Q9), measured by ``qkv study context`` (too long for verify's budget): the
spec's claim that sinusoidal PE extrapolates, and its neighbours from the papers practice follows — ALiBi
stays flat (Press et al. 2022) and YaRN beats the other RoPE scalings (Peng et al. 2023). Each row shows the
study's verdict and numbers once its results exist (runs/study-context, or the docs page's summary).

Shapes: none.
"""
from __future__ import annotations

import dataclasses

from .messages import Joined, render, say
from .registry import Claim, measured_by_study, study_summary

HOW = ("needs models trained at one length and scored at 2L … 16L (about 45 minutes on two cores), beyond "
       "verify's budget; run `qkv study context` (results in runs/study-context) and this row shows its verdict "
       "and numbers")
HOW_ZH = ("需要在一个长度上训练、在 2L … 16L 上评估（两个核心上约 45 分钟），超出 verify 的时间预算；运行 "
          "`qkv study context`（结果在 runs/study-context）后，这一行给出它的结论和测量值")


def with_verdict(row: Claim, part: str, message) -> Claim:
    """``row`` with the study's verdict ``part`` and ``message(part's dict, summary)`` once the study has run."""
    summary = study_summary("context")
    if summary is None or part not in summary["verdict"]:
        return row
    v = summary["verdict"][part]
    text = message(v, summary)
    return dataclasses.replace(row, measured=v, summary=render(text, "en"), summary_zh=render(text, "zh"))


def within(scheme: str):
    """The reader of a "stays within 10 % of its loss at L" row for ``scheme``."""
    def message(v: dict, summary: dict):
        ratios = Joined([say("context-ratio", ratio=r, L=L) for L, r in v["ratios"].items()], sep=", ")
        return say("context-within", **stamp(v, summary), scheme=scheme, factor=v["factor"], ratios=ratios,
                   tol=100 * (summary["verdict"]["tolerance"] - 1))
    return lambda row: with_verdict(row, scheme, message)


def yarn_message(v: dict, summary: dict):
    (won, of), (ft_won, ft_of) = v["untuned"], v["finetuned"]
    return say("context-yarn", **stamp(v, summary), won=won, of=of, ft_won=ft_won, ft_of=ft_of)


def stamp(v: dict, summary: dict) -> dict:
    """The verdict word, the run's date and its seeds."""
    return {"verdict": say("study/holds" if v["holds"] else "study/fails"), "seeds": summary["verdict"]["seeds"],
            "date": summary.get("run", {}).get("date", "?")}


measured_by_study(
    "sinusoidal-extrapolates", "§3.3 / Q9",
    "sinusoidal PE extrapolates: trained at 512, it roughly works at 1024 (within 10 % of its loss at 2L)",
    HOW, within("sinusoidal"),
    claim_zh="「Sinusoidal 的最大优势是可外推：训练时用了 512 长度，推理时给 1024 也大致能跑」",
    reason_zh=HOW_ZH)

measured_by_study(
    "alibi-extrapolates", "§3.3 / Q9",
    "ALiBi trained at L keeps its loss at far longer lengths, within 10 % at 16L (Press et al. 2022, Table 2)",
    HOW, within("alibi"),
    claim_zh="「后续工作如 RoPE、ALiBi 等则是改造注意力机制本身，让位置信息以更优雅的方式参与到 Q / K 的点积中」"
             "（ALiBi 在 L 上训练，到 16L 损失仍在 10 % 以内：Press et al. 2022 表 2）",
    reason_zh=HOW_ZH)

measured_by_study(
    "yarn-beats-pi-ntk", "§3.3 / Q9",
    "YaRN extends RoPE better than PI and NTK scaling, without a fine-tune and after one (Peng et al. 2023)",
    HOW, lambda row: with_verdict(row, "yarn", yarn_message),
    claim_zh="「LLaMA 系列把位置信息通过 RoPE 注入到 Q / K 的点积里」（把 RoPE 扩展到更长的上下文时，YaRN 优于 PI 和 "
             "NTK 缩放，无论是否微调：Peng et al. 2023）",
    reason_zh=HOW_ZH)
