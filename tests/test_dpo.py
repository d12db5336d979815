"""--task dpo: the losses against TRL's on fixed log-probabilities, the reference at the start (ln 2, no
margin), a short run raising reward accuracy, the answer-only scoring, and bad input."""
import json
import math

import pytest
import torch

from qkv.cli import main
from qkv.data import CharTokenizer
from qkv.training.recipe import TrainConfig, train
from benchmarks.trl import trl_dpo_loss
from qkv.training.tasks.dpo import LOSSES, preference_loss


def pairs(n: int = 48) -> list[dict]:
    """Arithmetic questions: the right sum chosen, a wrong one rejected; half as strings, half as messages."""
    out = []
    for i in range(n):
        a, b = i % 7, i % 5
        q, right, wrong = f"{a}+{b}?", str(a + b), str(a + b + 1 + i % 3)
        if i % 2:
            out.append({"prompt": q, "chosen": right, "rejected": wrong})
        else:
            out.append({"prompt": [{"role": "user", "content": q}],
                        "chosen": [{"role": "assistant", "content": right}],
                        "rejected": [{"role": "assistant", "content": wrong}]})
    return out


def write_jsonl(path, records) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


@pytest.mark.parametrize("kind, smoothing", [(k, 0.0) for k in LOSSES] + [("robust", 0.2)])
def test_the_losses_and_rewards_are_trls_on_fixed_log_probabilities(kind, smoothing):
    pytest.importorskip("trl", reason="TRL (the dev extra) is the loss functions' reference")
    g = torch.Generator().manual_seed(0)
    logps = [torch.randn(8, generator=g, dtype=torch.float64) * 3 - 20 for _ in range(4)]
    lengths = tuple(torch.randint(1, 12, (8,), generator=g) for _ in range(2))  # answers of different lengths
    losses, r_w, r_l = preference_loss(*logps, beta=0.1, kind=kind, lengths=lengths, label_smoothing=smoothing)
    theirs, metrics = trl_dpo_loss(kind, logps, 0.1, lengths, smoothing)
    assert losses.mean().item() == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    assert r_w.mean().item() == pytest.approx(metrics["rewards/chosen"], rel=1e-9)
    assert r_l.mean().item() == pytest.approx(metrics["rewards/rejected"], rel=1e-9)
    assert (r_w > r_l).double().mean().item() == pytest.approx(metrics["rewards/accuracies"])
    assert (r_w - r_l).mean().item() == pytest.approx(metrics["rewards/margins"], rel=1e-9)


def test_the_formulas_by_hand():
    c, r, rc, rr = (torch.tensor([v]) for v in (-10.0, -12.0, -11.0, -11.0))  # h = 2
    one = (torch.tensor([1]), torch.tensor([1]))
    assert preference_loss(c, r, rc, rr, beta=0.5)[0].item() == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))
    assert preference_loss(c, r, rc, rr, beta=0.5, kind="ipo", lengths=one)[0].item() == pytest.approx((2 - 1) ** 2)
    two = (torch.tensor([2]), torch.tensor([4]))  # ρ_w = 1 over 2 tokens, ρ_l = −1 over 4: the averages 0.5, −0.25
    assert preference_loss(c, r, rc, rr, beta=0.5, kind="ipo", lengths=two)[0].item() == pytest.approx(0.25 ** 2)
    assert preference_loss(c, r, rc, rr, beta=0.25, kind="hinge")[0].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dpo_loss must be one of sigmoid, hinge, ipo, .*got 'kto'"):
        preference_loss(c, r, rc, rr, beta=0.1, kind="kto")
    with pytest.raises(ValueError, match="give lengths"):
        preference_loss(c, r, rc, rr, beta=0.1, kind="ipo")


def dpo_config(data: str, **kw) -> TrainConfig:
    base = dict(task="dpo", preset="tiny", data=data, vocab_size=300, max_steps=0, batch_size=8, eval_interval=10,
                lr=3e-3, threads=1, progress=False, seed=1, device="cpu")
    return TrainConfig(**(base | kw))


