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
    #: The body key that holds the conversation (`messages`; Responses' `input`).
    conversation_key: str = "messages"

    def forces_tool_call(self, body: Mapping[str, Any]) -> bool:
        """Whether the body declares tools and its `tool_choice` says one must be called."""
        choice = body.get("tool_choice")
        forced = (isinstance(choice, str) and choice in self.forcing_strings) or (
            isinstance(choice, Mapping) and choice.get("type") in self.forcing_types
        )
        return forced and isinstance(body.get("tools"), list) and bool(body["tools"])

    def ends_with_assistant(self, body: Mapping[str, Any]) -> bool:
        """Whether the conversation's last message is the assistant's: a partial answer the
        request asks the model to continue ("prefill"; a gateway's mid-stream fallback sends one).
        A Responses `input` that is a string is a user message."""
        conversation = body.get(self.conversation_key)
        if not isinstance(conversation, list) or not conversation:
            return False
        last = conversation[-1]
        return isinstance(last, Mapping) and last.get("role") == "assistant"


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
        conversation_key="input",
    ),
}
