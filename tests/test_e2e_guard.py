"""tests/e2e_guard.py: a test that starts a process without the `e2e` mark fails with one line.

The inner sessions run in this process (pytester's in-process run) and raise the audit events that
starting a process raises with `sys.audit`, which runs every audit hook and starts nothing: so these
tests are themselves in the fast tier. The inner sessions share the guard's module with this one,
which is why the outer test starts no process of its own either.
"""

from __future__ import annotations

import pytest

from tests.e2e_guard import describe

pytest_plugins = ["pytester"]

POPEN = 'sys.audit("subprocess.Popen", "/bin/true", ["/bin/true", "--flag"], None, None)'
ADVICE = "but is not marked e2e; mark it @pytest.mark.e2e (or its file: pytestmark = pytest.mark.e2e)"


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # only the plugin under test
    pytester.makeini("[pytest]\nmarkers =\n    e2e: starts a process\n")
    return pytester


def run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "tests.e2e_guard", "-p", "no:cacheprovider", "-q")


def test_an_unmarked_test_that_starts_a_process_fails_naming_itself_and_the_command(inner):
    inner.makepyfile(
        test_one=f"""
        import sys, pytest
        def test_spawns():
            {POPEN}
        @pytest.mark.e2e
        def test_marked():
            {POPEN}
        def test_quiet():
            pass
    """
    )
    result = run(inner)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [f"test_one.py::test_spawns started a process during call: subprocess.Popen: /bin/true --flag {ADVICE}"]
    )


def test_a_process_started_from_another_thread_counts(inner):
    inner.makepyfile(
        test_thread=f"""
        import sys, threading
        def test_spawns_in_a_thread():
            thread = threading.Thread(target=lambda: {POPEN})
            thread.start()
            thread.join()
    """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["test_thread.py::test_spawns_in_a_thread started a process during call: *"])


def test_every_test_using_a_shared_fixture_that_started_a_process_must_be_e2e(inner):
    # The first user starts the service at its setup; the second finds it running and still needs it.
    inner.makepyfile(
        test_shared=f"""
        import sys, pytest
        @pytest.fixture(scope="module")
        def service():
            {POPEN}
            return "running"
        @pytest.mark.e2e
        def test_first(service):
            pass
        def test_second(service):
            pass
        def test_third():
            pass
    """
    )
    result = run(inner)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            f"test_shared.py::test_second uses the fixture service, which started a process (subprocess.Popen: /bin/true --flag) {ADVICE}"
        ]
    )


def test_a_fixture_that_starts_a_process_fails_the_setup_of_its_first_unmarked_user(inner):
    inner.makepyfile(
        test_setup=f"""
        import sys, pytest
        @pytest.fixture(scope="session")
        def service():
            {POPEN}
        def test_first(service):
            pass
    """
    )
    result = run(inner)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["test_setup.py::test_first started a process during setup: subprocess.Popen: /bin/true --flag *"]
    )


def test_a_module_that_starts_a_process_when_imported_fails_its_collection_whatever_its_marks(inner):
    inner.makepyfile(
        test_import=f"""
        import sys, pytest
        pytestmark = pytest.mark.e2e
        {POPEN}
        def test_anything():
            pass
    """
    )
    result = run(inner)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["test_import.py started a process while its module was imported: subprocess.Popen: *"])


@pytest.mark.parametrize(
    ("event", "args", "line"),
    [
        ("subprocess.Popen", ("/bin/sh", "/bin/sh -c 'exit 3'", None, None), "subprocess.Popen: /bin/sh -c 'exit 3'"),
        ("subprocess.Popen", (b"/bin/x", [b"/bin/x", "y", 3], None, None), "subprocess.Popen: /bin/x y 3"),
        ("os.posix_spawn", ("/bin/ls", ["ls", "-l"], {"SECRET": "never shown"}), "os.posix_spawn: ls -l"),
        ("os.exec", ("/bin/ls", ("ls",), None), "os.exec: ls"),
        ("os.spawn", (0, "/bin/ls", ["ls", "/"], None), "os.spawn: ls /"),
        ("os.system", (b"echo hi",), "os.system: echo hi"),
        ("os.fork", (), "os.fork: (no command: the interpreter forks)"),
        (
            "subprocess.Popen",
            ("python", ["python", "-c", "import a\nimport b"], None, None),
            "subprocess.Popen: python -c import a\\nimport b",
        ),
    ],
)
def test_each_way_of_starting_a_process_is_one_line_with_its_command_and_never_its_environment(event, args, line):
    assert describe(event, args) == line


def test_a_long_command_is_cut_to_200_characters():
    assert describe("os.system", ("x" * 500,)) == "os.system: " + "x" * 197 + "..."
