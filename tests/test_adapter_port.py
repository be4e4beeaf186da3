"""Adapters go through the monitor's public port (issue 52, item 2): no module of
``lld_monitor/integrations`` reads or writes a private name of the monitor or its LLDS switch
(``monitor._emit``, ``monitor.llds.blocked = ...``); they call ``lifecycle_event``,
``add_reward_fn`` and ``llds.block``."""

from __future__ import annotations

import ast
from pathlib import Path

INTEGRATIONS = Path(__file__).resolve().parents[1] / "lld_monitor" / "integrations"
MONITOR_NAMES = {"monitor", "mon"}


def _base_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _private_uses(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        base = _base_name(node.value)
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if base in MONITOR_NAMES and private:
            out.append(f"{path.name}:{node.lineno} {base}.{node.attr}")
        # monitor.llds.<private> or an assignment to monitor.llds.blocked
        if base == "llds" and isinstance(node.value, ast.Attribute):
            owner = _base_name(node.value.value)
            if owner in MONITOR_NAMES and (private or isinstance(node.ctx, ast.Store)):
                out.append(f"{path.name}:{node.lineno} {owner}.llds.{node.attr}")
    return out


def test_no_adapter_touches_a_private_name_of_the_monitor():
    files = sorted(INTEGRATIONS.glob("*.py"))
    assert len(files) >= 5
    found = [u for f in files for u in _private_uses(f)]
    assert found == [], found


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(self):\n    self.monitor._emit('x')\n    self.monitor.llds.blocked = 'r'\n"
    )
    assert sorted(_private_uses(bad)) == ["bad.py:2 monitor._emit", "bad.py:3 monitor.llds.blocked"]
