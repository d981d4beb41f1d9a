"""Watching processes from a test: whether a pid is gone, and waiting (with a deadline) for it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

#: How long a test waits for a process to start, answer or die: a backstop, with a loaded machine's
#: room (issue 25: under a parallel build a helper took minutes to start). A test that chains N such
#: waits needs a pytest timeout above N x DEADLINE (see `CHAINED_WAITS_TIMEOUT`), else pytest-timeout
#: kills it first and the failure does not say what was waited for.
DEADLINE = 90.0
#: The pytest timeout of a module whose tests chain up to four `DEADLINE` waits (start, answer, end,
#: helpers gone): 4 x 90 s and room for the rest; pyproject's default (120 s) covers one wait only.
CHAINED_WAITS_TIMEOUT = 400


def is_dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (a container's init may not reap orphans)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return re.search(r"^State:\s+Z", status, re.MULTILINE) is not None


def wait_until(condition: Callable[[], object], what: str, deadline: float = DEADLINE) -> None:
    """Poll `condition` until it is true; fail with `what` after `deadline` seconds."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"not within {deadline} s: {what}"
        time.sleep(0.02)
