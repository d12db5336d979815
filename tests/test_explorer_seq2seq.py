"""The encoder-decoder seen from outside: its three kinds of attention (encoder, decoder, cross) for a
translation, the explorer page with a view selector in a real browser, and the cross-attention grid."""
from __future__ import annotations

import base64
import json
import re
import warnings

import numpy as np
import pytest
import torch

import qkv
from qkv.data import SPECIAL_TOKENS, BPETokenizer
from qkv.training.tasks.translation import special_tokens
from qkv.viz import explorer
from qkv.viz.maps import pair_attention, seq2seq_maps, translation_attention
from test_explorer import ARTIFACTS, XSS, Watch, browser  # noqa: F401  (test_explorer's headless chromium)

PAIRS = [("the dog bites the man", "狗咬人"), ("the man bites the dog", "人咬狗"), ("hello world", "你好世界"),
         ("the cat sleeps", "猫在睡觉")]
SOURCE, TARGET = "the man bites the dog", "人咬狗 人咬狗"


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.train([s for pair in PAIRS for s in pair] * 5, 300, special_tokens=SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def model(tok):
    """A random tiny Transformer, 2 encoder and 3 decoder layers; wide q/k weights give distinct, sharp maps."""
    torch.manual_seed(0)
    config = qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size, num_layers=2, num_decoder_layers=3,
                                    attention=dict(num_heads=4))
    model = qkv.Transformer(config)
    attns = [b.attn for b in model.encoder.blocks] + [a for b in model.blocks for a in (b.attn, b.cross_attn)]
    for attn in attns:
        torch.nn.init.normal_(attn.q_proj.weight, std=0.3)
        torch.nn.init.normal_(attn.k_proj.weight, std=0.3)
    return model.eval()


@pytest.fixture(scope="module")
def att(model, tok):
    return translation_attention(model, tok, SOURCE, target=TARGET)


