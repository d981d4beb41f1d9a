"""Where each dialect's request body says what the worker reads from it (`WorkerSettings.for_request`).

One row per dialect: the keys that limit the output, the `tool_choice` values that force a tool
call, and whether `n` asks for several choices (Messages and Responses have no choices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from finishline import Dialect

__all__ = ["REQUEST_READINGS", "RequestReading"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReading:
    """What one dialect's request body says, and where."""

    #: The body keys that limit the output, first present wins.
    max_tokens_keys: tuple[str, ...]
    #: `tool_choice` strings that force a call.
    forcing_strings: frozenset[str]
    #: `tool_choice.type` values that force a call (an object naming one tool, or any).
    forcing_types: frozenset[str]
    #: Whether the body's `n` asks for several choices.
    has_choices: bool

    def forces_tool_call(self, body: Mapping[str, Any]) -> bool:
        """Whether the body declares tools and its `tool_choice` says one must be called."""
        choice = body.get("tool_choice")
        forced = (isinstance(choice, str) and choice in self.forcing_strings) or (
            isinstance(choice, Mapping) and choice.get("type") in self.forcing_types
        )
        return forced and isinstance(body.get("tools"), list) and bool(body["tools"])


REQUEST_READINGS: dict[Dialect, RequestReading] = {
    # OpenAI Chat: "required" means one or more calls; `{"type": "function", ...}` names the one.
    Dialect.CHAT: RequestReading(
        max_tokens_keys=("max_completion_tokens", "max_tokens"),
        forcing_strings=frozenset({"required"}),
        forcing_types=frozenset({"function"}),
        has_choices=True,
    ),
    # Anthropic: `{"type": "any"}` must use some tool, `{"type": "tool", "name": ...}` that one.
    Dialect.MESSAGES: RequestReading(
        max_tokens_keys=("max_tokens",),
        forcing_strings=frozenset(),
        forcing_types=frozenset({"any", "tool"}),
        has_choices=False,
    ),
    # OpenAI Responses: the same words as Chat; the limit is `max_output_tokens`.
    Dialect.RESPONSES: RequestReading(
        max_tokens_keys=("max_output_tokens",),
        forcing_strings=frozenset({"required"}),
        forcing_types=frozenset({"function"}),
        has_choices=False,
    ),
}
