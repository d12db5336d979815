"""qkv.inspect.claims: every check holds on qkv's modules and fails on a module built to break it."""
import json
import math

import pytest
import torch
from torch import nn

import qkv
from qkv.inspect import claims


def unscaled(q, k, v, **kw):
    """Attention without the 1/√d_k (the spec's §1.3 warning)."""
    return qkv.scaled_dot_product_attention(q, k, v, **{**kw, "scale": 1.0})


def sigmoid_attention(q, k, v, **kw):
    """Weights sigmoid(scores): positive, but rows do not sum to 1."""
    w = torch.sigmoid(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))
    return w @ v, w


class HeadsAsCopies(nn.Module):
    """The misconception §2.2 corrects: h full-width heads, so h times the parameters and FLOPs."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.heads = nn.ModuleList(qkv.SelfAttention(d_model) for _ in range(num_heads))
        self.out_proj = nn.Linear(num_heads * d_model, d_model, bias=False)

    def forward(self, x, return_weights=False):
        return self.out_proj(torch.cat([h(x) for h in self.heads], dim=-1))


class SpecMHA(qkv.MultiHeadAttention):
    """A module that runs the spec's §2.1 forward (scores (n, h, h))."""

    def forward(self, x, *args, **kwargs):
        return claims.spec_mha_scores(self, x[0])[1][None]


class Residual(qkv.SelfAttention):
    """Adds its input: the output leaves the convex hull of V's rows."""

    def forward(self, x, **kw):
        out, w = super().forward(x, return_weights=True)
        return out + x, w


@pytest.mark.parametrize("name", list(claims.CHECKS))
def test_every_claim_holds_on_qkv_and_is_a_plain_record(name):
    r = claims.CHECKS[name]()
    assert r.holds, r.summary
    assert r.name == name and r.section and r.claim and r.summary
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert set(d) >= {"claim", "section", "measured", "holds"} and d["measured"]


def test_checks_are_deterministic():
    a, b = claims.CHECKS["convex-combination"](), claims.CHECKS["convex-combination"]()
    assert a.measured == b.measured
    assert claims.CHECKS["convex-combination"](seed=1).measured != a.measured


def test_scaling_checks_fail_without_the_scaling():
    r = claims.scaling_variance(unscaled)
    assert not r.holds and r.measured["scaled_var"][0] > 10  # ≈ d_k = 16
    r = claims.scaling_saturation(unscaled)
    assert not r.holds and r.measured["scaled"]["max_weight"][-1] > 0.8


def test_softmax_rows_fails_for_unnormalised_weights():
    r = claims.softmax_rows(sigmoid_attention)
    assert not r.holds and max(r.measured["max_row_sum_error"].values()) > 0.1


def test_convex_combination_fails_when_the_output_is_not_w_v():
    assert not claims.convex_combination(Residual(16)).holds


def test_output_shape_fails_for_a_module_that_changes_width():
    assert not claims.output_shape({"Linear": (nn.Linear(16, 8), [(2, 5, 16)])}).holds


def test_params_and_flops_fail_for_heads_as_full_width_copies():
    r = claims.mha_params(HeadsAsCopies, d_model=32)
    assert not r.holds and r.measured["parameters"][-1] == 16 * 3 * 32**2 + 16 * 32**2
    r = claims.mha_flops(HeadsAsCopies, d_model=32, n=8)
    assert not r.holds and r.measured["max_over_min"] > 10


def test_flops_match_the_formula():
    r = claims.mha_flops()
    assert r.measured["flops_fused"] == r.measured["flops_reference"] == [r.measured["formula"]] * 5


def spec_mha(d_model, num_heads):
    """The spec's own constructor check (§2.1): an assert with no numbers."""
    assert d_model % num_heads == 0, "d_model 必须能被 num_heads 整除"
    return qkv.MultiHeadAttention(d_model, num_heads)


