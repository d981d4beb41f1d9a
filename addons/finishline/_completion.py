"""Whole (non-streaming) bodies: rule C9, a `chat.completion` whose choices lack a finish_reason;
rule M7, a Messages `message` whose `stop_reason` is null; and the limit rules for whole bodies
(`RepairPolicy.limit_reasons`): C11, a `stop` at the request's limit said as `length`; M8, an
`end_turn` that hides a stop sequence or the limit; R6, a Responses `response` whose status says
`completed` at the limit, said as `incomplete` with `incomplete_details.reason: max_output_tokens`.

The body is edited in place by the core's JSON editor (`_json_edit`), byte for byte except the
values a rule changes: a value is replaced, a missing key is added at the end of its object. Where
the edit cannot be made exactly (checked by parsing the result back), the body is re-serialized
instead.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ._dialect import Dialect
from ._inference import infer_finish_reason
from ._json import json_or_unreadable
from ._json_edit import JsonPath, edit_json
from ._messages import CORRECTED_REASONS, corrected_stop_reason, correction_words, infer_stop_reason, is_tool_block
from ._request import RequestFacts
from ._verdict import Correction, RepairPolicy, Verdict
from ._wording import (
    http_error_detail,
    limit_reason_corrected,
    repaired_detail,
    set_finish_reason,
    set_stop_reason,
    skipped_detail,
)

__all__ = ["CompletionRepair", "repair_completion"]


class CompletionRepair(NamedTuple):
    verdict: Verdict  # CLEAN, REPAIRED, HTTP_ERROR, or SKIPPED (not a body of its dialect this can read)
    body: bytes  # what to send: the body as it came unless the verdict is REPAIRED
    detail: str
    repairs: list[str]
    corrections: tuple[Correction, ...] = ()  # the rules that changed an upstream value (C11, M8, R6)


def repair_completion(
    body: bytes,
    request: RequestFacts = RequestFacts(),
    *,
    status: int = 200,
    content_type: str = "application/json",
    content_encoding: str = "",
    dialect: Dialect = Dialect.CHAT,
    policy: RepairPolicy = RepairPolicy(),
) -> CompletionRepair:
    """Fills in missing finish_reasons of a chat completion (the same inference as rule C3), or the
    missing stop_reason of a Messages `message` (`dialect=Dialect.MESSAGES`, as rule M2 infers it);
    with `policy.limit_reasons`, corrects a reason that hides the request's limit (C11, M8, R6).

    A response that is not one to repair passes as it came, with the verdict that says why: an error
    status (`http_error`), a compressed body or one that is not JSON (`skipped`)."""
    if status >= 400:
        return CompletionRepair(Verdict.HTTP_ERROR, body, http_error_detail(status), [])
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity"):
        return CompletionRepair(
            Verdict.SKIPPED, body, skipped_detail(f"compressed body ({encoding}) passed through untouched"), []
        )
    if "json" not in content_type.lower():
        return CompletionRepair(Verdict.SKIPPED, body, skipped_detail("not an event stream or a JSON chat completion"), [])
    completion = json_or_unreadable(body)
    if dialect is Dialect.MESSAGES:
        return _repair_message(body, completion, request, policy)
    if dialect is Dialect.RESPONSES:
        return _repair_response(body, completion, request, policy)
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
        return CompletionRepair(Verdict.SKIPPED, body, skipped_detail("not a chat completion"), [])
    if completion.get("object", "chat.completion") != "chat.completion":
        return CompletionRepair(
            Verdict.SKIPPED, body, skipped_detail(f"not a chat completion ({completion.get('object')!r})"), []
        )
    usage = completion.get("usage")
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    repairs: list[str] = []
    edits: dict[JsonPath, bytes] = {}
    corrections: list[Correction] = []
    choices = completion["choices"]
    limit = request.max_tokens
    if (
        policy.limit_reasons
        and limit is not None
        and len(choices) == 1
        and request.choices == 1
        and isinstance(choices[0], dict)
        and choices[0].get("finish_reason") == "stop"
        and isinstance(completion_tokens, int)
        and not isinstance(completion_tokens, bool)
        and completion_tokens >= limit
    ):
        # C11 on a whole body: one choice, its usage at the limit (with `n` > 1 it counts them all).
        choices[0]["finish_reason"] = "length"
        edits[("choices", 0, "finish_reason")] = json.dumps("length").encode()
        corrections.append(Correction.LIMIT_REASON)
        repairs.append(
            limit_reason_corrected("C11", upstream="stop", corrected="length", output_tokens=completion_tokens, max_tokens=limit)
        )
    for position, choice in enumerate(choices):
        if not isinstance(choice, dict) or choice.get("finish_reason"):
            continue
        message = choice.get("message")
        if not isinstance(message, dict):
            message = {}
        reason = infer_finish_reason(
            tool_calls=bool(message.get("tool_calls")),
            function_call=bool(message.get("function_call")),
            completion_tokens=completion_tokens if isinstance(completion_tokens, int) else None,
            max_tokens=request.max_tokens,
        )
        choice["finish_reason"] = reason
        edits[("choices", position, "finish_reason")] = json.dumps(reason).encode()
        repairs.append(set_finish_reason(reason, choice.get("index", position)))
    return _edited(body, completion, edits, repairs, corrections)


def _repair_message(body: bytes, message: object, request: RequestFacts, policy: RepairPolicy) -> CompletionRepair:
    """M7: a `message` with `stop_reason` null, "" or missing gets the reason M2 would infer; M8:
    an `end_turn` that hides a stop sequence or the limit is said as what it was."""
    if not isinstance(message, dict) or message.get("type") != "message":
        return CompletionRepair(Verdict.SKIPPED, body, skipped_detail("not a Messages message"), [])
    usage = message.get("usage")
    output_tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    if not isinstance(output_tokens, int) or isinstance(output_tokens, bool):
        output_tokens = None
    stop_reason = message.get("stop_reason")
    if stop_reason:
        correction = (
            corrected_stop_reason(
                stop_reason=stop_reason,
                stop_sequence=message.get("stop_sequence"),
                output_tokens=output_tokens,
                max_tokens=request.max_tokens,
            )
            if policy.limit_reasons
            else None
        )
        if correction is None:
            return CompletionRepair(Verdict.CLEAN, body, "clean", [])
        reason = message["stop_reason"] = CORRECTED_REASONS[correction]
        words = correction_words(correction, output_tokens=output_tokens, max_tokens=request.max_tokens)
        return _edited(body, message, {("stop_reason",): json.dumps(reason).encode()}, [words], [correction])
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    reason = infer_stop_reason(
        tool_use=any(is_tool_block(block) for block in blocks), output_tokens=output_tokens, max_tokens=request.max_tokens
    )
    message["stop_reason"] = reason
    return _edited(body, message, {("stop_reason",): json.dumps(reason).encode()}, [set_stop_reason(reason)], [])


def _repair_response(body: bytes, response: object, request: RequestFacts, policy: RepairPolicy) -> CompletionRepair:
    """R6 on a whole `response`: `status: "completed"` with its output tokens at or past the
    request's `max_output_tokens` is said as `incomplete`, `incomplete_details.reason:
    "max_output_tokens"`. Any other body passes as it came."""
    if not isinstance(response, dict) or response.get("object") != "response":
        return CompletionRepair(Verdict.SKIPPED, body, skipped_detail("not a Responses response"), [])
    usage = response.get("usage")
    output_tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    limit = request.max_tokens
    if (
        not policy.limit_reasons
        or limit is None
        or response.get("status") != "completed"
        or not isinstance(output_tokens, int)
        or isinstance(output_tokens, bool)
        or output_tokens < limit
    ):
        return CompletionRepair(Verdict.CLEAN, body, "clean", [])
    details = {"reason": "max_output_tokens"}
    response["status"] = "incomplete"
    response["incomplete_details"] = details
    edits: dict[JsonPath, bytes] = {
        ("status",): json.dumps("incomplete").encode(),
        ("incomplete_details",): json.dumps(details, separators=(",", ":")).encode(),
    }
    words = limit_reason_corrected(
        "R6", upstream="completed", corrected="incomplete", output_tokens=output_tokens, max_tokens=limit
    )
    return _edited(body, response, edits, [words], [Correction.LIMIT_REASON])


def _edited(
    body: bytes, intended: Any, edits: dict[JsonPath, bytes], repairs: list[str], corrections: list[Correction]
) -> CompletionRepair:
    """The body with `edits` made in place (re-serialized where the result does not parse back to
    `intended`), booked `repaired` with `repairs`; `clean` when there is nothing to edit."""
    if not edits:
        return CompletionRepair(Verdict.CLEAN, body, "clean", [])
    new_body = edit_json(body, edits)
    if new_body is None or json_or_unreadable(new_body) != intended:
        new_body = json.dumps(intended, ensure_ascii=False, separators=(",", ":")).encode()
    return CompletionRepair(Verdict.REPAIRED, new_body, repaired_detail(repairs), repairs, tuple(corrections))
