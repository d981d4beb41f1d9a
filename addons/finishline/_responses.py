"""The OpenAI Responses dialect (`/v1/responses`): what its events mean to the repair machine.

Theory of operation
-------------------
A Responses stream is `response.created`, `response.in_progress`, the output items' events, and one
terminal event: `response.completed`, `response.incomplete`, `response.failed`, or `error`. Every
event carries a `sequence_number`. Unlike Chat and Messages there is no end marker besides the
terminal events, so nothing can be "only missing its terminator": a stream that ends without one was
cut, and finish_fix never writes `response.completed` (rule R2). The rules:

* a well-formed stream passes byte-identical, a trailing `[DONE]` included (R1)
* a cut (clean end, transport failure, stall) before a terminal event -> two events, then the end
  of the response (R3). A `data: [DONE]` before any terminal event is the upstream's own clean end
  (a server that ends every dialect the Chat way): the two events go before it, since both SDKs
  stop reading at `[DONE]` and would never see them after it. The events: `event: error`, whose data has the documented flat fields and also a nested
  `error` object (openai-python raises only on the nested key, openai-node on the event name, and the
  AI SDK's schema needs `sequence_number`), then `event: response.failed` with the id of
  `response.created` (a changed id makes both SDKs raise "Lifecycle response identity changed"),
  `status: "failed"`. Their `sequence_number`s continue the upstream's.
* `response.failed`, `error`, or a bare `{"error": ...}` data frame (vLLM's) -> passed on, booked
  as `upstream_error`, nothing injected after it (R4)
* the first token is the first non-empty text, reasoning, refusal or function-call-arguments delta (R5)
* `response.completed` whose `usage.output_tokens` reached the request's `max_output_tokens`
  (llama.cpp and Ollama never say `incomplete`) -> sent as `response.incomplete`, status
  `incomplete`, `incomplete_details: {"reason": "max_output_tokens"}` (R6,
  `RepairPolicy.limit_reasons`)
* an event without its `sequence_number`, `output_index` or `content_index` (llama.cpp sends none;
  openai-python's `responses.stream()` helper then indexes a list with None) -> each missing one
  filled in from the stream's own order; a value the upstream sent is never changed (R7,
  `RepairPolicy.responses_indexes`). A stream that has them all passes byte for byte, and its
  routine deltas keep the fast path (`_routine_chunks` learns only deltas that carry their indexes).
* a `response.created` or `response.in_progress` whose `response` lacks `created_at` or `model`
  (llama.cpp sends neither there, only in `response.completed`; the AI SDK's schema requires both
  and fails the whole stream) -> each missing one filled in from the request: its `model`, and the
  time it went upstream (the caller's clock, `RequestFacts.created_at`). A value the upstream sent
  is never changed, and a fact the request lacks is never made up (R8, `RepairPolicy.responses_fields`).

The tables come first (terminal, error, token, content-indexed and R8's snapshot events), then what
R3's frames continue (`ResponseSoFar`, `failure_frames`), then `ResponsesRules`, which reads them.
The rules see their stream only through `_rule_interface.StreamServices`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, TypeGuard

from ._dialect import Dialect
from ._injected import DONE, ERROR_CODE, dialect_event
from ._json import UNREADABLE
from ._json_edit import JsonPath, rewrite_event
from ._routine_chunks import MAY_STEADY, RoutineMatch
from ._rule_interface import StreamServices
from ._sse import Event
from ._typed_rules import TypedEventRules
from ._verdict import Correction, InjectionKind, TokenUsage
from ._wording import filled_fields, filled_indexes, limit_reason_corrected

__all__ = [
    "CONTENT_INDEXED_EVENTS",
    "ERROR_EVENTS",
    "TERMINAL_EVENTS",
    "TOKEN_EVENTS",
    "ResponseSoFar",
    "ResponsesRules",
    "failure_frames",
]

#: Terminal events that end a stream as the upstream meant it (R1).
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})
#: Terminal events that say the upstream failed (R4).
ERROR_EVENTS = frozenset({"response.failed", "error"})
#: Events whose non-empty `delta` is a token (R5).
TOKEN_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)
#: Events that name a content part of their item by `content_index` (R7; the reasoning summary's
#: events name theirs by `summary_index`, which no server is known to leave out).
CONTENT_INDEXED_EVENTS = frozenset(
    {
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.delta",
        "response.refusal.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    }
)
# The rules' ids, as docs/repair-rules.md numbers them and the books name them.
_LIMIT_RULE = "R6"
_INDEXES_RULE = "R7"
_FIELDS_RULE = "R8"
#: R8: the snapshot events whose `response` must name its creation time and model (the OpenAI
#: spec's `Response` requires both; `response.queued` is not in the AI SDK's union, so not here).
_FIELDS_EVENTS = frozenset({"response.created", "response.in_progress"})
_INCOMPLETE_DETAILS = {"reason": "max_output_tokens"}
# The lifecycle events whose `response` is the snapshot a `response.failed` repeats.
_SNAPSHOT_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})
# Used only when the stream was cut before `response.created` named its response.
_UNNAMED_RESPONSE_ID = "resp_finish_fix_interrupted"


@dataclass(slots=True)
class ResponseSoFar:
    """What R3's two events continue: the response object of the last lifecycle event
    (`response.created`, `in_progress`, `queued`) and the last `sequence_number` seen."""

    snapshot: dict[str, Any] | None = None
    sequence_number: int | None = None

    def note(self, kind: str | None, message: dict[str, Any]) -> None:
        """One event's parsed data (`kind` its type)."""
        number = message.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            self.sequence_number = number
        if kind in _SNAPSHOT_EVENTS:
            response = message.get("response")
            if isinstance(response, dict):
                self.snapshot = response