def test_at_the_start_the_policy_is_the_reference(tmp_path):
    s = train(dpo_config(write_jsonl(tmp_path / "p.jsonl", pairs()))).summary
    assert s["val_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert s["val_reward_margin"] == pytest.approx(0, abs=1e-5) and s["val_reward_accuracy"] == 0


@pytest.mark.parametrize("precompute", [False, True])
def test_training_raises_reward_accuracy(tmp_path, precompute):
    data = write_jsonl(tmp_path / "p.jsonl", pairs(96))
    options = {"precompute_ref": precompute, "beta": 0.5}
    s = train(dpo_config(data, max_steps=40, warmup_steps=10, task_options=options)).summary
    assert s["val_loss"] < math.log(2) and s["val_reward_margin"] > 0 and s["val_reward_accuracy"] > 0.5, s


def test_only_the_answer_is_scored(tmp_path):
    from qkv.data.chat_template import CHATML
    from qkv.data.conversations import Preference
    from qkv.training.tasks.chat_data import ChatData
    from qkv.training.tasks.dpo import DPOOptions, DPOTask, encode_pair

    task = DPOTask()
    task.options = DPOOptions()
    task.chat = ChatData(CHATML, {}, "ChatML", task.options)
    task.tokenizer = CharTokenizer.train(CHATML + "abcdefghijklmnopqrstuvwxyz?+0123456789 ")
    prompt = ({"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"})
    pair = Preference(prompt, ({"role": "assistant", "content": "yes"},), ({"role": "assistant", "content": "no"},),
                      "x:1")
    (ids, scored, _), _ = encode_pair(task.chat, task.tokenizer, pair)
    assert task.tokenizer.decode(ids[scored].tolist()) == "yes<|im_end|>"  # not the prompt's own answer a1


@pytest.mark.parametrize("extra, message", [
    (["--beta", "0"], "beta must be > 0, got 0.0"),
    (["--dpo-loss", "kto"], "invalid choice: 'kto'"),
    (["--dpo-loss", "robust", "--label-smoothing", "0.5"], "label_smoothing must be in [0, 0.5), got 0.5"),
])
def test_bad_settings(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    code = main(["train", "--task", "dpo", "--preset", "tiny", "--data", write_jsonl(tmp_path / "p.jsonl", pairs()),
                 "--max-steps", "1", "--out", str(out), "--quiet", "--device", "cpu", *extra])
    assert code == 2 and message in capsys.readouterr().err and not out.exists()


def dpo_step_gradients(data: str, accum: int, kind: str) -> tuple[float, dict]:
    """The loss and gradients of one DPO step as the loop takes it, the policy moved off the reference first
    (the same way for every cut), so that the pairs' losses differ."""
    from qkv.training.distributed import Dist
    from qkv.training.loop import step_batches
    from qkv.training.recipe import Recipe

    r = Recipe(dpo_config(data, max_steps=1, batch_size=4, grad_accum=accum, task_options={"dpo_loss": kind}), Dist())
    r.setup()
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in r.engine.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=noise))
    micros, divisors = step_batches(r.task, r.loop.batch_gen, 0, r.cfg, r.dist)
    loss = 0.0
    for m, d in zip(micros, divisors):
        part = r.task.loss(r.engine.model, m) / d
        part.backward()
        loss += float(part.detach())
    return loss, {n: p.grad.clone() for n, p in r.engine.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
def test_accumulation_takes_the_step_of_one_big_batch(tmp_path, kind):
    """4 micro-batches of 1 pair and 1 of 4 pairs: the same mean over the step's pairs, the same gradients."""
    data = write_jsonl(tmp_path / "p.jsonl", pairs())
    (whole, grads), (cut, cut_grads) = dpo_step_gradients(data, 1, kind), dpo_step_gradients(data, 4, kind)
    assert whole == pytest.approx(cut, abs=1e-6) and abs(whole - math.log(2)) > 1e-4
    assert grads.keys() == cut_grads.keys() and grads
    for name, g in grads.items():
        torch.testing.assert_close(cut_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)
