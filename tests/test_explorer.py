"""The attention explorer: the data it gathers, the page's safety, the loopback server, and the
page itself in a real headless browser (Debian's chromium through Playwright)."""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import qkv
from qkv.data.tokens import encode_text
from qkv.viz import explorer

CHROMIUM = os.environ.get("QKV_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
XSS = 'hi <script>alert(1)</script> "><img src=x onerror=alert(1)>'
VOCAB = " abcdefghijklmnopqrstuvwxyz<>/\"=()1.,!?'-:;&023456789ABCDEFGHIJK"  # 64 characters


class CharTokenizer:
    """One token per character of VOCAB (the interface of qkv.checkpoint's tokenizer)."""

    def encode(self, text: str) -> list[int]:
        bad = sorted({c for c in text if c not in VOCAB})
        if bad:
            raise ValueError(f"unknown characters {bad!r}: not in the tokenizer's vocabulary")
        return [VOCAB.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(VOCAB[i] for i in ids)

    def token_strings(self, ids: list[int]) -> list[str]:
        return [VOCAB[i] for i in ids]


def _model(*, encoder: bool = False, **overrides) -> torch.nn.Module:
    """A random tiny model whose heads differ: q/k weights wide enough for sharp, distinct maps."""
    torch.manual_seed(0)
    config = qkv.ModelConfig.preset("tiny", num_layers=3, attention=dict(num_heads=4)).replace(**overrides)
    model = (qkv.Encoder if encoder else qkv.GPT)(config)
    for block in model.blocks:
        torch.nn.init.normal_(block.attn.q_proj.weight, std=0.3)
        torch.nn.init.normal_(block.attn.k_proj.weight, std=0.3)
    return model.eval()


@pytest.fixture(scope="module")
def gpt():
    return _model()


def _decode(b64: str, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").reshape(shape)


def boot_json(html_text: str) -> dict:
    m = re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', html_text, re.S)
    return json.loads(m.group(1))


# ---- the data ------------------------------------------------------------------------------

def test_attention_data_carries_the_models_weights(gpt):
    tok = CharTokenizer()
    ids, labels = encode_text(tok, "the dog bit the man")
    d = explorer.attention_data(gpt, ids, labels)
    T = len(ids)
    assert (d["num_layers"], d["num_heads"], d["T"], d["tokens"], d["ids"]) == (3, 4, T, list("the dog bit the man"), ids)
    att = _decode(d["attention"], (3, 4, T, T))
    with torch.no_grad():
        ref = torch.stack([a[0] for a in gpt(torch.tensor([ids]), return_attention=True).attentions])
    np.testing.assert_array_equal(att, ref.numpy())
    assert d["model"]["causal"] and d["model"]["kind"] == "GPT"
    assert np.abs(att.sum(-1) - 1).max() < 1e-5  # each query's row is a distribution
    # the heads differ (else the layer/head selectors would show nothing)
    assert np.abs(att[2, 3] - att[0, 0]).max() > 0.1
    # learned PE: the first T rows of the trained table
    pe = d["positional"]
    np.testing.assert_array_equal(_decode(pe["matrix"], (T, 32)), gpt.embed.pos.weight[:T].detach().numpy())


def test_entropy_bits_pinned_values():
    # uniform over 1, 2, 4 keys: 0, 1, 2 bits -> mean 1; the all-zero row (no allowed key) is left out
    w = torch.tensor([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.25] * 4, [0, 0, 0, 0]], dtype=torch.float32)
    h, top = explorer.entropy_bits(w)
    assert h.item() == pytest.approx(1.0) and top.item() == pytest.approx(1.0)
    one_hot = torch.eye(3)
    assert explorer.entropy_bits(one_hot)[0].item() == 0.0


def test_encoder_and_positional_kinds():
    enc = _model(encoder=True, position=dict(kind="sinusoidal"))
    d = explorer.attention_data(enc, [1, 2, 3, 4], list("abcd"))
    assert not d["model"]["causal"] and d["model"]["kind"] == "Encoder"
    pe = _decode(d["positional"]["matrix"], (4, 32))
    np.testing.assert_allclose(pe[1, :2], [np.sin(1.0), np.cos(1.0)], rtol=1e-6)  # PE(1, 0), PE(1, 1)
    sim = _decode(d["positional"]["similarity"], (4, 4))
    np.testing.assert_allclose(np.diag(sim), 1.0, rtol=1e-5)
    rope = explorer.attention_data(_model(position=dict(kind="rope")), [1, 2], ["a", "b"])["positional"]
    assert rope["kind"] == "rope" and "matrix" not in rope and "RoPE" in rope["note"]


def test_bad_input_is_refused(gpt):
    with pytest.raises(ValueError, match="token_labels must be a list of 3 strings"):
        explorer.attention_data(gpt, [1, 2, 3], ["a", "b"])
    with pytest.raises(ValueError, match="1 … 512 tokens, got 0"):
        explorer.attention_data(gpt, [], [])
    with pytest.raises(ValueError, match="one sequence"):
        explorer.attention_data(gpt, torch.zeros(2, 3, dtype=torch.long), ["a"] * 3)
    with pytest.raises(TypeError, match="nn.Module"):
        explorer.attention_data("gpt", [1], ["a"])
    with pytest.raises(TypeError, match="cannot be explored"):
        explorer.attention_data(qkv.Transformer(qkv.ModelConfig.preset("tiny")), [1, 2], ["a", "b"])
    with pytest.raises(ValueError, match="max_len"):  # learned PE has 64 positions
        explorer.attention_data(gpt, [1] * 65, ["a"] * 65)
    with pytest.raises(ValueError, match="unknown characters"):
        encode_text(CharTokenizer(), "naïve")


# ---- the page: self-contained and safe --------------------------------------------------------

def test_page_is_self_contained_and_escapes_user_text(gpt):
    tok = CharTokenizer()
    ids, labels = encode_text(tok, XSS)
    html_text = explorer.render_html(gpt, ids, labels, title="</title><script>alert(2)</script>")
    assert "alert(1)</script>" not in html_text and "<img" not in html_text and "alert(2)</script>" not in html_text
    assert len(re.findall(r"<script", html_text)) == 2  # the data block and the page's own code
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html_text)  # nothing fetched from anywhere
    boot = boot_json(html_text)
    assert "".join(boot["data"]["tokens"]) == XSS and boot["data"]["title"].startswith("</title>")
    assert "default-src 'none'" in html_text  # CSP: no network, no foreign script


# ---- the server -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(gpt):
    srv = explorer.make_server(gpt, CharTokenizer(), port=0, max_chars=64, title="served", text="the cat")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _post(srv, body: bytes, *, host: str = "127.0.0.1", ctype: str = "application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
    conn.request("POST", "/api/attention", body=body, headers={"Content-Type": ctype, "Host": host})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def test_server_binds_loopback_only(server):
    assert server.server_address[0] == "127.0.0.1"
    others = set()
    try:
        others.add(socket.gethostbyname(socket.gethostname()))  # on Debian often 127.0.1.1
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # picks the outgoing interface; sends nothing
            others.add(s.getsockname()[0])
        except OSError:
            pass
    for addr in others - {"127.0.0.1", "0.0.0.0"}:
        with pytest.raises(OSError):
            socket.create_connection((addr, server.server_address[1]), timeout=2).close()


def test_server_answers_and_refuses(server):
    status, d = _post(server, json.dumps({"text": "abc"}).encode())
    assert status == 200 and d["tokens"] == ["a", "b", "c"] and d["num_heads"] == 4
    status, d = _post(server, json.dumps({"text": "x" * 65}).encode())
    assert status == 413 and "65 characters" in d["error"] and "at most 64" in d["error"]
    status, d = _post(server, b"{" + b" " * 600 + b"}")  # body over the byte bound: not even read
    assert status == 413 and "at most 64 characters" in d["error"]
    status, d = _post(server, json.dumps({"text": "€"}).encode())
    assert status == 400 and "unknown characters" in d["error"]
    assert _post(server, b"not json")[0] == 400
    assert _post(server, b'{"text": 3}')[0] == 400
    assert _post(server, b'{"text": "a"}', ctype="text/plain")[0] == 415
    assert _post(server, b'{"text": "a"}', host="evil.example:80")[0] == 403  # DNS rebinding
    assert _post(server, b'{"text": "a"}', host=f"localhost:{server.server_address[1]}")[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.putrequest("POST", "/api/attention")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "-1")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()


def test_make_server_checks_arguments(gpt):
    with pytest.raises(ValueError, match="port"):
        explorer.make_server(gpt, CharTokenizer(), port=70000)
    with pytest.raises(ValueError, match="max_chars"):
        explorer.make_server(gpt, CharTokenizer(), max_chars=0)


# ---- the command ------------------------------------------------------------------------------

def test_command_writes_the_page(gpt, tmp_path, monkeypatch):
    from qkv import cli

    monkeypatch.setattr(cli.sources, "load_model_source", lambda args, device="cpu": (gpt, CharTokenizer()))
    out = tmp_path / "page.html"
    assert cli.main(["explore", "--run", "somewhere", "--text", "the dog", "--out", str(out)]) == 0
    assert boot_json(out.read_text())["data"]["tokens"] == list("the dog")
    assert cli.main(["explore", "--run", "somewhere"]) == 2  # no --text and no --serve
    assert cli.main(["explore", "--run", "somewhere", "--text", "€", "--out", str(out)]) == 2


# ---- in a real browser -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install -e '.[dev]')")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no browser at {CHROMIUM}: `make test` installs Debian's chromium where apt-get "
                    "and root (or sudo) are available; here neither could install one")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Watch:
    """Console errors, page errors and dialogs (alert) seen by a page."""

    def __init__(self, page):
        self.errors, self.dialogs = [], []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))


