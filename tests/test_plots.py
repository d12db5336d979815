"""qkv.viz.plots: each figure renders a non-empty PNG of the expected size."""
import re
import struct

import pytest
import torch
from matplotlib.image import imread

import qkv
from qkv import claims
from qkv.claims import multi_head
from qkv.viz import figures, plots
from qkv.viz.labels import readable_tokens


def png_size(path):
    """(width, height) from the PNG header (IHDR)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def assert_drawn(path, size):
    assert png_size(path) == size
    pixels = imread(path)[..., :3]  # (H, W, 3) floats
    assert pixels.std() > 0.05, "the image is (nearly) blank"
    assert (pixels < 0.5).mean() > 0.01, "almost nothing dark: no text or data"
    assert not list(path.parent.glob(".*.tmp")), "a temporary file was left behind"


def test_pe_figure(tmp_path):
    path = plots.plot_pe(tmp_path / "sub" / "pe.png", d_model=32, length=40)
    assert path == tmp_path / "sub" / "pe.png"
    assert_drawn(path, (1400, 550))  # figsize (14, 5.5) × DPI 100


def test_scaling_figure(tmp_path):
    assert_drawn(plots.plot_scaling(tmp_path / "s.png", d_ks=(4, 16, 64)), (1500, 480))


def test_scaling_curves_separate_with_d_k():
    c = plots.scaling_curves((4, 256))
    assert c["unscaled"][1]["max_weight"] > 0.8 > 0.2 > c["scaled"][1]["max_weight"]


def tiny_gpt(num_layers=2, num_heads=4):
    cfg = qkv.ModelConfig(vocab_size=16, d_model=16, attention=dict(num_heads=num_heads), num_layers=num_layers,
                          max_len=16)
    return qkv.GPT(cfg).eval()


def heading_inside(fig):
    """The figure's title (its text), after asserting that it lies inside the figure and above every panel."""
    renderer = fig.canvas.get_renderer()
    title = next(t for t in fig.texts if t.get_text() == fig.get_suptitle())
    box, page = title.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (box, page)
    assert box.y0 >= max(ax.get_tightbbox(renderer).y1 for ax in fig.axes), "the title overlaps a panel"
    return title.get_text()


def test_attention_grid_has_one_panel_per_layer_and_head(tmp_path):
    labels = ["a", " ", "$x$", "\n", "b", "\t", "é", "\x00"]  # mathtext, whitespace, control characters
    fig = plots.attention_figure(tiny_gpt(), torch.arange(8), labels)
    assert len(fig.axes) == 2 * 4 + 1  # a panel per (layer, head), and the colour bar
    path = figures.save_png(fig, tmp_path / "att.png")
    # cell = max(2.3, 0.1·8 + 0.9) = 2.3 in; width 4·2.3 + 1.6 = 10.8 in; height: 2·(2.3 + 0.4) + 1.0 in of panels
    # and key labels, then the title's measured height and 0.45 in around it
    assert png_size(path)[0] == 1080 and png_size(path)[1] > 100 * (2 * 2.7 + 1.0 + 0.45)
    assert "“a \\$x\\$ b é\\x00”" in heading_inside(fig).replace("\n", " ")  # the text, as written
    path = plots.plot_attention(tiny_gpt(1, 2), [1, 2, 3], ["x", "y", "z"], tmp_path / "att1.png", title="t")
    assert_drawn(path, (620, png_size(path)[1]))
    assert 100 * (2.3 + 0.4 + 1.0 + 0.45) < png_size(path)[1] < 100 * (2.3 + 0.4 + 1.0 + 0.45 + 0.3)  # one line


def test_chinese_title_is_the_text_as_written_and_fits(tmp_path):
    from qkv.data import BPETokenizer

    text = "狗咬人"
    bpe = BPETokenizer.train("狗咬人 人咬狗 " * 4, 260)  # byte-level: each character is 3 byte tokens, some merged
    ids, labels = readable_tokens(bpe, text)
    cfg = qkv.ModelConfig(vocab_size=bpe.vocab_size, d_model=16, attention=dict(num_heads=2), num_layers=1, max_len=16)
    fig = plots.attention_figure(qkv.GPT(cfg).eval(), ids, labels, text=text)
    figures.save_png(fig, tmp_path / "dog.png")  # draws it (the CJK font chosen)
    heading = heading_inside(fig)
    assert f"“{text}”" in heading.replace("\n", "") and "<e" not in heading
    ticks = [t.get_text() for ax in fig.axes[:-1] for t in ax.get_xticklabels() + ax.get_yticklabels()]
    shown = [t for t in ticks if t]
    assert shown and not [t for t in shown if re.search(r"<[0-9a-f]{2}", t)], shown  # no byte escapes
    assert {"".join(c for c in t if not "₀" <= c <= "₉") for t in shown} <= set(text), shown


def test_long_chinese_title_wraps_inside_a_narrow_figure(tmp_path):
    text = "自注意力让序列中每个位置都能直接看到其他所有位置" * 3  # no spaces to break at
    fig = plots.attention_figure(tiny_gpt(1, 1), [1, 2, 3], ["x", "y", "z"], text=text)
    figures.save_png(fig, tmp_path / "long.png")
    heading = heading_inside(fig)
    assert heading.count("\n") >= 2 and text in heading.replace("\n", "")


def test_attention_labels_are_readable():
    assert plots._label(" ") == "␣" and plots._label("\n") == "\\n" and plots._label("$") == r"\$"
    assert plots._label("\x00") == "\\x00" and plots._label("") == "∅"


def test_attention_needs_one_label_per_token(tmp_path):
    with pytest.raises(ValueError, match="one label per token"):
        plots.plot_attention(tiny_gpt(), torch.arange(4), ["a"], tmp_path / "x.png")


def test_report_embeds_figures(tmp_path):
    results = claims.run_claims(["mha-params"])
    gpt = tiny_gpt()
    results.append(multi_head.head_diversity(gpt, torch.randint(0, 16, (1, 8))))
    path = plots.write_report(results, tmp_path / "report.md", model=gpt, ids=torch.arange(6), labels=list("abcdef"))
    text = path.read_text(encoding="utf-8")
    for name in ("report-pe.png", "report-scaling.png", "report-heads.png", "report-attention.png"):
        assert f"]({name})" in text and (tmp_path / name).stat().st_size > 10_000
    assert_drawn(tmp_path / "report-heads.png", (800, 450))
    assert "| claim | section | measured | holds |" in text and "(`mha-params`)" in text


def test_complexity_figure(tmp_path):
    rows = [{"n": n, "path": p, "seconds": 1e-6 * n**t, "peak_mb": None if (p == "reference" and n > 512) else n**m}
            for n in (128, 256, 512, 1024) for p, t, m in (("reference", 2, 2), ("flash", 2, 1), ("linear", 1, 1))]
    assert_drawn(plots.plot_complexity(rows, tmp_path / "c.png"), (1300, 500))  # figsize (13, 5) × DPI 100
    with pytest.raises(ValueError, match="expected rows of dicts with keys"):
        plots.plot_complexity([{"n": 1}], tmp_path / "bad.png")
    with pytest.raises(ValueError, match="expected rows"):
        plots.plot_complexity([], tmp_path / "bad.png")
