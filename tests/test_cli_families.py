"""The `qkv` commands on the open families (Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, LLaMA with llama3 RoPE scaling,
DeepSeek-V3 with dense layers):
`qkv sample --hf` equals HF's greedy tokens past the window, `qkv explore --hf` shows sliding layers as bands,
`qkv train --init-from-hf` (full and --lora) then `qkv export` reloads in transformers with qkv's logits, a
LoRA run changes its base by the merged delta only, and bad configs or flags are one line, exit 2, nothing written.

No network: tiny random models (tests/hf_models.py) and a tokenizer trained in the test, saved with save_pretrained.
"""
import base64
import json
import re
import shutil

import numpy as np
import pytest
import torch
from hf_models import BUILDERS, save_with_tokenizer
from safetensors.torch import load_file
from test_cli_train import fails

pytestmark = pytest.mark.usefixtures("one_thread")

from qkv import cli
from qkv.interop.hf import from_hf
from qkv.training.run_dir import load_run

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

WINDOW = 6  # hf_models' sliding_window
TEXT = "the dog bites the man and the man bites the dog"
LAYER_KINDS = {"mistral": {"sliding_attention"}, "llama3": {"full_attention"}, "deepseek_v3": {"full_attention"}}  # else both kinds
EXPORTED_AS = {"llama3": "llama"}  # family -> model_type written by qkv export (else the family's own)
TRAIN = ["--max-steps", "2", "--batch-size", "2", "--context", "16", "--lr", "1", "--quiet", "--device", "cpu",
         "--sample-tokens", "0"]  # lr 1: 1/50 of it in warmup's first steps, enough to move every weight


@pytest.fixture(scope="module", params=list(BUILDERS))
def family(request, tmp_path_factory):
    """(family, its directory: tiny model + BPE tokenizer, a text file to train on)."""
    d = tmp_path_factory.mktemp(request.param)
    save_with_tokenizer(request.param, d / "hf")
    (d / "data.txt").write_text((TEXT + ". ") * 300, encoding="utf-8")
    return request.param, d


def hf_logits(path, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(ids).logits


def boot_data(page: str) -> dict:
    """The data the explorer embeds in its page."""
    m = re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))["data"]


def test_sample_prints_hugging_faces_greedy_text(family, capsys):
    name, d = family
    argv = ["sample", "--hf", str(d / "hf"), "--prompt", "the dog", "--max-new-tokens", "12", "--temperature", "0"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out.rstrip("\n")
    tok = transformers.AutoTokenizer.from_pretrained(d / "hf", local_files_only=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d / "hf", attn_implementation="eager").eval()
    ids = torch.tensor([tok.encode("the dog")])
    assert ids.size(1) + 12 > WINDOW  # the continuation runs past the sliding window
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                       pad_token_id=0, eos_token_id=tok.eos_token_id)
    assert text == tok.decode(want[0]) and len(text) > len("the dog")


def test_explore_shows_sliding_layers_as_bands_and_full_layers_whole(family, tmp_path, capsys):
    name, d = family
    out = tmp_path / "page.html"
    assert cli.main(["explore", "--hf", str(d / "hf"), "--text", TEXT, "--out", str(out)]) == 0
    data = boot_data(out.read_text(encoding="utf-8"))
    L, H, T = data["num_layers"], data["num_heads"], data["T"]
    att = np.frombuffer(base64.b64decode(data["attention"]), dtype="<f4").reshape(L, H, T, T)
    assert T > WINDOW + 2 and np.allclose(att.sum(-1), 1, atol=1e-5) and not np.triu(att, 1).any()
    config = from_hf(d / "hf").config
    far = np.tril(np.ones((T, T), dtype=bool), -WINDOW)  # keys j ≤ p − W: outside query p's window
    types = [config.layer_type(i) for i in range(L)]
    for layer, kind in enumerate(types):
        outside = att[layer][:, far]  # (H, keys outside the window over all queries)
        if kind == "sliding_attention":
            assert not outside.any(), (name, layer)
        else:
            assert (outside > 0).all(), (name, layer)  # softmax: every allowed key gets some weight
    assert set(types) == LAYER_KINDS.get(name, {"sliding_attention", "full_attention"})


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_fine_tuned_run_exports_to_hugging_face_with_qkvs_logits(family, lora, tmp_path, capsys):
    fine_tune_and_export(*family, lora, tmp_path, capsys)


