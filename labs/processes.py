"""Starting the lab's helper processes (gateways, driver hosts) on trio, and always stopping them.

`open_service` starts a process with its output in a log file, waits until it answers (a TCP
connect or an HTTP GET), and terminates it when the block ends, whatever happened. A process that
exits before it answers is an error that quotes the end of its log, so a broken gateway says why.

Every child is started by `open_process`, which ties it to this process (Linux
`PR_SET_PDEATHSIG`): if the lab dies without running its cleanup (SIGKILL, a crash), the kernel
sends the child SIGTERM instead of leaving an orphan that holds ports. The parent-death signal
fires when the *thread* that forked the child ends, and trio's `open_process` forks in a worker
thread that exits after 10 s idle, so `open_process` forks on the trio thread itself.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from faults.orphans import die_with_parent

__all__ = ["ServiceError", "free_port", "bind_failed", "open_process", "read_port_from_log", "open_service", "terminate"]


class ServiceError(RuntimeError):
    """A helper process did not start; the message names it and quotes its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for programs that cannot be told to pick one)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


async def open_process(
    argv: Sequence[str], *, stdin: int | None = None, stdout: int | None = None, stderr: int | None = None,
    env: Mapping[str, str] | None = None,
) -> trio.Process:
    """`trio.lowlevel.open_process`, but the child dies with this process (`die_with_parent`).

    `stdin`/`stdout` may be `subprocess.PIPE` (trio streams on the Process, like trio's own).
    Forks on the calling (trio) thread, which lives as long as the lab: see the module docstring.
    """
    popen = subprocess.Popen(
        list(argv), stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env) if env is not None else None,
        preexec_fn=die_with_parent(os.getpid()),
    )
    trio_stdin = trio_stdout = None
    if popen.stdin is not None:
        trio_stdin = trio.lowlevel.FdStream(os.dup(popen.stdin.fileno()))
        popen.stdin.close()
    if popen.stdout is not None:
        trio_stdout = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
        popen.stdout.close()
    # trio.Process has no public constructor; `_create` is what trio.lowlevel.open_process calls
    # with the Popen it made (trio/_subprocess.py).
    return trio.Process._create(popen, trio_stdin, trio_stdout, None)


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
    port_in_log: re.Pattern[str] | None = None,
) -> AsyncIterator[tuple[trio.Process, int]]:
    """Run `argv` until the block ends; ready when `host:port` accepts (or `health_path` answers 200).
    Yields the process and its port.

    With `port_in_log` (and `port=0`), the port is the pattern's first group in the log, for
    programs told to listen on port 0 that print where they listen (mitmdump: `listening at
    127.0.0.1:PORT`): no pick-a-free-port race.

    Raises:
        ServiceError: the process exited, or did not answer within `start_timeout` seconds.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        process = await open_process(argv, stdout=log, stderr=log, env={**os.environ, **(env or {})})
    try:
        with trio.move_on_after(start_timeout) as waited:
            while True:
                if process.returncode is not None or process.poll() is not None:
                    raise ServiceError(f"{name} exited with status {process.returncode} at start; its log ({log_path}):\n{_log_tail(log_path)}")
                if port_in_log is not None and not port:
                    port = read_port_from_log(log_path, offset, port_in_log)
                    if not port:
                        await trio.sleep(0.1)
                        continue
                ready = await (_answers_http(host, port, health_path) if health_path else _answers_tcp(host, port))
                if ready:
                    break
                await trio.sleep(0.1)
        if waited.cancelled_caught:
            raise ServiceError(f"{name} did not answer on {host}:{port} within {start_timeout} s; its log ({log_path}):\n{_log_tail(log_path)}")
        yield process, port
    finally:
        await terminate(process)


def read_port_from_log(path: Path, offset: int, pattern: re.Pattern[str]) -> int:
    """The first group of `pattern` in the log after `offset`, as a port; 0 if not (yet) there."""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            match = pattern.search(log.read().decode(errors="replace"))
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def bind_failed(error: ServiceError) -> bool:
    """Whether a service's start failed because its port was taken (after `free_port`'s race)."""
    return bool(re.search(r"address already in use|errno 98|could not bind", str(error), re.I))
