"""The codebase's own rules, checked: no import cycle in src/qkv, no private name imported from another
module, no function longer than 60 lines, and the atomic-write module imports nothing from qkv."""
import ast
from pathlib import Path

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
            if target in known and target != m and target != "qkv" and not m.startswith(target + "."):
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


def test_fileio_is_a_leaf():
    known = modules()
    assert imports("qkv.fileio", known["qkv.fileio"], known) == []
