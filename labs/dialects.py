"""The dialects the lab speaks: the worker, the hub, the clients, the gateways, the graders.

finish_fix speaks a fourth, Gemini (`Dialect.GEMINI`), which the lab does not drive yet (issue 29's
later slices): every place in the lab that means "every dialect" means these, so the lab's
scenarios, options, tables and graders stay as they were. Here, below them all, because each reads it.
"""

from __future__ import annotations

from finishline import Dialect

__all__ = ["LAB_DIALECTS"]

#: In `Dialect` order (the order of the lab's tables and options).
LAB_DIALECTS: tuple[Dialect, ...] = (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)
