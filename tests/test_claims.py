"""qkv.claims: every check holds on qkv's modules and fails on a module built to break it
(one section per chapter module), and the registry runs and prints them in the spec's order."""
import json
import math

import pytest
import torch
from torch import nn

import qkv
from qkv import claims
from qkv.claims import corrections, faq, masks, multi_head, positional, self_attention


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
        return corrections.spec_mha_scores(self, x[0])[1][None]


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
    r = self_attention.scaling_variance(unscaled)
    assert not r.holds and r.measured["scaled_var"][0] > 10  # ≈ d_k = 16
    r = self_attention.scaling_saturation(unscaled)
    assert not r.holds and r.measured["scaled"]["max_weight"][-1] > 0.8


def test_softmax_rows_fails_for_unnormalised_weights():
    r = self_attention.softmax_rows(sigmoid_attention)
    assert not r.holds and max(r.measured["max_row_sum_error"].values()) > 0.1


def test_convex_combination_fails_when_the_output_is_not_w_v():
    assert not self_attention.convex_combination(Residual(16)).holds


def test_output_shape_fails_for_a_module_that_changes_width():
    assert not self_attention.output_shape({"Linear": (nn.Linear(16, 8), [(2, 5, 16)])}).holds


def test_params_and_flops_fail_for_heads_as_full_width_copies():
    r = multi_head.mha_params(HeadsAsCopies, d_model=32)
    assert not r.holds and r.measured["parameters"][-1] == 16 * 3 * 32**2 + 16 * 32**2
    r = multi_head.mha_flops(HeadsAsCopies, d_model=32, n=8)
    assert not r.holds and r.measured["max_over_min"] > 10


def test_flops_match_the_formula():
    r = multi_head.mha_flops()
    assert r.measured["flops_fused"] == r.measured["flops_reference"] == [r.measured["formula"]] * 5


def spec_mha(d_model, num_heads):
    """The spec's own constructor check (§2.1): an assert with no numbers."""
    assert d_model % num_heads == 0, "d_model 必须能被 num_heads 整除"
    return qkv.MultiHeadAttention(d_model, num_heads)


@pytest.mark.parametrize("make", [spec_mha, lambda d, h: qkv.MultiHeadAttention(d - d % h, h)],
                         ids=["assert-without-numbers", "silently-rounds"])
def test_heads_divisible_fails_for_an_unclear_or_missing_error(make):
    assert not multi_head.heads_divisible(make).holds


def test_equivariance_fails_when_a_pe_module_is_passed_as_no_pe_and_vice_versa():
    without, with_pe = positional.position_variants()
    r = positional.permutation_equivariance({"sin": with_pe["MHA+sinusoidal"]}, with_pe)
    assert not r.holds and r.measured["without_pe"]["sin"] > 1e-2
    r = positional.permutation_equivariance(without, {"plain MHA": without["MHA"]})
    assert not r.holds


def test_sinusoidal_checks_fail_for_wrong_encodings():
    sin = qkv.SinusoidalPositionalEncoding(128)
    assert not positional.sinusoidal_range(lambda p: 2 * sin(p)).holds
    assert not positional.sinusoidal_wavelengths(qkv.SinusoidalPositionalEncoding(128, base=100.0)).holds
    r = positional.sinusoidal_rotation(qkv.LearnedPositionalEmbedding(600, 64))
    assert not r.holds and min(r.measured["max_error"]) > 1e-3
    sin64 = qkv.SinusoidalPositionalEncoding(64)
    assert not positional.sinusoidal_rotation(lambda p: sin64(p**2)).holds  # phase quadratic in position


def test_rotation_matrix_is_built_from_pe_k_only():
    pe = qkv.SinusoidalPositionalEncoding(8)
    R = positional.rotation_for_shift(pe(torch.tensor([3]))[0].double())
    torch.testing.assert_close((pe(torch.tensor([5]))[0].double() @ R.T).float(), pe(torch.tensor([8]))[0],
                               atol=1e-5, rtol=0)


class Clamped(qkv.LearnedPositionalEmbedding):
    """Silently reuses the last vector past max_len."""

    def forward(self, positions):
        return self.weight[torch.arange(positions).clamp(max=self.max_len - 1)]


