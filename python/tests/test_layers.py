"""The Python package in floors (docs/architecture.md §4.6): every module of
python/ernie imports only from its own floor or the floors below, at module
level; no import circle; inside a function, only an optional dependency.

Read from the source with `ast` (nothing is imported), so a new module, a
new import or a lazy import that papers over a circle fails here first.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ernie"

# Bottom to top; names relative to the package ("" is ernie/__init__.py).
# A module may import from its own floor (without a circle) and below.
FLOORS = (
    ("extension", ("_ernie",)),                       # the C++ extension, python/src
    ("launch", ("distributed.env", "distributed.launch")),  # the standard library only
    ("files and numbers", ("fp8", "weights")),        # numpy over the extension
    ("datasets", ("data.indexed", "data.sampler", "data.preprocess", "data",
                  "data.__main__")),                  # numpy; ernie.weights' read_json
    ("tracing", ("tensor", "functional", "nn", "optimizer")),
    ("config", ("strategy",)),
    ("parallel", ("mesh", "pipeline", "moe", "distributed")),
    ("models", ("models", "models.config_checks", "models.rope_scaling", "models.llama",
                "models.qwen2", "models.qwen3", "models.qwen3_moe", "models.mistral",
                "models.mixtral", "models.deepseek_v3", "models.ernie4_5", "models.auto")),
    ("compiler", ("cost_model", "compiler")),
    ("planning", ("cost", "autoplan", "autoplan.__main__")),
    ("training", ("train.config", "train.metrics", "train", "train.__main__")),
    ("package", ("",)),                               # loads every floor, links them
)

# Third-party packages a feature needs and ernie does not: imported where
# that feature runs, so `import ernie` works without them.
OPTIONAL = {"matplotlib", "torch", "tensorboard", "jax", "tokenizers"}

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _full(name: str) -> str:
    return f"ernie.{name}" if name else "ernie"


FLOOR_OF = {_full(m): (i, floor) for i, (floor, modules) in enumerate(FLOORS) for m in modules}


def package_sources() -> dict:
    """{module name: source} of every .py file of python/ernie."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path.read_text()
    return out


def _import_nodes(node, nested=False):
    """(Import or ImportFrom, whether inside a function or class)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, nested
        yield from _import_nodes(child, nested or isinstance(child, _SCOPES))


def imports(module: str, source: str, is_package: bool, known: set):
    """(target, line, nested) per imported name: target is an ernie module's
    name, or the top-level name of anything else."""
    for node, nested in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [(a.name, a.name) for a in node.names]
        elif node.level == 0:
            names = [(node.module, f"{node.module}.{a.name}") for a in node.names]
        else:
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(package[:len(package) - (node.level - 1)]
                            + ([node.module] if node.module else []))
            names = [(base, f"{base}.{a.name}") for a in node.names]
        targets = set()
        for base, submodule in names:
            if base == "__future__":
                continue
            if base != "ernie" and not base.startswith("ernie."):
                targets.add(base.split(".")[0])
            else:  # `from . import cost` imports ernie.cost; `from .nn import X`, ernie.nn
                targets.add(submodule if submodule in known else base)
        for target in sorted(targets):
            yield target, node.lineno, nested


def violations(sources: dict) -> dict:
    """Per check, what breaks it: modules in no floor, imports inside
    functions, imports of a higher floor, and import circles."""
    packages = {m for m in sources if m == "ernie" or any(o.startswith(m + ".") for o in sources)}
    known = set(sources) | {"ernie._ernie"}
    found = {"floorless": [], "function-level": [], "upward": [], "circle": []}
    found["floorless"] = [f"{m} is in no floor: add it to FLOORS" for m in sources
                          if m not in FLOOR_OF]
    graph = {m: set() for m in sources}
    for module, source in sources.items():
        floor, floor_name = FLOOR_OF.get(module, (len(FLOORS), "?"))
        for target, line, nested in imports(module, source, module in packages, known):
            where = f"{module}:{line}"
            ernie = target == "ernie" or target.startswith("ernie.")
            if nested and (ernie or target not in OPTIONAL):
                found["function-level"].append(
                    f"{where} imports {target} inside a function: move it to the top "
                    f"(only optional dependencies wait: {', '.join(sorted(OPTIONAL))})")
            if not ernie or target == module:
                continue
            if target not in known:
                found["upward"].append(f"{where} imports {target}, which is no module of ernie")
                continue
            graph[module].add(target)
            to, to_name = FLOOR_OF.get(target, (len(FLOORS), "?"))
            if to > floor:
                found["upward"].append(f"{where} (floor {floor_name}) imports {target} "
                                       f"(floor {to_name}, above it)")
    found["circle"] = _circles(graph)
    return found


def _circles(graph: dict) -> list:
    """One message per back edge of a depth-first walk: each a circle."""
    state, stack, out = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == "open":
                out.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def _check(kind):
    found = violations(package_sources())[kind]
    assert not found, "\n".join(found)


def test_every_module_has_a_floor():
    assert {"ernie.tensor", "ernie.distributed", "ernie.autoplan", "ernie.models.llama"} <= \
        set(package_sources())
    _check("floorless")
    stale = set(FLOOR_OF) - set(package_sources()) - {"ernie._ernie"}
    assert not stale, f"FLOORS names modules that are gone: {sorted(stale)}"


def test_no_import_inside_a_function_but_optional_ones():
    _check("function-level")


def test_imports_go_to_the_same_floor_or_below():
    _check("upward")


def test_no_import_circle():
    _check("circle")


def test_the_checks_catch_each_violation():
    """A package breaking every rule once: each check names it."""
    sources = {
        "ernie": "from . import compiler\n",
        "ernie.tensor": "import numpy as np\n\n"
                        "def add(a, b):\n    from . import functional as F\n    return F.add(a, b)\n",
        "ernie.functional": "from .tensor import Tensor\n",
        "ernie.mesh": "from .distributed import ProcessMesh\n",
        "ernie.distributed": "from . import mesh\nfrom .compiler import compile\n",
        "ernie.compiler": "def f():\n    import json\n    import matplotlib\n",
        "ernie.fresh": "",
    }
    found = violations(sources)
    assert found["floorless"] == ["ernie.fresh is in no floor: add it to FLOORS"]
    assert [v.split(" inside")[0] for v in found["function-level"]] == [
        "ernie.tensor:4 imports ernie.functional", "ernie.compiler:2 imports json"]
    assert found["upward"] == ["ernie.distributed:2 (floor parallel) imports ernie.compiler "
                               "(floor compiler, above it)"]
    assert found["circle"] == ["ernie.distributed -> ernie.mesh -> ernie.distributed",
                               "ernie.functional -> ernie.tensor -> ernie.functional"]
