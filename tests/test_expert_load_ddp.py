"""Aux-loss-free balancing under DDP (qkv.training.expert_load): two gloo processes on CPU under torchrun, each
training on its own share of the batches, move every router's correction bias alike — by the loads summed over
the processes, as one process would from those summed loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from qkv.training.expert_load import update_bias

SPEED, STEPS = 0.01, 5
# Under torchrun: a tiny MoE model (blocks 1 and 2 of 4 experts) trained for STEPS steps by the recipe; each rank
# writes the loads it counted itself before each update (the spy) and its routers' biases at the end.
SCRIPT = """
import json, os, sys
from qkv.data import Corpus
from qkv.models import ModelConfig
from qkv.training.expert_load import ExpertLoad
from qkv.training.recipe import TrainConfig, train

own = []
after_step = ExpertLoad.after_step
def spy(self):
    own.append(self.step_load.tolist())  # (L, E) this rank's tokens per expert, before the sum
    after_step(self)
ExpertLoad.after_step = spy

speed, steps = float(sys.argv[2]), int(sys.argv[3])
text = "".join(f"def f{i}(x):\\n    return x * {i} + {i % 7}\\n\\n" for i in range(300))
moe = dict(num_experts=4, d_expert=16, bias_update_speed=speed, layers=("dense", "moe", "moe"))
model = ModelConfig(d_model=16, num_layers=3, max_len=32, moe=moe, position=dict(kind="rope"),
                    attention=dict(num_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                    feed_forward=dict(activation="swiglu", bias=False), normalization=dict(kind="rmsnorm"))
cfg = TrainConfig(model=model, max_steps=steps, batch_size=8, context=32, eval_interval=100, eval_windows=2,
                  lr=1e-2, threads=1, warmup_steps=1, progress=False, final_eval=False, device="cpu", seed=5)
result = train(cfg, corpus=Corpus(train=text[:-2000], val=text[-2000:], source="test"))
biases = [m.correction_bias.tolist() for m in result.model.modules() if getattr(m, "correction_bias", None) is not None]
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"own": own, "biases": biases}, f)
"""
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}


def replay(loads: list[torch.Tensor]) -> torch.Tensor:
    """The biases (L, E) one process computes from each step's loads (L, E), starting from zero."""
    bias = torch.zeros(loads[0].shape)
    for step_load in loads:
        for b, layer_load in zip(bias, step_load):
            update_bias(b, layer_load, SPEED)
    return bias


def test_every_rank_moves_its_bias_by_the_summed_loads(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    done = subprocess.run([*TORCHRUN, str(tmp_path / "script.py"), str(tmp_path), str(SPEED), str(STEPS)],
                          env=ENV, capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    own = [torch.tensor(r["own"]) for r in ranks]  # (STEPS, L, E) each
    assert own[0].shape == (STEPS, 2, 4) and not torch.equal(own[0], own[1])  # different data, different loads
    b0, b1 = (torch.tensor(r["biases"]) for r in ranks)  # (L, E)
    assert torch.equal(b0, b1)  # every rank alike
    assert torch.equal(b0, replay(list(own[0] + own[1])))  # = one process's update from the summed loads
    assert b0.abs().sum() > 0 and not torch.equal(b0, replay(list(own[0])))  # a rank's own loads alone differ
