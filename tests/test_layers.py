"""The import graph of src/qkernels runs downward: kernels -> ops -> nn -> models -> bench -> eval / export -> cli,
with no circle between modules. Every import counts: inside functions (it runs when called) and under `if
TYPE_CHECKING:` (a type checker's arrow is a reader's too)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "qkernels"
# lowest first; a module may import its own layer's modules and those of the layers below
LAYERS = [
    ("_runtime", "_files", "formats", "schemes", "reference", "configs", "autotune"),   # facts, formats, twins, tables
    ("kernels",),
    ("packed_weight", "ops"),
    ("nn", "cuda_wrapper"),
    ("models",),
    ("bench",),
    ("eval", "export_c"),
    ("cli",),
]
FACADE = "qkernels"         # the package's public names (loaded lazily): for the layers from bench up
FACADE_FROM = 5


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The qkernels modules `name` imports (a `from package import submodule` names the submodule)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.split(".")[0] == "qkernels":
                deps |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.split(".")[0] == "qkernels"}
    return deps - {name}


def layer(name: str) -> int | None:
    if name == FACADE:
        return None
    top = name.split(".")[1]
    return next((i for i, group in enumerate(LAYERS) if top in group), -1)


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports(m, p, known) for m, p in known.items()}


def upward(g: dict) -> list[str]:
    up = []
    for m, deps in g.items():
        if layer(m) is None:
            continue
        for d in deps:
            if layer(d) is None:
                if layer(m) < FACADE_FROM:
                    up.append(f"{m} -> the {FACADE} facade")
            elif layer(d) > layer(m):
                up.append(f"{m} (layer {layer(m)}) -> {d} (layer {layer(d)})")
    return up


def circles(g: dict) -> list[str]:
    state, stack, found = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == "open":
                found.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d in g and d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found


def test_every_module_has_a_layer():
    assert [m for m in graph() if layer(m) == -1] == []


def test_imports_run_downward():
    assert upward(graph()) == []


def test_no_module_imports_itself_through_others():
    assert circles(graph()) == []


def test_the_checks_see_a_circle_and_an_upward_arrow(tmp_path):
    """On a tree made to fail them: a circle closed by a function-level import, an arrow from ops up to models, and
    a circle through a TYPE_CHECKING import."""
    pkg = tmp_path / "qkernels"
    for rel, text in {"__init__.py": "", "ops/__init__.py": "", "ops/a.py": "def f():\n    from .b import g\n",
                      "ops/b.py": "from .a import f\nfrom ..models import m\n", "models/__init__.py": "",
                      "models/m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..ops import a\n"
                      }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    g = graph(pkg)
    assert g["qkernels.ops.a"] == {"qkernels.ops.b"} and g["qkernels.models.m"] == {"qkernels.ops.a"}
    assert g["qkernels.ops.b"] == {"qkernels.ops.a", "qkernels.models.m"}
    assert set(circles(g)) == {"qkernels.models.m -> qkernels.ops.a -> qkernels.ops.b -> qkernels.models.m",
                               "qkernels.ops.a -> qkernels.ops.b -> qkernels.ops.a"}
    assert upward(g) == ["qkernels.ops.b (layer 2) -> qkernels.models.m (layer 4)"]
