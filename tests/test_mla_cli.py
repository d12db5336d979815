"""Multi-head latent attention in the commands: `qkv train --model attention=mla` (MLA's widths derived from the
head width unless given), `qkv explore` and `qkv plot attention` on that run, whose maps are MLA's own softmax
weights (rows sum to 1, causal, equal to a recomputation from the module's queries and keys), and bad MLA
flags as one line, exit 2, nothing written."""
import base64
import json
import re

import numpy as np
import pytest
import torch
from test_cli_train import fails

pytestmark = pytest.mark.usefixtures("one_thread")

from qkv.cli import build_parser, main
from qkv.cli.model_flags import apply_overrides, latent_defaults
from qkv.cli.train import train_config
from qkv.models import ModelConfig
from qkv.nn.latent_attention import MultiHeadLatentAttention
from qkv.training.run_dir import load_run

FAST = ["--preset", "tiny", "--context", "16", "--batch-size", "4", "--quiet", "--device", "cpu",
        "--sample-tokens", "0", "--max-steps", "2"]
MLA = ["--positional", "rope", "--model", "attention=mla"]
TEXT = "def f1(x):\n    return x"


def config(*argv):
    return train_config(build_parser().parse_args(["train", *FAST, *argv])).model


def widths(model_config):
    a = model_config.attention
    return a.kind, a.kv_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim, a.q_lora_rank


def test_mla_widths_default_to_deepseek_v2s_proportions_of_the_head_width():
    assert latent_defaults(5120, 40) == dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                             v_head_dim=128, q_lora_rank=None)  # DeepSeek-V2's d_h = 128
    assert widths(config(*MLA)) == ("mla", 32, 4, 8, 8, None)  # tiny: d_model 32, 4 heads -> d_h 8
    assert widths(config(*MLA, "--d-model", "48", "--heads", "2")) == ("mla", 48, 12, 24, 24, None)  # d_c ≤ C
    assert widths(config(*MLA, "--heads", "16")) == ("mla", 8, 2, 2, 2, None)  # d_R even, at least 2
    given = config(*MLA, "--model", "attention.qk_rope_head_dim=2", "--model", "attention.q_lora_rank=12")
    assert widths(given) == ("mla", 32, 2, 8, 8, 12)
    assert config("--positional", "rope", "--model", "attention.kind=mla") == config(*MLA)


def test_a_latent_config_turned_back_to_mha_drops_its_latent_widths():
    mla = config(*MLA)
    mha = apply_overrides(mla, {"attention.kind": "mha"})
    assert mha.attention.kind == "mha" and mha.attention.kv_lora_rank is None
    assert apply_overrides(mla, {"attention.kv_lora_rank": 16}).attention.qk_nope_head_dim == 8  # kept


@pytest.fixture(scope="module")
def mla_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla") / "run"
    assert main(["train", *FAST, *MLA, "--data", str(data), "--out", str(out)]) == 0
    return out


def recomputed_weights(model, ids):
    """Each layer's softmax(q kᵀ · scale) over causal keys, q and k rebuilt from the module's own parts:
    queries [q_C; RoPE(q_R)], keys [W_UK c_KV; k_R] (DeepSeek-V2 eq. 10–17) -> L × (1, H, T, T)."""
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model(ids)
        for hook in hooks:
            hook.remove()
        maps = []
        for block, x in zip(model.blocks, inputs):
            attn, T = block.attn, x.size(1)
            q_nope, q_rope = attn.queries(x, 0)  # (1, H, T, d_N), (1, H, T, d_R)
            latent, k_rope = attn.latent(x, 0)  # (1, 1, T, d_c), (1, 1, T, d_R)
            k_nope, _ = attn.expand(latent)  # (1, H, T, d_N)
            q = torch.cat((q_nope, q_rope), -1)
            k = torch.cat((k_nope, k_rope.expand(-1, attn.num_heads, -1, -1)), -1)  # (1, H, T, d_K)
            scores = (q @ k.transpose(-2, -1)) * attn.softmax_scale  # (1, H, T, T)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            maps.append(scores.masked_fill(~causal, float("-inf")).softmax(-1))
    return maps


