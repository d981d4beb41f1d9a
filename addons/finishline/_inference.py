"""Which `finish_reason` a choice that never got one should have had (rules C3 and C9).

The order follows what OpenAI itself reports: a turn that produced tool calls ends with `tool_calls`
(legacy `function_call` deltas with `function_call`), a turn cut by the token limit with `length`,
anything else with `stop`.
"""

from __future__ import annotations

__all__ = ["infer_finish_reason"]


def infer_finish_reason(
    *,
    tool_calls: bool,
    function_call: bool,
    completion_tokens: int | None,
    max_tokens: int | None,
) -> str:
    """Returns `tool_calls`, `function_call`, `length` or `stop`.

    Args:
        tool_calls: the choice carried `tool_calls` (deltas, or a message's list).
        function_call: the choice carried a legacy `function_call`.
        completion_tokens: the usage the upstream reported, if it reported any.
        max_tokens: the request's `max_completion_tokens` or `max_tokens`, if set.
    """
    if tool_calls:
        return "tool_calls"
    if function_call:
        return "function_call"
    if max_tokens is not None and completion_tokens is not None and completion_tokens >= max_tokens:
        return "length"
    return "stop"