def fine_tune_and_export(name: str, d, lora: bool, tmp_path, capsys) -> None:
    """`qkv train --init-from-hf d/hf` (``--lora 2`` or all weights) on d/data.txt, `qkv export --hf`: transformers
    loads the export with the run's logits (moved from the base's), its model_type and tokenizer."""
    run, out = tmp_path / "run", tmp_path / "exported"
    extra = ["--lora", "2"] if lora else []
    assert cli.main(["train", "--init-from-hf", str(d / "hf"), "--data", str(d / "data.txt"), *TRAIN, *extra,
                     "--out", str(run)]) == 0
    assert ("trained:" in capsys.readouterr().out) == lora
    assert cli.main(["export", "--run", str(run), "--hf", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == EXPORTED_AS.get(name, name)
    if name == "llama3":
        assert config["rope_parameters"]["rope_type"] == "llama3"
    ids = torch.randint(0, config["vocab_size"], (1, 24))  # past the window of 6
    with torch.no_grad():
        ours = load_run(run).model.eval()(ids).logits
    theirs = hf_logits(out, ids)
    # fp32 sums in another order through every layer: within 1e-4 plus 1e-4 of the logit
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert (theirs - hf_logits(d / "hf", ids)).abs().max() > 1e-3  # trained: not the base written back
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.encode(TEXT) == transformers.AutoTokenizer.from_pretrained(d / "hf").encode(TEXT)


def test_a_lora_run_of_a_qwen2_shape_changes_its_base_by_the_merged_delta_only(tmp_path, capsys):
    """Qwen2's shape: q/k/v biased, o unbiased, 6 query heads over 2 key/value heads, head_dim 12 ≠ 48 / 6."""
    base_dir, run, out = tmp_path / "hf", tmp_path / "run", tmp_path / "exported"
    hf = save_with_tokenizer("qwen2", base_dir)
    attn = hf.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.v_proj.bias is not None and attn.o_proj.bias is None
    assert (hf.config.num_attention_heads // hf.config.num_key_value_heads, hf.config.head_dim) == (3, 12)
    (tmp_path / "data.txt").write_text((TEXT + ". ") * 300, encoding="utf-8")
    assert cli.main(["train", "--init-from-hf", str(base_dir), "--data", str(tmp_path / "data.txt"), *TRAIN,
                     "--max-steps", "3", "--lora", "2", "--lora-alpha", "8", "--out", str(run)]) == 0
    base, tuned = from_hf(base_dir).state_dict(), load_run(run).model.state_dict()
    adapters = load_file(run / "adapters.safetensors")
    assert tuned.keys() == base.keys()
    moved = 0.0
    for key, w in tuned.items():
        layer = key.removesuffix(".weight")
        if f"{layer}.lora_A.weight" in adapters:  # W + (α / r) · B A, α = 8, r = 2
            delta = 4.0 * adapters[f"{layer}.lora_B.weight"] @ adapters[f"{layer}.lora_A.weight"]
            assert torch.allclose(w, base[key] + delta, atol=1e-6), key
            moved = max(moved, delta.abs().max().item())
        else:
            assert torch.equal(w, base[key]), key  # frozen: biases, norms, embeddings, feed-forward
    assert moved > 1e-3 and len(adapters) == 2 * 4 * 3  # A and B, q/k/v/out, 3 layers
    assert cli.main(["export", "--run", str(run), "--hf", str(out)]) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    theirs = hf.state_dict()
    assert again.state_dict().keys() == theirs.keys()
    for key, w in again.state_dict().items():
        assert torch.equal(w, theirs[key]) == (not re.search(r"\.(q|k|v|o)_proj\.weight$", key)), key
    ids = torch.randint(0, hf.config.vocab_size, (2, 20))
    with torch.no_grad():
        assert (again(ids).logits - load_run(run).model.eval()(ids).logits).abs().max() < 1e-4


# --- bad input: one line, exit 2, nothing written -------------------------------------------------

BAD_CONFIGS = {  # change to a Qwen2 config.json -> what the one line says
    "unknown rope type": (dict(rope_parameters={"rope_type": "magic", "rope_theta": 1e4}), r"RoPE scaling 'magic'"),
    "window past max_len": (dict(sliding_window=1000), r"sliding_window=1000 is larger than max_len=128"),
    "window 0": (dict(sliding_window=0), r"sliding_window=0 .*expected a positive int"),
    "negative window": (dict(sliding_window=-3), r"sliding_window=-3 .*expected a positive int"),
    "layer_types too short": (dict(layer_types=["full_attention", "sliding_attention"]),
                              r"expected a list of 3 layer types"),
}


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen2_good")
    save_with_tokenizer("qwen2", d)
    return d


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_a_bad_hugging_face_config_is_one_line_and_writes_nothing(qwen2_dir, case, tmp_path, capsys):
    change, message = BAD_CONFIGS[case]
    d = tmp_path / "hf"
    shutil.copytree(qwen2_dir, d)
    (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()) | change))
    (tmp_path / "data.txt").write_text(TEXT * 50)
    page, run = tmp_path / "page.html", tmp_path / "run"
    for argv in (["sample", "--hf", str(d), "--prompt", "the"],
                 ["explore", "--hf", str(d), "--text", TEXT, "--out", str(page)],
                 ["train", "--init-from-hf", str(d), "--data", str(tmp_path / "data.txt"), *TRAIN, "--out", str(run)]):
        line = fails(capsys, argv, message)
        assert line.startswith(f"qkv: error: cannot load {d} as qwen2: ")
    assert not page.exists() and not run.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt", "hf"]


@pytest.mark.parametrize("flags, message", [
    (["--model", "attention.sliding_window=0"], r"attention.sliding_window must be a positive int or None, got 0"),
    (["--model", "attention.sliding_window=-2"], r"attention.sliding_window must be a positive int or None, got -2"),
    (["--model", "attention.sliding_window=65"], r"attention.sliding_window=65 is larger than max_len=64"),
    (["--model", "attention.sliding_window=x"], r"attention.sliding_window=x: expected an int or none"),
    (["--model", "layer_types=sliding_attention"], r"layer_types must name each of the 2 layers"),
    (["--model", "layer_types=sliding_attention,full_attention"], r"attention.sliding_window is not set"),
    (["--model", "layer_types=local,full_attention"], r"unknown layer_types \['local'\]"),
    (["--positional", "alibi", "--model", "attention.sliding_window=4"], r"sliding_attention layers with ALiBi"),
])
def test_bad_sliding_window_flags_are_one_line_and_write_nothing(data, tmp_path, capsys, flags, message):
    out = tmp_path / "r"
    fails(capsys, ["train", "--preset", "tiny", *TRAIN, "--data", str(data), *flags, "--out", str(out)], message)
    assert not out.exists()


def test_a_run_and_a_hugging_face_directory_given_for_each_other_are_one_line_each(qwen2_dir, tmp_path, capsys):
    run = tmp_path / "run"
    (tmp_path / "data.txt").write_text(TEXT * 50)
    assert cli.main(["train", "--init-from-hf", str(qwen2_dir), "--data", str(tmp_path / "data.txt"), *TRAIN,
                     "--out", str(run)]) == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    hf, ours = re.escape(str(qwen2_dir)), re.escape(str(run))
    for argv, message in (
        (["sample", "--run", str(qwen2_dir), "--prompt", "the"], rf"--run {hf} is a Hugging Face model directory, "
                                                                  rf"not a qkv run directory: give it as --hf {hf}$"),
        (["explore", "--hf", str(run), "--text", "the", "--out", str(tmp_path / "p.html")],
         rf"--hf {ours} is a qkv run directory .*not a Hugging Face model directory: give it as --run {ours}$"),
        (["export", "--run", str(qwen2_dir), "--hf", str(tmp_path / "out")], r"transformers loads it as it is"),
        (["train", "--init-from-hf", str(run), "--data", str(tmp_path / "data.txt"), *TRAIN, "--out",
          str(tmp_path / "again")], rf"is a qkv run directory .*continue it with --resume --out {ours}$"),
    ):
        fails(capsys, argv, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
