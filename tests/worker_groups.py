"""Which tests share a pytest-xdist worker (`make test` runs `-n 2 --dist loadgroup`).

Registered in tests/conftest.py (`pytest_plugins`). Each test gets pytest-xdist's public
`xdist_group` mark, and `--dist loadgroup` keeps a group on one worker:

- a file with a test that uses one of `SHARED_RUNS`, a session fixture that runs something costly
  once (a lab run of a minute), is wholly in that fixture's group: spread over two workers, each
  would run it;
- any other file is a group of its own, so a module's services (a module-scoped mitmdump, an
  upstream) start once, as with `--dist loadfile`.

The group is read from the fixtures each test asks for, so a new user of a shared run cannot be
left out. (pytest-xdist then shows the group after a test's id: `test_x.py::test_y@tests/test_x.py`.)

pytest-xdist 3.8.0 carries the group to its scheduler in that suffix, which it writes into the
test's id. From pytest 9.2 the write no longer takes (pytest-xdist issue #1386): the marks are
there, but every test is scheduled alone, and each worker runs every module's services and every
shared run again, silently. pyproject.toml pins pytest below 9.2 for this, and
`pytest_xdist_node_collection_finished` below stops the run in one line if a worker's ids come back
without their group, so an upgrade cannot bring the slow, split run back unnoticed.
"""

from __future__ import annotations

import pytest

#: The session fixtures that are each a whole lab run (tests/fixtures_chaos.py).
SHARED_RUNS = ("small_matrix",)


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
    for item in items:
        item.add_marker(pytest.mark.xdist_group(run_of_file.get(_file(item), _file(item))))


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
