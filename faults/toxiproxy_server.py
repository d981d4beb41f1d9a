"""Start and stop the real toxiproxy server (v2.12.0, built by `make setup`) on 127.0.0.1.

`run_toxiproxy_server()` is a plain context manager (tests, scripts); `open_toxiproxy_server()` is
the same for trio code (the blocking waits run in a worker thread). Both let the server bind port 0
(or the port asked for), wait until *our* process listens and its API answers, yield a
`ToxiproxyServer`, and stop the process on exit, whatever happened; if the parent dies without
exiting the block, Linux stops the server (parent-death signal). Linux only: the bound port is read
from /proc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

from faults import orphans
from faults.toxiproxy_client import ToxiproxyClient, ToxiproxyUnavailable

__all__ = ["ToxiproxyServer", "find_toxiproxy_server", "open_toxiproxy_server", "run_toxiproxy_server"]

#: The Makefile exports the binary it built under this name.
SERVER_PATH_VARIABLE = "FINISHLINE_TOXIPROXY_SERVER"
_CHECKOUT_SERVER = Path(__file__).resolve().parent.parent / ".tools" / "bin" / "toxiproxy-server"


class ToxiproxyServerError(RuntimeError):
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
    *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 15.0, log_path: str | None = None
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
    with _start(host=host, port=port, log_path=log_path) as starting:
        yield _wait_until_serving(starting, start_timeout)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Starting:
    """A toxiproxy-server process that was just started, and where to read its log from."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    log: BinaryIO
    log_start: int


@contextmanager
def _start(*, host: str, port: int, log_path: str | None) -> Iterator[_Starting]:
    # Split from the waiting so that `open_toxiproxy_server` starts the process in trio's own thread
    # (the parent-death signal follows the thread that forked, and trio's worker threads come and go)
    # and only waits in a worker thread.
    if not orphans.SUPPORTED:
        raise ToxiproxyServerError("running toxiproxy-server here needs Linux (/proc and the parent-death signal)")
    binary = find_toxiproxy_server()
    with open(log_path, "ab+") if log_path else tempfile.TemporaryFile() as log:
        log_start = log.seek(0, os.SEEK_END)
        # toxiproxy accepts port 0 and binds a port of its own choosing, but logs the address as
        # given ("127.0.0.1:0"): the bound port is read from the process's sockets instead
        # (`_maybe_listening_port`), so no port is picked here and released for a race.
        process = subprocess.Popen(
            [binary, "-host", host, "-port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "warn") if log_path else "warn"},
            preexec_fn=orphans.die_with_parent(os.getpid()),
        )
        try:
            yield _Starting(process=process, host=host, port=port, log=log, log_start=log_start)
        finally:
            _stop(process)


@asynccontextmanager
async def open_toxiproxy_server(
    *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 15.0, log_path: str | None = None
) -> AsyncIterator[ToxiproxyServer]:
    """`run_toxiproxy_server` for trio code: the process starts in trio's thread, waiting runs in a worker thread."""
    with _start(host=host, port=port, log_path=log_path) as starting:
        try:
            yield await trio.to_thread.run_sync(_wait_until_serving, starting, start_timeout)
        finally:
            # Stopping can take seconds (toxiproxy drains its API connections): not in trio's thread.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_stop, starting.process)


def _wait_until_serving(starting: _Starting, timeout: float) -> ToxiproxyServer:
    """Wait until our process listens and its API answers; then the port is its own, not a stranger's.

    "Something answers on the port" is not enough: with the port taken (by another toxiproxy, say)
    toxiproxy-server logs "Server finished with error" and keeps running without an API, while the
    other server answers every call.
    """
    process, host = starting.process, starting.host
    deadline = time.monotonic() + timeout
    client = None
    while True:
        code = process.poll()
        if code is not None:
            raise ToxiproxyServerError(
                f"toxiproxy-server exited with status {code} at start on {host}:{starting.port}{_log_reason(starting)}"
            )
        failure = _maybe_start_failure(starting)
        if failure is not None:
            hint = ": is another toxiproxy running there? stop it or pick another port" if "address already in use" in failure else ""
            raise ToxiproxyServerError(f"toxiproxy-server cannot serve on {host}:{starting.port} ({failure}){hint}")
        if client is None:
            bound = _maybe_listening_port(process.pid, starting.port)
            if bound is not None:
                client = ToxiproxyClient(host=host, port=bound)
        if client is not None:
            try:
                client.version()
                return ToxiproxyServer(host=host, port=client.port, pid=process.pid, client=client)
            except ToxiproxyUnavailable:
                pass
        if time.monotonic() > deadline:
            raise ToxiproxyServerError(f"toxiproxy-server did not answer on {host}:{starting.port} within {timeout} s")
        time.sleep(0.02)


def _maybe_start_failure(starting: _Starting) -> str | None:
    """The server's own error if it logged that its API server ended (e.g. the port is taken)."""
    for record in _log_records(starting):
        if record.get("message") == "Server finished with error":
            return str(record.get("error", "unknown error"))
    return None


def _log_reason(starting: _Starting) -> str:
    errors = [str(r.get("error") or r.get("message")) for r in _log_records(starting) if r.get("level") in ("error", "fatal")]
    return f": {errors[-1]}" if errors else ""


def _log_records(starting: _Starting) -> list[dict[str, Any]]:
    # toxiproxy logs one JSON object per line (zerolog); the log is small while starting.
    text = os.pread(starting.log.fileno(), 1 << 20, starting.log_start).decode("utf-8", "replace")
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


_TCP_LISTEN = "0A"


def _maybe_listening_port(pid: int, port: int) -> int | None:
    """The TCP port process `pid` listens on (`port`, or any if 0), from Linux's /proc; None if not yet.

    Only the process's own sockets count (matched by inode), so a server of someone else's on the
    same port is never taken for ours.
    """
    inodes = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return None  # the process is gone; the caller sees it exit
    for fd in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed since the listing
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == _TCP_LISTEN and fields[9] in inodes and port in (0, local_port):
                return local_port
    return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
