"""--task sft: conversation files in their three forms, the chat template's answer mask, the loss over answer
tokens (its mean independent of how the step is cut), the starting model's baseline, and bad input."""
import json
import re

import pytest
import torch

from qkv.cli import main
from qkv.data import CharTokenizer
from qkv.data.chat_template import CHATML, GENERATION_TAGS, encode_conversation, render, segments
from qkv.data.conversations import Record, conversation, load_conversations, preference, record_format
from qkv.training.recipe import TrainConfig, train

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"}]


def write_jsonl(path, records) -> str:
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n", encoding="utf-8")
    return str(path)


def arithmetic(n: int = 60) -> list[dict]:
    """Conversations in the three forms: messages, sharegpt and alpaca."""
    out = []
    for i in range(n):
        a, b = i % 7, i % 5
        q, r = f"{a}+{b}?", (str(a + b) if i % 2 else f"{a}+{b}={a + b}")  # answers of two lengths
        out.append([{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": r}]},
                    {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": r}]},
                    {"instruction": "add", "input": q, "output": r}][i % 3])
    return out


def test_the_three_forms_read_as_the_same_messages():
    forms = [{"messages": [{"role": "user", "content": "add\n\n1+2?"}, {"role": "assistant", "content": "3"}]},
             {"conversations": [{"from": "human", "value": "add\n\n1+2?"}, {"from": "gpt", "value": "3"}]},
             {"instruction": "add", "input": "1+2?", "output": "3"}]
    assert [record_format(Record("x:1", f)) for f in forms] == ["messages", "sharegpt", "alpaca"]
    read = [conversation(Record("x:1", f)).messages for f in forms]
    assert read[0] == read[1] == read[2]
    system = conversation(Record("x:1", {"instruction": "i", "output": "o", "system": "s"})).messages
    assert [m["role"] for m in system] == ["system", "user", "assistant"]
    pair = preference(Record("x:1", {"prompt": "1+2?", "chosen": "3", "rejected": "4"}))
    assert pair.raw and (pair.prompt, pair.chosen, pair.rejected) == ("1+2?", "3", "4")  # raw text, as TRL's


@pytest.mark.parametrize("record", [
    {"chosen": "Sky? It is blue.", "rejected": "Sky? It is green."},
    {"chosen": "abc", "rejected": "abd"},
    {"chosen": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue."}],
     "rejected": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Green."}]},
])
def test_an_implicit_prompt_is_trls(record):
    data_utils = pytest.importorskip("trl.data_utils", reason="TRL (the dev extra) is the reference")
    pair = preference(Record("x:1", record))
    want = data_utils.extract_prompt(record)
    got = {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in got.items()} == want


def raw_task(task_type, **options):
    """A task over a byte-level BPE with ChatML's markers, its EOS ChatML's end marker."""
    from qkv.data import BPETokenizer
    from qkv.data.chat_template import CHATML_TOKENS

    from qkv.training.tasks.chat_data import ChatData

    task = task_type()
    task.options = task_type.options_type(**options)
    task.chat = ChatData(CHATML, {"eos_token": "<|im_end|>"}, "ChatML", task.options)
    task.tokenizer = BPETokenizer.train(["Sky?\n\n It is blue. green 2+2 = 4"] * 30, 300, special_tokens=CHATML_TOKENS)
    return task


def encoded(task, record):
    """The row of ``record`` (a conversation, or a preference pair) as ``task`` encodes it."""
    from qkv.data.conversations import Preference
    from qkv.training.tasks.dpo import encode_pair

    if isinstance(record, Preference):
        return encode_pair(task.chat, task.tokenizer, record)
    return task.chat.conversation(task.tokenizer, record)


def test_raw_prompt_completion_is_trls_text_with_the_eos():
    from qkv.training.tasks.sft import SFTTask

    task = raw_task(SFTTask)
    c = conversation(Record("x:1", {"prompt": "2+2 =", "completion": " 4"}))
    assert c.raw and record_format(Record("x:1", {"prompt": "p", "completion": "c"})) == "completion"
    ids, trained, _ = encoded(task, c)
    assert ids.tolist() == task.tokenizer.tokenizer.encode("2+2 = 4<|im_end|>", add_special_tokens=False).ids
    assert task.tokenizer.decode(ids[trained].tolist()).strip() == "4"  # and the EOS (a special token)
    assert trained[-1] and not trained[0]
    assert all(encoded(raw_task(SFTTask, train_on_prompt=True), c)[1])  # completion_only_loss=False
    chat = conversation(Record("x:1", {"prompt": [{"role": "user", "content": "2+2?"}],
                                       "completion": [{"role": "assistant", "content": "4"}]}))
    ids, trained, _ = encoded(task, chat)
    assert task.tokenizer.decode(ids[trained].tolist()) == "4"
    with pytest.raises(ValueError, match="x:1: prompt and completion must both be strings"):
        conversation(Record("x:1", {"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]}))


def test_a_raw_preference_pair_is_scored_as_trl_scores_it():
    """TRL's strings: prompt + answer + EOS tokenised whole, the answer's tokens where the prompt's ids end."""
    from qkv.training.tasks.dpo import DPOTask

    task = raw_task(DPOTask)
    pair = preference(Record("x:1", {"prompt": "Sky?\n", "chosen": "\n It is blue.", "rejected": "green"}))
    (c_ids, c_scored, _), (r_ids, r_scored, _) = encoded(task, pair)
    encode = lambda text: task.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert c_ids.tolist() == encode("Sky?\n\n It is blue.<|im_end|>")
    prompt = encode("Sky?\n")
    shared = next(i for i, (a, b) in enumerate(zip(prompt + [-1], c_ids.tolist())) if a != b)  # TRL's prompt_len
    assert c_scored.tolist() == [i >= shared for i in range(len(c_ids))] and shared < len(prompt)  # "\n\n" merged
    assert r_ids.tolist() == encode("Sky?\ngreen<|im_end|>") and r_scored.sum() >= 2
    with pytest.raises(ValueError, match="all be strings .* or all lists"):
        preference(Record("x:1", {"prompt": "p", "chosen": [{"role": "assistant", "content": "c"}], "rejected": "r"}))


def test_chatml_masks_exactly_the_answers_and_their_end_markers():
    pieces = segments(CHATML, CHAT)  # ChatML's {% generation %} markers
    assert "".join(t for t, _ in pieces) == render(CHATML, CHAT)
    assert [t for t, answer in pieces if answer] == ["4<|im_end|>", "6<|im_end|>"]
    tok = CharTokenizer.train(render(CHATML, CHAT))
    ids, trained = encode_conversation(tok, CHATML, CHAT)
    assert tok.decode([i for i, t in zip(ids, trained) if t]) == "4<|im_end|>6<|im_end|>"
    assert all(encode_conversation(tok, CHATML, CHAT, train_on_prompt=True)[1])
    # a template without markers: the answers found by rendering each prefix (the newline after the end comes along)
    plain = GENERATION_TAGS.sub("", CHATML)
    assert [t for t, answer in segments(plain, CHAT) if answer] == ["4<|im_end|>\n", "6<|im_end|>\n"]
    assert "".join(t for t, _ in segments(plain, CHAT)) == render(CHATML, CHAT)


@pytest.mark.parametrize("lines, message", [
    (['{"messages": [}'], r"data.jsonl:1: not valid JSON"),
    (['{"text": "hi"}'], r"data.jsonl:1: a record of no known format \(keys \['text'\]\)"),
    (['{"messages": [{"role": "user", "content": "hi"}]}'], r"data.jsonl:1: a conversation without an assistant turn"),
    (['{"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]}'],
     r"data.jsonl:1: roles out of order at message 0"),
    (['{"prompt": "p", "chosen": "c"}'], r"data.jsonl:1: a preference record missing 'rejected'"),
])
def test_bad_records_name_their_file_and_line(tmp_path, lines, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    reader = preference if "prompt" in lines[0] else conversation
    with pytest.raises(ValueError, match=message):
        from qkv.data.conversations import read_records

        [reader(r) for r in read_records(path)]


def sft_config(data: str, **kw) -> TrainConfig:
    base = dict(task="sft", preset="tiny", data=data, vocab_size=300, max_steps=1, batch_size=4, eval_interval=1,
                lr=1e-2, threads=1, progress=False, final_eval=False, seed=3, device="cpu")
    return TrainConfig(**(base | kw))


def step_gradients(data: str, accum: int) -> tuple[float, dict]:
    """The loss and gradients of one step as the loop takes it (micro-batches, each loss / their count)."""
    from qkv.training.distributed import Dist
    from qkv.training.loop import step_batches
    from qkv.training.recipe import Recipe

    r = Recipe(sft_config(data, grad_accum=accum), Dist())
    r.setup()
    micros, divisors = step_batches(r.task, r.loop.batch_gen, 0, r.cfg, r.dist)
    loss = sum(float(r.task.loss(r.engine.model, m).detach()) / d for m, d in zip(micros, divisors))
    for m, d in zip(micros, divisors):
        (r.task.loss(r.engine.model, m) / d).backward()
    return loss, {n: p.grad.clone() for n, p in r.engine.model.named_parameters() if p.grad is not None}


def test_the_loss_is_the_mean_over_answer_tokens_however_the_step_is_cut(tmp_path):
    """4 micro-batches of 1 and 1 of 4 take the same step: conversations of different lengths weigh per token."""
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic())
    (whole, grads), (cut, cut_grads) = step_gradients(data, 1), step_gradients(data, 4)
    assert whole == pytest.approx(cut, abs=1e-6)
    assert grads.keys() == cut_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(cut_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)
    # a per-conversation mean would differ: the rows' answers are of different lengths
    r_lengths = {len(m["messages"][1]["content"]) for m in arithmetic() if "messages" in m}
    assert len(r_lengths) > 1


def test_max_steps_zero_evaluates_the_starting_model(tmp_path):
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic())
    out = tmp_path / "run"
    result = train(sft_config(data, max_steps=0, out=str(out), final_eval=True))
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 0 and s["val_loss"] == pytest.approx(result.summary["val_loss"])
    vocab = s["vocab_size"]
    assert abs(s["val_loss"] - torch.log(torch.tensor(float(vocab)))) < 1.5  # an untrained model: near ln V
    assert (out / "chat_template.jinja").read_text() == CHATML  # the template it would train with


def test_a_short_sft_run_learns_and_the_command_reports_it(tmp_path, capsys):
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(90))
    out = tmp_path / "run"
    assert main(["train", "--task", "sft", "--preset", "tiny", "--data", data, "--vocab-size", "300",
                 "--max-steps", "30", "--batch-size", "8", "--eval-interval", "15", "--out", str(out), "--quiet",
                 "--device", "cpu", "--sample-tokens", "0"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"validation loss: [\d.]+ nats per answer token \(\d+ held-out conversations\)", text), text
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["val_loss"] < records[0]["val_loss"]


@pytest.mark.parametrize("extra, message", [
    (["--tokenizer", "char"], "--task sft trains a byte-level BPE"),
    (["--chat-template", "nope.jinja"], "--chat-template 'nope.jinja': expected 'chatml'"),
    (["--context", "128"], "context 128 exceeds max_len 64 of learned positions"),  # the tiny preset's
])
def test_bad_settings_are_one_line_and_write_nothing(tmp_path, capsys, extra, message):
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic())
    out = tmp_path / "run"
    assert main(["train", "--task", "sft", "--preset", "tiny", "--data", data, "--max-steps", "1", "--out", str(out),
                 "--quiet", "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_a_conversation_longer_than_the_context_is_named_or_cut_from_the_prompt(tmp_path, capsys):
    noise = "".join(chr(97 + (i * 7 + i // 26) % 26) for i in range(300))  # no merges make it short
    long = [{"messages": [{"role": "user", "content": noise}, {"role": "assistant", "content": "ok"}]}]
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic() + long)
    args = ["train", "--task", "sft", "--preset", "tiny", "--data", data, "--max-steps", "1", "--quiet",
            "--device", "cpu", "--vocab-size", "300", "--val-data", write_jsonl(tmp_path / "v.jsonl", arithmetic(6))]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"chat.jsonl:61: a conversation of \d+ tokens, longer than the context \(64 \+ 1\); "
                     r"--truncate", err), err
    assert main([*args, "--out", str(tmp_path / "b"), "--truncate", "--sample-tokens", "0"]) == 0


def test_conversations_read_from_a_directory_of_files(tmp_path):
    d = tmp_path / "chats"
    d.mkdir()
    write_jsonl(d / "a.jsonl", arithmetic(3))
    write_jsonl(d / "b.jsonl", arithmetic(4))
    assert len(load_conversations(d)) == 7


def test_a_trained_run_answers_with_its_chat_template(tmp_path, capsys):
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(90))
    out = tmp_path / "run"
    assert main(["train", "--task", "sft", "--preset", "tiny", "--data", data, "--vocab-size", "300", "--max-steps",
                 "5", "--batch-size", "8", "--out", str(out), "--quiet", "--device", "cpu", "--sample-tokens", "0"]) == 0
    capsys.readouterr()
    assert main(["sample", "--run", str(out), "--chat", "--prompt", "1+2?", "--temperature", "0",
                 "--max-new-tokens", "8", "--device", "cpu"]) == 0
    reply = capsys.readouterr().out
    assert "<|im_start|>" not in reply and "1+2?" not in reply  # the answer alone, without the template's markup


def test_an_exported_sft_run_chats_in_transformers_with_the_same_template(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the hf extra brings transformers")
    from qkv.data.chat_template import plain_ids
    from qkv.training.export import export_run
    from qkv.training.run_dir import load_run

    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(60))
    out = tmp_path / "run"
    train(TrainConfig(task="sft", preset="demo", data=data, vocab_size=300, max_steps=2, batch_size=4, threads=1,
                      progress=False, final_eval=False, out=str(out), device="cpu"))
    hf_dir = export_run(out, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    messages = [{"role": "user", "content": "1+2?"}]
    theirs = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    theirs = list(theirs["input_ids"] if isinstance(theirs, dict) else theirs)
    run = load_run(out)
    ours = plain_ids(run.tokenizer, render((out / "chat_template.jinja").read_text(), messages,
                                           add_generation_prompt=True))
    assert theirs == ours and tok.eos_token == "<|im_end|>"
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
    with torch.no_grad():
        ref = run.model(torch.tensor([ours])).logits
        torch.testing.assert_close(model(torch.tensor([ours])).logits, ref, rtol=1e-4, atol=1e-4)


def test_a_datasets_folder_on_disk_reads_as_its_records(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the chat extra brings datasets")
    records = arithmetic(9)
    messages = [r for r in records if "messages" in r]
    datasets.Dataset.from_list(messages).save_to_disk(str(tmp_path / "saved"))
    assert [c.messages for c in load_conversations(tmp_path / "saved")] == \
        [tuple(r["messages"]) for r in messages]
    (tmp_path / "pq").mkdir()
    datasets.Dataset.from_list(messages).to_parquet(str(tmp_path / "pq" / "train.parquet"))
    assert len(load_conversations(tmp_path / "pq")) == len(messages)


def test_qkv_chat_keeps_the_history_resets_and_ends(tmp_path, capsys, monkeypatch):
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(60))
    out = tmp_path / "run"
    assert main(["train", "--task", "sft", "--preset", "tiny", "--data", data, "--vocab-size", "300", "--max-steps",
                 "3", "--batch-size", "8", "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    from qkv.cli import chat

    seen = []
    real = chat.conversation_ids
    monkeypatch.setattr(chat, "conversation_ids", lambda a, t, messages: seen.append(list(messages)) or real(a, t, messages))
    lines = iter(["1+2?", "and 2+2?", "/reset", "3+3?", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    capsys.readouterr()
    assert main(["chat", "--run", str(out), "--temperature", "0", "--max-new-tokens", "4", "--device", "cpu"]) == 0
    turns = [[m["role"] for m in msgs] for msgs in seen[1:]]  # the first renders the template once, as a check
    assert turns == [["user"], ["user", "assistant", "user"], ["user"]]
    assert seen[2][2]["content"] == "and 2+2?" and seen[3][0]["content"] == "3+3?"
    assert "forgotten" in capsys.readouterr().err


def test_qkv_chat_refuses_a_model_without_a_template(tmp_path, capsys, data):
    out = tmp_path / "lm"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--max-steps", "1", "--out", str(out), "--quiet",
                 "--device", "cpu", "--sample-tokens", "0"]) == 0
    capsys.readouterr()
    assert main(["chat", "--run", str(out), "--device", "cpu"]) == 2
    assert "has no chat template" in capsys.readouterr().err


def test_packed_rows_give_the_unpacked_loss_and_gradients(tmp_path):
    """--packing: conversations share rows, attention stays within each and positions restart, so the sum of the
    answer tokens' losses over the data is the unpacked one (to 1e-5), in fewer, fuller rows."""
    from qkv.training.distributed import Dist
    from qkv.training.recipe import Recipe
    from qkv.training.tasks.chat_data import batch

    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(40))
    totals = {}
    for packing in (False, True):
        r = Recipe(sft_config(data, task_options={"packing": packing}, context=64), Dist())
        r.setup()
        rows = r.task.train_rows
        inputs, targets, docs, _ = batch(rows, list(range(len(rows))), r.task.device)
        logits = (r.engine.model(inputs) if docs is None else r.engine.model(inputs, document_ids=docs)).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                                                 reduction="sum")
        loss.backward()
        totals[packing] = (loss.item(), int((targets != -100).sum()), len(rows),
                           {n: p.grad.clone() for n, p in r.engine.model.named_parameters() if p.grad is not None})
    (plain, n_plain, rows_plain, g_plain), (packed, n_packed, rows_packed, g_packed) = totals[False], totals[True]
    assert n_plain == n_packed and rows_packed < rows_plain / 2
    assert packed == pytest.approx(plain, rel=1e-5)
    for name, g in g_plain.items():
        torch.testing.assert_close(g_packed[name], g, rtol=1e-4, atol=1e-5, msg=name)


def test_a_packed_run_trains(tmp_path):
    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(60))
    s = train(sft_config(data, task_options={"packing": True}, max_steps=3, final_eval=True, batch_size=2)).summary
    assert s["packed_rows"] < s["conversations"] and s["val_loss"] > 0


def test_the_answer_mask_is_transformers_generation_mask(tmp_path):
    """ChatML with its {% generation %} markers: transformers' assistant-token mask (return_assistant_tokens_mask)
    marks exactly the tokens qkv trains on, and the ids are the same."""
    transformers = pytest.importorskip("transformers", reason="the hf extra brings transformers")
    from qkv.data import BPETokenizer
    from qkv.data.chat_template import CHATML_TOKENS

    bpe = BPETokenizer.train([render(CHATML, CHAT)] * 20, 300, special_tokens=CHATML_TOKENS)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.tokenizer)
    hf.chat_template = CHATML
    out = hf.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, trained = encode_conversation(bpe, CHATML, CHAT)
    assert list(out["input_ids"]) == ids
    assert [bool(m) for m in out["assistant_masks"]] == trained and sum(trained) > 0


@pytest.mark.parametrize("answer", ["\n\n4", "  4", " 4\n", "\n 4 \n\n"])
def test_the_ids_are_transformers_for_any_answer_and_the_mask_end_is_one_rule(answer):
    """The whole conversation tokenised once: ids equal apply_chat_template(tokenize=True) even where a token
    spans the prompt and the answer ("\n\n"); the mask is transformers' generation mask, and a template without
    markers masks the same tokens (the newline after the end marker the prompt's unless asked for)."""
    transformers = pytest.importorskip("transformers", reason="the hf extra brings transformers")
    from qkv.data import BPETokenizer
    from qkv.data.chat_template import CHATML_TOKENS

    chat = CHAT[:2] + [{"role": "assistant", "content": answer}] + CHAT[3:]
    bpe = BPETokenizer.train([render(CHATML, chat)] * 20 + ["\n\n\n  x \n\n"] * 50, 300,
                             special_tokens=CHATML_TOKENS)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.tokenizer)
    plain = GENERATION_TAGS.sub("", CHATML)
    for template in (CHATML, plain):
        hf.chat_template = template
        assert encode_conversation(bpe, template, chat)[0] == list(hf.apply_chat_template(chat, tokenize=True,
                                                                                          return_dict=False))
    hf.chat_template = CHATML
    out = hf.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert encode_conversation(bpe, CHATML, chat)[1] == encode_conversation(bpe, plain, chat)[1] \
        == [bool(m) for m in out["assistant_masks"]]
    ids, with_newline = encode_conversation(bpe, plain, chat, end_newline=True)
    newline = [i for i, (a, b) in enumerate(zip(encode_conversation(bpe, plain, chat)[1], with_newline)) if a != b]
    assert len(newline) == 2 and all(bpe.decode([ids[i]]) == "\n" for i in newline)  # after each <|im_end|>


def test_two_processes_take_the_one_process_steps(tmp_path):
    """The loss is the mean over the step's answer tokens across processes too: the same run under torchrun with
    2 ranks (DDP, gloo) logs the one-process losses and ends with its weights."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    data = write_jsonl(tmp_path / "chat.jsonl", arithmetic(90))
    argv = ["-m", "qkv", "train", "--task", "sft", "--preset", "tiny", "--data", data, "--vocab-size", "300",
            "--max-steps", "4", "--batch-size", "4", "--eval-interval", "2", "--lr", "1e-2", "--seed", "3",
            "--device", "cpu", "--quiet", "--sample-tokens", "0"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    for launcher, out in (([sys.executable], "one"), (torchrun, "two")):
        done = subprocess.run([*launcher, *argv, "--out", str(tmp_path / out)], env=env, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    logs = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("one", "two")]
    assert [m["step"] for m in logs[0]] == [m["step"] for m in logs[1]] == [2, 4]
    for a, b in zip(*logs):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)
    one, two = (load_file(tmp_path / d / "model.safetensors") for d in ("one", "two"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=name)


def test_batches_are_pinned_for_a_gpu_only():
    from qkv.training.tasks.chat_data import pins_host_batches, to_device

    assert pins_host_batches("cuda") and pins_host_batches(torch.device("cuda:1"))
    assert not pins_host_batches("cpu") and not pins_host_batches(torch.device("cpu"))
    x = torch.arange(6).view(2, 3)[:, 1:]  # a view, as a batch's shifted inputs
    assert [t.tolist() for t in to_device([x], torch.device("cpu"))] == [[[1, 2], [4, 5]]]
    if torch.cuda.is_available():
        moved = to_device([x], torch.device("cuda"))[0]
        assert moved.is_cuda and moved.tolist() == x.tolist()


def test_the_loss_computes_the_answers_logits_alone_and_is_the_whole_ones(tmp_path):
    """answer_window: the logits from the first counted target on; the step's loss and gradients are those of every
    position's logits (the prompt's targets count nothing)."""
    from qkv.training.distributed import Dist
    from qkv.training.recipe import Recipe
    from qkv.training.tasks.chat_data import answer_window, batch

    t = torch.tensor([[-100, -100, 5, 6, -100], [-100, -100, -100, 7, -100]])
    assert answer_window(t) == 3 and answer_window(torch.full((2, 4), -100)) == 0
    assert answer_window(torch.tensor([[1, -100]])) == 0  # from the first position: all
    r = Recipe(sft_config(write_jsonl(tmp_path / "chat.jsonl", arithmetic(40))), Dist())
    r.setup()
    micro = batch(r.task.train_rows, list(range(8)), r.task.device)
    assert 0 < micro[3] < micro[0].size(1)  # the prompts' positions left out
    window = r.task.loss(r.engine.model, micro)
    window.backward()
    grads = {n: p.grad.clone() for n, p in r.engine.model.named_parameters()}
    r.engine.model.zero_grad()
    whole = r.task.loss(r.engine.model, micro[:3] + (0,))
    whole.backward()
    assert window.item() == pytest.approx(whole.item(), rel=1e-6)
    for n, p in r.engine.model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7, msg=n)
