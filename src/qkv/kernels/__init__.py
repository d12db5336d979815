"""The speed layer: qkv's CPU kernels and the transforms that apply them on top of a model.

    transform.py    accelerate / restore / accelerated: a model's linears served by the kernels, in place
                    (accelerate_training, accelerated(training=True): its attention by training.py's path,
                    its mixtures of experts by moe_training.py's)
    training.py     attention in training: q, k, v in one product; the core in fp32 where a CPU's bf16 is slower
    moe_training.py mixture-of-experts layers in training: each expert product one torch._grouped_mm
    linear.py       F.linear at inference on a CPU through oneDNN, inductor's reduction or qkv's matvec kernel
    moe.py          mixture-of-experts layers at inference: qkv's MoE kernel for a few tokens (csrc/moe.cpp),
                    the gathered dispatch inside the compiled step otherwise
    fused_step.py   one decoded token through a whole pre-norm decoder in one C++ call, for the models and
                    settings it accepts (an allow-list); generate falls back, saying why, for the rest
    quant.py        quantize_weights: the linears' weights to int8 through torchao (weight-only), in place
    build.py        building the C++ sources (csrc/) once per machine, remembering a build that failed

Nothing in the reference layers (qkv.nn, qkv.models) imports this package: it is applied on top.
"""
from .quant import quantize_weights
from .transform import accelerate, accelerate_training, accelerated, restore

__all__ = ["accelerate", "accelerate_training", "accelerated", "quantize_weights", "restore"]
