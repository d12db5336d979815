"""A run's checkpoints: the run directory checked before anything is written, the one pair that captures and
restores the training state, saving (whole or sharded) and resuming."""
from __future__ import annotations

import sys
from dataclasses import replace

import torch

from ..fileio import DiskFullError, atomic_text
from .finetune import keyed_as_model, model_weights, set_model_weights
from .sharded_checkpoint import load_sharded, save_sharded
from .sharding import load_full
from .config import TrainConfig, check_same_run
from .state import TrainState


class Checkpoints:
    """A run's checkpoints, a collaborator of the run (``qkv.training.recipe.Recipe``): its directory (None: nothing
    is written) and the model it saves and restores (``engine``, ``qkv.training.setup.Engine``); the loop's
    counters (``TrainState``) and batch generator come in as arguments."""

    def __init__(self, cfg: TrainConfig, dist, run, engine, task) -> None:
        self.cfg, self.dist, self.run, self.engine, self.task = cfg, dist, run, engine, task
        self.last_saved: int | None = None
        self.sharded_saved: str | None = None  # the distributed checkpoint train_state.pt names

    def check_out(self) -> TrainState | None:
        """Refuse a run directory that cannot take this run, before anything is read or written;
        on --resume, the saved state (None when the run stopped before its first checkpoint)."""
        cfg, run = self.cfg, self.run
        if run is None:
            return None
        if not cfg.resume:
            if run.path.exists() and not run.path.is_dir():
                raise ValueError(f"--out {run} exists and is not a directory")
            if not run.is_empty() and not cfg.overwrite:
                raise ValueError(f"{run} already exists; pass --resume to continue it or --overwrite to start again")
            return None
        if not run.has(run.TRAIN_CONFIG) or run.has(run.STATE):
            run.check()  # names what is missing; a run stopped before its first checkpoint passes
        check_same_run(TrainConfig.for_resume(run.path), self.cfg)
        if run.has(run.STATE):
            return TrainState.from_dict(run.load_state(), where=str(run / run.STATE))
        if self.dist.is_main:
            print(f"qkv: {run} has no checkpoint yet (stopped before its first one): starting from step 0",
                  file=sys.stderr)
        return None

    # --- the one pair that saves and restores ----------------------------------------------------
    def capture_state(self, state: TrainState, batch_gen: torch.Generator) -> TrainState:
        """``state``'s counters and the RNGs; the weights and optimizer in it, or under fsdp in the distributed
        checkpoint every rank writes now (a collective)."""
        e = self.engine
        cuda = torch.cuda.get_rng_state(e.device) if e.device.type == "cuda" else None
        weights, optimizer, sharded = None, None, None
        if e.sharding == "fsdp":
            sharded = self.save_sharded(state.step)
        else:
            weights, optimizer = model_weights(e.model), e.opt.state_dict()
        threads = torch.get_num_threads() if e.device.type == "cpu" else None
        return replace(state, model=weights, optimizer=optimizer, sharded=sharded, threads=threads,
                       batch_rng=batch_gen.get_state(), torch_rng=torch.get_rng_state(), cuda_rng=cuda)

    def save_sharded(self, step: int) -> str:
        """Every rank writes its shards of the weights and optimizer into step ``step``'s folder (what a killed
        run left there is removed first; the complete checkpoint train_state.pt names is kept)."""
        name = self.run.sharded_name(step)
        if self.dist.is_main:
            self.run.discard_sharded(keep=self.sharded_saved)
        self.dist.barrier()
        save_sharded(self.engine.model, self.engine.opt, self.run / name)
        return name

    def restore(self, saved: TrainState, batch_gen: torch.Generator) -> tuple[TrainState, list[dict]]:
        """Weights (checked against model.safetensors' checksum first), optimizer, RNGs (``batch_gen``'s too);
        the counters to go on from and the metrics records so far."""
        from .run_dir import check_weights, load_weights

        e = self.engine
        if e.sharding == "fsdp":  # no rank holds the whole model: the file is read one tensor at a time
            check_weights(self.run.path)
        else:
            load_weights(e.model, self.run.path, device=e.device)  # refuses a damaged model.safetensors
        try:  # then the weights saved with the optimizer: one consistent snapshot, even if a kill split the files
            self.restore_training(saved)
        except (ValueError, KeyError, RuntimeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # one line
            raise ValueError(f"{self.run / self.run.STATE} does not match the model: {first}") from None
        self.sharded_saved = saved.sharded
        batch_gen.set_state(saved.batch_rng)
        torch.set_rng_state(saved.torch_rng)
        if e.device.type == "cuda" and saved.cuda_rng is not None:
            torch.cuda.set_rng_state(saved.cuda_rng, e.device)
        live = {k: None for k in ("model", "optimizer", "batch_rng", "torch_rng", "cuda_rng", "threads")}
        self.last_saved = saved.step
        # the live objects hold the rest
        return replace(saved, running=list(saved.running), **live), self.run.read_metrics(saved.step)

    def restore_training(self, saved: TrainState) -> None:
        """The trained weights and the optimizer: from a distributed checkpoint (resharded to this world size),
        else from the whole state dicts in ``saved`` (under fsdp each rank keeps its shards of them)."""
        where, model, opt = str(self.run / self.run.STATE), self.engine.model, self.engine.opt
        if saved.sharded is not None:
            load_sharded(model, opt, self.run / saved.sharded)
        elif self.engine.sharding == "fsdp":  # a LoRA run's state holds the adapters alone: the base is in the model
            weights = keyed_as_model(model, saved.model, where=where)
            load_full(model, opt, weights, saved.optimizer, strict=not self.cfg.lora)
        else:
            set_model_weights(model, saved.model, where=where)
            opt.load_state_dict(saved.optimizer)

    def save(self, state: TrainState, batch_gen: torch.Generator) -> None:
        """The model files, then the training state (rank 0); a full disk keeps the last complete checkpoint."""
        if self.run is None:
            return
        whole = self.engine.gathered_model(frozen=not self.cfg.lora)  # fsdp: rank 0's alone, freed once written
        step = state.step
        state = self.capture_state(state, batch_gen) if self.dist.is_main or self.engine.sharding == "fsdp" else None
        if not self.dist.is_main:
            return
        try:
            self.run.save_model(whole, self.task.tokenizer, step=step)
            self.run.save_state(state.to_dict())  # last: it names the complete distributed checkpoint, if any
            self.sharded_saved = state.sharded
            self.run.discard_sharded(keep=self.sharded_saved)
        except DiskFullError as e:
            kept = "no checkpoint was written yet" if self.last_saved is None else \
                f"the last complete checkpoint (step {self.last_saved}) is kept; after freeing space, continue " \
                f"with: qkv train --resume --out {self.run}"
            raise ValueError(f"{e}; {kept}") from None
        self.last_saved = step

    def begin_writing(self, records: list[dict]) -> None:
        if self.run is None or not self.dist.is_main:
            return
        if self.cfg.overwrite:
            self.run.clear()
        self.run.write_json(self.run.TRAIN_CONFIG, self.cfg.to_dict() | {"resume": False, "overwrite": False})
        for name, text in self.task.run_files().items():
            atomic_text(self.run / name, text)
        self.run.write_metrics(records)
