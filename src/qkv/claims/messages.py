"""Every sentence ``qkv verify`` prints, in every language ``--lang`` offers: ``WORDS``, the words
around the table (headers, verdicts, the tally, the report's captions), and ``MESSAGES``, what
each check says about its numbers, as sentence templates keyed by message and language.

A check returns ``say(key, **values)`` as its summary; the registry renders it once per
language (``Claim.summary``, ``Claim.summary_zh``). Both templates of a key take the same fields
with the same format specs (``{err:.2g}``), so the numbers read identically in each language;
a value that is a ``Message``, ``Joined`` or ``Term`` is rendered in the same language. Names
of code (``d_model``, ``F.scaled_dot_product_attention``), units and models stay as written.

Shapes: none (text).
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..viz.text import language


# The words around the table (`qkv verify`, its --markdown report): headers, verdicts, the tally, captions.
WORDS = {
    "en": {"result": "result", "section": "section", "claim": "claim", "measured": "measured", "verdict": "holds",
           True: "holds", False: "FAILS", None: "n/a",
           "md": {True: "✅ holds", False: "❌ fails", None: "➖ not measurable"},
           "unmeasured": "not measurable here (the reason below each):",
           "tally": "{held} of {measured} claims hold", "failing": "; failing: {names}",
           "skipped": "; {count} not measurable", "title": "# qkv verify: the spec's claims, measured",
           "intro": "Produced by `qkv verify --markdown`; every number below is measured on qkv's own modules "
                    "(seeded, CPU).",
           "lead": "{tally}. {intro}", "wrote": "wrote {path} (figures next to it)",
           "figures": {"pe": "Sinusoidal positional encoding (§3.1)", "scaling": "Softmax saturation against d_k (§1.3)",
                       "heads": "Head diversity, trained vs initialisation (Q3)",
                       "attention": "Attention of the trained model"}},
    "zh": {"result": "结果", "section": "章节", "claim": "原文论断", "measured": "测量值", "verdict": "结论",
           True: "成立", False: "不成立", None: "无法测量",
           "md": {True: "✅ 成立", False: "❌ 不成立", None: "➖ 无法测量"},
           "unmeasured": "此处无法测量（原因写在每条下面）：",
           "tally": "{measured} 条论断中 {held} 条成立", "failing": "；不成立：{names}",
           "skipped": "；{count} 条无法测量", "title": "# qkv verify：逐条测量原文的论断",
           "intro": "由 `qkv verify --markdown --lang zh` 生成；下面每个数字都在 qkv 自己的模块上测得（固定随机种子，CPU）。",
           "lead": "{tally}。{intro}", "wrote": "已写入 {path}（图在它旁边）",
           "figures": {"pe": "正弦位置编码（§3.1）", "scaling": "有无 1/√d_k 缩放时 softmax 随 d_k 的饱和（§1.3）",
                       "heads": "各头之间的差异：训练后与初始化时（Q3）", "attention": "训练后模型的注意力"}},
}

MESSAGES: dict[str, dict[str, str]] = {
    # --- chapter 1: self-attention ---
    "scaling-variance": {
        "en": "var(QKᵀ)/d_k = {raw}; softmax-input var = {scaled} (d_k = {d_ks})",
        "zh": "var(QKᵀ)/d_k = {raw}；softmax 输入的方差 = {scaled}（d_k = {d_ks}）"},
    "scaling-saturation": {
        "en": "d_k = {d_ks}: mean max weight {s_max} scaled vs {u_max} unscaled; entropy {s_ent} vs {u_ent} nats; "
              "median |∂L/∂scores| {s_grad} vs {u_grad}",
        "zh": "d_k = {d_ks}：每行最大权重的均值，缩放时 {s_max}，不缩放时 {u_max}；熵 {s_ent} 对 {u_ent} nats；"
              "|∂L/∂scores| 的中位数 {s_grad} 对 {u_grad}"},
    "sdpa-default-scale": {
        "en": "d_k={d_k}: F.scaled_dot_product_attention vs softmax(QKᵀ/√d_k)V rel. error {scaled:.2g}; "
              "vs softmax(QKᵀ)V {unscaled:.3g}",
        "zh": "d_k={d_k}：F.scaled_dot_product_attention 与 softmax(QKᵀ/√d_k)V 的相对误差 {scaled:.2g}；"
              "与 softmax(QKᵀ)V 的相对误差 {unscaled:.3g}"},
    "qkv-projections": {
        "en": "n={n}, d_model={d_model}: W_Q, W_K, W_V {shapes}, bias {bias}, receive gradients {learned}; "
              "weights {weights}",
        "zh": "n={n}，d_model={d_model}：W_Q、W_K、W_V 形状 {shapes}，有偏置 {bias}，接收梯度 {learned}；"
              "注意力权重 {weights}"},
    "softmax-rows": {
        "en": "min weight {min_w:.3g}; max |row sum − 1| = {dev:.2g} (plain, causal, padding)",
        "zh": "最小权重 {min_w:.3g}；max |行和 − 1| = {dev:.2g}（无掩码、因果掩码、填充掩码）"},
    "convex-combination": {
        "en": "max |out − W·V| = {recon:.2g}; min weight {min_w:.3g}; max |row sum − 1| = {dev:.2g}; "
              "max excursion outside V's range {outside:.2g}",
        "zh": "max |out − W·V| = {recon:.2g}；最小权重 {min_w:.3g}；max |行和 − 1| = {dev:.2g}；"
              "超出 V 取值范围的最大幅度 {outside:.2g}"},
    "output-shape/module": {"en": "{name}: {pairs}", "zh": "{name}：{pairs}"},
    # --- against a recurrent network ---
    "path-length-one": {
        "en": "n={n}, width {d}, at initialisation: ‖∂out_last/∂x_0‖ / ‖∂out_last/∂x_(n−2)‖ = {ratios}",
        "zh": "n={n}，宽度 {d}，初始化时：‖∂out_last/∂x_0‖ / ‖∂out_last/∂x_(n−2)‖ = {ratios}"},
    "no-sequential-dependency": {
        "en": "longest chain of autograd operations for n = {lengths}: {depths}; each position computed alone = "
              "all at once, rel. error {alone:.2g}",
        "zh": "n = {lengths} 时 autograd 运算的最长链：{depths}；逐个位置单独计算 = 一次算完全部位置，"
              "相对误差 {alone:.2g}"},
    "parallel-speed": {
        "en": "µs per token (forward + backward), width {d}, n = {lengths} on {device}: {times}{slower}",
        "zh": "每个 token 的 µs（前向 + 反向），宽度 {d}，n = {lengths}，设备 {device}：{times}{slower}"},
    "parallel-speed/slower": {
        "en": "; attention is slower than an RNN here at n = {at}",
        "zh": "；在这台机器上 n = {at} 时注意力比 RNN 慢"},
    # --- chapter 2: multi-head attention ---
    "mha-formula": {
        "en": "d_model={d_model}, h={h}: the module against a loop over heads with sliced weights, rel. error {err:.2g}",
        "zh": "d_model={d_model}，h={h}：模块与逐头循环（权重切片）的写法相比，相对误差 {err:.2g}"},
    "mha-params": {
        "en": "d_model={d_model}, h = {heads}: {counts} parameters; 4·d² = {expected}",
        "zh": "d_model={d_model}，h = {heads}：参数量 {counts}；4·d² = {expected}"},
    "mha-flops": {
        "en": "n={n}, d_model={d_model}, h = {heads}: {fused} MFLOP (fused), {reference} (reference); "
              "max/min = {spread:.4f}; 8nd² + 4n²d = {formula:.3f} M",
        "zh": "n={n}，d_model={d_model}，h = {heads}：{fused} MFLOP（融合路径），{reference}（参考路径）；"
              "max/min = {spread:.4f}；8nd² + 4n²d = {formula:.3f} M"},
    "heads-divisible": {
        "en": "{bad} bad (d, h) pairs → {first!r} …; the spec's 512/8, 768/12, 1024/16 build: {built}",
        "zh": "{bad} 组不合法的 (d, h) → {first!r} …；原文的 512/8、768/12、1024/16 能构建：{built}"},
    "head-counts": {
        "en": "{models}; the spec's numbers match: {match}; checked locally: {sources}",
        "zh": "{models}；原文的数字一致：{match}；本机核对：{sources}"},
    "head-counts/model": {"en": "{model} {d}/{h} → d_k {d_k:g}", "zh": "{model} {d}/{h} → d_k {d_k:g}"},
    "head-diversity": {
        "en": "mean pairwise TV distance between heads, per layer: trained {trained} vs init {init} "
              "(on {tokens} tokens)",
        "zh": "每层各头之间两两 TV 距离的均值：训练后 {trained}，初始化时 {init}（在 {tokens} 个 token 上）"},
    # --- chapter 3: positional encoding ---
    "permutation-equivariance": {
        "en": "rel. error of f(x[perm]) vs f(x)[perm]: no PE {without} ({names}); with PE min {least:.3g} over "
              "{count} variants",
        "zh": "f(x[perm]) 与 f(x)[perm] 的相对误差：无 PE 时 {without}（{names}）；有 PE 时 {count} 种变体中最小 "
              "{least:.3g}"},
    "sinusoidal-range": {
        "en": "positions 0 … {last}, d_model={d}: min {lo:.6f}, max {hi:.6f}",
        "zh": "位置 0 … {last}，d_model={d}：最小值 {lo:.6f}，最大值 {hi:.6f}"},
    "sinusoidal-wavelengths": {
        "en": "d_model={d_model}: first {first:.5f} (2π = {two_pi:.5f}), last {last:.1f} = {ratio:.3f}·10000·2π "
              "(10000^(1−2/d)·2π = {expected:.1f}); each {step:.4f}× the previous",
        "zh": "d_model={d_model}：第一个 {first:.5f}（2π = {two_pi:.5f}），最后一个 {last:.1f} = {ratio:.3f}·10000·2π"
              "（10000^(1−2/d)·2π = {expected:.1f}）；每个是前一个的 {step:.4f}×"},
    "sinusoidal-rotation": {
        "en": "k = {shifts}, pos 0 … {last}: max |PE(pos+k) − R_k·PE(pos)| = {errors}; max |R_kᵀR_k − I| = {orth:.2g}",
        "zh": "k = {shifts}，pos 0 … {last}：max |PE(pos+k) − R_k·PE(pos)| = {errors}；max |R_kᵀR_k − I| = {orth:.2g}"},
    "learned-max-len": {
        "en": "max_len={max_len}: learned PE at {beyond_n} positions → {beyond!r}; sinusoidal PE at {far} positions "
              "finite: {finite}; GPT(sinusoidal) at {gpt_n} tokens runs",
        "zh": "max_len={max_len}：可学习 PE 用在 {beyond_n} 个位置上 → {beyond!r}；正弦 PE 在 {far} 个位置上都是有限值："
              "{finite}；GPT(sinusoidal) 在 {gpt_n} 个 token 上能运行"},
    # --- where position enters ---
    "pe-before-attention": {
        "en": "rel. error of layer(x[perm]) vs layer(x)[perm], 2 blocks, T={T}: first attention with PE before "
              "{before:.3g}, after {after:.2g} (order-blind); the second block's output sees order either way "
              "({before_out:.3g}, {after_out:.3g})",
        "zh": "layer(x[perm]) 与 layer(x)[perm] 的相对误差，2 个块，T={T}：第一层注意力，PE 加在之前 {before:.3g}，"
              "加在之后 {after:.2g}（看不到顺序）；两种情况下第二个块的输出都能看到顺序（{before_out:.3g}，"
              "{after_out:.3g}）"},
    "rope-alibi-relative": {
        "en": "moving all {T} positions by {shift}: RoPE scores change by {rope:.2g} (rel.; rotating changes them by "
              "{rotating:.3g}), ALiBi bias by {alibi:.2g}; ALiBi bias = −m_h·|i − j| to {linear:.2g}",
        "zh": "把全部 {T} 个位置都平移 {shift}：RoPE 分数的相对变化 {rope:.2g}（旋转本身使分数变化 {rotating:.3g}），"
              "ALiBi 偏置变化 {alibi:.2g}；ALiBi 偏置 = −m_h·|i − j|，误差 {linear:.2g}"},
    "embedding-plus-pe": {
        "en": "d_model={d}, token std {std:.3g}: ‖PE‖/‖token‖ = {ratio:.3g}, max |x| {token:.3g} → {sum:.3g} after "
              "adding PE; with the paper's ×√d_model: {ratio2:.3g}, max |x| {token2:.3g} → {sum2:.3g}",
        "zh": "d_model={d}，token 的 std {std:.3g}：‖PE‖/‖token‖ = {ratio:.3g}，加上 PE 后 max |x| {token:.3g} → "
              "{sum:.3g}；按论文乘以 ×√d_model：{ratio2:.3g}，max |x| {token2:.3g} → {sum2:.3g}"},
    # --- chapter 4: the block and its masks ---
    "block-order": {
        "en": "{blocks} blocks, d_model={d}: the model against the diagram written by hand on its parameters, "
              "rel. error {err:.2g}",
        "zh": "{blocks} 个块，d_model={d}：模型与在其参数上按示意图手写的计算相比，相对误差 {err:.2g}"},
    "causal-no-future/module": {
        "en": "{name}: max future grad {future:.3g}, min past grad norm {past:.3g}",
        "zh": "{name}：对未来位置的最大梯度 {future:.3g}，对过去位置的最小梯度范数 {past:.3g}"},
    # --- FAQ entries ---
    "separate-qk": {
        "en": "d={d}, T={T}: rows whose top score is the token itself: separate W_Q, W_K {separate:.3g} "
              "(uniform chance {chance:.3g}); W_K = W_Q {tied:.3g}",
        "zh": "d={d}，T={T}：得分最高的是 token 自身的行所占比例：W_Q、W_K 分开时 {separate:.3g}"
              "（均匀随机为 {chance:.3g}）；W_K = W_Q 时 {tied:.3g}"},
    "scores-not-symmetric": {
        "en": "‖S − Sᵀ‖/‖S‖ = {asym:.3g}; softmax(S) matches the module's weights to {match:.2g}",
        "zh": "‖S − Sᵀ‖/‖S‖ = {asym:.3g}；softmax(S) 与模块的注意力权重一致，误差 {match:.2g}"},
    "attends-to-itself/module": {
        "en": "{name}: min self-weight {least:.3g}, mean {ratio:.3g}× a uniform row's",
        "zh": "{name}：自身权重最小 {least:.3g}，平均是均匀分布的 {ratio:.3g}×"},
    "cross-attention": {
        "en": "weights {shape} = (B, H, T={T}, S={S}); K's input = the encoder output (diff {k:.2g}); another source "
              "changes Q's input by {q:.2g}, the logits by {logits:.3g}, and with cross-attention cut by {cut:.2g}",
        "zh": "注意力权重 {shape} = (B, H, T={T}, S={S})；K 的输入 = 编码器的输出（差 {k:.2g}）；换一个源句，Q 的输入"
              "变化 {q:.2g}，logits 变化 {logits:.3g}，切断交叉注意力后变化 {cut:.2g}"},
    "length-stable": {
        "en": "n = {lengths}: max |out| / max |V| = {bound} (≤ 1); out's std {spread} (it narrows as weights spread "
              "over more keys); mean |Σ_j v_j| = {plain}",
        "zh": "n = {lengths}：max |out| / max |V| = {bound}（≤ 1）；out 的 std {spread}（权重分散到更多的 key 上，"
              "它随之变窄）；|Σ_j v_j| 的均值 = {plain}"},
    # --- other ways to attend ---
    "softmax-vs-relu/way": {
        "en": "{name}: row sums {mean:.3g} ± {std:.2g}, min {least:.3g}, {zeros:.0f} % exact zeros",
        "zh": "{name}：行和 {mean:.3g} ± {std:.2g}，最小值 {least:.3g}，{zeros:.0f} % 恰好为零"},
    "window-is-convolution": {
        "en": "n={n}, window ±{r}: fixed position-only weights vs conv1d (edges renormalised) rel. error {err:.2g}; "
              "with query/key-dependent weights in the same window {dynamic:.3g}",
        "zh": "n={n}，窗口 ±{r}：只依赖位置的固定权重与 conv1d（边缘重新归一化）的相对误差 {err:.2g}；"
              "同一窗口内权重随 query/key 变化时 {dynamic:.3g}"},
    "additive-vs-dot": {
        "en": "L = S = {n}, d = A = {d}: additive {a_flops:.1f} MFLOP in products + {a_ops:.1f} M add/tanh, dot "
              "{d_flops:.1f} MFLOP ({ratio:.2f}×); largest tensor {a_mb:.1f} MB vs {d_mb:.2f} MB ({memory:.0f}×)",
        "zh": "L = S = {n}，d = A = {d}：加性打分的矩阵乘 {a_flops:.1f} MFLOP + {a_ops:.1f} M 次加法/tanh，点积 "
              "{d_flops:.1f} MFLOP（{ratio:.2f}×）；最大张量 {a_mb:.1f} MB 对 {d_mb:.2f} MB（{memory:.0f}×）"},
    "additive-vs-dot-measured": {
        "en": "d = {d}, n = {lengths} on {device}: additive {additive} ms, dot {dot} ms: dot is {speedup}× faster",
        "zh": "d = {d}，n = {lengths}，设备 {device}：加性打分 {additive} ms，点积 {dot} ms：点积快 {speedup}×"},
    # --- FAQ Q4: the cost against n ---
    "attention-quadratic": {
        "en": "d_model={d_model}, n = {lengths}: attention {attention} GFLOP (= 4n²d: {exact}), exponent "
              "{e_attention:.3f}; largest tensor {largest} MB, exponent {e_largest:.3f}; projections exponent "
              "{e_projections:.3f}; at n = {crossover} both parts are {at:.3f} GFLOP",
        "zh": "d_model={d_model}，n = {lengths}：注意力部分 {attention} GFLOP（= 4n²d：{exact}），指数 "
              "{e_attention:.3f}；最大张量 {largest} MB，指数 {e_largest:.3f}；投影部分的指数 {e_projections:.3f}；"
              "n = {crossover} 时两部分都是 {at:.3f} GFLOP"},
    "attention-quadratic-answers": {
        "en": "n = {lengths}, 8 heads × 64: exponent of FLOPs / largest tensor: {paths}",
        "zh": "n = {lengths}，8 个头 × 64：FLOPs / 最大张量的指数：{paths}"},
    "attention-quadratic-measured": {
        "en": "n = {lo} … {hi} on {device}: exponent of time / peak memory: {paths}",
        "zh": "n = {lo} … {hi}，设备 {device}：时间 / 峰值内存的指数：{paths}"},
    "exponents/path": {"en": "{name} {first:.2f} / {second:.2f}", "zh": "{name} {first:.2f} / {second:.2f}"},
    # --- the spec's own code ---
    "spec-1.5-self-attention": {
        "en": "n={n}, d_model={d_model}, same weights: rel. error {err:.2g}",
        "zh": "n={n}，d_model={d_model}，相同权重：相对误差 {err:.2g}"},
    "spec-3.2-sinusoidal": {
        "en": "{lengths} — exact in maths, not bitwise in fp32",
        "zh": "{lengths} —— 数学上完全相等，fp32 下并非逐位相同"},
    "spec-3.2-sinusoidal/length": {
        "en": "n={n}: max |spec − formula| {fp64:.2g} (fp64), {fp32:.2g} (fp32); qkv {qkv:.2g}",
        "zh": "n={n}：max |原文 − 公式| {fp64:.2g}（fp64），{fp32:.2g}（fp32）；qkv {qkv:.2g}"},
    "spec-q12-triu-mask": {
        "en": "n={n}: rel. error against is_causal=True {causal:.2g}, against qkv.causal_mask {mask:.2g}; token 0's "
              "output = its own value to {first:.2g} (diagonal kept)",
        "zh": "n={n}：与 is_causal=True 的相对误差 {causal:.2g}，与 qkv.causal_mask 的相对误差 {mask:.2g}；token 0 的"
              "输出 = 它自己的 V 行，误差 {first:.2g}（对角线保留）"},
    "spec-2.1-scores-shape": {
        "en": "n={n}, h={h}: spec scores {spec}, correct {right}; both outputs are {out}, so the bug passes shape "
              "checks; rel. error vs qkv.MultiHeadAttention: spec {spec_err:.3g}, correct {right_err:.2g}",
        "zh": "n={n}，h={h}：原文的 scores 形状 {spec}，正确的是 {right}；两者的输出都是 {out}，所以这个错误能通过形状"
              "检查；与 qkv.MultiHeadAttention 的相对误差：原文 {spec_err:.3g}，正确写法 {right_err:.2g}"},
    "spec-3.4-pe-check": {
        "en": "狗咬人 vs 人咬狗: spec check (no PE, PE) = ({spec_none}, {spec_pe}) — the spec prints (True, False); "
              "permutation test = ({perm_none}, {perm_pe})",
        "zh": "狗咬人 对 人咬狗：原文的检查（无 PE，有 PE）= ({spec_none}, {spec_pe}) —— 原文打印 (True, False)；"
              "置换检验 = ({perm_none}, {perm_pe})"},
    "spec-q2-packed-projection": {
        "en": "parameters {params}; nn.Linear submodules: {linears}{split}",
        "zh": "参数 {params}；nn.Linear 子模块：{linears}{split}"},
    "spec-q2-packed-projection/split": {
        "en": "; split into 4 projections it equals qkv's MHA to {err:.2g}",
        "zh": "；拆成 4 个投影后与 qkv 的 MHA 一致，误差 {err:.2g}"},
    "named": {"en": "{name} {value}", "zh": "{name} {value}"},  # a name (a Term) and its numbers
    # --- Q4 at decode time: the KV cache, read from `qkv study kv` ---
    "kv-cache-mla": {
        "en": "`qkv study kv` ({date}, {seeds} seeds) measured that it {verdict} at this scale: MLA {mla:.3f} bpc, "
              "MHA {mha:.3f} ({diff:+.3f}; seed std {noise:.3f}); MLA's cache {mla_n} numbers per token and layer "
              "against MHA's {mha_n}: {reduction:.1f} % smaller (the claim: at least {bar:.0f} %)",
        "zh": "`qkv study kv`（{date}，{seeds} 个种子）测得它在这个规模上{verdict}：`MLA` {mla:.3f} `bpc`，"
              "MHA {mha:.3f}（{diff:+.3f}；种子标准差 {noise:.3f}）；`MLA` 每 token 每层缓存 {mla_n} 个数，MHA "
              "{mha_n} 个：小 {reduction:.1f} %（论断要求至少 {bar:.0f} %）"},
    "study/holds": {"en": "holds", "zh": "成立"},
    "study/fails": {"en": "does not hold", "zh": "不成立"},
    "context-within": {
        "en": "`qkv study context` ({date}, {seeds} seeds) measured that it {verdict} at this scale: {scheme}'s bits "
              "per character at {factor}L over those at L: {ratios} (the claim: within {tol:.0f} %)",
        "zh": "`qkv study context`（{date}，{seeds} 个种子）测得它在这个规模上{verdict}：`{scheme}` 在 {factor}L 处的每字符"
              "比特数与 L 处之比：{ratios}（论断要求在 {tol:.0f} % 以内）"},
    "context-ratio": {"en": "{ratio:.3f} (L = {L})", "zh": "{ratio:.3f}（L = {L}）"},
    "context-yarn": {
        "en": "`qkv study context` ({date}, {seeds} seeds) measured that it {verdict} at this scale: without a "
              "fine-tune YaRN's bits per character are below PI's, NTK's and dynamic NTK's at {won} of {of} lengths "
              "past L; after the 4L fine-tune below PI's at {ft_won} of {ft_of}",
        "zh": "`qkv study context`（{date}，{seeds} 个种子）测得它在这个规模上{verdict}：不微调时，YaRN 的每字符比特数在超过 "
              "L 的 {of} 个长度中有 {won} 个低于 PI、NTK 和动态 NTK；在 4L 微调后，{ft_of} 个中有 {ft_won} 个低于 PI"},
}

# Names a summary shows, in each language (missing: shown as written, e.g. code names and models).
TERMS: dict[str, dict[str, str]] = {
    "zh": {"attention": "注意力", "MHA (fused)": "MHA（融合路径）", "MHA (reference)": "MHA（参考路径）",
           "GPT (causal)": "GPT（因果）", "reference": "参考路径", "fused": "融合路径", "linear": "线性注意力",
           "none": "无", "qkv preset paper-base": "qkv 预设 paper-base", "qkv preset gpt2": "qkv 预设 gpt2"},
}
# The words of a section label (§1.3 tip, Q10 (correction) …), in each language.
SECTION_WORDS: dict[str, dict[str, str]] = {
    "zh": {"tip": "提示", "correction": "更正", "why": "为什么", "paper": "论文", "view": "观点", "Roadmap": "路线图"},
}
SEPARATORS = {"en": {"; ": "; ", ", ": ", "}, "zh": {"; ": "；", ", ": ", "}}  # numbers keep ", " in every language


@dataclass(frozen=True)
class Message:
    """MESSAGES[key] with its values, rendered in a language on demand."""

    key: str
    values: dict[str, Any] = field(default_factory=dict)

    def render(self, lang: str) -> str:
        template = MESSAGES[self.key][language(lang)]
        return template.format(**{k: shown(v, lang) for k, v in self.values.items()})


@dataclass(frozen=True)
class Joined:
    """Parts (messages, terms or plain text) joined by ``sep`` as the language writes it ('; ' → '；')."""

    parts: Sequence[Any]
    sep: str = "; "

    def render(self, lang: str) -> str:
        return SEPARATORS[language(lang)][self.sep].join(str(shown(p, lang)) for p in self.parts)


@dataclass(frozen=True)
class Term:
    """A name that some languages translate (``TERMS``): 'attention' → '注意力'."""

    text: str

    def render(self, lang: str) -> str:
        return TERMS.get(language(lang), {}).get(self.text, self.text)


def shown(value: Any, lang: str) -> Any:
    """``value`` rendered in ``lang`` when it is a Message, Joined or Term; anything else as it is."""
    return value.render(lang) if isinstance(value, (Message, Joined, Term)) else value


def say(key: str, **values: Any) -> Message:
    """The summary MESSAGES[key] with ``values``; KeyError naming the key when the table lacks it."""
    if key not in MESSAGES:
        raise KeyError(f"no message {key!r} in qkv.claims.messages.MESSAGES")
    return Message(key, values)


def named(name: str, value: Any) -> Message:
    """'attention 1.44': a name, translated where TERMS has it, and its value."""
    return say("named", name=Term(name), value=value)


def render(summary: Message | Joined | str, lang: str) -> str:
    """A check's summary in ``lang``: a Message or Joined rendered, plain text as it is."""
    return str(shown(summary, lang))


def section_text(section: str, lang: str) -> str:
    """A section label in ``lang``: '§1.3 tip' → '§1.3 提示'; numbers and § unchanged."""
    words = SECTION_WORDS.get(language(lang), {})
    text = re.sub(r"[A-Za-z]+", lambda m: words.get(m[0], m[0]), section)
    return re.sub(r" \(([^)]*)\)", r"（\1）", text) if words else text  # Chinese brackets in Chinese


def fields(template: str) -> list[tuple[str, str, str | None]]:
    """(name, format spec, conversion) of each replacement field of ``template``, in order of name."""
    found = [(name, spec or "", conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    return sorted(found)