def test_learned_max_len_fails_for_silent_or_unclear_behaviour():
    assert not positional.learned_max_len(Clamped(16, 8)).holds
    table = nn.Embedding(16, 8)
    r = positional.learned_max_len(lambda n: table(torch.arange(n)))  # IndexError, not a clear error
    assert not r.holds and r.measured["learned_beyond"].startswith("unclear IndexError")


def test_causal_check_fails_without_the_mask():
    mha = qkv.MultiHeadAttention(16, 4)
    r = masks.causal_no_future({"no mask": (lambda x: mha(x), torch.randn(1, 6, 16))})
    assert not r.holds and r.measured["no mask"]["max_future_grad"] > 0


def test_symmetry_check_fails_when_w_q_is_w_k():
    tied = qkv.SelfAttention(16)
    tied.k_proj = tied.q_proj
    r = faq.scores_not_symmetric(tied)
    assert not r.holds and r.measured["relative_asymmetry"] < 1e-6


def test_self_attention_check_fails_when_the_diagonal_is_masked():
    x = torch.randn(1, 6, 8)
    no_self = ~torch.eye(6, dtype=torch.bool)
    r = faq.attends_to_itself({"no self": lambda: qkv.scaled_dot_product_attention(
        x, x, x, mask=no_self, return_weights=True)[1]})
    assert not r.holds and r.measured["no self"]["min_self_weight"] == 0


