"""The spec's claims that ``qkv verify`` cannot measure, each with the reason and, where one
exists, where it is measured instead. They appear in the table and the JSON with ``holds``
null (``run_claims(unmeasurable=True)``).

Shapes: none.
"""
from __future__ import annotations

from .registry import not_measurable

not_measurable(
    "heads-model-relations", "§2 (why)",
    "different heads model different relations: syntax, coreference, synonymy, collocation",
    "needs a trained model and text annotated with those relations; `qkv verify --run DIR` measures the weaker "
    "claim that trained heads attend differently (head-diversity, Q3)",
    claim_zh="「Multi-Head Attention 的目标就是让不同的头分别建模不同类型的关系」",
    reason_zh="需要训练好的模型和标注了这些关系的文本；`qkv verify --run DIR` 测的是较弱的论断：训练后各头的注意力不同（head-diversity，Q3）")

not_measurable(
    "paper-attention-figures", "Q3 (paper)",
    "the paper's Figures 3–5 show heads for long-distance dependencies, anaphora and sentence structure",
    "a statement about the paper's trained WMT 2014 models, whose weights were not published with it; "
    "head-diversity (--run) measures the heads of your own model instead",
    claim_zh="「原论文在 Attention Visualizations 一节（对应 Figure 3 / Figure 4 / Figure 5）中展示了多个 head 的注意力分布」",
    reason_zh="这是关于论文中训练好的 WMT 2014 模型的陈述，论文没有公开其权重；head-diversity（--run）改为测量你自己的模型的各头")

not_measurable(
    "only-multi-head-in-a-block", "§4 (view 2)",
    "a block only ever holds multi-head attention, never single-head self-attention",
    "a matter of naming: single-head attention is multi-head attention with h = 1, which qkv builds like any h "
    "(mha-params and mha-flops measure h = 1 … 16 alike); nothing to measure",
    claim_zh="「Transformer 一层 Block 里只可能出现 Multi-Head Attention，不会单独出现\"Single-Head Self-Attention\"」",
    reason_zh="这是命名问题：单头注意力就是 h = 1 的多头注意力，qkv 对任何 h 都一样构建（mha-params 与 mha-flops 测了 h = 1 … 16）；没有可测的量")

not_measurable(
    "norms-for-stability", "§4 (view 3)",
    "residual connections and LayerNorm serve training stability",
    "stability is a property of training runs (divergence and loss curves across depths and learning rates), "
    "not of a forward pass; it needs training sweeps beyond verify's budget",
    claim_zh="「这些模块是为了训练稳定性服务的」",
    reason_zh="稳定性是训练过程的性质（不同深度、学习率下是否发散、损失曲线如何），不是一次前向计算的性质；需要超出 verify 预算的训练扫描")

not_measurable(
    "priorities", "Q20",
    "self-attention is the mechanism, multi-head its parallel form, PE restores order; all three are needed",
    "a way of reading, not a measurable statement; its one checkable part, PE added before multi-head attention, "
    "is measured by pe-before-attention and block-order",
    claim_zh="「Self-Attention 是底层机制、Multi-Head Attention 是并行实现、Position Encoding 用于补回顺序信息」",
    reason_zh="这是一种理解顺序，不是可测量的陈述；其中唯一可检验的部分——PE 在多头注意力之前相加——由 pe-before-attention 和 block-order 测量")

not_measurable(
    "roadmap", "Roadmap",
    "next: the full block (residual + LayerNorm + FFN), a trainable nanoGPT, RoPE and ALiBi",
    "announces further articles and claims nothing; qkv implements each item (TransformerBlock, GPT, "
    "RotaryEmbedding, ALiBi), checked by block-order and rope-alibi-relative",
    claim_zh="「下篇预告：Transformer Block 完整结构 —— 残差 + LayerNorm + Feed-Forward 三件套」",
    reason_zh="预告后续文章，本身没有论断；qkv 实现了其中每一项（TransformerBlock、GPT、RotaryEmbedding、ALiBi），"
              "由 block-order 和 rope-alibi-relative 检查")
