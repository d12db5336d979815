"""Translation metrics and the two baselines a trained model has to beat.

  bleu     corpus BLEU (Papineni et al. 2002) via sacrebleu, 0–100: ``tokenize="zh"`` (one token
           per Chinese character) for a Chinese target, ``13a`` (sacrebleu's default) otherwise.
  chrf     corpus chrF (Popović 2015) via sacrebleu, 0–100: character n-grams, no tokenizer.
  copy     the output is the source, unchanged: what a UI shows when a string is untranslated
           (numbers, options and ``%s`` survive, so it is not zero).
  memory   a translation memory, as localisation tools keep: the translation of the most
           similar training source by ``rapidfuzz.fuzz.ratio`` (normalised Indel similarity).

``fuzz.ratio`` rather than ``fuzz.WRatio``: WRatio's partial matches pick long strings that merely
contain the query, and it is much slower; docs/design-notes.md has the comparison. The two baselines'
scores on a run's catalogs are printed by ``qkv train --task translate`` beside the model's.
"""
from __future__ import annotations

from typing import Sequence

from ..data.catalogs import Pair, PairCorpus

MEMORY_CHUNK = 256  # queries per similarity matrix: 256 × 42 000 float32 = 43 MB


def check_texts(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """ValueError/TypeError unless two equally long, non-empty lists of strings."""
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"expected as many hypotheses as references (at least one), "
                         f"got {len(hypotheses)} hypotheses and {len(references)} references")


def bleu_tokenizer(target_lang: str) -> str:
    """sacrebleu's tokenizer for a target language: ``zh`` for Chinese, ``13a`` otherwise."""
    return "zh" if target_lang.lower().startswith("zh") else "13a"


def bleu(hypotheses: Sequence[str], references: Sequence[str], *, target_lang: str) -> float:
    """Corpus BLEU, 0–100, one reference per hypothesis."""
    import sacrebleu  # the `translate` extra

    check_texts(hypotheses, references)
    tokenize = bleu_tokenizer(target_lang)
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (character 6-grams, beta 2), 0–100, one reference per hypothesis."""
    import sacrebleu  # the `translate` extra

    check_texts(hypotheses, references)
    return sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score


def copy_baseline(val_pairs: Sequence[Pair]) -> list[str]:
    """The untranslated output: each source as its own translation."""
    return [src for src, _ in val_pairs]


def memory_baseline(train_pairs: Sequence[Pair], val_sources: Sequence[str]) -> list[str]:
    """For each query, the translation of the most similar training source (``fuzz.ratio``;
    ties go to the first in ``train_pairs``)."""
    from rapidfuzz import fuzz, process  # the `translate` extra
    import numpy as np

    if not train_pairs:
        raise ValueError("memory_baseline needs at least one training pair, got 0")
    sources = [src for src, _ in train_pairs]
    best: list[int] = []
    for i in range(0, len(val_sources), MEMORY_CHUNK):
        scores = process.cdist(val_sources[i:i + MEMORY_CHUNK], sources, scorer=fuzz.ratio,
                               dtype=np.float32, workers=-1)  # (queries, train)
        best += scores.argmax(axis=1).tolist()
    return [train_pairs[j][1] for j in best]


def baselines(corpus: PairCorpus, *, target_lang: str | None = None) -> dict[str, float]:
    """copy_bleu, copy_chrf, memory_bleu, memory_chrf on the corpus's held-out pairs
    (``target_lang`` defaults to the corpus's)."""
    lang = target_lang or corpus.target_lang
    references = [tgt for _, tgt in corpus.val]
    outputs = {"copy": copy_baseline(corpus.val),
               "memory": memory_baseline(corpus.train, [src for src, _ in corpus.val])}
    scores = {}
    for name, hypotheses in outputs.items():
        scores[f"{name}_bleu"] = bleu(hypotheses, references, target_lang=lang)
        scores[f"{name}_chrf"] = chrf(hypotheses, references)
    return scores
