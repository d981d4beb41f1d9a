"""The house's layers, read from the code's own imports (docs/architecture.md, "Layers").

Every `.py` file under addons/, faults/ and labs/ is parsed (ast, nothing is imported) and each of
its imports of the project's own modules becomes an arrow: at module level, under `TYPE_CHECKING`
and inside a function alike, because each is a module that needs another. `from package import
name` is an arrow to `package` too (its `__init__` runs first), and to `package.name` when that is
a module. Then:

- no import circle anywhere;
- at most `MAX_LAZY_IMPORTS` imports of the project's own code inside a function, each a documented
  lazy load with a comment on its line or the line before saying why;
- the layer rules (`LAYER_RULES`): a lower layer never imports a higher one, directly or through
  another module;
- no function over `MAX_FUNCTION_LINES` lines and no file over `MAX_FILE_LINES` lines (tests aside).

A failure names the circle, the import (file and line) or the unit, so it says what to move.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The folders whose Python files are the project's code (addons/ is the wheel's top level).
CODE_FOLDERS = ("addons", "faults", "labs")
MAX_LAZY_IMPORTS = 4
MAX_FUNCTION_LINES = 100
MAX_FILE_LINES = 600


@dataclass(frozen=True, slots=True)
class Arrow:
    """One import of a project module by another."""

    importer: str
    imported: str
    path: Path
    line: int
    #: Inside a function (a lazy load), rather than at module level or under `TYPE_CHECKING`.
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "addons":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def code_files() -> dict[str, Path]:
    files = {}
    for folder in CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" not in path.parts:
                files[module_name(path)] = path
    return files


MODULES = code_files()


def _project_module(name: str) -> str | None:
    """The project module an imported name lives in (`labs.worker.settings.X` -> `labs.worker.settings`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> set[str]:
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if is_package else importer.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        names = [base, *(f"{base}.{alias.name}" if base else alias.name for alias in node.names)]
    found = {_project_module(name) for name in names}
    return {name for name in found if name and name != importer}


class _ImportReader(ast.NodeVisitor):
    """Every import of a project module in one file, and whether it sits inside a function."""

    def __init__(self, importer: str, path: Path) -> None:
        self.importer = importer
        self.path = path
        self.depth = 0
        self.arrows: list[Arrow] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for target in sorted(_targets(node, self.importer, self.path.name == "__init__.py")):
            self.arrows.append(Arrow(self.importer, target, self.path, node.lineno, in_function=self.depth > 0))

    visit_Import = visit_ImportFrom = _import


#: Each file parsed once, by module name.
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in MODULES.items()}


def read_arrows() -> list[Arrow]:
    arrows = []
    for name, path in MODULES.items():
        reader = _ImportReader(name, path)
        reader.visit(TREES[name])
        arrows.extend(reader.arrows)
    return arrows


ARROWS = read_arrows()
GRAPH: dict[str, dict[str, Arrow]] = {}
for _arrow in ARROWS:
    GRAPH.setdefault(_arrow.importer, {}).setdefault(_arrow.imported, _arrow)


def where(arrow: Arrow) -> str:
    return f"{arrow.path.relative_to(ROOT)}:{arrow.line}"


# -- circles ------------------------------------------------------------------------------------


