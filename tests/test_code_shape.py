"""Checks on the shape of the package's code (``radixray/`` only; tests and benchmarks are free).

- No import cycle between modules: every import counts, lazy ones inside functions included,
  except those under ``if TYPE_CHECKING:`` (they never run). Relative imports are resolved, and
  ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, to the module
  ``pkg`` loads ``name`` from when ``pkg`` exports it lazily (PEP 562 ``__getattr__`` over a
  {name: module} table, as ``radixray.worker`` does), else to ``pkg``. Each cycle is reported as
  a chain of imports with their lines.
- No file over ``MAX_FILE_LINES`` lines and no function over ``MAX_FUNCTION_LINES`` lines
  (``def`` line to last line, docstring included), outside the Triton kernels, whose launch
  wrappers and kernels read best whole.

The ``KNOWN_*`` allow-lists name violations that are being fixed in other branches of issue 21;
they are emptied when those branches merge (``test_known_violations_still_exist`` says when an
entry is stale). Do not add to them: fix the code.
"""

from __future__ import annotations

import ast
from collections import deque
from functools import cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "radixray"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80

# Temporary: each entry is owned by another helper on issue 21 and goes when their branch merges.
KNOWN_IMPORT_EDGES: dict[tuple[str, str], str] = {}
KNOWN_LONG_FILES: dict[str, str] = {}
KNOWN_LONG_FUNCTIONS: dict[str, str] = {}


class Import(NamedTuple):
    target: str  # the module imported
    line: int
    lazy: bool  # inside a function body


def _is_triton_kernel(rel: str) -> bool:
    return rel.startswith(f"{PACKAGE}/kernels/triton_")


@cache
def _sources() -> dict[str, tuple[str, ast.Module]]:
    """Module name -> (path relative to the repo, parsed tree), for every file in the package."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (rel.as_posix(), ast.parse(path.read_text(), str(rel)))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _existing(name: str, modules: dict) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``import a.b.c`` where ``c`` is
    an attribute still imports ``a.b``); None outside the package."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _package_of(module: str, is_package: bool, level: int) -> str:
    """The package a relative import of ``level`` dots starts from."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 >= len(parts):
        raise AssertionError(f"{module}: relative import beyond the top package")
    return ".".join(parts[: len(parts) - (level - 1)])


def _lazy_exports(package: str, tree: ast.Module, modules) -> dict[str, str]:
    """Names a package's ``__init__`` loads on first use (PEP 562): a module-level
    ``__getattr__`` beside a dict literal {name: "module"}. ``from package import Name`` then
    runs that module, so the import is an edge to it (the package alone would hide a cycle)."""
    body = tree.body
    if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in body):
        return {}
    out = {}
    for node in body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict):
            continue
        for k, v in zip(value.keys, value.values, strict=True):
            if not (isinstance(k, ast.Constant) and isinstance(v, ast.Constant)):
                continue
            if not (isinstance(k.value, str) and isinstance(v.value, str)):
                continue
            dots = len(v.value) - len(v.value.lstrip("."))
            rest = v.value[dots:]
            target = f"{_package_of(package, True, dots)}.{rest}" if dots else rest
            if target in modules:
                out[k.value] = target
    return out


# An import is a statement, and a statement sits only in another statement's body, an except
# clause or a match case, never inside an expression (a lambda's body is one): the walk skips
# expressions, nine in ten of the nodes (the whole package's walk: 0.85 s -> ~0.1 s).
_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def _imports(module: str, is_package: bool, tree: ast.Module, modules, lazy_exports) -> list:
    """Every import in ``tree`` that lands in ``modules``, resolved to the module it loads."""
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, lazy)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _existing(alias.name, modules)
                if target:
                    found.append(Import(target, node.lineno, lazy))
        elif isinstance(node, ast.ImportFrom):
            pkg = node.module or ""
            if node.level:
                pkg = _package_of(module, is_package, node.level) + (f".{pkg}" if pkg else "")
            for alias in node.names:
                sub = f"{pkg}.{alias.name}"
                if sub in modules:
                    target = sub
                else:
                    target = lazy_exports.get(pkg, {}).get(alias.name) or _existing(pkg, modules)
                if target:
                    found.append(Import(target, node.lineno, lazy))
        inside = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _HOLDS_STATEMENTS):
                visit(child, inside)

    visit(tree, False)
    return found


