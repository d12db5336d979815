"""`qkv sample --chat [--system TEXT]`: the prompt as a user message in the checkpoint's own chat template,
the reply printed without the template's markup, stopping at the end of the turn (<|im_end|>).

No network: a tiny random Qwen2-shaped model and a byte-level BPE tokenizer trained here, with ChatML's special
tokens and a ChatML Jinja template, saved with save_pretrained. The model is made to end its turn after k tokens
by swapping two rows of its output projection: <|im_end|> takes the logits of the token its free greedy reply
first emits at step k.
"""
import json
import shutil

import pytest
import torch

from qkv import cli
from qkv.interop import from_hf
from qkv.interop.hf import load_pretrained

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from hf_models import TEXTS, hf_model  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "the dog"}]
ARGV = ["--chat", "--system", "You are terse.", "--prompt", "the dog", "--max-new-tokens", "20", "--temperature", "0"]


def chat_tokenizer(*, template: bool = True, eos: str = "<|im_end|>"):
    """A byte-level BPE PreTrainedTokenizerFast with <|endoftext|>, <|im_start|>, <|im_end|> (and ChatML)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=290, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token="<|endoftext|>",
                                                chat_template=CHATML if template else None)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """(directory, the chat prompt's ids, the reply's ids ending in <|im_end|>)."""
    tok = chat_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    hf = hf_model("qwen2", vocab_size=len(tok))
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    free = from_hf(hf).generate(torch.tensor([ids]), 20, eos_id=None)[0, len(ids):].tolist()  # greedy, no stop
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i] and im_end not in free[:i + 1])
    with torch.no_grad():  # <|im_end|> now wins at step k, and nothing changes before it
        hf.lm_head.weight[[im_end, free[k]]] = hf.lm_head.weight[[free[k], im_end]].clone()
    d = tmp_path_factory.mktemp("qwen2_chat")
    hf.save_pretrained(d)
    tok.save_pretrained(d)
    return d, ids, free[:k] + [im_end]


def test_chat_prompt_ids_are_apply_chat_templates(chat_dir):
    d, ids, _ = chat_dir
    _, tokenizer = load_pretrained(d)
    assert tokenizer.chat_ids(MESSAGES) == ids
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n")


def test_sample_chat_prints_the_reply_alone_and_stops_at_im_end(chat_dir, capsys):
    d, ids, reply = chat_dir
    assert cli.main(["sample", "--hf", str(d), *ARGV]) == 0
    out = capsys.readouterr().out
    tok = transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)
    hf = transformers.Qwen2ForCausalLM.from_pretrained(d).eval()
    prompt = torch.tensor([ids])
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    assert want[0].tolist() == ids + reply  # HF, fed apply_chat_template's ids, ends the turn there too
    assert len(reply) < 20 and out == tok.decode(reply, skip_special_tokens=True) + "\n"
    assert "<|im_" not in out and "assistant" not in out


def test_the_generation_configs_eos_ids_end_the_turn(chat_dir, tmp_path, capsys):
    """A tokenizer whose eos is <|endoftext|>: the turn ends at generation_config.json's <|im_end|>."""
    d, ids, reply = chat_dir
    shutil.copytree(d, tmp_path, dirs_exist_ok=True)
    tok = chat_tokenizer(eos="<|endoftext|>")
    tok.save_pretrained(tmp_path)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_token_id, im_end]}))
    assert cli.main(["sample", "--hf", str(tmp_path), *ARGV]) == 0
    assert capsys.readouterr().out == tok.decode(reply, skip_special_tokens=True) + "\n"


def test_a_tokenizer_without_a_chat_template_is_one_line_and_exit_2(chat_dir, tmp_path, capsys):
    d, *_ = chat_dir
    shutil.copytree(d, tmp_path, dirs_exist_ok=True)
    for f in tmp_path.glob("chat_template*"):
        f.unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert cli.main(["sample", "--hf", str(tmp_path), *ARGV]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "has no chat template (tokenizer_config.json 'chat_template')" in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_system_without_chat_is_one_line_and_exit_2(chat_dir, capsys):
    d, *_ = chat_dir
    assert cli.main(["sample", "--hf", str(d), "--system", "x", "--prompt", "the dog"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--system needs --chat" in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_help_explains_both_flags(capsys):
    assert cli.main(["sample", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--chat" in text and "chat template" in text and "--system TEXT" in text and "system message" in text
