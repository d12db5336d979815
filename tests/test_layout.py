"""The codebase's own rules, checked: which layer may import which (above all, nothing in the reference layers
imports the kernels or decoding), no import circle in src/qkv counting every import, no private name imported from
another module, no function longer than 60 lines, no module longer than 500 lines, no class outside nn/ and
models/ with more than 12 methods, and the leaf modules import nothing from qkv."""
import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "qkv"


def modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = p
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import statement, at any depth (lazy ones too)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = f"{base}.{node.module}" if node.module else base
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub, []) if sub in known else (target, [a.name]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "qkv":
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "qkv"]
    return found


def graph() -> dict[str, set[str]]:
    """module -> the modules of src/qkv it imports: every import statement, at module level or inside a function,
    into the package root and into the module's own packages too."""
    known = modules()
    return {m: {t for t, _ in imports(m, p, known) if t in known and t != m} for m, p in known.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):  # the graph has a few hundred modules: recursion is deep enough
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1 or v in g[v]:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_counting_every_import():
    found = circles(graph())
    assert not found, "import circles (every import counted, inside functions too): " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle_through_a_lazy_import(tmp_path, monkeypatch):
    """The check can fail: a model whose method imports decoding, which imports the model, is a circle."""
    (tmp_path / "qkv" / "models").mkdir(parents=True)
    (tmp_path / "qkv" / "generation").mkdir()
    for init in ("", "models/", "generation/"):
        (tmp_path / "qkv" / f"{init}__init__.py").write_text("")
    (tmp_path / "qkv" / "models" / "gpt.py").write_text("def generate():\n    from ..generation import decode\n")
    (tmp_path / "qkv" / "generation" / "decode.py").write_text("from qkv.models.gpt import generate\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "qkv")
    assert circles(graph()) == [["qkv.generation.decode", "qkv.models.gpt"]]


def test_the_models_generate_methods_stay_public_and_work():
    """GPT.generate and Transformer.generate keep their signatures and docstrings and decode, with
    ``import qkv.models.gpt`` the first import of a fresh process (the root registers their decoders)."""
    code = textwrap.dedent("""\
        import qkv.models.gpt, inspect, sys, torch
        from qkv.models import GPT, ModelConfig, Transformer
        assert not any(m.startswith("qkv.generation") for m in sys.modules), "decoding loaded before use"
        assert list(inspect.signature(GPT.generate).parameters) == ["self", "ids", "max_new_tokens", "kwargs"]
        assert "max_new_tokens" in inspect.signature(Transformer.generate).parameters
        assert "sampling" in GPT.generate.__doc__ and "beam search" in Transformer.generate.__doc__
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=11, d_model=8, attention=dict(num_heads=2), num_layers=1, feed_forward=dict(d_ff=16),
                             max_len=16)
        out = GPT(config).eval().generate(torch.tensor([[1, 2]]), 3, temperature=0.0)
        assert out.shape == (1, 5) and out[0, :2].tolist() == [1, 2], out
        from qkv.generation.beam_search import Special
        model = Transformer(config).eval()
        out = model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, num_beams=2, special=Special(1, 2, 0))
        assert out.shape[0] == 1 and 2 <= out.shape[1] <= 5 and out[0, 0].item() == 1, out
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC.parent), "PATH": ""})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_no_private_name_is_imported_from_another_module():
    known = modules()
    bad = [f"{m}: {t}.{n}" for m, p in known.items() for t, names in imports(m, p, known)
           for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_no_function_is_longer_than_60_lines():
    long = [f"{p.relative_to(SRC)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in SRC.rglob("*.py") for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, long


def test_no_module_is_longer_than_500_lines():
    long = [f"{p.relative_to(SRC)} ({n} lines)" for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500]
    assert not long, long


def test_no_class_outside_nn_and_models_defines_more_than_12_methods():
    wide = [f"{p.relative_to(SRC)}:{c.lineno} {c.name} ({n} methods)"
            for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in ("nn", "models")
            for c in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(c, ast.ClassDef)
            if (n := sum(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for f in c.body)) > 12]
    assert not wide, wide



# Each layer and what it may import (besides itself and the leaf modules). Lazy imports inside functions count:
# a layer must not reach upwards even at run time, but through this door: a training run draws its loss curve
# with the figures' PNG writer (no circle: qkv.viz.figures imports nothing of training). The models' generate
# methods reach decoding through no import at all: the package root registers their decoders
# (qkv.models.decoders).
LEAVES = {"qkv.checks", "qkv.fileio", "qkv.runtime"}
LAYERS = {
    "qkv.nn": set(),
    "qkv.models": {"qkv.nn"},
    "qkv.kernels": {"qkv.nn", "qkv.models"},
    "qkv.generation": {"qkv.nn", "qkv.models", "qkv.kernels"},
    "qkv.data": set(),
    "qkv.interop": {"qkv.nn", "qkv.models", "qkv.generation", "qkv.data"},
    "qkv.training": {"qkv.nn", "qkv.models", "qkv.generation", "qkv.kernels", "qkv.data", "qkv.interop"},
    "qkv.viz": {"qkv.nn", "qkv.models", "qkv.generation", "qkv.kernels", "qkv.data", "qkv.interop", "qkv.training",
                "qkv.claims"},
    "qkv.claims": {"qkv.nn", "qkv.models", "qkv.generation", "qkv.kernels", "qkv.data", "qkv.interop",
                   "qkv.training", "qkv.viz"},
    "qkv.studies": {"qkv.nn", "qkv.models", "qkv.generation", "qkv.kernels", "qkv.data", "qkv.training", "qkv.viz"},
    "qkv.serve": {"qkv.nn", "qkv.models", "qkv.generation", "qkv.kernels"},  # beside the command, uses decoding
    "qkv.cli": {"*"},  # the command: anything
}
DOORS = {("qkv.training.report", "qkv.viz.figures")}


def layer_of(module: str) -> str | None:
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def layer_violations() -> list[str]:
    known, bad = modules(), []
    for m, p in known.items():
        mine = layer_of(m)
        if mine is None:
            continue
        allowed = LAYERS[mine]
        for target, _ in imports(m, p, known):
            theirs = layer_of(target)
            if theirs in (None, mine) or "*" in allowed or theirs in allowed or (m, target) in DOORS:
                continue
            bad.append(f"{m} imports {target} ({mine} may import {sorted(allowed) or 'nothing else in qkv'})")
    return bad


def test_every_module_is_in_a_layer_or_a_leaf():
    loose = [m for m in modules() if layer_of(m) is None and m not in LEAVES | {"qkv", "qkv.__main__"}]
    assert not loose, f"modules outside the layers of tests/test_layout.py: {loose}"


def test_each_layer_imports_only_the_layers_below_it():
    assert not layer_violations()


def test_the_reference_layers_do_not_import_the_kernels(monkeypatch):
    """The rule above all: qkv.nn and qkv.models import nothing of qkv.kernels nor of qkv.generation, not even
    inside a method — checked on the source, and by importing them in a fresh process (where a stray import would
    load the speed layer or decoding)."""
    known = modules()
    direct = [f"{m} imports {t}" for m, p in known.items() if layer_of(m) in ("qkv.nn", "qkv.models")
              for t, _ in imports(m, p, known) if t.startswith(("qkv.kernels", "qkv.generation"))]
    assert not direct
    code = ("import sys, qkv, qkv.nn.attention, qkv.models; "
            "print(sorted(m for m in sys.modules if m.startswith(('qkv.kernels', 'qkv.generation'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC.parent), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing the reference layers loaded {done.stdout.strip()}"


def test_the_layer_check_fails_on_a_reference_module_importing_the_kernels(tmp_path, monkeypatch):
    """The check can fail: a qkv.nn module that imports qkv.kernels (lazily, inside a function) is found."""
    fake = tmp_path / "qkv" / "nn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "sneaky.py").write_text("def f():\n    from ..kernels import accelerate\n    return accelerate\n")
    (tmp_path / "qkv" / "kernels").mkdir()
    (tmp_path / "qkv" / "kernels" / "__init__.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "qkv")
    assert layer_violations() == ["qkv.nn.sneaky imports qkv.kernels (qkv.nn may import nothing else in qkv)"]


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_leaf_modules_import_nothing_from_qkv(leaf):
    known = modules()
    assert imports(leaf, known[leaf], known) == []
