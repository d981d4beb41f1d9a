"""Run one of the lab's trio servers (`open_worker`, the hub) in a thread, for blocking callers.

pytest fixtures and other synchronous code need a worker that keeps serving while they block on
their own requests. `serving_in_thread(factory)` runs `async with factory() as value` under
`trio.run` in a daemon thread, hands `value` back once the server is up, and on exit cancels the
server and joins the thread: structured, no orphan task, and the server's own `finally` blocks run.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

import trio

__all__ = ["serving_in_thread"]

#: Seconds a server has to start, and to stop once cancelled.
START_TIMEOUT_S = 30.0


@contextmanager
def serving_in_thread[T](
    factory: Callable[[], AbstractAsyncContextManager[T]], *, name: str = "finishline server"
) -> Iterator[T]:
    """Yield what `factory()`'s async context manager yields, while it runs in a thread.

    Raises:
        Whatever the server raised at start (a port already taken, ...).
        TimeoutError: it did not start within START_TIMEOUT_S.
    """
    handed: queue.Queue[tuple[str, Any]] = queue.Queue()
    stop_holder: dict[str, Any] = {}

    async def main() -> None:
        stop = trio.Event()
        stop_holder["token"], stop_holder["stop"] = trio.lowlevel.current_trio_token(), stop
        try:
            async with factory() as value:
                handed.put(("value", value))
                await stop.wait()
        except BaseException as error:  # reported to the caller below, not lost in the thread
            handed.put(("error", error))

    thread = threading.Thread(target=trio.run, args=(main,), name=name, daemon=True)
    thread.start()
    try:
        kind, value = handed.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        raise TimeoutError(f"{name} did not start within {START_TIMEOUT_S} s") from None
    if kind == "error":
        thread.join(START_TIMEOUT_S)
        raise value
    try:
        yield value
    finally:
        trio.from_thread.run_sync(stop_holder["stop"].set, trio_token=stop_holder["token"])
        thread.join(START_TIMEOUT_S)
