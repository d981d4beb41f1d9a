"""Children that die with their parent: no toxiproxy, LiteLLM or mitmdump is left running after a lab
or a test that was killed outright (SIGKILL, a crash) and so never ran its cleanup.

Every child gets it from the one launcher, `faults.child_processes`; start children there."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["SUPPORTED", "die_with_parent"]

# prctl(2): the signal a process gets when the thread that forked it dies.
_PR_SET_PDEATHSIG = 1

SUPPORTED = sys.platform.startswith("linux")
"""Whether `die_with_parent` does anything here (Linux only)."""


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn` after which the child gets SIGTERM when its parent dies (elsewhere a no-op).

    The signal follows the *thread* that forked, so fork from a thread that lives as long as the
    child should (not one of trio's worker threads, which exit when idle). If the parent died before
    the request took effect, nobody would send the signal: the child leaves at once instead.
    """
    if not SUPPORTED:
        return lambda: None
    # Resolved here, in the parent: between fork and exec the child should not dlopen (another thread
    # may have held the loader's lock at the fork).
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGTERM.value), 0, 0, 0) != 0 or os.getppid() != parent_pid:
            os._exit(121)

    return preexec
