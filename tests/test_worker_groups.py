"""tests/worker_groups.py: the files that use a costly session fixture share one group, every other file is its own."""

from __future__ import annotations

import re

import pytest

from tests.worker_groups import ungrouped

pytest_plugins = ["pytester"]


def test_the_files_of_a_shared_run_share_its_group_and_the_others_go_by_file(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # only the plugin under test (and xdist's mark)
    pytester.makeconftest("import pytest\n@pytest.fixture(scope='session')\ndef small_matrix():\n    return {}\n")
    pytester.makepyfile(
        test_one="def test_uses(small_matrix):\n    pass\n\ndef test_plain():\n    pass\n",
        test_two="def test_uses_too(small_matrix):\n    pass\n",
        test_three="def test_alone():\n    pass\n",
    )
    items, _ = pytester.inline_genitems("-p", "xdist", "-p", "tests.worker_groups", "-p", "no:cacheprovider")
    groups = {item.name: item.get_closest_marker("xdist_group").args[0] for item in items}
    assert groups == {
        "test_uses": "small_matrix",
        "test_plain": "small_matrix",
        "test_uses_too": "small_matrix",
        "test_alone": "test_three.py",
    }


def test_an_id_without_its_group_suffix_is_found():
    assert ungrouped(["t.py::a@t.py", "t.py::b[x@y]", "t.py::c[x@y]@t.py", "t.py::d"]) == ["t.py::b[x@y]", "t.py::d"]


@pytest.mark.e2e
def test_under_xdist_each_files_tests_run_on_one_worker(pytester):
    # What `make test` relies on: with pytest 9.2 and pytest-xdist 3.8.0 the marks were there but
    # each test was scheduled alone, and every module's services started once per worker.
    pytester.makeconftest('pytest_plugins = ["tests.worker_groups"]\n')
    body = "".join(f"def test_{n}():\n    pass\n\n" for n in range(6))
    pytester.makepyfile(test_one=body, test_two=body, test_three=body)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=18)
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        match = re.search(r"\[(gw\d)\].* PASSED (test_\w+\.py)::", line)
        if match:
            workers.setdefault(match[2], set()).add(match[1])
    assert len(workers) == 3 and all(len(ran_on) == 1 for ran_on in workers.values()), workers
