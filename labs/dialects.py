"""The dialects the lab speaks: the worker, the hub, the clients, the gateways, the graders.

Every place in the lab that means "every dialect" reads `LAB_DIALECTS`: Chat Completions, Anthropic
Messages, OpenAI Responses and Google Gemini (issue 29). Here, below them all, because each reads it.

A scenario file that lists no `dialects` runs in `UNLISTED_DIALECTS`, the three OpenAI-shaped and
Anthropic dialects: Gemini runs where a scenario names it. Its wire differs in what the knobs can
mean (no terminator: `done=0` has no meaning there, labs/worker/settings.py `check_gemini`), so each
scenario says whether it applies.
"""

from __future__ import annotations

from finishline import Dialect

__all__ = ["LAB_DIALECTS", "UNLISTED_DIALECTS"]

#: In `Dialect` order (the order of the lab's tables and options).
LAB_DIALECTS: tuple[Dialect, ...] = (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES, Dialect.GEMINI)
#: The dialects of a scenario that lists none (module docstring).
UNLISTED_DIALECTS: tuple[Dialect, ...] = (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)
