"""The translation task in the training recipe: pairs → Transformer → beam search → BLEU / chrF."""
import pytest
import torch

from qkv.training import run_dir as ckpt
from qkv.data.catalogs import load_pairs
from qkv.models import GPT, ModelConfig, Transformer
from qkv.training.tasks.translation import translate_texts
from qkv.training.recipe import TrainConfig, train

WORDS = ["file", "open", "save", "close", "error", "print", "copy", "delete", "network", "user"]
ZH = ["文件", "打开", "保存", "关闭", "错误", "打印", "复制", "删除", "网络", "用户"]
TINY = ModelConfig(d_model=32, attention=dict(num_heads=2), position=dict(kind="sinusoidal"),
                   feed_forward=dict(d_ff=64, activation="relu"), num_layers=2, max_len=32, dropout=0.0)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    lines = [f"{a} {b} %s\t{za}{zb} %s" for a, za in zip(WORDS, ZH) for b, zb in zip(WORDS, ZH) if a != b]
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cfg(pairs, **kw) -> TrainConfig:
    base = dict(task="translate", data=str(pairs), model=TINY, vocab_size=300, max_steps=4, batch_size=8,
                eval_interval=2, progress=False, final_eval=False, threads=1)
    return TrainConfig(**(base | kw | {"task_options": {"num_beams": 2} | kw.get("task_options", {})}))


def test_translation_run_writes_a_transformer_run_and_scores_it(pairs_file, tmp_path):
    out = tmp_path / "run"
    r = train(cfg(pairs_file, out=str(out), final_eval=True))
    s = r.summary
    for key in ("bleu", "chrf", "greedy_chrf", "copy_bleu", "copy_chrf", "memory_bleu", "memory_chrf", "val_loss"):
        assert isinstance(s[key], float) and s[key] >= 0, key
    assert s["task"] == "translate" and s["train_pairs"] + s["val_pairs"] == 90 and s["target_lang"] == "zh_CN"
    assert s["memory_chrf"] > s["copy_chrf"]  # neighbours share words: the memory is informative here
    assert {r["step"] for r in r.metrics} == {2, 4} and all("val_loss" in m for m in r.metrics)
    run = ckpt.load_run(out)
    assert isinstance(run.model, Transformer)
    (text,) = translate_texts(run.model, run.tokenizer, ["open file %s"], num_beams=2)
    assert isinstance(text, str)


@pytest.mark.parametrize("recipe", [{}, {"optimizer": "muon", "schedule": "wsd"}])  # the translate preset's
def test_translation_resume_is_exact(pairs_file, tmp_path, recipe):
    full = train(cfg(pairs_file, out=str(tmp_path / "a"), **recipe))
    saved = TrainConfig.for_resume(tmp_path / "a")
    assert (saved.optimizer, saved.schedule) == (recipe.get("optimizer", "adamw"), recipe.get("schedule", "cosine"))
    train(cfg(pairs_file, out=str(tmp_path / "b"), **recipe), stop_at=2)
    resumed = train(TrainConfig.for_resume(tmp_path / "b", progress=False))
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_loss_is_label_smoothed_cross_entropy(pairs_file):
    from qkv.training.distributed import Dist
    from qkv.training.loop import step_batches
    from qkv.training.recipe import Recipe

    recipe = Recipe(cfg(pairs_file, task_options={"label_smoothing": 0.3}), Dist())
    recipe.setup()
    (micro,), (divisor,) = step_batches(recipe.task, torch.Generator().manual_seed(0), 0, recipe.cfg, recipe.dist)
    src, src_mask, tgt_in, targets, tokens = micro
    assert divisor == tokens == (targets != -100).sum()  # one process, one micro-batch: its own target tokens
    assert (targets == -100).any() and (src_mask == 0).any()  # a padded batch
    logits = recipe.engine.model(src, tgt_in, src_mask=src_mask).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                                             label_smoothing=0.3)
    assert torch.allclose(recipe.task.loss(recipe.engine.model, micro) / divisor, want)


