"""Per-choice bookkeeping: what each choice of a stream did, for rules C3 and C4.

A stream's chunks carry `choices[]`, each with an `index`. For every index the repair machine keeps
one `ChoiceState`: whether the choice finished and who gave the reason (the upstream, or finish_fix
at a usage chunk or `[DONE]`), whether content came after such an injected finish (then the usage
chunk was not the end), and whether it carried tool or function calls (which reason to infer).
`record_choice` reads one choice of a chunk into that table; anything unreadable is left out.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_CHOICES", "TOKEN_KEYS", "ChoiceState", "all_finished", "record_choice"]

# Choice indices tracked per stream; more distinct indices than this are data, not choices.
MAX_CHOICES = 1024
# Delta keys that mean the model produced something: the first such chunk is the "first token".
TOKEN_KEYS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")


class ChoiceState:
    __slots__ = ("finish_reason", "finished_by_upstream", "content_after_injection", "tool_calls", "function_call")

    def __init__(self) -> None:
        # The reason the choice finished with, the upstream's or one finish_fix injected.
        self.finish_reason: str | None = None
        self.finished_by_upstream = False
        # A token came after a finish finish_fix injected: that finish does not count for rule C4.
        self.content_after_injection = False
        self.tool_calls = False
        self.function_call = False


def record_choice(choices: dict[int, ChoiceState], choice: dict[str, Any]) -> tuple[bool, bool]:
    """Records one choice of a chunk in `choices` (index -> state).

    Returns:
        (its finish_reason is the empty string, its delta carried a token).
    """
    index = choice.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        return False, False
    state = choices.get(index)
    if state is None:
        if len(choices) >= MAX_CHOICES:
            return False, False
        state = choices[index] = ChoiceState()
    token = False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("tool_calls"):
            state.tool_calls = True
        if delta.get("function_call"):
            state.function_call = True
        if any(delta.get(key) for key in TOKEN_KEYS):
            token = True
            if state.finish_reason is not None and not state.finished_by_upstream:
                state.content_after_injection = True
    reason = choice.get("finish_reason")
    if isinstance(reason, str) and reason:
        state.finish_reason = reason
        state.finished_by_upstream = True
    return reason == "", token


def all_finished(choices: dict[int, ChoiceState]) -> bool:
    """Every choice finished, by the upstream or by an injection that nothing contradicted."""
    return bool(choices) and all(c.finish_reason is not None and not c.content_after_injection for c in choices.values())
