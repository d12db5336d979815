"""How the training recipe spreads a model over a ``torchrun`` job, and activation checkpointing.

    none   one process, the whole model, gradients and AdamW state in it
    ddp    every rank holds a whole replica; gradients are all-reduced (DistributedDataParallel)
    fsdp   FSDP2 (``torch.distributed.fsdp.fully_shard``): each block, then the root, is sharded per
           parameter (DTensor, dim 0 over the ranks); a block's weights are all-gathered for its forward
           and backward and its gradients reduce-scattered, so weights, gradients and AdamW state take
           1/world of the memory each (Zhao et al. 2023, "PyTorch FSDP", arXiv:2304.11277). No rank keeps
           a whole copy: evaluation runs the sharded model itself, saving gathers the weights to rank 0
           alone (``full_weights``) around a meta-device skeleton (``whole_from``)

Activation checkpointing (Chen et al. 2016, arXiv:1604.06174) keeps only each block's inputs in the
forward and recomputes the block in the backward (``torch.utils.checkpoint``, non-reentrant), for any of
the three. Both act on the training model instance; the reference modules are not changed.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

SHARDINGS = ("auto", "none", "ddp", "fsdp")


def check_sharding(name: str) -> None:
    if name not in SHARDINGS:
        raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, got {name!r}")


def resolve_sharding(name: str, world: int) -> str:
    """``auto``: ddp under torchrun (world > 1), none in one process. ddp and fsdp need torchrun with 2+
    processes; none under torchrun would train unsynchronised copies: both are refused (ValueError)."""
    check_sharding(name)
    if name == "auto":
        return "ddp" if world > 1 else "none"
    if name in ("ddp", "fsdp") and world == 1:
        raise ValueError(f"--sharding {name} spreads training over processes: launch it with "
                         f"torchrun --nproc_per_node N (N >= 2), got 1 process; in one process use --sharding none")
    if name == "none" and world > 1:
        raise ValueError(f"--sharding none under torchrun would train {world} unsynchronised copies; "
                         "use --sharding ddp or fsdp (or auto)")
    return name


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: the members of the model's outermost ``nn.ModuleList``s (decoder, encoder layers)."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and not any(name.startswith(f"{b}.") for b, _ in found):
            found += [(f"{name}.{i}", block) for i, block in enumerate(m)]
    return [block for _, block in found]


class Checkpointed:
    """A block's forward that, while gradients are recorded, keeps only its inputs and recomputes the
    block in the backward (dropout masks too: the RNG state is replayed)."""

    def __init__(self, forward) -> None:
        self.forward = forward

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module) -> int:
    """Activation checkpointing on each block of ``model`` (this instance only); returns how many."""
    blocks = model_blocks(model)
    for block in blocks:
        if not isinstance(block.forward, Checkpointed):
            block.forward = Checkpointed(block.forward)
    return len(blocks)


def has_bf16(device: torch.device) -> bool:
    """``device`` is a GPU with native bf16 (``qkv.runtime.cuda_bf16``: emulated bf16 is slower than fp32)."""
    from ..runtime import cuda_bf16

    return device.type == "cuda" and cuda_bf16(str(device))


def shard_model(model: nn.Module, device: torch.device, world: int, *, bf16: bool = False) -> nn.Module:
    """FSDP2 in place: ``fully_shard`` each block, then the root (embeddings, head, final norm). With ``bf16``
    on a device that has it, blocks compute in bfloat16 and reduce gradients in float32; otherwise float32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if bf16 and has_bf16(device) else MixedPrecisionPolicy()
    for block in model_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def shard_frozen(model: nn.Module, device: torch.device, world: int, *, bf16: bool = False) -> nn.Module:
    """A model that only runs forwards without gradients (DPO's reference), moved to ``device`` and sharded as
    ``shard_model`` shards the trained one, so no rank holds a whole copy; its root's weights are dropped again after
    each forward (FSDP2 keeps a root's gathered for the backward, which never comes). A collective to run."""
    shard_model(model.to(device), device, world, bf16=bf16)
    model.register_forward_hook(lambda module, args, out: module.reshard())
    return model


