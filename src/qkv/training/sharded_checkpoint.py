"""The resume state of an fsdp run as a distributed checkpoint (``torch.distributed.checkpoint``, DCP).

Every rank writes its own shards of the trained weights and of AdamW's state (``__R_0.distcp``), rank 0
the index of them (``.metadata``, last, once every rank has written). Loading reshards: a checkpoint
written by N processes loads into M processes, fsdp or not, or into one process without torchrun.
Frozen parameters (a LoRA run's base) are left out: they come from the base checkpoint.

Nothing here runs code from the files it reads: tensors are read with ``weights_only=True``, and the
pickled index may name only DCP's own metadata classes, ``torch.Size`` and dtypes (``SafeUnpickler``).
"""
from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch
from torch import nn

INDEX = ".metadata"  # DCP's index of the shards, written last: a directory without it is incomplete


class SafeUnpickler(pickle.Unpickler):
    """DCP's index, refusing any global but its own metadata classes, ``torch.Size``, dtypes and layouts."""

    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}

    def find_class(self, module: str, name: str):
        allowed = (module, name) in self.ALLOWED or module == "torch.distributed.checkpoint.metadata" or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if not allowed:
            raise pickle.UnpicklingError(f"a DCP index may not name {module}.{name}")
        return super().find_class(module, name)


def reader(path: Path):
    """A ``FileSystemReader`` whose index is read by ``SafeUnpickler``."""
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, rank: int | None = None, **kwargs):
            name = INDEX if rank is None else f"__{rank}{INDEX}"  # DCP asks for a rank's own index first
            metadata = SafeUnpickler(io.BytesIO((Path(self.path) / name).read_bytes())).load()
            metadata.storage_meta = metadata.storage_meta or _storage_meta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(path)


def _storage_meta():
    from torch.distributed.checkpoint.metadata import StorageMeta

    return StorageMeta()


def planner():
    """DCP's default load planner, reading non-tensor values (AdamW's hyperparameters) with weights_only."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class WeightsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            checked = io.BytesIO()  # the value read safely, then handed on as bytes DCP reads back itself
            torch.save(torch.load(value, weights_only=True), checked)
            checked.seek(0)
            super().load_bytes(read_item, checked)

    return WeightsOnlyPlanner()


def state_dicts(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The trained weights and the optimizer's state, keyed by parameter name (each rank's shards under
    fsdp, whole tensors otherwise)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    weights, optimizer = get_state_dict(model, opt, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": weights, "optimizer": optimizer}


def is_complete(path: Path) -> bool:
    return (path / INDEX).is_file()


def save_sharded(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    """Write this rank's shards into ``path`` (a collective: every rank calls it; the index comes last)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dicts(model, opt), checkpoint_id=path)


def load_sharded(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    """Fill ``model`` and ``opt`` from the DCP checkpoint ``path``, whatever world size wrote it (every rank
    calls it). ValueError when it is incomplete or does not hold this model's weights and optimizer."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if not is_complete(path):
        raise ValueError(f"{path} is not a complete distributed checkpoint (no {INDEX})")
    try:  # once here, for a clear message; DCP reads it again through the same unpickler
        SafeUnpickler(io.BytesIO((path / INDEX).read_bytes())).load()
    except Exception as e:  # noqa: BLE001 - UnpicklingError, EOFError, … for a damaged or hostile index
        why = str(e)[:200] or type(e).__name__
        raise ValueError(f"{path / INDEX} is not a distributed checkpoint's index ({why})") from None
    state = state_dicts(model, opt)
    alone = not (dist.is_available() and dist.is_initialized())
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(state, storage_reader=reader(path), planner=planner(), no_dist=alone)
    except (Exception, dcp.CheckpointException) as e:  # noqa: BLE001 - CheckpointException is a BaseException
        lines = [x for x in str(e).splitlines() if x.strip()]
        raise ValueError(f"{path} does not match this model ({(lines[-1] if lines else type(e).__name__)[:200]})") \
            from None
    # not strict: the frozen weights are left out on purpose, and DCP has just filled every key of ``state``
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(ignore_frozen_params=True, strict=False))
