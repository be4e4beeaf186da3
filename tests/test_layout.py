"""The package's layout is its architecture: few rooms at the top, imports that only go down.

An ast walk over every module of ``lld_monitor`` (imports inside functions included, since a lazy
import is still an arrow). Fails when the top level grows past 16 entries or when an import
cycle appears; the one arrow allowed back up is ``LLDMonitor.attach()``'s lazy import of the
adapters (``monitor.core`` -> ``integrations``), which the adapters' own import of the monitor
would otherwise close into a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lld_monitor"
MAX_TOP_LEVEL = 16
#: The one arrow back up: (importing module, imported module), lazily inside ``attach``.
ALLOWED_BACK = {("lld_monitor.monitor.core", "lld_monitor.integrations")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The project modules ``name`` imports (absolute or relative, at any depth of the code)."""
    known = set(known)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for t in targets:
            while t and t not in known:  # ``import a.b.c`` of a name inside a module
                t = t.rpartition(".")[0]
            if t and t.startswith("lld_monitor") and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {
        n: _imports(n, p, mods) - {m for a, m in ALLOWED_BACK if a == n} for n, p in mods.items()
    }


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None (iterative DFS, white/grey/black)."""
    state: dict[str, int] = {}
    for start in graph:
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            nxt = todo.pop()
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph.get(nxt, ()))))
    return None


def floors(graph: dict[str, set[str]]) -> list[list[str]]:
    """The rooms by floor: floor 0 imports no other room, floor k only rooms below it."""
    rooms: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        rooms.setdefault(_room(mod), set()).update(_room(d) for d in deps)
    for room, deps in rooms.items():
        deps.discard(room)
    out: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(rooms):
        floor = sorted(r for r, d in rooms.items() if r not in placed and d <= placed)
        assert floor, f"rooms import each other in a circle: {sorted(set(rooms) - placed)}"
        out.append(floor)
        placed.update(floor)
    return out


def test_top_level_has_at_most_16_entries() -> None:
    entries = sorted(
        p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")
    )
    assert len(entries) <= MAX_TOP_LEVEL, entries
    for p in PACKAGE.iterdir():
        assert p.suffix == ".py" or (p / "__init__.py").is_file() or p.name == "__pycache__", p


def test_no_import_cycle_between_modules() -> None:
    graph = _graph()
    assert len(graph) > 40  # the walk found the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_rooms_stack_in_floors_with_no_arrow_back_up() -> None:
    levels = floors(_graph())
    where = {room: i for i, floor in enumerate(levels) for room in floor}
    # the layers of DESIGN.md: the core at the bottom, the CLI on top
    assert where["columns"] == 0
    assert where["metrics"] < where["monitor"] < where["integrations"] < where["cli"]
    assert where["runlog"] < where["importers"] < where["analysis"] < where["monitor"]
    assert where["report"] < where["cli"] and where["toy"] < where["cli"]
    assert where["events"] < where["sinks"] < where["monitor"]


def test_the_only_arrow_back_up_is_attach_s_lazy_adapter_import() -> None:
    mods = _modules()
    core, integrations = next(iter(ALLOWED_BACK))
    assert integrations in _imports(core, mods[core], mods)  # still there, so still excepted
    tree = ast.parse(mods[core].read_text())
    lazy = [
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.ImportFrom) and node.module == integrations
    ]
    assert lazy == ["attach"]
    # with the arrow, the adapters (which build a monitor) and the monitor form the one circle
    full = {n: _imports(n, p, mods) for n, p in mods.items()}
    cycle = _cycle(full)
    assert cycle is None or (core in cycle and integrations in cycle), cycle


def test_a_cycle_is_caught() -> None:  # the check itself can fail
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
