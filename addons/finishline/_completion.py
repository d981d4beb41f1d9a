"""Rule C9: a non-streaming `chat.completion` body whose choices lack a finish_reason; rule M7: a
non-streaming Messages `message` whose `stop_reason` is null.

The body is edited in place, byte for byte except the reasons: a `null`/`""` value is replaced, a
missing key is added at the end of its object. Where the edit cannot be made exactly (checked by
parsing the result back), the body is re-serialized instead. A whole Responses body has a `status`
of its own and is passed as it came (`skipped`, saying so).
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from . import _wording as wording
from ._dialect import Dialect
from ._inference import infer_finish_reason
from ._json import json_or_unreadable
from ._messages import infer_stop_reason, is_tool_block
from ._request import RequestFacts
from ._verdict import Verdict

__all__ = ["CompletionRepair", "repair_completion"]

# JSON tokens: strings (with escapes), structure, and bare literals (numbers, true/false/null).
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


class CompletionRepair(NamedTuple):
    verdict: Verdict  # CLEAN, REPAIRED, HTTP_ERROR, or SKIPPED (not a chat completion this can read)
    body: bytes  # what to send: the body as it came unless the verdict is REPAIRED
    detail: str
    repairs: list[str]


class _ChoiceSpan(NamedTuple):
    close: int  # offset of the choice object's closing brace
    empty: bool  # the object has no members
    reason_value: tuple[int, int] | None  # offsets of the finish_reason value, when the key is there


def repair_completion(
    body: bytes,
    request: RequestFacts = RequestFacts(),
    *,
    status: int = 200,
    content_type: str = "application/json",
    content_encoding: str = "",
    dialect: Dialect = Dialect.CHAT,
) -> CompletionRepair:
    """Fills in missing finish_reasons of a chat completion (the same inference as rule C3), or the
    missing stop_reason of a Messages `message` (`dialect=Dialect.MESSAGES`, as rule M2 infers it).

    A response that is not one to repair passes as it came, with the verdict that says why: an error
    status (`http_error`), a compressed body or one that is not JSON (`skipped`)."""
    if status >= 400:
        return CompletionRepair(Verdict.HTTP_ERROR, body, wording.http_error_detail(status), [])
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity"):
        return CompletionRepair(
            Verdict.SKIPPED, body, wording.skipped_detail(f"compressed body ({encoding}) passed through untouched"), []
        )
    if "json" not in content_type.lower():
        return CompletionRepair(
            Verdict.SKIPPED, body, wording.skipped_detail("not an event stream or a JSON chat completion"), []
        )
    completion = json_or_unreadable(body)
    if dialect is Dialect.MESSAGES:
        return _repair_message(body, completion, request)
    if dialect is Dialect.RESPONSES:
        return CompletionRepair(Verdict.SKIPPED, body, wording.skipped_detail("a whole Responses body is passed as it came"), [])
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
        return CompletionRepair(Verdict.SKIPPED, body, wording.skipped_detail("not a chat completion"), [])
    if completion.get("object", "chat.completion") != "chat.completion":
        return CompletionRepair(
            Verdict.SKIPPED, body, wording.skipped_detail(f"not a chat completion ({completion.get('object')!r})"), []
        )
    usage = completion.get("usage")
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    repairs: list[str] = []
    to_fix: list[tuple[int, str]] = []
    for position, choice in enumerate(completion["choices"]):
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
        to_fix.append((position, reason))
        repairs.append(wording.set_finish_reason(reason, choice.get("index", position)))
    if not repairs:
        return CompletionRepair(Verdict.CLEAN, body, "clean", [])
    new_body = _edit_in_place(body, to_fix)
    if new_body is None or json_or_unreadable(new_body) != completion:
        new_body = json.dumps(completion, ensure_ascii=False, separators=(",", ":")).encode()
    return CompletionRepair(Verdict.REPAIRED, new_body, wording.repaired_detail(repairs), repairs)


def _repair_message(body: bytes, message: object, request: RequestFacts) -> CompletionRepair:
    """M7: a `message` with `stop_reason` null, "" or missing gets the reason M2 would infer."""
    if not isinstance(message, dict) or message.get("type") != "message":
        return CompletionRepair(Verdict.SKIPPED, body, wording.skipped_detail("not a Messages message"), [])
    if message.get("stop_reason"):
        return CompletionRepair(Verdict.CLEAN, body, "clean", [])
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    usage = message.get("usage")
    output_tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    reason = infer_stop_reason(
        tool_use=any(is_tool_block(block) for block in blocks),
        output_tokens=output_tokens if isinstance(output_tokens, int) and not isinstance(output_tokens, bool) else None,
        max_tokens=request.max_tokens,
    )
    message["stop_reason"] = reason
    repairs = [wording.set_stop_reason(reason)]
    new_body = _edit_top_level(body, "stop_reason", json.dumps(reason).encode())
    if new_body is None or json_or_unreadable(new_body) != message:
        new_body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    return CompletionRepair(Verdict.REPAIRED, new_body, wording.repaired_detail(repairs), repairs)


def _edit_top_level(body: bytes, key: str, value: bytes) -> bytes | None:
    """`body` with the top-level object's `key` set to `value` (replaced, or added at its end),
    or None for a body this cannot walk. The caller checks the result by parsing it back."""
    depth = 0
    previous = b""
    wanted = json.dumps(key).encode()
    value_next = False
    for match in _TOKEN.finditer(body):
        token = match.group()
        if value_next:
            if token in (b"{", b"["):
                return None  # a reason is never an object or array: not this body's shape
            return body[: match.start()] + value + body[match.end() :]
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            if depth == 1:
                separator = b"" if previous == b"{" else b", "
                return body[: match.start()] + separator + wanted + b": " + value + body[match.start() :]
            depth -= 1
        elif depth == 1 and token == b":" and previous == wanted:
            value_next = True
        previous = token
    return None


def _edit_in_place(body: bytes, to_fix: list[tuple[int, str]]) -> bytes | None:
    spans = _choice_spans(body)
    if spans is None:
        return None
    edits: list[tuple[int, int, bytes]] = []
    for position, reason in to_fix:
        if position >= len(spans):
            return None
        span = spans[position]
        value = json.dumps(reason).encode()
        if span.reason_value is not None:
            edits.append((*span.reason_value, value))
        else:
            member = b'"finish_reason": ' + value
            edits.append((span.close, span.close, member if span.empty else b", " + member))
    for start, end, replacement in sorted(edits, reverse=True):
        body = body[:start] + replacement + body[end:]
    return body


def _choice_spans(body: bytes) -> list[_ChoiceSpan] | None:
    """Where each element of the top-level "choices" array is (None for elements that are not
    objects or a body this cannot walk)."""
    depth = 0
    key: bytes | None = None  # the last string seen at depth 1 (a key of the top-level object)
    in_choices = False
    spans: list[_ChoiceSpan] = []
    members = 0
    reason_key = False
    reason_value: tuple[int, int] | None = None
    previous = b""
    for match in _TOKEN.finditer(body):
        token = match.group()
        if token in (b"{", b"["):
            depth += 1
            if depth == 2 and token == b"[" and key == b'"choices"' and previous == b":":
                in_choices = True
            elif in_choices and depth == 3:
                if token != b"{":
                    return None
                members, reason_key, reason_value = 0, False, None
        elif token in (b"}", b"]"):
            if in_choices and depth == 3:
                spans.append(_ChoiceSpan(match.start(), members == 0, reason_value))
            elif in_choices and depth == 2:
                in_choices = False
            depth -= 1
        elif in_choices and depth == 3:
            if token == b":" or token == b",":
                pass
            elif previous in (b"{", b","):  # a key
                members += 1
                reason_key = token == b'"finish_reason"'
            elif previous == b":" and reason_key:
                reason_value = (match.start(), match.end())
                reason_key = False
        elif depth == 1 and token.startswith(b'"') and previous in (b"{", b","):
            key = token
        previous = token
    return spans if depth == 0 else None
