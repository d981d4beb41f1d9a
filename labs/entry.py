"""How the lab's commands (`python -m labs`, `python -m labs.ui`) run and end.

`run_command` runs an async main on trio so that it always ends the same three ways:

- normally: its result;
- stopped: SIGTERM or Ctrl-C cancels it, so every `finally` and `async with` below runs and stops
  the helper processes (toxiproxy, LiteLLM, mitmdump, driver hosts), then one line `stopped`;
- failed: one line `error: ...` and exit status 2, never a traceback or an ExceptionGroup dump
  (trio wraps errors raised inside nurseries in groups; the leaves are what a user needs).

Set FINISHLINE_DEBUG=1 to get the traceback of an error instead.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from faults.child_processes import ChildStartError
from faults.toxiproxy_client import ToxiproxyError

__all__ = ["EXIT_ERROR", "Stopped", "error_line", "run_command"]

EXIT_ERROR = 2
#: The signals that stop a command (Ctrl-C, and `kill`/systemd/make's SIGTERM).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """The command was stopped by a signal (after its cleanup ran)."""

    def __init__(self, number: int) -> None:
        super().__init__(signal.Signals(number).name)
        self.number = number


async def _cancelled_by_signals(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    stopped_by: int | None = None
    result = None
    async with trio.open_nursery() as nursery:

        async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            nonlocal stopped_by
            with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
                task_status.started()
                async for number in signals:
                    stopped_by = number
                    nursery.cancel_scope.cancel()
                    return

        await nursery.start(watch)
        result = await main(*args)
        nursery.cancel_scope.cancel()
    if stopped_by is not None:
        raise Stopped(stopped_by)
    return result


def leaf_errors(error: BaseException) -> list[BaseException]:
    """The errors inside `error`, exception groups unwrapped at every depth."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaf_errors(inner)]
    return [error]


def error_line(error: BaseException) -> str:
    """One line for a user: the first line of each distinct error's message (a ChildStartError's
    message goes on with its log's tail, which the log file keeps)."""
    parts = []
    for leaf in leaf_errors(error):
        message = (str(leaf).strip().splitlines() or [""])[0]
        if isinstance(leaf, OSError) and leaf.strerror:
            message = f"{leaf.strerror}" + (f": {leaf.filename}" if leaf.filename else "")
        if not isinstance(leaf, (ValueError, ChildStartError, ToxiproxyError)):
            message = f"{type(leaf).__name__}: {message}" if message else type(leaf).__name__
        if message not in parts:
            parts.append(message)
    return "error: " + "; ".join(parts)


def run_command(main: Callable[..., Awaitable[Any]], *args: Any) -> tuple[int, Any]:
    """Run `main(*args)` on trio; returns (exit status, result). Prints `stopped` or `error: ...`."""
    try:
        return 0, trio.run(_cancelled_by_signals, main, *args)
    except Stopped as stopped:
        print(f"\nstopped ({stopped})", file=sys.stderr)
        return 128 + stopped.number, None
    except BaseException as error:
        leaves = leaf_errors(error)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            # A second Ctrl-C during cleanup.
            print("\nstopped", file=sys.stderr)
            return 128 + signal.SIGINT, None
        if os.environ.get("FINISHLINE_DEBUG") or not all(isinstance(leaf, Exception) for leaf in leaves):
            raise
        print(error_line(error), file=sys.stderr)
        return EXIT_ERROR, None