def failure_frames(message: str, line_ending: bytes, *, so_far: ResponseSoFar, code: str = ERROR_CODE) -> bytes:
    """R3's events: `event: error` (the documented flat fields and OpenAI's nested `error`, `code`
    in both), then `event: response.failed` repeating the snapshot's response (its id) with
    `status: "failed"`; their `sequence_number`s continue `so_far`'s."""
    number = -1 if so_far.sequence_number is None else so_far.sequence_number
    error = {
        "type": "error",
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": number + 1,
        "error": {"type": "server_error", "code": code, "message": message, "param": None},
    }
    response: dict[str, Any] = (
        copy.deepcopy(so_far.snapshot)
        if so_far.snapshot is not None
        else {
            "id": _UNNAMED_RESPONSE_ID,
            "object": "response",
            "output": [],
        }
    )
    response["status"] = "failed"
    response["error"] = {"code": "server_error", "message": message}
    failed = {"type": "response.failed", "sequence_number": number + 2, "response": response}
    return dialect_event("error", error, line_ending) + dialect_event("response.failed", failed, line_ending)


class ResponsesRules(TypedEventRules):
    """The Responses facts of one stream, read event by event for its `StreamRepair`."""

    dialect = Dialect.RESPONSES
    # finish_fix_on_cut=stop would need a made-up `response.completed`, which R2 forbids: a cut is
    # told as with `error`.
    may_stop = False

    def __init__(self, stream: StreamServices) -> None:
        super().__init__(stream)
        self._so_far = ResponseSoFar()
        # R7: per item id, its output index (from its `output_item.added`) and its current content
        # index (from its last `content_part.added`); how many of each came; what was filled in.
        self._output_indexes: dict[str, int] = {}
        self._content_indexes: dict[str, int] = {}
        self._items_added = 0
        self._parts_added: dict[str, int] = {}
        self._filled = {"sequence_number": 0, "output_index": 0, "content_index": 0}
        # R8: how many snapshots got each field.
        self._fields = {"created_at": 0, "model": 0}

    # -- reading ------------------------------------------------------------------------------

    def on_routine(self, match: RoutineMatch) -> int:
        """A routine delta's token, and its `sequence_number` (the fast path read it)."""
        if match.number is not None:
            self._so_far.sequence_number = match.number
        return MAY_STEADY

    def note_sequence_number(self, number: int) -> None:
        """The last sequence number the machine's steady path took (`_repair._leave_steady`)."""
        self._so_far.sequence_number = number

    def on_event(self, event: Event, kind: str | None, message: Any) -> bytes:
        """The bytes to send for one event (`kind` its type, `message` its parsed data)."""
        stream = self._stream
        if (event.data or b"").startswith(DONE):
            # No terminal event came (after one the machine passes `[DONE]` itself, R1): the
            # upstream ended the stream here. R3's events first, where the client still reads.
            return stream.cut_here() + event.raw
        if message is UNREADABLE:  # not JSON, or not UTF-8: passed on as it came, booked `malformed` (rule C8)
            stream.malformed()
        if not isinstance(message, dict):
            return event.raw
        edits: dict[JsonPath, bytes] = {}
        if stream.policy.responses_indexes and _is_responses_event(message.get("type")):
            self._missing_indexes(kind, message, edits)
            if edits:
                stream.corrected(Correction.RESPONSES_INDEXES, None)  # its words at the end: `closing_books`
        if kind in _FIELDS_EVENTS and stream.policy.responses_fields and self._missing_fields(message, edits):
            stream.corrected(Correction.RESPONSES_FIELDS, None)  # its words at the end: `closing_books`
        event_type = None
        if kind == "response.completed" and stream.policy.limit_reasons and self._at_the_limit(message, edits):
            kind = event_type = "response.incomplete"
        raw = event.raw
        if edits:
            expected = _edited(message, edits)
            raw = rewrite_event(event, edits, expected, stream.line_ending(), event_type=event_type)
            message = expected
        self._so_far.note(kind, message)
        if kind in TOKEN_EVENTS:
            if message.get("delta"):
                stream.token_seen()
        elif kind in TERMINAL_EVENTS:
            stream.terminated()
            self._note_terminal(kind, message.get("response"))
        elif kind == "response.failed":
            response = message.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            if isinstance(error, dict):
                stream.upstream_error(label=error.get("code"), message=error.get("message"))
            else:
                stream.upstream_error(label="response.failed", message=None)
        elif kind == "error" or ("type" not in message and message.get("error") is not None):
            # The documented flat shape, OpenAI's nested one, or vLLM's bare `{"error": ...}` frame,
            # whatever `event:` name it came under: both SDKs raise on data with a top-level `error`.
            nested = message.get("error")
            source = nested if isinstance(nested, dict) else message
            label = source.get("code") or source.get("type")
            text = source.get("message") if isinstance(nested, dict) or kind == "error" else nested
            stream.upstream_error(label=label, message=text)
        elif kind in _SNAPSHOT_EVENTS:
            response = message.get("response")
            if isinstance(response, dict):
                stream.note_model(response.get("model"))
        return raw

    def _missing_indexes(self, kind: str | None, message: dict[str, Any], edits: dict[JsonPath, bytes]) -> None:
        """R7: the indexes this event lacks, from the stream's own order, into `edits`. What the
        upstream sent is kept, and read: a later event's missing index follows it. Only a key
        absent or `null` is missing: any other value the server sent (`"2"`, `1.0`) is its own and
        stays as it came, the count going on past it as past a number."""
        number = message.get("sequence_number")
        if not _is_int(number):
            counted = self._so_far.sequence_number = (
                0 if self._so_far.sequence_number is None else self._so_far.sequence_number + 1
            )
            if number is None:
                edits[("sequence_number",)] = _json(counted)
                self._filled["sequence_number"] += 1
        item_id = message.get("item_id")
        if kind == "response.output_item.added":
            item = message.get("item")
            index = message.get("output_index")
            if not _is_int(index):
                if index is None:
                    edits[("output_index",)] = _json(self._items_added)
                    self._filled["output_index"] += 1
                index = self._items_added
            self._items_added += 1
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                self._output_indexes[item["id"]] = index
            return
        if kind == "response.output_item.done":
            item = message.get("item")
            item_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(item_id, str):
            return
        if message.get("output_index") is None and item_id in self._output_indexes:
            edits[("output_index",)] = _json(self._output_indexes[item_id])
            self._filled["output_index"] += 1
        if kind not in CONTENT_INDEXED_EVENTS:
            return
        index = message.get("content_index")
        if kind == "response.content_part.added":
            added = self._parts_added.get(item_id, 0)
            if not _is_int(index):
                if index is None:
                    edits[("content_index",)] = _json(added)
                    self._filled["content_index"] += 1
                index = added
            self._parts_added[item_id] = added + 1
            self._content_indexes[item_id] = index
        elif index is None and item_id in self._content_indexes:
            edits[("content_index",)] = _json(self._content_indexes[item_id])
            self._filled["content_index"] += 1

    def _missing_fields(self, message: dict[str, Any], edits: dict[JsonPath, bytes]) -> bool:
        """R8: the `created_at` and `model` this snapshot's `response` lacks (absent or `null`),
        from the request, into `edits`; whether it added any. A field the request cannot give (no
        model asked for, no clock reading passed in) stays missing."""
        response = message.get("response")
        if not isinstance(response, dict):
            return False
        request = self._stream.request
        added = False
        for field, value in (("created_at", request.created_at), ("model", request.model)):
            if response.get(field) is None and value is not None:
                edits[("response", field)] = _json(value)
                self._fields[field] += 1
                added = True
        return added

    def _at_the_limit(self, message: dict[str, Any], edits: dict[JsonPath, bytes]) -> bool:
        """R6: whether this `response.completed` hides the request's token limit; if so, the edits
        that say `incomplete` go into `edits` and the correction is booked. Only a `completed`
        status with its output tokens at or past `max_output_tokens` is changed: any other status
        already says something (vLLM 0.29 sent `incomplete` inside `response.completed`)."""
        stream = self._stream
        limit = stream.request.max_tokens
        response = message.get("response")
        if limit is None or not isinstance(response, dict) or response.get("status") != "completed":
            return False
        usage = response.get("usage")
        output_tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
        if not _is_int(output_tokens) or output_tokens < limit:
            return False
        edits[("type",)] = _json("response.incomplete")
        edits[("response", "status")] = _json("incomplete")
        edits[("response", "incomplete_details")] = _json(_INCOMPLETE_DETAILS)
        stream.corrected(
            Correction.LIMIT_REASON,
            limit_reason_corrected(
                _LIMIT_RULE,
                upstream="response.completed",
                corrected="response.incomplete",
                output_tokens=output_tokens,
                max_tokens=limit,
            ),
        )
        return True

    def closing_books(self) -> None:
        """R7's and R8's counts of what they filled in, once for the whole stream."""
        if any(self._filled.values()):
            self._stream.repaired(filled_indexes(_INDEXES_RULE, self._filled))
        if any(self._fields.values()):
            self._stream.repaired(filled_fields(_FIELDS_RULE, self._fields))

    def _note_terminal(self, kind: str, response: object) -> None:
        """The finish reason and the usage of a terminal event's response (`StreamReport` says which words)."""
        report = self._stream.report
        reason = "completed"
        if kind == "response.incomplete":
            details = response.get("incomplete_details") if isinstance(response, dict) else None
            cause = details.get("reason") if isinstance(details, dict) else None
            reason = cause if isinstance(cause, str) and cause else "incomplete"
        report.finish_reasons = [reason]
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict):
            report.usage = TokenUsage(
                input_tokens=_maybe_int(usage.get("input_tokens")), output_tokens=_maybe_int(usage.get("output_tokens"))
            )

    # -- the end ------------------------------------------------------------------------------

    def finished(self) -> bool:
        """Never: only a terminal event ends a Responses stream (R2)."""
        return False

    def terminator(self, how: str) -> bytes:  # pragma: no cover - `finished` is never true
        raise AssertionError("a Responses stream has no terminator finish_fix may write (R2)")

    def cut_frames(self, message: str) -> bytes:
        """R3: `event: error` (flat and nested), then `event: response.failed`."""
        stream = self._stream
        so_far = self._so_far
        stream.injected({"kind": InjectionKind.ERROR_EVENT, "code": ERROR_CODE})
        response_id = so_far.snapshot.get("id") if so_far.snapshot is not None else _UNNAMED_RESPONSE_ID
        stream.injected({"kind": InjectionKind.RESPONSE_FAILED, "id": response_id})
        return failure_frames(message, stream.line_ending(), so_far=so_far)

    def stop_frames(self) -> bytes:  # pragma: no cover - `may_stop` is False
        raise AssertionError("finish_fix_on_cut=stop never writes response.completed (R2)")


def _maybe_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_responses_event(kind: object) -> bool:
    """A type of the Responses event union (R7 numbers those only, not another dialect's event)."""
    return isinstance(kind, str) and (kind.startswith("response.") or kind == "error")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _edited(message: dict[str, Any], edits: dict[JsonPath, bytes]) -> dict[str, Any]:
    """A copy of `message` with `edits` made (what the edited event must parse to)."""
    edited = copy.deepcopy(message)
    for path, value in edits.items():
        holder: Any = edited
        for step in path[:-1]:
            holder = holder[step]
        holder[path[-1]] = json.loads(value)
    return edited
