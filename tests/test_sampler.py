"""qkv.training.sampler: each row once per epoch, in the order transformers' Trainer visits them."""
import pytest
import torch

from qkv.training.sampler import EpochSampler


def trainer_order(n: int, seed: int, batch: int, epochs: int) -> list[int]:
    """The rows a transformers Trainer's training dataloader gives, epoch by epoch, as its loop asks for them."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    args = transformers.TrainingArguments(output_dir="/tmp/qkv-sampler-test", per_device_train_batch_size=batch,
                                          seed=seed, report_to=[], remove_unused_columns=False, use_cpu=True)
    trainer = transformers.Trainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=[{"x": i} for i in range(n)],
                                   data_collator=lambda rows: torch.tensor([r["x"] for r in rows]))
    loader = trainer.get_train_dataloader()
    order = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)  # as Trainer's loop does at each epoch
        order += [i for b in loader for i in b.tolist()]
    return order


@pytest.mark.parametrize("n,seed,batch", [(64, 42, 8), (12, 3, 4), (10, 0, 5)])
def test_the_order_is_the_trainers(n, seed, batch):
    expected = trainer_order(n, seed, batch, epochs=3)
    sampler = EpochSampler(n, seed)
    steps = [sampler.step(k, batch) for k in range(3 * n // batch)]
    assert torch.cat(steps).tolist() == expected


def test_every_row_once_per_epoch_and_a_step_runs_into_the_next_epoch():
    sampler = EpochSampler(5, 7)
    assert sorted(sampler.positions(0, 5).tolist()) == list(range(5))
    assert sampler.step(1, 4).tolist() == sampler.positions(4, 1).tolist() + sampler.epoch(1)[:3].tolist()
    assert sampler.step(3, 4).tolist() == sampler.positions(12, 4).tolist()  # the same rows asked again
    with pytest.raises(ValueError, match="at least one row, got n=0"):
        EpochSampler(0, 1)