def strongly_connected(graph: dict[str, dict[str, Arrow]], modules: list[str]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (each holds a circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.get(module, {}):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def one_circle(component: list[str], graph: dict[str, dict[str, Arrow]]) -> list[Arrow]:
    """A shortest circle through the component's first module, as the arrows that make it."""
    members = set(component)
    start = component[0]
    paths: dict[str, list[Arrow]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imported, arrow in sorted(graph.get(module, {}).items()):
                if imported == start:
                    return [*paths[module], arrow]
                if imported in members and imported not in paths:
                    paths[imported] = [*paths[module], arrow]
                    following.append(imported)
        frontier = following
    raise AssertionError(f"no circle through {start} in {component}")


def describe_circle(component: list[str]) -> str:
    arrows = one_circle(component, GRAPH)
    chain = " -> ".join([arrows[0].importer, *(arrow.imported for arrow in arrows)])
    steps = "; ".join(f"{arrow.importer} imports {arrow.imported} at {where(arrow)}" for arrow in arrows)
    return f"import circle {chain} ({steps}); modules in it: {', '.join(component)}"


def test_no_import_circle():
    circles = [describe_circle(component) for component in strongly_connected(GRAPH, sorted(MODULES))]
    assert not circles, "move the shared type or function down to a module both need:\n" + "\n".join(circles)


# -- lazy loads ---------------------------------------------------------------------------------


def _has_reason(arrow: Arrow) -> bool:
    lines = arrow.path.read_text(encoding="utf-8").splitlines()
    same_line = lines[arrow.line - 1]
    line_before = lines[arrow.line - 2].strip() if arrow.line > 1 else ""
    return "#" in same_line or line_before.startswith("#")


def lazy_imports() -> list[Arrow]:
    # One per import statement (an import of two names from a package is one lazy load).
    return list({(a.path, a.line): a for a in ARROWS if a.in_function}.values())


def test_few_in_function_imports_each_with_its_reason():
    lazy = lazy_imports()
    listed = "\n".join(f"{where(a)}: {a.importer} imports {a.imported}" for a in lazy)
    assert len(lazy) <= MAX_LAZY_IMPORTS, (
        f"{len(lazy)} imports of the project's own code inside functions, at most {MAX_LAZY_IMPORTS} "
        f"(only documented lazy loads; import the rest at module level):\n{listed}"
    )
    unexplained = [f"{where(a)}: {a.importer} imports {a.imported}" for a in lazy if not _has_reason(a)]
    assert not unexplained, "a lazy import needs a comment saying why, on its line or the line before:\n" + "\n".join(unexplained)


# -- layers -------------------------------------------------------------------------------------


def within(*prefixes: str) -> Callable[[str], bool]:
    """Modules that are one of `prefixes` or inside one."""
    return lambda module: any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def console_commands() -> set[str]:
    """The modules the wheel's console scripts run (pyproject.toml's `[project.scripts]`)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {target.partition(":")[0] for target in project.get("scripts", {}).values()}


def is_core(module: str) -> bool:
    # The sans-IO core: the `finishline` package's own private modules (its subpackages, if any,
    # are adapters the wheel ships beside it).
    head, _, rest = module.partition(".")
    return head == "finishline" and (not rest or (rest.startswith("_") and "." not in rest))


#: The command lines: `python -m` entries, the CLI modules they run, and the console scripts.
COMMAND_LINES = frozenset({"faults.cli", "labs.grade.cli", *console_commands()})


def is_cli(module: str) -> bool:
    return module.endswith("__main__") or module in COMMAND_LINES


#: The lab's runner: the modules that run a lab, its topologies, a scenario's run, the cells' books
#: and its repeats (a cell's result, `labs.cell_result`, is a type below them all).
RUNNER = within(
    "labs.runner", "labs.topology", "labs.scenario_run", "labs.cell_books", "labs.repeat", "labs.workers", "labs.cell_requests"
)


@dataclass(frozen=True, slots=True)
class LayerRule:
    """`importers` never import a module of `forbidden`, directly or through another module."""

    name: str
    importers: Callable[[str], bool]
    forbidden: Callable[[str], bool]
    #: Importers the rule allows (each with its reason in `LAYER_RULES`).
    allowed: frozenset[str] = frozenset()


LAYER_RULES = (
    LayerRule("the core imports only itself", is_core, lambda module: not is_core(module)),
    LayerRule(
        "the worker, the hub and the outcome never import the lab's runner",
        within("labs.worker", "labs.hub", "labs.outcome"),
        RUNNER,
    ),
    # The one grader that grades the lab's own gateways may start them the way the runner does.
    LayerRule(
        "the graders never import the lab's runner",
        within("labs.grade"),
        RUNNER,
        allowed=frozenset({"labs.grade.lab_gateways"}),
    ),
    # The fault CLI is a CLI, the top layer: its `--worker-settings` computes the simulated worker's
    # byte counts with the worker's own code. The faults themselves know nothing of the lab.
    LayerRule(
        "faults never imports the lab",
        lambda module: within("faults")(module) and not is_cli(module),
        within("labs"),
    ),
    LayerRule("only a command line imports a command line", lambda module: not is_cli(module), is_cli),
)


def crossings(rule: LayerRule, graph: dict[str, dict[str, Arrow]], modules: list[str]) -> dict[Arrow, list[str]]:
    """Each arrow into a `forbidden` module on a way from one of the rule's importers, with the
    importers whose imports lead through it (directly or through other modules). A way does not go
    on through a forbidden module (its own imports are its own business) nor through an importer
    the rule allows."""
    found: dict[Arrow, list[str]] = {}
    for start in modules:
        if not rule.importers(start) or start in rule.allowed:
            continue
        seen = {start}
        frontier = [start]
        while frontier:
            following = []
            for module in frontier:
                for imported, arrow in sorted(graph.get(module, {}).items()):
                    if imported in seen or imported in rule.allowed:
                        continue
                    seen.add(imported)
                    if rule.forbidden(imported):
                        found.setdefault(arrow, []).append(start)
                    else:
                        following.append(imported)
            frontier = following
    return found


@pytest.mark.parametrize("rule", LAYER_RULES, ids=lambda rule: rule.name)
def test_layer_rule(rule):
    offences = []
    for arrow, importers in crossings(rule, GRAPH, sorted(MODULES)).items():
        others = [module for module in importers if module != arrow.importer]
        named = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        through = f" (and through it {len(others)} more: {named})" if others else ""
        offences.append(f"{arrow.importer} imports {arrow.imported} at {where(arrow)}{through}")
    assert not offences, f"{rule.name}:\n" + "\n".join(offences)


# -- size ---------------------------------------------------------------------------------------


def test_no_function_over_the_limit():
    long_ones = []
    for name, path in MODULES.items():
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_ones.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long_ones, f"functions over {MAX_FUNCTION_LINES} lines (split into named steps):\n" + "\n".join(long_ones)


def test_no_file_over_the_limit():
    long_ones = []
    for path in MODULES.values():
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_FILE_LINES:
            long_ones.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long_ones, f"files over {MAX_FILE_LINES} lines (move a coherent part to its own module):\n" + "\n".join(long_ones)


# -- the reader itself --------------------------------------------------------------------------


def test_the_reader_sees_every_kind_of_import():
    # The reader could miss what it exists to catch: check it on imports it must see.
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import catalog\n"
        "import faults.orphans as orphans\n"
        "if TYPE_CHECKING:\n"
        "    from labs.worker.settings import WorkerSettings\n"
        "def f():\n"
        "    # lazy: the reason\n"
        "    from labs.grade.cli import main\n"
    )
    reader = _ImportReader("faults.example", ROOT / "faults" / "example.py")
    reader.visit(ast.parse(source))
    seen = {(a.imported, a.in_function) for a in reader.arrows}
    assert seen == {
        ("faults", False),
        ("faults.catalog", False),
        ("faults.orphans", False),
        ("labs.worker.settings", False),
        ("labs.grade.cli", True),
    }


def test_a_circle_is_found_and_named():
    there = Arrow("a", "b", ROOT / "a.py", 3, in_function=False)
    back = Arrow("b", "a", ROOT / "b.py", 5, in_function=True)
    graph = {"a": {"b": there}, "b": {"a": back}, "c": {"a": Arrow("c", "a", ROOT / "c.py", 1, in_function=False)}}
    assert strongly_connected(graph, ["a", "b", "c"]) == [["a", "b"]]
    assert one_circle(["a", "b"], graph) == [there, back]


def test_a_layer_crossing_is_found_through_another_module():
    def arrow(importer: str, imported: str) -> Arrow:
        return Arrow(importer, imported, ROOT / "x.py", 1, in_function=False)

    via, crossing = arrow("labs.grade.a", "labs.scorecard"), arrow("labs.scorecard", "labs.runner")
    graph = {"labs.grade.a": {"labs.scorecard": via}, "labs.scorecard": {"labs.runner": crossing}}
    rule = next(rule for rule in LAYER_RULES if rule.name == "the graders never import the lab's runner")
    assert crossings(rule, graph, sorted(graph)) == {crossing: ["labs.grade.a"]}
    allowed = {"labs.grade.lab_gateways": {"labs.runner": arrow("labs.grade.lab_gateways", "labs.runner")}}
    assert crossings(rule, allowed, sorted(allowed)) == {}
