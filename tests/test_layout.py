"""The codebase's own rules, checked: which layer may import which (above all, nothing in the reference layers
imports the kernels), no import cycle in src/qkv, no private name imported from another module, no function
longer than 60 lines, and the leaf modules import nothing from qkv."""
import ast
import subprocess
import sys
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
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qkv"):
            found.append((node.module, [a.name for a in node.names]))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    g = {m: set() for m in known}
    for m, p in known.items():
        for target, _ in imports(m, p, known):
            if target in known and target != m and target != "qkv" and not m.startswith(target + ".") \
                    and (m, target) not in DOORS:  # a door is a call at run time, from a method, by design
                g[m].add(target)  # the package root only re-exports: edges into it are not dependencies
    return g


def test_no_import_cycle():
    g, state, cycles = graph(), {}, []

    def visit(v, path):
        state[v] = "open"
        for w in g[v]:
            if state.get(w) == "open":
                cycles.append(path[path.index(w):] + [w])
            elif w not in state:
                visit(w, path + [w])
        state[v] = "done"

    for v in sorted(g):
        if v not in state:
            visit(v, [v])
    assert not cycles, cycles


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



# Each layer and what it may import (besides itself, the package root's lazy doors and the leaf modules).
# Lazy imports inside functions count: a layer must not reach upwards even at run time, but through these doors:
# the models' generate methods hand over to qkv.generation (the DESIGN's GPT.generate / Transformer.generate),
# and a training run draws its loss curve with the figures' PNG writer.
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
DOORS = {("qkv.models.gpt", "qkv.generation"), ("qkv.models.encoder_decoder", "qkv.generation.beam_search"),
         ("qkv.training.report", "qkv.viz.figures")}


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
    """The rule above all: qkv.nn and qkv.models import nothing of qkv.kernels — checked on the source, and by
    importing them in a fresh process (where a stray import would load the speed layer)."""
    known = modules()
    direct = [f"{m} imports {t}" for m, p in known.items() if layer_of(m) in ("qkv.nn", "qkv.models")
              for t, _ in imports(m, p, known) if t.startswith("qkv.kernels") and (m, t) not in DOORS]
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
