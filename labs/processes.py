"""The lab's helper services (gateways, the hub, workers, mitmweb) on trio: `open_service` starts
one, waits until it serves, and always stops it.

Starting, reading the port, stopping and dying with the lab are the one launcher's
(`faults.child_processes`, whose docstring says how; import its names from there); this module adds
what a lab service needs on top: an HTTP health check, and stopping when the block ends, whatever
happened. A service that exits before it serves is the launcher's `ChildStartError`, quoting the end
of its log, so a broken gateway says why.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from faults.child_processes import START_DEADLINE_S, ChildStartError, TrioChildProcess, start_trio_child

__all__ = ["open_service"]


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


@asynccontextmanager
async def open_service(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    health_path: str | None = None,
    start_timeout: float = START_DEADLINE_S,
    host: str = "127.0.0.1",
    port_in_log: re.Pattern[str] | None = None,
) -> AsyncIterator[tuple[TrioChildProcess, int]]:
    """Run `argv` until the block ends; ready when it listens on its port (and `health_path`, if
    given, answers 200). Yields the process and its port.

    The port is read from the kernel (the launcher's `wait_until_listening`): `port` is the one the
    program was told, or 0 for a program told to listen on port 0. A program that listens on several
    ports names the one wanted in its log: `port_in_log`, a regex whose first group is the port
    (mitmweb: `listening at 127.0.0.1:PORT`). Output (stdout and stderr) is appended to `log_path`.

    Raises:
        ChildStartError: the process could not be run, exited, or did not serve within `start_timeout` s.
    """
    process = await start_trio_child(argv, name=name, log_path=log_path, env={**os.environ, **(env or {})})
    try:
        deadline = trio.current_time() + start_timeout
        port = await process.wait_until_listening(port, timeout=start_timeout, port_in_log=port_in_log)
        with trio.move_on_at(deadline) as waited:
            while health_path and not await _answers_http(host, port, health_path):
                process.process.maybe_listening_port(port)  # raises if it exited meanwhile
                await trio.sleep(0.1)
        if waited.cancelled_caught:
            raise ChildStartError(
                f"{name} did not answer 200 on http://{host}:{port}{health_path} within {start_timeout} s; "
                f"{process.process.describe_log()}"
            )
        yield process, port
    finally:
        await process.aclose()