def diverse_gpt():
    """A GPT whose heads attend sharply and differently (large random Q/K), standing in for a trained one."""
    cfg = qkv.ModelConfig(vocab_size=32, d_model=32, attention=dict(num_heads=4), num_layers=2, max_len=32)
    model = qkv.GPT(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            nn.init.normal_(block.attn.q_proj.weight, std=1.0)
            nn.init.normal_(block.attn.k_proj.weight, std=1.0)
    return model


def test_head_diversity_holds_for_diverse_heads_and_fails_against_itself():
    model, ids = diverse_gpt(), torch.randint(0, 32, (2, 24))
    r = multi_head.head_diversity(model, ids)
    assert r.holds and r.measured["trained_mean"] > 2 * r.measured["init_mean"]
    assert not multi_head.head_diversity(model, ids, initial=model).holds


def test_head_distance_is_zero_for_identical_heads():
    model = qkv.GPT(qkv.ModelConfig(vocab_size=16, d_model=16, attention=dict(num_heads=2), num_layers=1, max_len=8))
    with torch.no_grad():  # head 1 = head 0
        for p in (model.blocks[0].attn.q_proj, model.blocks[0].attn.k_proj):
            p.weight[8:] = p.weight[:8]
    assert multi_head.head_distances(model, torch.randint(0, 16, (1, 8))).item() == pytest.approx(0, abs=1e-6)


def test_spec_corrections_fail_for_the_wrong_module():
    r = corrections.spec_scores_shape(SpecMHA(32, 4))
    assert not r.holds and r.measured["spec_scores_shape"] == [6, 4, 4] and r.measured["correct_vs_module"] > 1e-2
    sa, pe = qkv.SelfAttention(16), qkv.SinusoidalPositionalEncoding(16)
    with_pe = lambda t: sa(t + pe(t.size(0)))  # noqa: E731
    assert not corrections.spec_pe_check_claim(with_pe, with_pe).holds
    r = corrections.spec_packed_projection(qkv.MultiHeadAttention(32, 4))
    assert not r.holds and r.measured["linear_submodules"] == ["q_proj", "k_proj", "v_proj", "out_proj"]


def test_spec_pe_check_is_blind_and_permutation_test_is_not():
    x = torch.randn(3, 16)
    sa, pe = qkv.SelfAttention(16), qkv.SinusoidalPositionalEncoding(16)
    with torch.no_grad():
        assert corrections.spec_pe_check(sa(x)) == corrections.spec_pe_check(sa(x + pe(3))) == False  # noqa: E712
        assert corrections.permutation_check(sa, x, [2, 1, 0])
        assert not corrections.permutation_check(lambda t: sa(t + pe(3)), x, [2, 1, 0])


SPEC_ORDER = [  # what `qkv verify` prints, chapter by chapter
    "scaling-variance", "scaling-saturation", "sdpa-default-scale", "qkv-projections", "softmax-rows",
    "convex-combination", "output-shape", "path-length-one", "no-sequential-dependency",  # ch. 1, Q15
    "mha-formula", "mha-params", "mha-flops", "heads-divisible", "head-counts",  # ch. 2, Q11
    "permutation-equivariance", "sinusoidal-range", "sinusoidal-wavelengths", "sinusoidal-rotation",
    "learned-max-len", "pe-before-attention", "rope-alibi-relative", "embedding-plus-pe",  # ch. 3, Q6, Q7, Q10
    "block-order", "causal-no-future",  # ch. 4
    "separate-qk", "scores-not-symmetric", "attends-to-itself", "cross-attention", "length-stable",  # FAQ
    "softmax-vs-relu", "window-is-convolution", "additive-vs-dot",  # Q1, Q14, Q19
    "attention-quadratic", "attention-quadratic-answers",  # Q4
    "spec-1.5-self-attention", "spec-3.2-sinusoidal", "spec-q12-triu-mask",  # the spec's code, right
    "spec-2.1-scores-shape", "spec-3.4-pe-check", "spec-q2-packed-projection",  # corrections
]
FULL_ORDER = ["parallel-speed", "additive-vs-dot-measured", "attention-quadratic-measured"]


def test_registry_keeps_the_specs_order():
    assert list(claims.CHECKS) == SPEC_ORDER and list(claims.RUN_CHECKS) == ["head-diversity"]
    assert list(claims.FULL_CHECKS) == FULL_ORDER
    assert claims.claim_names() == SPEC_ORDER + FULL_ORDER + ["head-diversity"] + list(claims.NOT_MEASURABLE)
    assert [r.name for r in claims.run_claims(SPEC_ORDER[-3:][::-1])] == SPEC_ORDER[-3:]


def test_a_new_check_is_one_decorated_function(monkeypatch):
    from qkv.claims import registry

    monkeypatch.setattr(registry, "CHECKS", dict(registry.CHECKS))  # registered here only for this test

    @claims.check("draws-are-small", "Q0", "a draw from U(0, 1) is below `bound`")
    def draws_are_small(bound: float = 1.0):
        x = torch.rand(())
        return {"draw": x}, x < bound, f"drew {float(x):.3g}"

    assert registry.claim_names()[len(SPEC_ORDER)] == "draws-are-small"
    (r,) = registry.run_claims(["draws-are-small"], seed=3)
    assert r.holds and r.section == "Q0" and r.name == "draws-are-small"
    assert r.measured == draws_are_small(seed=3).measured != draws_are_small(seed=4).measured
    assert not draws_are_small(0.0).holds
    for name in ("draws-are-small", "mha-params", "head-diversity", "parallel-speed", "roadmap"):
        with pytest.raises(ValueError, match=f"claim '{name}' is registered twice"):
            claims.check(name, "Q0", "again")


def test_seeded_uses_one_thread_and_leaves_the_callers_rng_alone():
    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    with claims.seeded(5):
        assert torch.get_num_threads() == 1
        a = torch.rand(3)
    with claims.seeded(5):
        assert torch.equal(torch.rand(3), a)
    assert torch.get_num_threads() == threads and torch.equal(torch.random.get_rng_state(), state)


def test_names_and_bad_input():
    assert claims.resolve_names(None) is None
    assert claims.resolve_names(["mha-params,output-shape", "mha-flops"]) == [
        "mha-params", "output-shape", "mha-flops"]
    with pytest.raises(ValueError, match="unknown claim 'nope'.*scaling-variance"):
        claims.resolve_names(["nope"])
    with pytest.raises(ValueError, match="needs a trained model"):
        claims.run_claims(["head-diversity"])
    assert [r.name for r in claims.run_claims(["mha-params", "output-shape"])] == ["output-shape", "mha-params"]


def test_tables_show_every_claim():
    results = claims.run_claims(["mha-params", "output-shape"])
    results[0].holds = False
    table = claims.format_table(results)
    assert "holds   §2.2" in table and "FAILS   Q18" in table and "1 of 2 claims hold; failing: output-shape" in table
    md = claims.format_markdown(results, {"PE": "r-pe.png"})
    assert "| claim | section | measured | holds |" in md and "![PE](r-pe.png)" in md and "❌ fails" in md
