"""Start and stop the real toxiproxy server (v2.12.0, built by `make setup`) on 127.0.0.1.

`run_toxiproxy_server()` is a plain context manager (tests, scripts); `open_toxiproxy_server()` is
the same for trio code (the blocking parts run in a worker thread). Both pick a free port, wait until
the API answers, yield a `ToxiproxyServer`, and stop the process on exit, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from faults.toxiproxy_client import ToxiproxyClient, ToxiproxyUnavailable

__all__ = ["ToxiproxyServer", "find_toxiproxy_server", "open_toxiproxy_server", "run_toxiproxy_server"]

#: The Makefile exports the binary it built under this name.
SERVER_PATH_VARIABLE = "FINISHLINE_TOXIPROXY_SERVER"
_CHECKOUT_SERVER = Path(__file__).resolve().parent.parent / ".tools" / "bin" / "toxiproxy-server"


class ToxiproxyServerError(RuntimeError):
    """The toxiproxy server binary is missing or did not start; the message says what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToxiproxyServer:
    """A running toxiproxy server: its API address and a client bound to it."""

    host: str
    port: int
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


def _free_port(host: str) -> int:
    # toxiproxy cannot report a port it chose itself, so pick one; the small race with another
    # process is handled by retrying the start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@contextmanager
def run_toxiproxy_server(
    *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 15.0, log_path: str | None = None
) -> Iterator[ToxiproxyServer]:
    """Run toxiproxy-server on `host:port` (0 = a free port) for the duration of the block.

    Args:
        log_path: where the server's log goes (appended); default: discarded. It logs every
            connection, which is noise in tests but useful when a fault misbehaves.

    Raises:
        ToxiproxyServerError: the binary is missing or the API did not answer in `start_timeout`.
    """
    binary = find_toxiproxy_server()
    attempts = 3 if port == 0 else 1
    for attempt in range(attempts):
        chosen = port or _free_port(host)
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        process = subprocess.Popen(
            [binary, "-host", host, "-port", str(chosen)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "warn")},
        )
        if log_path:
            log.close()
        client = ToxiproxyClient(host=host, port=chosen)
        try:
            _wait_until_answering(process, client, start_timeout)
        except ToxiproxyServerError:
            _stop(process)
            if attempt + 1 == attempts:
                raise
            continue
        try:
            yield ToxiproxyServer(host=host, port=chosen, client=client)
        finally:
            _stop(process)
        return


@asynccontextmanager
async def open_toxiproxy_server(
    *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 15.0, log_path: str | None = None
) -> AsyncIterator[ToxiproxyServer]:
    """`run_toxiproxy_server` for trio code: starting and stopping run in a thread."""
    manager = run_toxiproxy_server(host=host, port=port, start_timeout=start_timeout, log_path=log_path)
    server = await trio.to_thread.run_sync(manager.__enter__)
    try:
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(manager.__exit__, None, None, None)


def _wait_until_answering(process: subprocess.Popen[bytes], client: ToxiproxyClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code = process.poll()
        if code is not None:
            raise ToxiproxyServerError(f"toxiproxy-server exited with status {code} at start (port taken?)")
        try:
            client.version()
            return
        except ToxiproxyUnavailable:
            if time.monotonic() > deadline:
                raise ToxiproxyServerError(f"toxiproxy-server did not answer within {timeout} s") from None
            time.sleep(0.02)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
