"""Fixtures for the end-to-end tests: a scripted upstream and real mitmdump processes in front of it.

Registered in tests/conftest.py (`pytest_plugins`). Every process started here is stopped at
teardown, and its output is printed then, so pytest shows it with a failing test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from faults.child_processes import START_DEADLINE_S
from tests import mitmdump_process
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump
from tests.upstream_server import UpstreamServer


@dataclass
class FinishFixProxy:
    """mitmdump with finish_fix in reverse mode in front of `upstream`, writing `ledger`."""

    mitmdump: Mitmdump
    upstream: UpstreamServer
    ledger: Path

    def base_url(self, prefix: str) -> str:
        """The openai client's base URL for the upstream script registered under `prefix`."""
        return f"{self.mitmdump.url}{prefix}/v1"

    def ledger_lines(self, prefix: str | None = None) -> list[dict]:
        """The ledger's JSON lines, only those whose URL path starts with `prefix` if given."""
        records = read_ledger(self.ledger)
        if prefix is None:
            return records
        return [r for r in records if _under(r, prefix)]

    def wait_ledger_lines(self, prefix: str, count: int = 1, timeout: float = START_DEADLINE_S) -> list[dict]:
        """The ledger lines under `prefix` once there are `count` (`wait_ledger_rows`)."""
        return wait_ledger_rows(self.ledger, lambda record: _under(record, prefix), count=count, timeout=timeout, what=prefix)


def read_ledger(ledger: Path) -> list[dict]:
    """A ledger's complete JSON lines (a line being written is not read yet)."""
    if not ledger.exists():
        return []
    text = ledger.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def wait_ledger_rows(
    ledger: Path, select: Callable[[dict], bool], *, count: int = 1, timeout: float = START_DEADLINE_S, what: str = "the request"
) -> list[dict]:
    """The ledger lines `select` picks (by a marker of the request: its URL prefix, its model) once
    there are `count`. The addon writes a flow's line when the flow ends, which can be just after
    the client saw the end, and other flows' lines land in any order: only the marker says whose a
    line is. Fails after `timeout` s, a backstop with a loaded machine's room: the wait ends when
    the lines are there."""
    deadline = time.monotonic() + timeout
    while len(rows := [row for row in read_ledger(ledger) if select(row)]) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    if len(rows) >= count:
        # A second line for the same flow would be a bug: a moment more lets a test see it (this
        # can only miss such a line, never fail a right one).
        time.sleep(0.2)
        return [row for row in read_ledger(ledger) if select(row)]
    raise AssertionError(
        f"expected {count} ledger line(s) for {what} within {timeout} s, got {rows!r}; whole ledger: {read_ledger(ledger)!r}"
    )


def _under(record: dict, prefix: str) -> bool:
    return _url_path(str(record.get("url", ""))).startswith(prefix + "/")


def _url_path(url: str) -> str:
    after_scheme = url.split("://", 1)[-1]
    return "/" + after_scheme.split("/", 1)[1] if "/" in after_scheme else "/"


@pytest.fixture(scope="session")
def mitmproxy_confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One private confdir per session: mitmproxy makes its CA there once, never in ~/.mitmproxy."""
    return tmp_path_factory.mktemp("mitmproxy-confdir")


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamServer]:
    with UpstreamServer() as server:
        yield server


@pytest.fixture
def start_mitmdump(mitmproxy_confdir: Path) -> Iterator[Callable[..., Mitmdump]]:
    """A factory: `start_mitmdump(mode=..., scripts=[...], options={...})`, stopped at teardown."""
    started: list[Mitmdump] = []

    def start(**kwargs: object) -> Mitmdump:
        kwargs.setdefault("confdir", mitmproxy_confdir)
        mitmdump = mitmdump_process.start(**kwargs)  # type: ignore[arg-type]
        started.append(mitmdump)
        return mitmdump

    yield start
    for mitmdump in started:
        mitmdump.stop()
        print(f"--- mitmdump (pid {mitmdump.pid}, exit {mitmdump.process.returncode}) ---")
        print(" ".join(mitmdump.args))
        print(mitmdump.output)


@pytest.fixture
def start_finish_fix(
    start_mitmdump: Callable[..., Mitmdump], upstream: UpstreamServer, tmp_path: Path
) -> Callable[..., FinishFixProxy]:
    """A factory for finish_fix in reverse mode in front of `upstream`, with extra `--set` options."""

    started = 0

    def start(**options: str) -> FinishFixProxy:
        nonlocal started
        started += 1
        ledger = tmp_path / f"ledger-{started}.jsonl"
        mitmdump = start_mitmdump(
            mode=f"reverse:{upstream.origin}",
            scripts=[FINISH_FIX_SCRIPT],
            options={"finish_fix_ledger": str(ledger), **options},
        )
        return FinishFixProxy(mitmdump=mitmdump, upstream=upstream, ledger=ledger)

    return start


@pytest.fixture
def finish_fix(shared_finish_fix: FinishFixProxy) -> Iterator[FinishFixProxy]:
    """finish_fix with default options, shared by a module's tests (each uses its own script);
    prints at teardown what mitmdump logged during this test, so a failure shows it."""
    before = len(shared_finish_fix.mitmdump.output)
    yield shared_finish_fix
    print(f"--- shared mitmdump (pid {shared_finish_fix.mitmdump.pid}), during this test ---")
    print(shared_finish_fix.mitmdump.output[before:])


@pytest.fixture(scope="module")
def shared_finish_fix(
    upstream: UpstreamServer, mitmproxy_confdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FinishFixProxy]:
    """The one mitmdump behind `finish_fix` for a module."""
    ledger = tmp_path_factory.mktemp("ledger") / "finish_fix.jsonl"
    with mitmdump_process.running_finish_fix(confdir=mitmproxy_confdir, upstream_url=upstream.origin, ledger=ledger) as mitmdump:
        yield FinishFixProxy(mitmdump=mitmdump, upstream=upstream, ledger=ledger)
