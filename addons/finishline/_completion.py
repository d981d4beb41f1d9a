"""Rule 9: a non-streaming `chat.completion` body whose choices lack a finish_reason."""

from __future__ import annotations

import json
import re

from ._inference import infer_finish_reason
from ._request import RequestFacts

__all__ = ["repair_completion"]

# `"finish_reason": null` or `""` as JSON text (quotes inside strings are escaped, so this cannot
# match content); used to change just that value and leave the rest of the body byte for byte.
_NULL_OR_EMPTY_REASON = re.compile(rb'("finish_reason"\s*:\s*)(?:null|"")')


def repair_completion(body: bytes, request: RequestFacts = RequestFacts()) -> tuple[bytes, list[str]] | None:
    """Fills in missing finish_reasons of a chat completion.

    Returns:
        (new body, what was done), or None when the body needs no repair or is not a chat
        completion this can read (it is then left alone).
    """
    try:
        completion = json.loads(body)
    except ValueError:
        return None
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
        return None
    if completion.get("object", "chat.completion") != "chat.completion":
        return None
    usage = completion.get("usage")
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    repairs = []
    missing_key = False
    for position, choice in enumerate(completion["choices"]):
        if not isinstance(choice, dict) or choice.get("finish_reason"):
            continue
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        reason = infer_finish_reason(
            tool_calls=bool(message.get("tool_calls")),
            function_call=bool(message.get("function_call")),
            completion_tokens=completion_tokens if isinstance(completion_tokens, int) else None,
            max_tokens=request.max_tokens,
        )
        missing_key = missing_key or "finish_reason" not in choice
        choice["finish_reason"] = reason
        repairs.append(f"set finish_reason {reason!r} for choice {choice.get('index', position)}")
    if not repairs:
        return None
    if not missing_key:
        reasons = iter(c["finish_reason"] for c in completion["choices"] if isinstance(c, dict))
        candidate = _NULL_OR_EMPTY_REASON.sub(lambda m: m.group(1) + json.dumps(next(reasons, "stop")).encode(), body)
        try:
            if json.loads(candidate) == completion:
                return candidate, repairs
        except ValueError:
            pass
    return json.dumps(completion, ensure_ascii=False, separators=(",", ":")).encode(), repairs
