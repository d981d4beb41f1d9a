"""The Anthropic Messages dialect (`/v1/messages`): what its events mean to the repair machine.

Theory of operation
-------------------
A well-formed stream is `message_start`, then per content block `content_block_start`, deltas and
`content_block_stop`, then `message_delta` (its `delta.stop_reason` says why the turn ended, its
`usage.output_tokens` counts the output so far) and `message_stop`; `ping` may come anywhere, and
`event: error` ends a stream that failed. The machine (`_repair.StreamRepair`) frames the events,
counts them, runs the deadlines and keeps the books; this module reads each event for the few facts
the rules need and writes the frames they inject:

* `message_stop` while no `message_delta` carried a non-empty `stop_reason` (missing, null or "")
  -> first `content_block_stop` for a block still open, then a `message_delta` with the reason
     `infer_stop_reason` gives and the last `output_tokens` seen, then the `message_stop` (rule M2)
* a clean end after a non-empty `stop_reason` without `message_stop`
  -> `message_stop` appended, "terminator lost" (rule M3)
* a cut (clean end, transport failure, stall) before any non-empty `stop_reason`
  -> one `event: error` (`api_error`), nothing after it (rule M4)
* `event: error` from the upstream -> passed on, nothing injected after it (rule M5)
* `ping` is a keep-alive for the deadlines; the first token is the first non-empty `text_delta`,
  `thinking_delta` or `input_json_delta` (rule M6)
* a `message_delta` whose `stop_reason` is `end_turn` with a `stop_sequence` (llama.cpp) -> the
  reason sent as `stop_sequence`; else `end_turn` with the output tokens at or past the request's
  `max_tokens` -> `max_tokens` (rule M8, `RepairPolicy.limit_reasons`)

The output tokens are the usage a `message_delta` counted. A stream that never counted them (no
`message_delta` at all) shows at least one token per non-empty token delta, so with
`limit_reasons` M2 infers `max_tokens` when those deltas alone reach the limit: a lower bound
never says "limit" where the limit was not reached.

Every frame finish_fix writes carries `event: <type>`: both Anthropic SDKs skip a frame without one.

The tables come first (the event types, the token deltas, the tool blocks, the corrections), then
the frames and inferences built from them, then `MessagesRules`, which reads them. The rules see
their stream only through `_rule_interface.StreamServices`.
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard

from ._dialect import Dialect
from ._injected import dialect_event
from ._json import UNREADABLE
from ._json_edit import rewrite_event
from ._routine_chunks import MAY_STEADY, RoutineMatch
from ._rule_interface import StreamServices
from ._sse import Event
from ._typed_rules import TypedEventRules
from ._verdict import Correction, InjectionKind, TokenUsage
from ._wording import (
    AFTER_CUT_STOPPED,
    BEFORE_MESSAGE_STOP,
    injected_stop_reason,
    limit_reason_corrected,
    stop_sequence_reason_corrected,
    terminator_lost,
)

__all__ = [
    "EVENT_TYPES",
    "KEEPALIVES",
    "MessagesRules",
    "corrected_stop_reason",
    "error_frame",
    "infer_stop_reason",
    "is_tool_block",
]

#: The event types of a Messages stream (a first event of another dialect's shape is not one of them).
EVENT_TYPES = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
#: Events that only keep the connection alive: they move no deadline and count as no event (M6).
KEEPALIVES = frozenset({"ping"})
#: Delta types that carry a token, and the key of their text (M6).
TOKEN_DELTAS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
#: Content blocks whose presence makes the inferred reason `tool_use`.
TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})
# The error type a cut is reported as: what Anthropic itself sends for an internal failure, which
# both SDKs raise on and pi-ai's retry filter ("stream was interrupted") matches by its message.
CUT_ERROR_TYPE = "api_error"
#: The reason each correction sends (M8), and its words in the books.
CORRECTED_REASONS = {Correction.STOP_SEQUENCE_REASON: "stop_sequence", Correction.LIMIT_REASON: "max_tokens"}
# Rule M8's id, as docs/repair-rules.md numbers it and the books name it.
_RULE = "M8"


def error_frame(message: str, line_ending: bytes) -> bytes:
    """M4's frame: `event: error` with Anthropic's error shape and `CUT_ERROR_TYPE` (Anthropic's
    errors carry no code: the type and the message are all a client reads)."""
    return dialect_event("error", {"type": "error", "error": {"type": CUT_ERROR_TYPE, "message": message}}, line_ending)


def is_tool_block(block: object) -> bool:
    """Whether a content block is one of `TOOL_BLOCKS`. Its type is looked up only if it is a
    string: a list or object there is unhashable, and what the upstream sent never raises."""
    kind = block.get("type") if isinstance(block, dict) else None
    return isinstance(kind, str) and kind in TOOL_BLOCKS


def infer_stop_reason(*, tool_use: bool, output_tokens: int | None, max_tokens: int | None) -> str:
    """`tool_use` if a tool_use block was sent, else `max_tokens` if the request's limit was
    reached by the output tokens seen, else `end_turn`. Never `pause_turn`, `refusal` or
    `stop_sequence`: those say something finish_fix cannot know (M2)."""
    if tool_use:
        return "tool_use"
    if max_tokens is not None and output_tokens is not None and output_tokens >= max_tokens:
        return "max_tokens"
    return "end_turn"


def corrected_stop_reason(
    *, stop_reason: object, stop_sequence: object, output_tokens: int | None, max_tokens: int | None
) -> Correction | None:
    """M8: which correction an upstream's `stop_reason` needs, if any. Only `end_turn` is ever
    changed: to `stop_sequence` when a stop sequence was matched, else to `max_tokens` when the
    output tokens reached the request's limit. Any other reason already says more than that."""
    if stop_reason != "end_turn":
        return None
    if isinstance(stop_sequence, str) and stop_sequence:
        return Correction.STOP_SEQUENCE_REASON
    if max_tokens is not None and output_tokens is not None and output_tokens >= max_tokens:
        return Correction.LIMIT_REASON
    return None


