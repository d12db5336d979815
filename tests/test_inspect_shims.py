"""qkv.inspect: the old import paths still work for one release, each with a DeprecationWarning
that names the new module."""
import importlib
import sys
import warnings

import pytest
import torch


@pytest.fixture
def fresh(monkeypatch):
    """Import a qkv.inspect module as if for the first time (the old modules come back afterwards)."""
    for name in [m for m in sys.modules if m == "qkv.inspect" or m.startswith("qkv.inspect.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module


@pytest.mark.parametrize("old, new", [("qkv.inspect", "qkv.claims"), ("qkv.inspect.claims", "qkv.claims"),
                                      ("qkv.inspect.plots", "qkv.viz.plots"),
                                      ("qkv.inspect.explorer", "qkv.viz.explorer")])
def test_old_path_warns_naming_the_new_module(fresh, old, new):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fresh(old)
    said = [str(w.message) for w in seen if w.category is DeprecationWarning]
    assert any(s.startswith(f"{old} is deprecated: use {new}") for s in said), said
    assert all(s.startswith(("qkv.inspect is", f"{old} is")) for s in said), said  # the package's and its own


def test_old_names_still_work(fresh):
    import qkv.claims
    from qkv.claims import multi_head, self_attention
    from qkv.data import CharTokenizer
    from qkv.viz import explorer, plots

    with pytest.warns(DeprecationWarning):
        from qkv.inspect.claims import CHECKS, run_claims, softmax_stats, head_diversity, encode_text
        from qkv.inspect import format_table, plots as old_plots, explorer as old_explorer
    assert run_claims is qkv.claims.run_claims and CHECKS is qkv.claims.CHECKS
    assert format_table is qkv.claims.format_table and softmax_stats is self_attention.softmax_stats
    assert head_diversity is multi_head.head_diversity
    assert [r.name for r in run_claims(["mha-params"])] == ["mha-params"]
    ids, labels = encode_text(CharTokenizer("ab"), "ba", max_len=4)  # the old form: a tensor
    assert isinstance(ids, torch.Tensor) and ids.tolist() == [1, 0] and labels == ["b", "a"]
    assert old_plots.plot_pe is plots.plot_pe and old_plots.attention_maps is plots.attention_maps
    assert old_explorer.render_html is explorer.render_html and old_explorer.tokenize is explorer.tokenize
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fresh("qkv.inspect.claims").nope
