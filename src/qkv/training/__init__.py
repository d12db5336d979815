"""Training: the recipe (TrainConfig, train), what a run learns (tasks/), the run directory it writes,
fine-tuning a real checkpoint (LoRA), torchrun, and the translation metrics.

    recipe.py        setup → restore → repeat { step → [evaluate → save] } → summarise, around one TrainState;
                     its parts: config.py (TrainConfig), setup.py, loop.py, checkpointing.py, state.py, report.py
    optim.py, muon.py the optimizers (AdamW; Muon, its Newton–Schulz precision by machine) and the schedules
    tasks/           language modelling (lm) and translation: a batch, a loss, the validation metrics
    run_dir.py       the run directory: its files, atomic writes, its lock; load_run for inference
    finetune.py      the base checkpoint, its identity, LoRA adapters
    distributed.py   this process's place in a torchrun job
    metrics.py       BLEU, chrF and the two baselines a translation model must beat
    export.py        a run as a Hugging Face directory (qkv export)
"""
from .recipe import TrainConfig, TrainResult, train
from .run_dir import Run, RunDir, load_run

__all__ = ["TrainConfig", "TrainResult", "train", "Run", "RunDir", "load_run"]
