"""tests/worker_groups.py: the users of a costly session fixture are all named, so they share a worker."""

from __future__ import annotations

import pytest

from tests.worker_groups import SHARED_RUNS

pytest_plugins = ["pytester"]


def test_a_file_that_uses_a_shared_run_but_is_not_listed_stops_the_session_in_one_line(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # only the plugin under test
    pytester.makeconftest("import pytest\n@pytest.fixture(scope='session')\ndef small_matrix():\n    return {}\n")
    pytester.makepyfile(**{"tests/test_new": "def test_uses(small_matrix):\n    pass\n"})
    result = pytester.runpytest_inprocess("-p", "tests.worker_groups", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = (
        "ERROR: tests/test_new.py uses the session fixture small_matrix: add it to SHARED_RUNS['small_matrix'] in "
        "tests/worker_groups.py, which keeps its users on one pytest-xdist worker"
    )
    result.stderr.fnmatch_lines([line])


def test_every_listed_file_uses_its_run(pytestconfig):
    # A file that stopped using the fixture would only pin itself to a worker for nothing; say so.
    root = pytestconfig.rootpath
    for run, files in SHARED_RUNS.items():
        for file in files:
            assert run in (root / file).read_text(), f"{file} no longer uses {run}: drop it from SHARED_RUNS"
