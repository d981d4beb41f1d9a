"""Starting the lab's helper processes (gateways, driver hosts) on trio, and always stopping them.

`open_service` starts a process with its output in a log file, waits until it answers (a TCP
connect or an HTTP GET), and terminates it when the block ends, whatever happened. A process that
exits before it answers is an error that quotes the end of its log, so a broken gateway says why.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

__all__ = ["ServiceError", "free_port", "open_service", "terminate"]


class ServiceError(RuntimeError):
    """A helper process did not start; the message names it and quotes its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for programs that cannot be told to pick one)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _answers_tcp(host: str, port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return False
    await stream.aclose()
    return True


async def _answers_http(host: str, port: int, path: str) -> bool:
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return False
    try:
        with trio.move_on_after(2):
            await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
            head = await stream.receive_some(64)
            return head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200")
        return False
    except (trio.BrokenResourceError, OSError):
        return False
    finally:
        await stream.aclose()


async def terminate(process: trio.Process, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; never leaves the process running."""
    if process.returncode is not None:
        return
    with trio.CancelScope(shield=True):
        try:
            process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        with trio.move_on_after(grace):
            await process.wait()
            return
        process.kill()
        await process.wait()


@asynccontextmanager
async def open_service(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    health_path: str | None = None,
    start_timeout: float = 60.0,
    host: str = "127.0.0.1",
) -> AsyncIterator[trio.Process]:
    """Run `argv` until the block ends; ready when `host:port` accepts (or `health_path` answers 200).

    Raises:
        ServiceError: the process exited, or did not answer within `start_timeout` seconds.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = await trio.lowlevel.open_process(
            list(argv), stdin=None, stdout=log, stderr=log, env={**os.environ, **(env or {})}
        )
    try:
        with trio.move_on_after(start_timeout) as waited:
            while True:
                if process.returncode is not None or process.poll() is not None:
                    raise ServiceError(f"{name} exited with status {process.returncode} at start; its log ({log_path}):\n{_log_tail(log_path)}")
                ready = await (_answers_http(host, port, health_path) if health_path else _answers_tcp(host, port))
                if ready:
                    break
                await trio.sleep(0.1)
        if waited.cancelled_caught:
            raise ServiceError(f"{name} did not answer on {host}:{port} within {start_timeout} s; its log ({log_path}):\n{_log_tail(log_path)}")
        yield process
    finally:
        await terminate(process)