def open_page(browser, tmp_path, html_text):
    path = tmp_path / "explore.html"
    path.write_text(html_text, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    watch = Watch(page)
    page.goto(path.as_uri())
    page.wait_for_selector("#main:not([hidden])")
    return page, watch


def _heatmap_pixels(page) -> str:
    return page.eval_on_selector("#heatmap", "c => c.toDataURL()")


def test_page_in_browser_selects_hovers_and_screenshots(browser, gpt, tmp_path):
    from playwright.sync_api import expect

    text = "the dog bit the man"
    ids, labels = encode_text(CharTokenizer(), text)
    page, watch = open_page(browser, tmp_path, explorer.render_html(gpt, ids, labels, title="qkv test page"))
    assert page.title() == "qkv test page"
    assert page.locator("#tokens .tok").count() == len(text)
    assert page.locator("#thumbs .thumb").count() == 4 and page.locator("#entropy td").count() == 12

    before = _heatmap_pixels(page)
    page.select_option("#layer", "2")
    page.select_option("#head", "3")
    after = _heatmap_pixels(page)
    assert after != before
    assert page.eval_on_selector("#heatmap", "c => [c.dataset.layer, c.dataset.head]") == ["2", "3"]
    assert page.locator("#thumbs .thumb.selected").get_attribute("data-head") == "3"
    assert page.locator("#entropy td.selected").get_attribute("data-layer") == "2"
    page.click("#thumbs .thumb[data-head='1']")  # a thumbnail click selects that head
    assert page.input_value("#head") == "1" and _heatmap_pixels(page) != after
    page.click("#entropy td[data-layer='2'][data-head='3']")  # so does an entropy cell
    assert page.input_value("#head") == "3" and _heatmap_pixels(page) == after

    i = 4  # hovering a token outlines its row of the heatmap (and its column, and its lines)
    page.hover(f"#tokens .tok >> nth={i}")
    row = page.locator("#hm-row")
    expect(row).to_have_attribute("data-row", str(i))
    assert row.is_visible()
    geo = page.evaluate("() => { const c = document.getElementById('heatmap').getBoundingClientRect();"
                        " const r = document.getElementById('hm-row').getBoundingClientRect();"
                        " return [c.top, r.top, r.height]; }")
    cell = 520 // len(text)
    margin = geo[1] + 2 - geo[0] - i * cell  # the row box starts 2 px above row i
    assert geo[2] == cell + 4 and 0 < margin < 200
    assert "active" in page.locator("#tokens .tok >> nth=4").get_attribute("class")
    assert "active" in page.locator("#lines-left .ltok >> nth=4").get_attribute("class")
    page.hover("#lines-right .ltok >> nth=7")  # from the lines view too
    expect(row).to_have_attribute("data-row", "7")
    page.hover(f"#tokens .tok >> nth={i}")
    expect(row).to_have_attribute("data-row", str(i))

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer.png"), full_page=True)
    assert watch.errors == [] and watch.dialogs == []
    page.close()


def test_page_in_browser_shows_hostile_text_as_text(browser, gpt, tmp_path):
    ids, labels = encode_text(CharTokenizer(), XSS)
    page, watch = open_page(browser, tmp_path, explorer.render_html(gpt, ids, labels, title=XSS))
    page.hover("#tokens .tok >> nth=5")
    page.select_option("#layer", "1")
    page.wait_for_selector("#hm-row[data-row='5']")
    shown = page.eval_on_selector_all("#tokens .tok", "ts => ts.map(t => t.textContent).join('')")
    assert shown == XSS.replace(" ", "␣")
    assert page.text_content("#title") == XSS and page.title() == XSS
    assert page.locator("img").count() == 0 and page.locator("script").count() == 2
    assert watch.dialogs == [] and watch.errors == []
    page.close()


def test_page_in_browser_positional_section(browser, gpt, tmp_path):
    page, watch = open_page(browser, tmp_path, explorer.render_html(gpt, [1, 2, 3], list("abc")))
    assert page.locator("#pe-matrix").is_visible() and "Learned" in page.text_content("#pe-note")
    page.close()
    rope = _model(position=dict(kind="rope"))
    page, watch = open_page(browser, tmp_path, explorer.render_html(rope, [1, 2, 3], list("abc")))
    assert not page.locator("#pe-views").is_visible() and "RoPE" in page.text_content("#pe-note")
    assert watch.errors == []
    page.close()


def test_served_page_runs_new_text_and_refuses_oversized(browser, server):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    watch = Watch(page)
    page.goto(server.url)
    page.wait_for_selector("#main:not([hidden])")
    assert page.input_value("#text") == "the cat" and page.locator("#tokens .tok").count() == 7
    page.fill("#text", XSS)
    page.click("#run")
    expect(page.locator("#tokens .tok")).to_have_count(len(XSS))
    assert page.locator("img").count() == 0 and watch.dialogs == [] and watch.errors == []

    page.fill("#text", "a" * 65)
    assert "65 / 64" in page.text_content("#count")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    msg = page.text_content("#error")
    assert "HTTP 413" in msg and "65 characters" in msg and "at most 64" in msg
    page.fill("#text", "price: 5€")
    page.click("#run")
    expect(page.locator("#error")).to_contain_text("unknown characters")
    assert page.locator("#tokens .tok").count() == len(XSS)  # the last good result stays on screen
    assert watch.dialogs == []
    page.close()


# ---- the command on real checkpoints: `--run` (qkv train's output) and `--hf` ------------------

CORPUS = "the quick brown fox jumps over the lazy dog. <script>alert(1)</script>\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from qkv.training.run_dir import save_model
    from qkv.data import CharTokenizer as Chars

    tok = Chars.train(CORPUS)
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size, num_layers=3,
                                           attention=dict(num_heads=4)))
    d = tmp_path_factory.mktemp("run")
    save_model(d, model, tok)
    return d


