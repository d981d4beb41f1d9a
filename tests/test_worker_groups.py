"""tests/worker_groups.py: the files that use a costly session fixture share one group, every other file is its own."""

from __future__ import annotations

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