def _decode(b64: str, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").reshape(shape)


# ---- the data --------------------------------------------------------------------------------

def test_three_kinds_of_maps_with_their_tokens(att, model, tok):
    S, T = len(tok.encode(SOURCE)) + 1, len(tok.encode(TARGET)) + 1
    assert att.encoder.shape == (2, 4, S, S) and att.decoder.shape == (3, 4, T, T) and att.cross.shape == (3, 4, T, S)
    assert att.source[-1] == "<|eos|>" and att.target[0] == "<|bos|>" and "狗" in att.target
    assert (len(att.source), len(att.target)) == (S, T) and att.translation == TARGET and att.text == SOURCE
    for maps in (att.encoder, att.decoder, att.cross):  # every query's row is a distribution over the keys
        torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    assert torch.all(att.decoder.triu(1) == 0) and torch.all(att.decoder.diagonal(dim1=-2, dim2=-1) > 0)
    assert (att.cross[2, 3] - att.cross[0, 0]).abs().max() > 0.1  # the heads differ
    with torch.no_grad():  # the same weights as one ordinary forward pass
        src, tgt = torch.tensor([att.source_ids]), torch.tensor([att.target_ids])
        out = model(src, tgt, return_attention=True)
        enc = model.encoder(src, return_attention=True)
    torch.testing.assert_close(att.cross, torch.stack(out.cross_attentions)[:, 0])
    torch.testing.assert_close(att.decoder, torch.stack(out.attentions)[:, 0])
    torch.testing.assert_close(att.encoder, torch.stack(enc.attentions)[:, 0])


def test_greedy_translation_keeps_the_models_own_ids(model, tok):
    att = translation_attention(model, tok, "the dog", num_beams=1)
    special = special_tokens(tok)
    src = torch.tensor([tok.encode("the dog") + [special.eos]])
    row = model.generate(src, special=special, num_beams=1, max_new_tokens=min(63, 2 * src.size(1) + 10))[0].tolist()
    ids = row[:row.index(special.eos)] if special.eos in row else row
    assert att.target_ids == ids and att.translation == tok.decode(ids[1:])
    assert att.cross.shape[-2:] == (len(ids), src.size(1))


def test_bad_input_is_refused(model, tok):
    with pytest.raises(TypeError, match="expected a qkv.Transformer.*got GPT"):
        seq2seq_maps(qkv.GPT(qkv.ModelConfig.preset("tiny")), [1, 2], [1])
    with pytest.raises(ValueError, match="src_ids as one sequence of 1 … 64 ids, got shape \\(0,\\)"):
        seq2seq_maps(model, [], [1])
    with pytest.raises(ValueError, match="expected target labels: 2 strings"):
        pair_attention(model, [5, 2], ["a", "b"], [1, 5], ["x"])
    with pytest.raises(ValueError, match="max_len is 64"):
        translation_attention(model, tok, SOURCE, target="狗" * 80)
    with pytest.raises(ValueError, match="the text is empty"):
        translation_attention(model, tok, "")
    with pytest.raises(ValueError, match="target translation is for an encoder-decoder.*got GPT"):
        explorer.text_data(qkv.GPT(qkv.ModelConfig.preset("tiny")), tok, "the", target="狗")
    with pytest.raises(TypeError, match="target_ids are for a qkv.Transformer.*got GPT"):
        explorer.attention_data(qkv.GPT(qkv.ModelConfig.preset("tiny")), [1, 2], ["a", "b"], target_ids=[1],
                                target_labels=["x"])


def test_page_data_has_three_views(att, model):
    d = explorer.translation_data(model, att, title="t")
    assert [v["name"] for v in d["views"]] == ["encoder", "decoder", "cross"] and d["view"] == "cross"
    assert d["text"] == SOURCE and d["translation"] == TARGET and d["model"]["kind"] == "Transformer"
    S, T = len(att.source), len(att.target)
    enc, dec, cross = d["views"]
    assert (cross["rows"], cross["cols"], cross["num_layers"], cross["same"]) == (T, S, 3, False)
    assert (cross["queries"], cross["keys"], cross["query_ids"]) == (att.target, att.source, att.target_ids)
    assert (enc["rows"], enc["cols"], enc["num_layers"], enc["same"], enc["causal"]) == (S, S, 2, True, False)
    assert dec["causal"] and not cross["causal"] and len(dec["entropy"]) == 3 and len(dec["entropy"][0]) == 4
    np.testing.assert_array_equal(_decode(cross["attention"], (3, 4, T, S)), att.cross.numpy())
    same = explorer.attention_data(model, att.source_ids, att.source, title="t", target_ids=att.target_ids,
                                   target_labels=att.target, translation=TARGET)
    assert same["views"] == d["views"] and same["translation"] == TARGET


# ---- the page in a browser ---------------------------------------------------------------------

def _shown(browser, html_text):  # noqa: F811
    """The page as a new tab's content, and a Watch on it, once its data is drawn."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    watch = Watch(page)
    page.set_content(html_text)
    page.wait_for_selector("#main:not([hidden])")
    return page, watch


def _box(page, selector: str) -> dict:
    return page.eval_on_selector(selector, "e => { const r = e.getBoundingClientRect();"
                                           " return {w: r.width, h: r.height}; }")


def test_page_switches_views_and_shows_the_cross_attention(browser, model, att):  # noqa: F811
    from playwright.sync_api import expect

    S, T = len(att.source), len(att.target)
    data = explorer.translation_data(model, att, title="translation <b>")
    page, watch = _shown(browser, explorer.page(data, title="translation <b>"))
    assert page.locator("#view option").count() == 3 and page.locator("#view-pick").is_visible()
    assert TARGET in page.text_content("#translation") and SOURCE in page.text_content("#translation")
    page.select_option("#view", "0")  # encoder: source × source, one token list
    shape = "c => [c.dataset.view, +c.dataset.rows, +c.dataset.cols, c.dataset.layer]"
    assert page.eval_on_selector("#heatmap", shape) == ["encoder", S, S, "0"]
    assert page.locator("#tokens .tok").count() == S and not page.locator("#keys-block").is_visible()
    page.select_option("#view", "1")  # decoder: three layers
    assert page.locator("#layer option").count() == 3 and page.locator("#entropy tr").count() == 4
    page.select_option("#layer", "2")
    page.select_option("#view", "2")  # cross: target rows × source columns, layer 2 kept
    assert page.eval_on_selector("#heatmap", shape) == ["cross", T, S, "2"]
    assert page.locator("#tokens .tok").count() == T and page.locator("#key-tokens .tok").count() == S
    assert page.locator("#lines-left .ltok").count() == T and page.locator("#lines-right .ltok").count() == S
    assert page.locator("#thumbs .thumb").count() == 4 and page.locator("#entropy td").count() == 12

    page.hover("#key-tokens .tok >> nth=1")  # a source token: its column, and the target tokens attending to it
    col = page.locator("#hm-col")
    expect(col).to_have_attribute("data-col", "1")
    cell = _box(page, "#hm-col")["w"] - 4
    assert _box(page, "#hm-col")["h"] == T * cell + 4 and not page.locator("#hm-row").is_visible()
    assert "active" in page.locator("#lines-right .ltok >> nth=1").get_attribute("class")
    page.hover("#tokens .tok >> nth=2")  # a target token: its row over the S source columns
    expect(page.locator("#hm-row")).to_have_attribute("data-row", "2")
    assert _box(page, "#hm-row")["w"] == S * cell + 4 and _box(page, "#hm-row")["h"] == cell + 4
    shade = page.eval_on_selector_all("#key-tokens .tok", "ts => ts.map(t => t.style.backgroundColor)")
    assert all(s.startswith("rgba(31, 95, 191") for s in shade)  # each source token shaded by the weight
    page.hover("#lines-left .ltok >> nth=0")
    expect(page.locator("#hm-row")).to_have_attribute("data-row", "0")

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-seq2seq.png"), full_page=True)
    assert page.title() == "translation <b>" and watch.errors == [] and watch.dialogs == []
    page.close()


def test_page_shows_hostile_text_as_text(browser, model, tok):  # noqa: F811
    data = explorer.text_data(model, tok, XSS, target=XSS, title=XSS)
    html_text = explorer.page(data, title=XSS)
    assert "alert(1)</script>" not in html_text and "<img" not in html_text
    boot = json.loads(re.search(r'id="qkv-data">(.*?)</script>', html_text, re.S).group(1))
    assert boot["data"]["translation"] == XSS
    page, watch = _shown(browser, html_text)
    page.hover("#tokens .tok >> nth=3")
    assert page.text_content("#title") == XSS and XSS in page.text_content("#translation")
    assert page.locator("img").count() == 0 and page.locator("script").count() == 2
    assert watch.errors == [] and watch.dialogs == []
    page.close()


def test_served_page_translates_new_text(browser, model, tok):  # noqa: F811
    import threading

    from playwright.sync_api import expect

    srv = explorer.make_server(model, tok, port=0, max_chars=64, title="served", text="the dog")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        watch = Watch(page)
        page.goto(srv.url)
        page.wait_for_selector("#main:not([hidden])")
        expect(page.locator("#key-tokens .tok")).to_have_count(len(tok.encode("the dog")) + 1)
        page.fill("#text", "hello world")
        page.click("#run")
        expect(page.locator("#key-tokens .tok")).to_have_count(len(tok.encode("hello world")) + 1)
        assert page.input_value("#view") == "2" and watch.errors == [] and watch.dialogs == []
        page.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_notebook_show_on_a_translation_run(model, tok, tmp_path):
    from qkv.training.run_dir import save_model
    from qkv.viz.notebook import show

    save_model(tmp_path / "run", model, tok)
    view = show(tmp_path / "run", SOURCE, target=TARGET)
    assert '"kind":"translation"' in view.html and '"name":"cross"' in view.html and "sandbox" in view._repr_html_()


# ---- the cross-attention grid ------------------------------------------------------------------

def test_cross_attention_plot_size_and_cjk_labels(att, model, tok, tmp_path):
    from matplotlib.image import imread

    from qkv.viz import figures, seq2seq

    S, T = len(att.source), len(att.target)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        path = seq2seq.plot_cross_attention(att, tmp_path / "cross.png")
    width, height, _, _ = seq2seq.grid_size(3, 4, T, S)
    assert imread(path).shape[:2] == (round(height * figures.DPI), round(width * figures.DPI))
    if figures.cjk_font() is not None:  # the target's Chinese tick labels drawn, not boxes
        assert not [w for w in seen if "missing from font" in str(w.message)]
    one = seq2seq.plot_cross_attention(att, tmp_path / "layer1.png", layer=1)
    width, height, _, _ = seq2seq.grid_size(1, 4, T, S)
    assert imread(one).shape[:2] == (round(height * figures.DPI), round(width * figures.DPI))
    enc = seq2seq.plot_translation_attention(model, tok, SOURCE, tmp_path / "enc.png", target=TARGET,
                                             kind="encoder")
    width, height, _, _ = seq2seq.grid_size(2, 4, S, S)
    assert imread(enc).shape[:2] == (round(height * figures.DPI), round(width * figures.DPI))
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 3\).*got 3"):
        seq2seq.plot_cross_attention(att, tmp_path / "x.png", layer=3)
    with pytest.raises(ValueError, match="kind must be one of.*got 'self'"):
        seq2seq.plot_cross_attention(att, tmp_path / "x.png", kind="self")
    assert seq2seq.tick_label(" $x\n") == "␣\\$x↵" and seq2seq.tick_label("") == "∅"