@pytest.mark.parametrize("make", [spec_mha, lambda d, h: qkv.MultiHeadAttention(d - d % h, h)],
                         ids=["assert-without-numbers", "silently-rounds"])
def test_heads_divisible_fails_for_an_unclear_or_missing_error(make):
    assert not claims.heads_divisible(make).holds


def test_equivariance_fails_when_a_pe_module_is_passed_as_no_pe_and_vice_versa():
    without, with_pe = claims._position_variants()
    r = claims.permutation_equivariance({"sin": with_pe["MHA+sinusoidal"]}, with_pe)
    assert not r.holds and r.measured["without_pe"]["sin"] > 1e-2
    r = claims.permutation_equivariance(without, {"plain MHA": without["MHA"]})
    assert not r.holds


def test_sinusoidal_checks_fail_for_wrong_encodings():
    sin = qkv.SinusoidalPositionalEncoding(128)
    assert not claims.sinusoidal_range(lambda p: 2 * sin(p)).holds
    assert not claims.sinusoidal_wavelengths(qkv.SinusoidalPositionalEncoding(128, base=100.0)).holds
    r = claims.sinusoidal_rotation(qkv.LearnedPositionalEmbedding(600, 64))
    assert not r.holds and min(r.measured["max_error"]) > 1e-3
    sin64 = qkv.SinusoidalPositionalEncoding(64)
    assert not claims.sinusoidal_rotation(lambda p: sin64(p**2)).holds  # phase quadratic in position


def test_rotation_matrix_is_built_from_pe_k_only():
    pe = qkv.SinusoidalPositionalEncoding(8)
    R = claims.rotation_for_shift(pe(torch.tensor([3]))[0].double())
    torch.testing.assert_close((pe(torch.tensor([5]))[0].double() @ R.T).float(), pe(torch.tensor([8]))[0],
                               atol=1e-5, rtol=0)


class Clamped(qkv.LearnedPositionalEmbedding):
    """Silently reuses the last vector past max_len."""

    def forward(self, positions):
        return self.weight[torch.arange(positions).clamp(max=self.max_len - 1)]


def test_learned_max_len_fails_for_silent_or_unclear_behaviour():
    assert not claims.learned_max_len(Clamped(16, 8)).holds
    table = nn.Embedding(16, 8)
    r = claims.learned_max_len(lambda n: table(torch.arange(n)))  # IndexError, not a clear error
    assert not r.holds and r.measured["learned_beyond"].startswith("unclear IndexError")


def test_causal_check_fails_without_the_mask():
    mha = qkv.MultiHeadAttention(16, 4)
    r = claims.causal_no_future({"no mask": (lambda x: mha(x), torch.randn(1, 6, 16))})
    assert not r.holds and r.measured["no mask"]["max_future_grad"] > 0


def test_symmetry_check_fails_when_w_q_is_w_k():
    tied = qkv.SelfAttention(16)
    tied.k_proj = tied.q_proj
    r = claims.scores_not_symmetric(tied)
    assert not r.holds and r.measured["relative_asymmetry"] < 1e-6


def test_self_attention_check_fails_when_the_diagonal_is_masked():
    x = torch.randn(1, 6, 8)
    no_self = ~torch.eye(6, dtype=torch.bool)
    r = claims.attends_to_itself({"no self": lambda: qkv.scaled_dot_product_attention(
        x, x, x, mask=no_self, return_weights=True)[1]})
    assert not r.holds and r.measured["no self"]["min_self_weight"] == 0


