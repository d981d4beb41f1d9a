"""Start and stop the real toxiproxy server (v2.12.0, built by `make setup`) on 127.0.0.1.

`run_toxiproxy_server()` is a plain context manager (tests, scripts); `open_toxiproxy_server()` is
the same for trio code (the blocking waits run in a worker thread). Both let the server bind port 0
(or the port asked for), wait until *our* process listens and its API answers, yield a
`ToxiproxyServer`, and stop the process on exit, whatever happened; if the parent dies without
exiting the block, Linux stops the server (parent-death signal). The process is started, its port
read and stopped by the one launcher, `faults.child_processes`. Linux only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

import faults.orphans as orphans
from faults.child_processes import START_DEADLINE_S, ChildProcess, ChildStartError, start_child, start_trio_child
from faults.toxiproxy_client import ToxiproxyClient, ToxiproxyUnavailable

__all__ = ["ToxiproxyServer", "find_toxiproxy_server", "open_toxiproxy_server", "run_toxiproxy_server"]

#: The Makefile exports the binary it built under this name.
SERVER_PATH_VARIABLE = "FINISHLINE_TOXIPROXY_SERVER"
_CHECKOUT_SERVER = Path(__file__).resolve().parent.parent / ".tools" / "bin" / "toxiproxy-server"


class ToxiproxyServerError(ChildStartError):
    """The toxiproxy server binary is missing or did not start; the message says what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToxiproxyServer:
    """A running toxiproxy server: its API address, its process id, and a client bound to it."""

    host: str
    port: int
    pid: int
    client: ToxiproxyClient

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def find_toxiproxy_server() -> str:
    """Path of the toxiproxy server binary: $FINISHLINE_TOXIPROXY_SERVER, this checkout's, or PATH.

    Raises:
        ToxiproxyServerError: none found (run `make setup`).
    """
    for candidate in (os.environ.get(SERVER_PATH_VARIABLE), str(_CHECKOUT_SERVER)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which("toxiproxy-server")
    if on_path:
        return on_path
    raise ToxiproxyServerError(
        f"toxiproxy-server not found (looked at ${SERVER_PATH_VARIABLE}, {_CHECKOUT_SERVER}, PATH): run `make setup`"
    )


@contextmanager
def run_toxiproxy_server(
    *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = START_DEADLINE_S, log_path: str | None = None
) -> Iterator[ToxiproxyServer]:
    """Run toxiproxy-server on `host:port` (0 = a port the server picks) for the duration of the block.

    The server gets SIGTERM if the thread that entered this block dies (Linux `PR_SET_PDEATHSIG`),
    so a killed lab or CLI does not leave it behind; enter and leave the block in one thread.

    Args:
        log_path: where the server's log goes (appended); default: a temporary file read only to
            see why a start failed. It logs every connection at `LOG_LEVEL=info`, which is noise in
            tests but useful when a fault misbehaves.

    Raises:
        ToxiproxyServerError: the binary is missing, or the server did not listen on `host:port`
            (port taken: the message has the server's own error) within `start_timeout`.
    """
    with _log_file(log_path) as path:
        argv, options = _command(host, port, path, quiet=log_path is None)
        with start_child(argv, **options) as process:
            yield _wait_until_serving(process, host, port, start_timeout)


@asynccontextmanager
async def open_toxiproxy_server(
    *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = START_DEADLINE_S, log_path: str | None = None
) -> AsyncIterator[ToxiproxyServer]:
    """`run_toxiproxy_server` for trio code: the process starts on trio's thread (it must: the
    parent-death signal follows the thread that forked), the blocking API checks run in a worker thread."""
    with _log_file(log_path) as path:
        argv, options = _command(host, port, path, quiet=log_path is None)
        child = await start_trio_child(argv, **options)
        try:
            yield await trio.to_thread.run_sync(_wait_until_serving, child.process, host, port, start_timeout)
        finally:
            # toxiproxy can take seconds to stop (it drains its API connections): waited on a pidfd.
            await child.aclose()


@contextmanager
def _log_file(log_path: str | None) -> Iterator[Path]:
    if log_path is not None:
        yield Path(log_path)
        return
    with tempfile.TemporaryDirectory(prefix="toxiproxy-") as scratch:
        yield Path(scratch) / "toxiproxy.log"


def _command(host: str, port: int, log_path: Path, *, quiet: bool) -> tuple[list[str], dict[str, Any]]:
    if not orphans.SUPPORTED:
        raise ToxiproxyServerError("running toxiproxy-server here needs Linux (/proc and the parent-death signal)")
    # toxiproxy accepts port 0 and binds a port of its own choosing, but logs the address as given
    # ("127.0.0.1:0"): the bound port is read from the process's own sockets by the launcher.
    level = "warn" if quiet else os.environ.get("LOG_LEVEL", "warn")
    options = {"name": "toxiproxy-server", "log_path": log_path, "env": {**os.environ, "LOG_LEVEL": level}}
    return [find_toxiproxy_server(), "-host", host, "-port", str(port)], options


def _wait_until_serving(process: ChildProcess, host: str, port: int, timeout: float) -> ToxiproxyServer:
    """Wait until our process listens and its API answers; then the port is its own, not a stranger's.

    "Something answers on the port" is not enough: with the port taken (by another toxiproxy, say)
    toxiproxy-server logs "Server finished with error" and keeps running without an API, while the
    other server answers every call.
    """
    deadline = time.monotonic() + timeout
    client = None
    while True:
        code = process.poll()
        if code is not None:
            raise ToxiproxyServerError(
                f"toxiproxy-server exited with status {code} at start on {host}:{port}{_log_reason(process)}"
            )
        failure = _maybe_start_failure(process)
        if failure is not None:
            hint = (
                ": is another toxiproxy running there? stop it or pick another port"
                if "address already in use" in failure
                else ""
            )
            raise ToxiproxyServerError(f"toxiproxy-server cannot serve on {host}:{port} ({failure}){hint}")
        if client is None:
            try:
                bound = process.maybe_listening_port(port)
            except ChildStartError as error:  # exited since the check above
                raise ToxiproxyServerError(str(error)) from None
            if bound is not None:
                client = ToxiproxyClient(host=host, port=bound)
        if client is not None:
            try:
                client.version()
                return ToxiproxyServer(host=host, port=client.port, pid=process.pid, client=client)
            except ToxiproxyUnavailable:
                pass
        if time.monotonic() > deadline:
            raise ToxiproxyServerError(f"toxiproxy-server did not answer on {host}:{port} within {timeout} s")
        time.sleep(0.02)


def _maybe_start_failure(process: ChildProcess) -> str | None:
    """The server's own error if it logged that its API server ended (e.g. the port is taken)."""
    for record in _log_records(process):
        if record.get("message") == "Server finished with error":
            return str(record.get("error", "unknown error"))
    return None


def _log_reason(process: ChildProcess) -> str:
    errors = [str(r.get("error") or r.get("message")) for r in _log_records(process) if r.get("level") in ("error", "fatal")]
    return f": {errors[-1]}" if errors else ""


def _log_records(process: ChildProcess) -> list[dict[str, Any]]:
    # toxiproxy logs one JSON object per line (zerolog); the log is small while starting.
    records = []
    for line in process.log_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
