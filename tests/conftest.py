import pytest
import torch


@pytest.fixture(autouse=True)
def seed():
    """Every test starts from the same RNG state."""
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (a file's ``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny
    models run fastest so, above all on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CODE = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """A small directory of Python-like files, for training runs in tests (`--data`)."""
    d = tmp_path_factory.mktemp("corpus")
    for i in range(4):
        (d / f"m{i}.py").write_text(CODE[i * 2000:(i + 1) * 4000], encoding="utf-8")
    return d


HF_TEXTS = ["the dog bites the man", "the man bites the dog", "attention is all you need", "héllo wörld"] * 4


@pytest.fixture(scope="session")
def with_tokenizer(tmp_path_factory):
    """A GPT-2-style directory: byte-level BPE tokenizer (trained offline) + a matching tiny model."""
    transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
    from tokenizers import Tokenizer as Fast, decoders, models, pre_tokenizers, trainers

    tok = Fast(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(HF_TEXTS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    d = tmp_path_factory.mktemp("with_tokenizer")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(d)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=32, n_embd=16, n_layer=1, n_head=2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)).save_pretrained(d)
    return d


@pytest.fixture
def ddp_matches_one_process(tmp_path):
    """Runs ``python -m qkv ARGS`` in one process and under torchrun in two (gloo on CPU), asserts the same
    steps and losses (within 1e-5), and returns both summaries."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    def check(args: list[str]) -> tuple[dict, dict]:
        env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
        launchers = {"one": [], "two": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]}
        for name, launcher in launchers.items():
            done = subprocess.run([sys.executable, *launcher, "-m", "qkv", *args, "--out", str(tmp_path / name)],
                                  env=env, capture_output=True, text=True, timeout=200)
            assert done.returncode == 0, done.stderr[-2000:]
        read = lambda d: [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
        a, b = read("one"), read("two")
        assert [m["step"] for m in a] == [m["step"] for m in b] and a
        for x, y in zip(a, b):
            assert abs(x["train_loss"] - y["train_loss"]) <= 1e-5 and abs(x["val_loss"] - y["val_loss"]) <= 1e-5
        return tuple(json.loads((tmp_path / d / "summary.json").read_text()) for d in launchers)

    return check


@pytest.fixture
def kernels():
    """qkv's C++ kernels (qkv.matvec, qkv.decoder_step), asked for when a test needs them, not at collection:
    the first build takes seconds."""
    from qkv.kernels import build as matvec

    if not matvec.available():
        pytest.skip(f"qkv's C++ kernels are not available here: {matvec.why_not()}")