def correction_words(correction: Correction, *, output_tokens: int | None, max_tokens: int | None) -> str:
    if correction is Correction.STOP_SEQUENCE_REASON:
        return stop_sequence_reason_corrected(_RULE)
    return limit_reason_corrected(
        _RULE, upstream="end_turn", corrected="max_tokens", output_tokens=output_tokens or 0, max_tokens=max_tokens or 0
    )


class MessagesRules(TypedEventRules):
    """The Messages facts of one stream, read event by event for its `StreamRepair`."""

    dialect = Dialect.MESSAGES
    keepalives = KEEPALIVES
    may_stop = True

    def __init__(self, stream: StreamServices) -> None:
        super().__init__(stream)
        # The index of the content block started and not yet stopped, if any.
        self._open_block: int | None = None
        self._tool_use = False
        # The non-empty stop_reason a message_delta carried (the stream's answer is complete then).
        self._stop_reason: str | None = None
        self._output_tokens: int | None = None
        # Every input token the usage counted so far, cached ones included (`TokenUsage`).
        self._input_tokens: int | None = None
        # The output tokens a `message_delta` counted (`message_start`'s count is the placeholder
        # of a turn just begun: a cut stream's books do not take it for the answer's).
        self._counted_output_tokens: int | None = None
        # Events that were not a non-empty token delta: the stream's events less these are its
        # token deltas, counted so without a step on the machine's steady path (which takes only
        # deltas with text).
        self._other_events = 0

    # -- reading ------------------------------------------------------------------------------

    def on_routine(self, match: RoutineMatch) -> int:
        """A routine delta: a token delta unless its text is empty."""
        if not match.has_text:
            self._other_events += 1
        return MAY_STEADY

    def _token_deltas(self) -> int:
        return self._stream.report.events - self._other_events

    def _output_tokens_seen(self) -> int | None:
        """The output tokens for M2 and M8: the usage a `message_delta` counted; else, with
        `limit_reasons`, at least one per token delta. Never `message_start`'s count: that is the
        placeholder of a turn just begun (Anthropic sends 1 before any token), and taking it would
        say `max_tokens` at `max_tokens` 1 after no token at all."""
        if self._counted_output_tokens is not None:
            return self._counted_output_tokens
        return self._token_deltas() if self._stream.policy.limit_reasons else None

    def on_event(self, event: Event, kind: str | None, message: Any) -> bytes:
        """The bytes to send for one event (`kind` its type, `message` its parsed data)."""
        stream = self._stream
        self._other_events += 1  # undone below for a token delta
        if kind == "error":
            error = message.get("error") if isinstance(message, dict) else None
            if isinstance(error, dict):
                stream.upstream_error(label=error.get("type"), message=error.get("message"))
            else:
                stream.upstream_error(label=None, message=event.data)
            return event.raw
        if message is UNREADABLE:  # not JSON, or not UTF-8: passed on as it came, booked `malformed` (rule C8)
            # (An `event: error` is the upstream's error whatever its data, as in Chat: rule M5 above.)
            stream.malformed()
            return event.raw
        if not isinstance(message, dict):
            return event.raw
        if kind == "content_block_delta":
            delta = message.get("delta")
            if isinstance(delta, dict):
                # Only a string is looked up: a list or object there is unhashable (rule C8: data).
                delta_type = delta.get("type")
                key = TOKEN_DELTAS.get(delta_type) if isinstance(delta_type, str) else None
                if key is not None and delta.get(key):
                    stream.token_seen()
                    self._other_events -= 1
            return event.raw
        if kind == "content_block_start":
            if is_tool_block(message.get("content_block")):
                self._tool_use = True
            index = message.get("index")
            self._open_block = index if _is_int(index) else 0
        elif kind == "content_block_stop":
            self._open_block = None
        elif kind == "message_start":
            start = message.get("message")
            if isinstance(start, dict):
                self._note_usage(start.get("usage"))
                stream.note_model(start.get("model"))
        elif kind == "message_delta":
            delta = message.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str) and reason:
                self._stop_reason = reason
            usage = message.get("usage")
            self._note_usage(usage)
            if isinstance(usage, dict) and _is_int(usage.get("output_tokens")):
                self._counted_output_tokens = usage["output_tokens"]
            if reason == "end_turn" and stream.policy.limit_reasons and isinstance(delta, dict):
                return self._maybe_corrected(event, message, delta)
        elif kind == "message_stop":
            before = b"" if self._stop_reason is not None else self._finishing(BEFORE_MESSAGE_STOP)
            stream.terminated()
            return before + event.raw
        return event.raw

    def _maybe_corrected(self, event: Event, message: dict[str, Any], delta: dict[str, Any]) -> bytes:
        """M8: an `end_turn` that hides a stop sequence or the token limit, said as what it was."""
        stream = self._stream
        output_tokens = self._output_tokens_seen()
        limit = stream.request.max_tokens
        correction = corrected_stop_reason(
            stop_reason="end_turn", stop_sequence=delta.get("stop_sequence"), output_tokens=output_tokens, max_tokens=limit
        )
        if correction is None:
            return event.raw
        reason = self._stop_reason = CORRECTED_REASONS[correction]
        expected = {**message, "delta": {**delta, "stop_reason": reason}}
        raw = rewrite_event(event, {("delta", "stop_reason"): json.dumps(reason).encode()}, expected, stream.line_ending())
        stream.corrected(correction, correction_words(correction, output_tokens=output_tokens, max_tokens=limit))
        return raw

    def _note_usage(self, usage: object) -> None:
        """`message_start`'s usage, then `message_delta`'s (cumulative counts: the last one holds)."""
        if not isinstance(usage, dict):
            return
        if _is_int(usage.get("output_tokens")):
            self._output_tokens = usage["output_tokens"]
        # Anthropic counts cached input apart from `input_tokens`; the total is their sum.
        counts = [usage.get(key) for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
        if any(_is_int(count) for count in counts):
            self._input_tokens = sum(count for count in counts if _is_int(count))

    def closing_books(self) -> None:
        """The stop_reason the client was sent (the upstream's or injected) and the usage seen."""
        report = self._stream.report
        if self._stop_reason is not None:
            report.finish_reasons = [self._stop_reason]
        if self._input_tokens is not None or self._counted_output_tokens is not None:
            report.usage = TokenUsage(input_tokens=self._input_tokens, output_tokens=self._counted_output_tokens)

    # -- the end ------------------------------------------------------------------------------

    def finished(self) -> bool:
        """A clean end now lacks only `message_stop`: the stop_reason came (M3)."""
        return self._stop_reason is not None

    def terminator(self, how: str) -> bytes:
        """M3: the `message_stop` a finished stream lost, booked as such."""
        stream = self._stream
        stream.repaired(terminator_lost("message_stop", how))
        stream.injected({"kind": InjectionKind.MESSAGE_STOP})
        return dialect_event("message_stop", {"type": "message_stop"}, stream.line_ending())

    def cut_frames(self, message: str) -> bytes:
        """M4: the one error event a cut ends with; no `message_stop` follows an error."""
        stream = self._stream
        stream.injected({"kind": InjectionKind.ERROR_EVENT, "type": CUT_ERROR_TYPE})
        return error_frame(message, stream.line_ending())

    def stop_frames(self) -> bytes:
        """finish_fix_on_cut=stop: the cut told as a finished turn (the books still say interrupted)."""
        finishing = self._finishing(AFTER_CUT_STOPPED)
        self._stream.injected({"kind": InjectionKind.MESSAGE_STOP})
        return finishing + dialect_event("message_stop", {"type": "message_stop"}, self._stream.line_ending())

    def _finishing(self, where: str) -> bytes:
        """M2: close an open block, then a `message_delta` with the inferred reason."""
        stream = self._stream
        ending = stream.line_ending()
        out = b""
        if self._open_block is not None:
            out += dialect_event("content_block_stop", {"type": "content_block_stop", "index": self._open_block}, ending)
            stream.injected({"kind": InjectionKind.CONTENT_BLOCK_STOP, "index": self._open_block})
            self._open_block = None
        reason = infer_stop_reason(
            tool_use=self._tool_use, output_tokens=self._output_tokens_seen(), max_tokens=stream.request.max_tokens
        )
        self._stop_reason = reason
        payload = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": self._output_tokens or 0},
        }
        out += dialect_event("message_delta", payload, ending)
        stream.injected({"kind": InjectionKind.FINISH, "stop_reason": reason})
        stream.repaired(injected_stop_reason(reason, where))
        return out


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