def decode_backend(model: nn.Module) -> str:
    """The decode backend (``qkv.generation.generate``'s ``backend``) for ``model``: "eager" where FSDP shards any of
    it (each forward all-gathers weights: collectives that a CUDA graph or a compiled step must not record), else
    "auto"."""
    from torch.distributed.fsdp import FSDPModule

    return "eager" if any(isinstance(m, FSDPModule) for m in model.modules()) else "auto"


def full_weights(model: nn.Module, *, frozen: bool = True) -> dict[str, Tensor]:
    """The sharded model's whole state dict, gathered on rank 0 alone into CPU memory (the other ranks get an
    empty dict); ``frozen=False`` leaves the frozen parameters out (a LoRA run's base). A collective: every
    rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=not frozen)
    return get_model_state_dict(model, options=options)


def whole_from(skeleton: nn.Module, weights: dict[str, Tensor], sharded: nn.Module, *,
               strict: bool = True) -> nn.Module:
    """``skeleton`` (the model ``sharded`` was, built again on the meta device) around the gathered ``weights``
    themselves (assigned, not copied), tied where ``sharded`` is tied, with ``sharded``'s buffers (FSDP does not
    shard them). Not ``strict``: parameters missing from ``weights`` stay on the meta device."""
    for name, t in weights.items():  # on CPU they are views into each group's gathered buffer, which
        if t.untyped_storage().nbytes() != t.nbytes:  # safetensors refuses: copied one at a time, a buffer
            weights[name] = t.clone()  # goes once its last view is copied
    skeleton.load_state_dict(weights, strict=strict, assign=True)
    first: dict[int, str] = {}
    for name, p in sharded.named_parameters(remove_duplicate=False):
        if id(p) in first:  # assign gave each name its own tensor: share the first's again
            set_tensor(skeleton, name, skeleton.get_parameter(first[id(p)]))
        first.setdefault(id(p), name)
    for name, b in sharded.named_buffers():
        if skeleton.get_buffer(name).is_meta:  # not in the state dict (non-persistent)
            set_tensor(skeleton, name, b)
    return skeleton


def set_tensor(model: nn.Module, name: str, value: Tensor) -> None:
    """Register ``value`` as ``model``'s parameter or buffer ``name`` (a dotted path)."""
    owner, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(owner), leaf, value)


def load_full(model: nn.Module, opt: torch.optim.Optimizer, weights: dict, optimizer: dict, *,
              strict: bool = True) -> None:
    """Shard whole state dicts (every rank holds them) into the sharded model and its optimizer; not ``strict``:
    ``weights`` may leave parameters out (a LoRA run's frozen base, already in the model)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, weights, options=options)
    optimizer = keyed_by_name(optimizer, model, opt)
    set_optimizer_state_dict(model, opt, optimizer, options=options)


def keyed_by_name(optimizer: dict, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """A plain ``opt.state_dict()`` (parameters numbered, as none and ddp save it) keyed by parameter name,
    as fsdp's full state dicts are; one keyed by name already is returned as it is."""
    groups = optimizer["param_groups"]
    if all(isinstance(i, str) for g in groups for i in g["params"]):
        return optimizer
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in opt.param_groups]:
        raise ValueError(f"the optimizer state has groups of {[len(g['params']) for g in groups]} parameters, "
                         f"this model's optimizer {[len(g['params']) for g in opt.param_groups]}")
    names = {id(p): n for n, p in model.named_parameters()}
    name_of = {i: names[id(p)] for g, live in zip(groups, opt.param_groups)
               for i, p in zip(g["params"], live["params"])}
    return {"state": {name_of[i]: v for i, v in optimizer["state"].items()},
            "param_groups": [g | {"params": [name_of[i] for i in g["params"]]} for g in groups]}


def local_parameter_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds: its DTensor shards under fsdp, else every parameter."""
    local = lambda p: p.to_local() if hasattr(p, "to_local") else p  # noqa: E731
    return sum(local(p).numel() * p.element_size() for p in model.parameters())
