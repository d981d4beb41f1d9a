"""Which tests share a pytest-xdist worker (`make test` runs `-n 2 --dist loadfile`).

Registered in tests/conftest.py (`pytest_plugins`). With `--dist loadfile` a test file stays on one
worker, so a module's services (a module-scoped mitmdump, an upstream) start once. The files that
use one of `SHARED_RUNS`, a session fixture that runs something costly once (a lab run of a minute),
also share one worker: spread over two, each worker would run it. The scheduler runs in pytest-xdist's
controller, which never collects, so the files are named here; collection checks that the list is
whole, so that a new user of such a fixture cannot be forgotten.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Session fixture -> the test files that use it. Each is a whole lab run (tests/fixtures_chaos.py).
SHARED_RUNS = {"small_matrix": ("tests/test_clients_pinned.py", "tests/test_lab_runner.py")}
_RUN_OF_FILE = {file: run for run, files in SHARED_RUNS.items() for file in files}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown when it is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist: pytest-xdist's own scheduler for it
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]  # (pytest-xdist 3.8.0 has no py.typed)

    class FileOrSharedRun(LoadFileScheduling):
        """loadfile's scheduling, with each of SHARED_RUNS' files in its run's one scope."""

        def _split_scope(self, nodeid: str) -> str:  # the scope a test id belongs to
            file = nodeid.split("::", 1)[0]
            return _RUN_OF_FILE.get(file, file)

    return FileOrSharedRun(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        file = item.nodeid.split("::", 1)[0]
        for run, files in SHARED_RUNS.items():
            if run in item.fixturenames and file not in files:
                raise pytest.UsageError(
                    f"{file} uses the session fixture {run}: add it to SHARED_RUNS[{run!r}] in "
                    f"tests/worker_groups.py, which keeps its users on one pytest-xdist worker"
                )