def diverse_gpt():
    """A GPT whose heads attend sharply and differently (large random Q/K), standing in for a trained one."""
    cfg = qkv.ModelConfig(vocab_size=32, d_model=32, num_heads=4, num_layers=2, max_len=32)
    model = qkv.GPT(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            nn.init.normal_(block.attn.q_proj.weight, std=1.0)
            nn.init.normal_(block.attn.k_proj.weight, std=1.0)
    return model


def test_head_diversity_holds_for_diverse_heads_and_fails_against_itself():
    model, ids = diverse_gpt(), torch.randint(0, 32, (2, 24))
    r = claims.head_diversity(model, ids)
    assert r.holds and r.measured["trained_mean"] > 2 * r.measured["init_mean"]
    assert not claims.head_diversity(model, ids, initial=model).holds


def test_head_distance_is_zero_for_identical_heads():
    model = qkv.GPT(qkv.ModelConfig(vocab_size=16, d_model=16, num_heads=2, num_layers=1, max_len=8))
    with torch.no_grad():  # head 1 = head 0
        for p in (model.blocks[0].attn.q_proj, model.blocks[0].attn.k_proj):
            p.weight[8:] = p.weight[:8]
    assert claims.head_distances(model, torch.randint(0, 16, (1, 8))).item() == pytest.approx(0, abs=1e-6)


def test_spec_corrections_fail_for_the_wrong_module():
    r = claims.spec_scores_shape(SpecMHA(32, 4))
    assert not r.holds and r.measured["spec_scores_shape"] == [6, 4, 4] and r.measured["correct_vs_module"] > 1e-2
    sa, pe = qkv.SelfAttention(16), qkv.SinusoidalPositionalEncoding(16)
    with_pe = lambda t: sa(t + pe(t.size(0)))  # noqa: E731
    assert not claims.spec_pe_check_claim(with_pe, with_pe).holds
    r = claims.spec_packed_projection(qkv.MultiHeadAttention(32, 4))
    assert not r.holds and r.measured["linear_submodules"] == ["q_proj", "k_proj", "v_proj", "out_proj"]


def test_spec_pe_check_is_blind_and_permutation_test_is_not():
    x = torch.randn(3, 16)
    sa, pe = qkv.SelfAttention(16), qkv.SinusoidalPositionalEncoding(16)
    with torch.no_grad():
        assert claims.spec_pe_check(sa(x)) == claims.spec_pe_check(sa(x + pe(3))) == False  # noqa: E712
        assert claims.permutation_check(sa, x, [2, 1, 0])
        assert not claims.permutation_check(lambda t: sa(t + pe(3)), x, [2, 1, 0])


def test_names_and_bad_input():
    assert claims.resolve_names(None) is None
    assert claims.resolve_names(["mha-params,output-shape", "mha-flops"]) == [
        "mha-params", "output-shape", "mha-flops"]
    with pytest.raises(ValueError, match="unknown claim 'nope'.*scaling-variance"):
        claims.resolve_names(["nope"])
    with pytest.raises(ValueError, match="needs a trained model"):
        claims.run_claims(["head-diversity"])
    assert [r.name for r in claims.run_claims(["mha-params", "output-shape"])] == ["output-shape", "mha-params"]


def test_encode_text_checks_vocabulary_and_length():
    from qkv.data import CharTokenizer

    tok = CharTokenizer("abc ")
    ids, labels = claims.encode_text(tok, "ab c", max_len=8)
    assert ids.tolist() == tok.encode("ab c") and labels == ["a", "b", " ", "c"]
    with pytest.raises(ValueError, match="outside"):
        claims.encode_text(tok, "abz", max_len=8)
    with pytest.raises(ValueError, match="9 tokens but the model's max_len is 8"):
        claims.encode_text(tok, "a" * 9, max_len=8)
    with pytest.raises(ValueError, match="empty"):
        claims.encode_text(tok, "", max_len=8)


def test_tables_show_every_claim():
    results = claims.run_claims(["mha-params", "output-shape"])
    results[0].holds = False
    table = claims.format_table(results)
    assert "holds   §2.2" in table and "FAILS   Q18" in table and "1 of 2 claims hold; failing: output-shape" in table
    md = claims.format_markdown(results, {"PE": "r-pe.png"})
    assert "| claim | section | measured | holds |" in md and "![PE](r-pe.png)" in md and "❌ fails" in md
