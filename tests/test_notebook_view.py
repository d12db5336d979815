"""qkv.viz.notebook: the explorer page inline in Jupyter, in a sandboxed srcdoc iframe; from a model,
a run directory or a Hugging Face directory; executed in a real kernel (nbclient) and a real browser."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

import qkv
from qkv.training.run_dir import load_run, save_model
from qkv.data import CharTokenizer
from qkv.viz.notebook import ExplorerView, show
from test_explorer import browser  # noqa: F401  (the module's headless chromium, or a skip saying why)

TEXT = "狗咬人 & <b>"  # CJK, and characters that must stay escaped inside srcdoc
CELL = """\
import torch, qkv
from qkv.data import CharTokenizer
from qkv.viz.notebook import show
torch.manual_seed(0)
tokenizer = CharTokenizer("狗咬人 ")
show(qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=4)), "狗咬人", tokenizer=tokenizer)
"""


@pytest.fixture
def tiny():
    tokenizer = CharTokenizer(TEXT)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size)).eval(), tokenizer


class Tags(HTMLParser):
    """The start tags of a fragment, attribute values unescaped as a browser reads them."""

    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(fragment)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def iframe_page(fragment: str) -> str:
    """The one iframe of ``fragment``, checked to be sandboxed; returns the page in its srcdoc."""
    (tag, attrs), = Tags(fragment).tags
    assert tag == "iframe" and attrs["sandbox"] == "allow-scripts"  # scripts, but an opaque origin
    assert not re.search(r"srcdoc=\"[^\"]*[<>]", fragment)  # escaped: nothing in srcdoc is markup of the notebook
    return attrs["srcdoc"]


def assert_offline(page: str) -> None:
    """Nothing in the page loads from a network: no http(s) URL, every src/href a data: URL."""
    assert not re.search(r"https?://", page)
    loads = [v for _, attrs in Tags(page).tags for k, v in attrs.items() if k in ("src", "href") and v]
    assert all(v.startswith("data:") for v in loads), loads
    assert "default-src 'none'" in page  # the page's CSP forbids anything else


def test_model_view_is_the_explorer_page_in_a_sandboxed_iframe(tiny):
    model, tokenizer = tiny
    view = show(model, TEXT, tokenizer=tokenizer, height=500)
    page = iframe_page(view._repr_html_())
    assert page == view.html and page.startswith("<!DOCTYPE html>")
    assert '"tokens":["狗","咬","人"," ","\\u0026"," ","\\u003c","b","\\u003e"]' in page  # escaped JSON inside
    assert "height: 500px" in view._repr_html_()
    assert_offline(page)


def test_run_directory_and_run(tiny, tmp_path):
    model, tokenizer = tiny
    save_model(tmp_path / "run", model, tokenizer)
    for source in (tmp_path / "run", str(tmp_path / "run"), load_run(tmp_path / "run")):
        page = iframe_page(show(source, "狗咬人")._repr_html_())
        assert '"tokens":["狗","咬","人"]' in page
        assert_offline(page)


def test_hugging_face_directory(with_tokenizer):
    page = iframe_page(show(with_tokenizer, "the dog bites")._repr_html_())
    assert '"kind":"GPT"' in page and '" dog"' in page
    assert_offline(page)


def test_save_writes_the_page(tiny, tmp_path):
    model, tokenizer = tiny
    view = show(model, "狗", tokenizer=tokenizer)
    assert view.save(tmp_path / "x.html").read_text(encoding="utf-8") == view.html
    assert repr(view).startswith("ExplorerView(")


def test_bad_input(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="expected a tokenizer"):
        show(model, "狗")
    with pytest.raises(TypeError, match="source must be a qkv model.*got int"):
        show(3, "狗")
    with pytest.raises(ValueError, match="no such directory"):
        show(tmp_path / "missing", "狗")
    with pytest.raises(ValueError, match="no config.json"):
        show(tmp_path, "狗")
    with pytest.raises(ValueError, match="outside"):
        show(model, "猫", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="65 tokens but the model's max_len is 64"):
        show(model, "狗" * 65, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="height must be an int in 100 … 10000.*got 5"):
        ExplorerView("<p>", height=5)


def test_notebook_cell_displays_the_explorer(tmp_path):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[notebooks]')")
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    (out,) = nb.cells[0].outputs
    assert out["output_type"] == "execute_result"
    page = iframe_page(out["data"]["text/html"])
    assert '"tokens":["狗","咬","人"]' in page
    assert_offline(page)


def test_iframe_runs_the_page_in_a_browser(browser, tiny):  # noqa: F811
    model, tokenizer = tiny
    notebook = browser.new_page(viewport={"width": 1100, "height": 900})
    errors = []
    notebook.on("console", lambda m: m.type == "error" and errors.append(m.text))
    notebook.on("dialog", lambda d: (errors.append(d.message), d.dismiss()))
    notebook.set_content(f"<!DOCTYPE html><body>{show(model, TEXT, tokenizer=tokenizer)._repr_html_()}</body>")
    frame = notebook.frame_locator("iframe")
    frame.locator("#main:not([hidden])").wait_for(timeout=15_000)  # the page's scripts ran inside the sandbox
    assert "狗" in frame.locator("body").inner_text()
    assert not errors
    notebook.close()
