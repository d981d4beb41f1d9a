"""Which tests share a pytest-xdist worker, and in which order the groups go (`make test` runs
`-n 3 --dist loadgroup --no-loadscope-reorder`).

Registered in tests/conftest.py (`pytest_plugins`). Each test gets pytest-xdist's public
`xdist_group` mark, and `--dist loadgroup` keeps a group on one worker:

- a file with a test that uses one of `SHARED_RUNS`, a session fixture that runs something costly
  once (a lab run of a minute), is wholly in that fixture's group: spread over two workers, each
  would run it;
- any other file is a group of its own, so a module's services (a module-scoped mitmdump, an
  upstream) start once, as with `--dist loadfile`.

The group is read from the fixtures each test asks for, so a new user of a shared run cannot be
left out. (pytest-xdist then shows the group after a test's id: `test_x.py::test_y@tests/test_x.py`.)

Order: the costliest groups first, by the seconds a measured run gave each (`GROUP_SECONDS`, the
file `tests/group_seconds.json`; a group it does not know counts as none, and goes after the known
ones in the order pytest collected it). `make test` passes `--no-loadscope-reorder`, so pytest-xdist
hands the groups out in this order, each to the first worker that runs low, rather than by how many
tests each has: a group of a few tests around a two-minute lab run then starts first instead of
last, when one worker would run it alone. The numbers only order the run; a stale file costs time,
never a result. `python -m tests.worker_groups JUNIT_XML` prints the file anew from a run's
`--junitxml` report.

pytest-xdist 3.8.0 carries the group to its scheduler in that suffix, which it writes into the
test's id. From pytest 9.2 the write no longer takes (pytest-xdist issue #1386): the marks are
there, but every test is scheduled alone, and each worker runs every module's services and every
shared run again, silently. pyproject.toml pins pytest below 9.2 for this, and
`pytest_xdist_node_collection_finished` below stops the run in one line if a worker's ids come back
without their group, so an upgrade cannot bring the slow, split run back unnoticed.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

#: The session fixtures that are each costly to start: a whole lab run (tests/fixtures_chaos.py), the
#: real llama.cpp server (tests/fixtures_llama.py: its files go to one worker, which starts it once).
SHARED_RUNS = ("small_matrix", "llama_cpp")
#: Seconds per group in a measured run (see the module docstring).
GROUP_SECONDS_FILE = Path(__file__).with_name("group_seconds.json")


def group_seconds() -> dict[str, float]:
    """The measured seconds of each group ({} when the file is missing or unreadable)."""
    try:
        seconds = json.loads(GROUP_SECONDS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(group): float(value) for group, value in seconds.items()} if isinstance(seconds, dict) else {}


def costliest_first(items: list[pytest.Item], group_of: dict[str, str], seconds: dict[str, float]) -> list[pytest.Item]:
    """`items` with their groups in descending measured cost (unknown groups last, as collected),
    each group's tests together and in the order they came."""
    order: dict[str, int] = {}
    for item in items:
        order.setdefault(group_of[item.nodeid], len(order))
    ranked = sorted(order, key=lambda group: (-seconds.get(group, 0.0), order[group]))
    rank = {group: number for number, group in enumerate(ranked)}
    return sorted(items, key=lambda item: rank[group_of[item.nodeid]])


def seconds_from_junit(report: Path) -> dict[str, float]:
    """Per group, the seconds its tests took (setup, call and teardown) in a `--junitxml` report of
    a run with these groups (pytest-xdist names the group after each test's id)."""
    totals: dict[str, float] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name", "")
        group = name.rsplit("@", 1)[1] if "@" in name.rsplit("]", 1)[-1] else None
        if group is None:  # the report's name lost the suffix: the file is the group
            group = case.get("classname", "").replace(".", "/") + ".py"
        totals[group] = totals.get(group, 0.0) + float(case.get("time") or 0.0)
    return {group: round(seconds, 1) for group, seconds in sorted(totals.items(), key=lambda item: -item[1])}


def ungrouped(ids: list[str] | tuple[str, ...]) -> list[str]:
    """The test ids that pytest-xdist did not suffix with their `xdist_group` (`id@group`)."""
    return [test_id for test_id in ids if "@" not in test_id.rsplit("]", 1)[-1]]


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


# tryfirst: pytest-xdist reads the marks in its own (trylast) collection hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_of_file: dict[str, str] = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for run in SHARED_RUNS:
            if run in fixtures:
                run_of_file.setdefault(_file(item), run)
    group_of = {item.nodeid: run_of_file.get(_file(item), _file(item)) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of[item.nodeid]))
    items[:] = costliest_first(items, group_of, group_seconds())


_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


# pytest-xdist's public hook on the controller: the ids one worker collected, suffixed with their
# group when `--dist loadgroup` works. Optional: without pytest-xdist the hook has no spec.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    if _config is None or _config.getoption("dist", None) != "loadgroup":
        return
    missing = ungrouped(ids)
    if missing:
        pytest.exit(
            f"pytest-xdist scheduled {len(missing)} tests without their xdist_group (e.g. {missing[0]}): "
            "--dist loadgroup does not work with this pytest (pytest-xdist issue #1386); use the pytest pyproject.toml pins",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


if __name__ == "__main__":
    # python -m tests.worker_groups JUNIT_XML > tests/group_seconds.json
    json.dump(seconds_from_junit(Path(sys.argv[1])), sys.stdout, indent=1)
    print()