def test_explore_shows_mla_heads_with_its_real_softmax_weights(mla_run, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["explore", "--run", str(mla_run), "--text", TEXT, "--out", str(page)]) == 0
    m = re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', page.read_text(), re.S)
    data = json.loads(m.group(1))["data"]
    L, H, T = data["num_layers"], data["num_heads"], data["T"]
    att = torch.from_numpy(np.frombuffer(base64.b64decode(data["attention"]), dtype="<f4").reshape(L, H, T, T).copy())
    model = load_run(mla_run).model.eval()
    assert all(isinstance(b.attn, MultiHeadLatentAttention) for b in model.blocks)
    assert (L, H, T) == (2, 4, len(TEXT)) and data["model"]["causal"]
    assert torch.allclose(att.sum(-1), torch.ones(L, H, T), atol=1e-5) and not att.triu(1).any()
    want = recomputed_weights(model, torch.tensor([data["ids"]]))
    assert all(torch.allclose(att[i], w[0], atol=1e-5) for i, w in enumerate(want))
    assert (att[0] - att[0, :1]).abs().max() > 1e-3  # heads differ: one head's map is not repeated


def test_plot_attention_draws_the_mla_runs_heads(mla_run, tmp_path, capsys):
    assert main(["plot", "attention", "--run", str(mla_run), "--text", TEXT, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "attention.png").stat().st_size > 1000


def test_sampling_an_mla_run_prints_text(mla_run, capsys):
    assert main(["sample", "--run", str(mla_run), "--prompt", "def", "--max-new-tokens", "6", "--seed", "0"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out.startswith("def") and len(out) == len("def") + 6  # a character tokenizer: 6 characters


def test_info_names_the_runs_latent_attention(mla_run, capsys):
    assert main(["info", "--run", str(mla_run)]) == 0
    assert "attention=mla (kv_lora_rank=" in capsys.readouterr().out


def test_qk_norm_with_latent_heads_is_modelconfigs_one_line(data, tmp_path, capsys):
    """q/k norms need heads of one width; MLA's queries and keys are [q_C; q_R] and [k_C; k_R] (no such D)."""
    with pytest.raises(ValueError) as e:
        ModelConfig(d_model=32, position=dict(kind="rope"),
                    attention=dict(kind="mla", qk_norm=True, **latent_defaults(32, 4)))
    out = tmp_path / "r"
    line = fails(capsys, ["train", *FAST, *MLA, "--model", "attention.qk_norm=true", "--data", str(data),
                          "--out", str(out)], "qk_norm")
    assert line == f"qkv: error: {e.value}" and "one width" in line and not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--model", "attention=mla"], r"attention.kind 'mla' needs position.kind 'rope'.*got kind 'learned'"),
    ([*MLA, "--model", "attention.kv_lora_rank=0"], r"attention.kv_lora_rank must be a positive int"),
    ([*MLA, "--model", "attention.qk_rope_head_dim=3"], r"qk_rope_head_dim must be even"),
    ([*MLA, "--kv-heads", "2"], r"no grouped heads: num_kv_heads must be None or num_heads \(4\), got 2"),
    ([*MLA, "--model", "attention.sliding_window=4"], r"'mla' takes no sliding_window"),
    ([*MLA, "--model", "attention.kind=mha"], r"disagree \('mla' vs 'mha'\)"),
    (["--model", "attention.kv_lora_rank=8"], r"\['kv_lora_rank'\] belong to kind 'mla'"),
])
def test_bad_mla_flags_are_one_line_and_write_nothing(data, tmp_path, capsys, flags, message):
    out = tmp_path / "r"
    fails(capsys, ["train", *FAST, *flags, "--data", str(data), "--out", str(out)], message)
    assert not out.exists()
