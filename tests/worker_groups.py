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
"""

from __future__ import annotations

import pytest

#: The session fixtures that are each a whole lab run (tests/fixtures_chaos.py).
SHARED_RUNS = ("small_matrix",)


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
