"""The rule that keeps `make check` fast and process-free, enforced: a test that starts a process is
marked `e2e`, or it fails.

Registered in tests/conftest.py (`pytest_plugins`). Python raises an audit event
(https://docs.python.org/3/library/audit_events.html) whenever it starts a process, whichever API
asked for it: `subprocess` (so also `trio.run_process`, asyncio's subprocesses and `os.popen`),
`os.posix_spawn`, the `os.exec*`, `os.spawn*` and `os.fork*` families and `os.system`. One audit
hook, added when this module is imported, notes each such event against the node whose phase is
running at that moment, from any thread. A test not marked `e2e` then fails at the end of the phase
(setup, call or teardown) with one line naming the test and the command.

Attribution does not depend on the order tests run in. A module- or session-scoped fixture starts
its service in the setup of the first test that asks for it; the guard also notes the fixture
itself (by name) as one that starts a process, so every later test that uses it, whose setup finds
the service already running, fails the same way unless it is `e2e` too. A process started while a
module is being collected fails that module's collection whatever its marks, since `-m "not e2e"`
deselects only after collecting. Outside any test or collector (pytest-xdist starting its workers,
a session fixture's finaliser after the last test) nothing is checked.
"""

from __future__ import annotations

import platform
import sys
import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

#: The audit events through which CPython starts a process (os.posix_spawnp raises "os.posix_spawn").
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.fork", "os.forkpty", "os.system"})


@dataclass
class _Running:
    """The node whose phase is running now, and the process starts noted against it."""

    node: pytest.Item | pytest.Collector | None = None
    started: list[str] = field(default_factory=list)


_running = _Running()
_lock = threading.Lock()
#: Fixture name -> the first process its setup started, in this pytest process.
_process_fixtures: dict[str, str] = {}
_started_key = pytest.StashKey[list[str]]()


def describe(event: str, args: Sequence[Any]) -> str:
    """`event` and the command it starts, as one short line (the arguments, never the environment)."""
    if event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):  # (executable or path, args, ...)
        command = args[1]
    elif event == "os.spawn":  # (mode, path, args, env)
        command = args[2]
    elif event == "os.system":  # (command,)
        command = args[0]
    else:  # os.fork, os.forkpty: no arguments
        command = "(no command: the interpreter forks)"
    if isinstance(command, (bytes, str)):
        text = command.decode(errors="replace") if isinstance(command, bytes) else command
    else:
        text = " ".join(part.decode(errors="replace") if isinstance(part, bytes) else str(part) for part in command)
    text = "\\n".join(text.splitlines())  # a `python -c` script's lines: the message stays one line
    return f"{event}: {text if len(text) <= 200 else text[:197] + '...'}"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # Called for every audit event in the process (each open, import, ...): return at once unless it
    # starts a process, and never raise, since an exception here would fail the caller's operation.
    if event not in PROCESS_EVENTS:
        return
    try:
        line = describe(event, args)
    except Exception as error:  # noqa: BLE001 (an argument shape not known here: still a process start)
        line = f"{event}: (arguments not readable: {error!r})"
    with _lock:
        if _running.node is not None:
            _running.started.append(line)


# `platform.processor()` runs `uname -p` once per interpreter and caches it; openai-python and
# anthropic ask for it (their platform headers) on their first request. Asked here, before any test,
# so that this one child is nobody's and an in-process client test is not taken for an e2e one.
platform.processor()
sys.addaudithook(_audit)


def _enter(node: pytest.Item | pytest.Collector) -> None:
    with _lock:
        _running.node = node
        _running.started = []


def _leave() -> list[str]:
    with _lock:
        started, _running.node, _running.started = _running.started, None, []
    return started


def violation(nodeid: str, what: str) -> str:
    """The one line a test (or module) that started a process without being `e2e` fails with."""
    return f"{nodeid} {what} but is not marked e2e; mark it @pytest.mark.e2e (or its file: pytestmark = pytest.mark.e2e)"


def _what_started(started: list[str], during: str) -> str:
    more = f" (and {len(started) - 1} more)" if len(started) > 1 else ""
    return f"started a process {during}: {started[0]}{more}"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Generator[None, Any, Any]:
    with _lock:
        before = len(_running.started)
    try:
        return (yield)
    finally:
        with _lock:
            new = _running.started[before:]
        if new:
            _process_fixtures.setdefault(fixturedef.argname, new[0])


def _phase(item: pytest.Item) -> Generator[None, None, None]:
    _enter(item)
    try:
        return (yield)
    finally:
        item.stash[_started_key] = _leave()


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_phase)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_phase)
pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(_phase)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    started = item.stash.get(_started_key, [])
    item.stash[_started_key] = []
    if item.get_closest_marker("e2e") is not None:
        return report
    if started:
        what = _what_started(started, f"during {call.when}")
    elif (
        call.when == "setup"
        and isinstance(item, pytest.Function)
        and (used := sorted(set(item.fixturenames) & _process_fixtures.keys()))
    ):
        what = f"uses the fixture {used[0]}, which started a process ({_process_fixtures[used[0]]})"
    else:
        return report
    report.outcome = "failed"
    line = violation(item.nodeid, what)
    report.longrepr = line if report.longrepr is None else f"{report.longrepr}\n{line}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    if not isinstance(collector, pytest.Module):
        return (yield)
    _enter(collector)
    try:
        report = yield
    finally:
        started = _leave()
    if started:
        report.outcome = "failed"
        line = violation(collector.nodeid, _what_started(started, "while its module was imported"))
        report.longrepr = line if report.longrepr is None else f"{report.longrepr}\n{line}"
    return report