def build_graph(files: dict[str, tuple[bool, ast.Module]]) -> dict[str, dict[str, Import]]:
    """module -> {imported module: its first import}, self-imports left out. ``files`` maps a
    module name to (is it a package's ``__init__``, its parsed source)."""
    lazy_exports = {
        name: _lazy_exports(name, tree, files) for name, (is_pkg, tree) in files.items() if is_pkg
    }
    graph: dict[str, dict[str, Import]] = {}
    for name, (is_package, tree) in files.items():
        edges: dict[str, Import] = {}
        for imp in _imports(name, is_package, tree, files, lazy_exports):
            if imp.target != name:
                edges.setdefault(imp.target, imp)
        graph[name] = edges
    return graph


@cache
def _graph() -> dict[str, dict[str, Import]]:
    return build_graph(
        {m: (rel.endswith("/__init__.py"), tree) for m, (rel, tree) in _sources().items()}
    )


def _strong_components(graph: dict[str, dict]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the import graph is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def _shortest_cycle(graph: dict[str, dict], start: str, within: set[str]) -> list[str]:
    """Shortest path start -> ... -> start inside one strong component (BFS)."""
    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w not in within:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is in a cycle but no path returns to it")


def import_cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Every strong component's shortest cycle through each of its modules, without repeats
    (a cycle is named from its smallest module)."""
    cycles: dict[tuple[str, ...], list[str]] = {}
    for comp in _strong_components(graph):
        if len(comp) < 2:
            continue
        for start in comp:
            cycle = _shortest_cycle(graph, start, set(comp))
            ring = cycle[:-1]
            i = ring.index(min(ring))
            key = tuple(ring[i:] + ring[:i])
            cycles.setdefault(key, [*key, key[0]])
    return sorted(cycles.values())


def describe(cycle: list[str], graph: dict[str, dict[str, Import]]) -> str:
    """One line per hop: ``a -> b   [line 12, lazy]``."""
    hops = []
    for a, b in zip(cycle, cycle[1:], strict=False):
        imp = graph[a][b]
        hops.append(f"  {a} -> {b}   [line {imp.line}{', lazy' if imp.lazy else ''}]")
    return "\n".join(hops)


def _without_known(graph: dict[str, dict[str, Import]]) -> dict[str, dict[str, Import]]:
    return {
        a: {b: imp for b, imp in edges.items() if (a, b) not in KNOWN_IMPORT_EDGES}
        for a, edges in graph.items()
    }


@cache
def _long_files() -> dict[str, int]:
    out = {}
    for rel, _ in _sources().values():
        if _is_triton_kernel(rel):
            continue
        n = len((ROOT / rel).read_text().splitlines())
        if n > MAX_FILE_LINES:
            out[rel] = n
    return out


@cache
def _long_functions() -> dict[str, int]:
    out = {}
    for rel, tree in _sources().values():
        if _is_triton_kernel(rel):
            continue

        def visit(node: ast.AST, qual: str, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{qual}.{child.name}" if qual else child.name
                    if not isinstance(child, ast.ClassDef):
                        n = child.end_lineno - child.lineno + 1
                        if n > MAX_FUNCTION_LINES:
                            out[f"{rel}::{name}"] = n
                    visit(child, name)
                else:
                    visit(child, qual)

        visit(tree, "")
    return out


# ------------------------------------------------------------------ the checks


def test_no_import_cycle():
    graph = _without_known(_graph())
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s) in {PACKAGE}/:\n" + "\n\n".join(
        describe(c, graph) for c in cycles
    )


def test_no_file_over_the_limit():
    long = {rel: n for rel, n in _long_files().items() if rel not in KNOWN_LONG_FILES}
    assert not long, f"files over {MAX_FILE_LINES} lines: " + ", ".join(
        f"{rel} ({n})" for rel, n in sorted(long.items())
    )


def test_no_function_over_the_limit():
    long = {k: n for k, n in _long_functions().items() if k not in KNOWN_LONG_FUNCTIONS}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(
        f"{k} ({n})" for k, n in sorted(long.items())
    )


def test_ttft_reads_in_one_sitting():
    """The default policy and the modules only it imports stay within 400 lines in all (issue
    46: the cost model a reader checks by hand; its settings and shared parts live apart)."""
    graph, sources = _graph(), _sources()
    ttft = f"{PACKAGE}.router.policies.ttft"
    own = [m for m in graph[ttft] if {a for a, edges in graph.items() if m in edges} == {ttft}]
    lines = {m: len((ROOT / sources[m][0]).read_text().splitlines()) for m in [ttft, *own]}
    assert sum(lines.values()) <= 400, lines


def test_known_violations_still_exist():
    """An allow-list entry whose violation is gone must be deleted (so the list only shrinks)."""
    graph = _graph()
    stale = [f"import {a} -> {b}" for a, b in KNOWN_IMPORT_EDGES if b not in graph.get(a, {})]
    stale += [f"long file {rel}" for rel in KNOWN_LONG_FILES if rel not in _long_files()]
    stale += [f"long function {k}" for k in KNOWN_LONG_FUNCTIONS if k not in _long_functions()]
    assert not stale, "fixed, so delete from the KNOWN_* allow-lists: " + "; ".join(stale)


# ------------------------------------------------------------------ the checker checked


def _fake(files: dict[str, str]) -> dict[str, dict[str, Import]]:
    """Import graph of a made-up package: {"pkg/__init__" or "pkg.mod": source}."""
    return build_graph(
        {
            m.removesuffix("/__init__"): (m.endswith("/__init__"), ast.parse(src))
            for m, src in files.items()
        }
    )


def test_the_resolver_follows_every_kind_of_import():
    graph = _fake(
        {
            "p/__init__": "from .a import A\nfrom . import b\n",
            "p.a": "import p.b.x\nfrom p import c\nfrom p import A\nimport os\n",
            "p.b": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from p.c import C\n"
                "else:\n    from .d import D\n"
            ),
            "p.c": "",
            "p.d": "",
            "p.q/__init__": "from .. import d\nfrom ..q import e\n",
            "p.q.e": "def f():\n    from ..b import x\n    return x\n",
        }
    )
    edges = {m: {t: (i.line, i.lazy) for t, i in e.items()} for m, e in graph.items()}
    assert edges == {
        "p": {"p.a": (1, False), "p.b": (2, False)},
        # `import p.b.x` (x no module) loads p.b; `from p import c` is the submodule p.c;
        # `from p import A` (a name) is the package p; os is not ours.
        "p.a": {"p.b": (1, False), "p.c": (2, False), "p": (3, False)},
        # the TYPE_CHECKING branch is skipped, its else is not
        "p.b": {"p.d": (5, False)},
        "p.c": {},
        "p.d": {},
        # `..` from a package's __init__ is its parent; from a module, its package's parent
        "p.q": {"p.d": (1, False), "p.q.e": (2, False)},
        "p.q.e": {"p.b": (2, True)},
    }


def test_an_import_in_any_block_is_found():
    """The walk visits statements only: an import in an except clause, a match case, a with, a
    loop's else or a class body is still an edge (a function's is lazy)."""
    graph = _fake(
        {
            "p/__init__": "",
            "p.a": (
                "try:\n    pass\nexcept ImportError:\n    import p.b\n"
                "match 1:\n    case 1:\n        import p.c\n"
                "with x:\n    for i in y:\n        pass\n    else:\n        import p.d\n"
                "class K:\n    import p.e\n"
                "    async def f(self):\n        async with z:\n            import p.f\n"
            ),
            **{f"p.{m}": "" for m in "bcdef"},
        }
    )
    assert {t: (i.line, i.lazy) for t, i in graph["p.a"].items()} == {
        "p.b": (4, False),
        "p.c": (7, False),
        "p.d": (12, False),
        "p.e": (14, False),
        "p.f": (17, True),
    }


def test_cycles_are_found_and_named_as_chains():
    graph = _fake(
        {
            "p/__init__": "",
            "p.a": "from . import b\n",
            "p.b": "def f():\n    from p.c import x\n",
            "p.c": (
                "import p.a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.d\n"
            ),
            "p.d": "import p.c\n",
            "p.e": "import p.f\n",
            "p.f": "import p.e\n",
        }
    )
    cycles = import_cycles(graph)
    assert cycles == [["p.a", "p.b", "p.c", "p.a"], ["p.e", "p.f", "p.e"]]
    assert describe(cycles[0], graph).splitlines() == [
        "  p.a -> p.b   [line 1]",
        "  p.b -> p.c   [line 2, lazy]",
        "  p.c -> p.a   [line 1]",
    ]
    assert import_cycles(_fake({"p/__init__": "from . import a\n", "p.a": "x = 1\n"})) == []


def test_a_name_a_package_loads_on_first_use_is_an_edge_to_its_module():
    graph = _fake(
        {
            "w/__init__": (
                "import importlib\n_LAZY = {'Engine': '.engine', 'Gone': '.nowhere'}\n"
                "def __getattr__(name):\n    return importlib.import_module(_LAZY[name], 'w')\n"
            ),
            "w.engine": "from w.host import Host\n",
            "w.host": "def start():\n    from w import Engine, Other\n",
        }
    )
    assert {t: i.lazy for t, i in graph["w.host"].items()} == {"w.engine": True, "w": True}
    assert import_cycles(graph) == [["w.engine", "w.host", "w.engine"]]