def test_a_language_model_cannot_translate():
    from qkv.data import BPETokenizer, SPECIAL_TOKENS

    tok = BPETokenizer.train(["hello world"] * 10, 300, special_tokens=SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="encoder-decoder"):
        translate_texts(GPT(ModelConfig(vocab_size=300)), tok, ["hi"])


def test_bad_translation_settings(pairs_file, tmp_path):
    with pytest.raises(ValueError, match="shared byte-level BPE"):
        cfg(pairs_file, tokenizer="char")
    with pytest.raises(ValueError, match="need at least batch_size"):
        train(cfg(pairs_file, batch_size=4096, out=str(tmp_path / "x")))
    assert not (tmp_path / "x").exists()
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\nthree without a tab\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        load_pairs(str(bad))


def test_the_shared_vocabulary_learns_both_languages(pairs_file):
    """Regression: interleaved (source, target) pieces once let the BPE sampler keep English only,
    so every Chinese character cost three byte tokens (the sampler thins texts over max_chars)."""
    from qkv.training.tasks.translation import shared_vocabulary

    pairs = load_pairs(str(pairs_file)).train
    tok = shared_vocabulary(pairs, 300, max_chars=sum(len(s) + len(t) for s, t in pairs) // 2)
    assert len(tok.encode("打开文件")) < len("打开文件".encode()) / 2  # merges of Chinese bytes were learned
    assert len(tok.encode("open file")) < len("open file")


def test_the_copy_mechanism_is_the_default_and_can_be_switched_off(pairs_file, tmp_path):
    from qkv.models.pointer import PointerTransformer

    train(cfg(pairs_file, out=str(tmp_path / "on"), max_steps=1))
    train(cfg(pairs_file, out=str(tmp_path / "off"), max_steps=1, task_options={"copy": False}))
    assert type(ckpt.load_run(tmp_path / "on").model) is PointerTransformer
    assert type(ckpt.load_run(tmp_path / "off").model) is Transformer
    with pytest.raises(ValueError, match="copy"):
        TrainConfig(task="lm", task_options={"copy": True}, max_steps=1)
    with pytest.raises(ValueError, match="copy"):  # a run keeps its architecture
        TrainConfig.for_resume(tmp_path / "off", task_options={"copy": True})


def test_a_run_saved_before_the_copy_mechanism_resumes_without_it(pairs_file, tmp_path):
    import json

    train(cfg(pairs_file, out=str(tmp_path / "old"), task_options={"copy": False}), stop_at=2)
    path = tmp_path / "old" / "train_config.json"
    saved = json.loads(path.read_text())  # written flat then, without the copy option
    flat = {k: v for k, v in saved.items() if k != "task_options"} | saved["task_options"]
    path.write_text(json.dumps({k: v for k, v in flat.items() if k != "copy"}))
    assert TrainConfig.for_resume(tmp_path / "old").task_options.copy is False
    assert type(train(TrainConfig.for_resume(tmp_path / "old", progress=False)).model) is Transformer


def test_ddp_two_processes_match_one_process(pairs_file, ddp_matches_one_process):
    """torchrun --nproc_per_node 2 (gloo on CPU) trains the pointer-generator to the losses of one process:
    each micro-batch's loss is weighted by its share of the step's target tokens."""
    one, two = ddp_matches_one_process(
        ["train", "--task", "translate", "--pairs", str(pairs_file), "--max-steps", "3", "--eval-interval", "1",
         "--batch-size", "8", "--vocab-size", "300", "--d-model", "32", "--layers", "2", "--heads", "2", "--model",
         "feed_forward.d_ff=64", "--model", "max_len=32", "--num-beams", "2", "--quiet", "--device", "cpu"])
    assert two["world_size"] == 2 and two["architecture"] == one["architecture"] == "PointerTransformer"
