"""The core's structure, read from its source: the rules meet the machine through one interface.

- No rules module reads a private attribute of another object (`x._y` where `x` is not `self`):
  what a rule may use of its stream is `_rule_interface.StreamServices`, and nothing else.
- The machine (`_repair`) imports no rules module, and no rules module imports the machine, the
  registry or the cut policy: the registry (`_rules.DIALECT_RULES`) is the one place a dialect's
  rules are named.
- The core has no import circle, counting every import: at the top, under `TYPE_CHECKING` and
  inside functions (`from . import x` imports the package, `__init__`, too).
- Every dialect has rules in the registry, of the shape the machine asks for (`DialectRules`).
- Small, telling files: the machine under 500 lines, no core file over 600, no function over 100.

Each check is also run on a small source that breaks it, so it is known to be able to fail.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import finishline
from finishline import Dialect
from finishline._rule_interface import DialectRules
from finishline._rules import DIALECT_RULES

CORE = Path(finishline.__file__).parent
PACKAGE = "finishline"
# The sans-IO core: the package's `__init__` and its private modules (what else the package holds,
# the addon, the commands, the plugin, builds on the core and is not part of it).
CORE_FILES = sorted(CORE.glob("_*.py"))  # (`__init__.py` among them)


def module_of(path: Path) -> str:
    return PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"


def rules_modules() -> set[str]:
    """The modules that define the registry's rules classes and their bases (the core's own)."""
    return {
        base.__module__
        for rules in DIALECT_RULES.values()
        for base in inspect.getmro(rules)  # type: ignore[arg-type]
        if base.__module__.startswith(f"{PACKAGE}.")
    }


def private_reads(source: str) -> list[str]:
    """Every `x._y` in `source` where `x` is not `self` or `cls` (dunders aside), as `line: text`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def imported_modules(source: str, module: str) -> set[str]:
    """The core modules `source` (the module `module`) imports anywhere in its text: at the top,
    under `TYPE_CHECKING`, inside functions."""
    package_parts = module.split(".") if module == PACKAGE else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package_parts[: len(package_parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)  # `from . import x` imports the package itself first
            found.update(f"{base}.{alias.name}" for alias in node.names)
    core = {module_of(path) for path in CORE_FILES}
    return {name for name in found if name in core and name != module}


def import_graph() -> dict[str, set[str]]:
    return {module_of(path): imported_modules(path.read_text(), module_of(path)) for path in CORE_FILES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the path that closes it."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            circle = path[path.index(module) :] + [module]
            if not any(set(circle) == set(seen) for seen in found):
                found.append(circle)
            return
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


def source_of(module: str) -> str:
    return (CORE / f"{module.rpartition('.')[2]}.py").read_text()


# -- the checks, each shown able to fail first --------------------------------------------------


def test_the_checks_see_what_they_look_for():
    assert private_reads("def f(machine):\n    return machine._policy\n") == ["2: machine._policy"]
    assert private_reads("class R:\n    def f(self):\n        return self._stream.report.__class__\n") == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._repair import StreamRepair\ndef f():\n    from . import _chat\n"
    assert imported_modules(source, "finishline._messages") == {"finishline", "finishline._repair", "finishline._chat"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_rules_read_no_private_attribute_of_another_object():
    modules = rules_modules() | {f"{PACKAGE}._rules", f"{PACKAGE}._cut_policy"}
    reads = {module: private_reads(source_of(module)) for module in sorted(modules)}
    assert {module: found for module, found in reads.items() if found} == {}
    assert {f"{PACKAGE}._chat", f"{PACKAGE}._messages", f"{PACKAGE}._responses"} <= modules


def test_the_machine_imports_no_rules_module():
    machine = f"{PACKAGE}._repair"
    assert imported_modules(source_of(machine), machine) & rules_modules() == set()
    assert f"{PACKAGE}._rules" in imported_modules(source_of(machine), machine)


@pytest.mark.parametrize("module", sorted(rules_modules()))
def test_a_rules_module_imports_neither_the_machine_nor_the_registry(module):
    imported = imported_modules(source_of(module), module)
    assert imported & {f"{PACKAGE}._repair", f"{PACKAGE}._rules", f"{PACKAGE}._cut_policy", PACKAGE} == set()


def test_the_core_has_no_import_circle():
    assert circles(import_graph()) == []


def test_every_dialect_has_rules_of_the_shape_the_machine_asks_for():
    assert set(DIALECT_RULES) == set(Dialect)
    asked = {name for name in vars(DialectRules) if not name.startswith("_")} | set(DialectRules.__annotations__)
    assert {"on_event", "on_routine", "cut_frames", "may_stop"} <= asked
    for dialect, rules in DIALECT_RULES.items():
        assert {name for name in asked if not hasattr(rules, name)} == set(), dialect


def test_the_core_is_small_telling_files():
    lines = {path.name: path.read_text().count("\n") for path in CORE_FILES}
    assert lines["_repair.py"] < 500
    assert {name: count for name, count in lines.items() if count > 600} == {}
    long_functions = [
        f"{path.name}:{node.lineno} {node.name}"
        for path in CORE_FILES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 100
    ]
    assert long_functions == []
