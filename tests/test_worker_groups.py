"""tests/worker_groups.py: the files that use a costly session fixture share one group, every other file is its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.worker_groups import SHARED_RUNS, costliest_first, group_seconds, seconds_from_junit, ungrouped

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
def test_under_xdist_each_files_tests_run_on_one_worker(pytester: pytest.Pytester) -> None:
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


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_costliest_groups_go_first_each_group_together_unknown_ones_last_as_collected():
    items = [_Item(n) for n in ("a.py::1", "b.py::1", "c.py::1", "a.py::2", "d.py::1", "b.py::2")]
    group_of = {item.nodeid: item.nodeid.split("::")[0] for item in items}
    ordered = costliest_first(items, group_of, {"b.py": 90.0, "c.py": 5.0})
    assert [item.nodeid for item in ordered] == ["b.py::1", "b.py::2", "c.py::1", "a.py::1", "a.py::2", "d.py::1"]


def test_a_junit_report_gives_each_groups_seconds(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.test_a" name="test_x@small_matrix" time="1.5"/>'
        '<testcase classname="tests.test_b" name="test_y[p@q]@small_matrix" time="2"/>'
        '<testcase classname="tests.test_c" name="test_z@tests/test_c.py" time="0.25"/>'
        '<testcase classname="tests.test_d" name="test_w[a@b]" time="1"/>'
        "</testsuite></testsuites>"
    )
    assert seconds_from_junit(report) == {"small_matrix": 3.5, "tests/test_d.py": 1.0, "tests/test_c.py": 0.2}


def test_the_committed_seconds_name_groups_that_exist():
    # A group renamed or removed leaves a stale number behind: it would only cost time, but the
    # file should say what the suite is.
    files = {path.as_posix() for path in Path("tests").glob("test_*.py")}
    assert set(group_seconds()) - files - set(SHARED_RUNS) == set()