def test_command_explores_a_run(run_dir, tmp_path, capsys):
    from qkv import cli
    from qkv.training.run_dir import load_run

    out = tmp_path / "run.html"
    assert cli.main(["explore", "--run", str(run_dir), "--text", "the lazy dog", "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    d = boot_json(out.read_text())["data"]
    assert d["tokens"] == list("the lazy dog") and d["title"] == f"qkv explorer: {run_dir.name}"
    run = load_run(run_dir)
    ids = torch.tensor([run.tokenizer.encode("the lazy dog")])
    with torch.no_grad():
        ref = torch.stack([a[0] for a in run.model(ids, return_attention=True).attentions])
    np.testing.assert_array_equal(_decode(d["attention"], (3, 4, 12, 12)), ref.numpy())
    assert cli.main(["explore", "--run", str(run_dir), "--text", "naïve €", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error:") and "vocabulary" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["explore", "--run", str(tmp_path / "nope"), "--text", "the"]) == 2


def test_command_serves_a_run_on_loopback(run_dir):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "qkv", "explore", "--serve", "--run", str(run_dir), "--port", "0",
                             "--max-chars", "20", "--text", "the fox"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=20)
        conn.request("GET", "/")
        r = conn.getresponse()
        assert r.status == 200 and boot_json(r.read().decode())["data"]["tokens"] == list("the fox")
        for text, status in (("dog", 200), ("x" * 21, 413), ("€", 400)):
            conn.request("POST", "/api/attention", body=json.dumps({"text": text}),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            body = json.loads(r.read())
            assert r.status == status, body
            assert status == 200 or ("at most 20" if status == 413 else "vocabulary") in body["error"]
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="--hf needs the hf extra: pip install 'qkv[hf]'")
    from tokenizers import Tokenizer as Fast, decoders, models, pre_tokenizers, trainers

    from qkv.interop import to_hf

    tok = Fast(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS] * 4, trainers.BpeTrainer(
        vocab_size=290, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    d = tmp_path_factory.mktemp("hf")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(d)
    torch.manual_seed(0)
    config = qkv.ModelConfig.preset("tiny", vocab_size=tok.get_vocab_size(), num_layers=3,
                                    attention=dict(num_heads=4), feed_forward=dict(activation="gelu_tanh"))
    to_hf(qkv.GPT(config)).save_pretrained(d)
    return d


def test_command_explores_a_hugging_face_directory(hf_dir, tmp_path):
    from qkv import cli

    out = tmp_path / "hf.html"
    assert cli.main(["explore", "--hf", str(hf_dir), "--text", "the lazy fox", "--out", str(out)]) == 0
    d = boot_json(out.read_text())["data"]
    assert "".join(d["tokens"]) == "the lazy fox" and d["num_layers"] == 3 and d["num_heads"] == 4
    bare = tmp_path / "bare"  # weights without a tokenizer: a clear one-line error
    bare.mkdir()
    for f in hf_dir.iterdir():
        if f.name.startswith(("config", "model")):
            (bare / f.name).write_bytes(f.read_bytes())
    assert cli.main(["explore", "--hf", str(bare), "--text", "the"]) == 2


def test_served_page_without_text_waits_for_input(browser, gpt):
    from playwright.sync_api import expect

    srv = explorer.make_server(gpt, CharTokenizer(), port=0, max_chars=64, title="empty <b>start</b>")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        watch = Watch(page)
        page.goto(srv.url)
        assert page.locator("#empty").is_visible() and not page.locator("#main").is_visible()
        assert page.text_content("#title") == "empty <b>start</b>"
        page.fill("#text", "a b")
        page.press("#text", "Control+Enter")
        expect(page.locator("#tokens .tok")).to_have_count(3)
        assert not page.locator("#empty").is_visible() and watch.errors == []
        page.close()
    finally:
        srv.shutdown()
        srv.server_close()
