"""The books: what happened to one stream, in the words the ledger, mitmweb and the lab use."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple, Required, TypedDict

from ._dialect import Dialect
from ._wording import how_it_was_cut, no_response_detail

__all__ = [
    "Booking",
    "ClientEnding",
    "Correction",
    "CutCause",
    "Injection",
    "InjectionKind",
    "Interruption",
    "MALFORMED_OUTRANKS",
    "OnCut",
    "RepairPolicy",
    "StreamReport",
    "TokenUsage",
    "Verdict",
    "book_missing_response",
]


class Verdict(enum.StrEnum):
    """What a flow in finish_fix's scope ended as. The values are the words users read."""

    # Ended the way the spec says; nothing was changed.
    CLEAN = "clean"
    # Ended badly but recoverably (missing or empty finish_reason, missing [DONE]); finish_fix fixed it.
    REPAIRED = "repaired"
    # The upstream stopped before the stream finished: the answer is incomplete.
    INTERRUPTED = "interrupted"
    # The upstream itself reported an error in the stream (an error event); passed on as is.
    UPSTREAM_ERROR = "upstream_error"
    # An event the client reads had data that is not JSON (rule C8): passed on as it came, but the
    # client saw garbage. Outranks what else the stream ended as (`MALFORMED_OUTRANKS`).
    MALFORMED = "malformed"
    # The upstream answered with an HTTP error status; passed on as is.
    HTTP_ERROR = "http_error"
    # Not repaired, and why (compressed body, not a chat completion, internal fallback).
    SKIPPED = "skipped"


#: The verdicts a malformed event outranks (docs/repair-rules.md, "Which verdict a stream gets"): a
#: stream with an event whose data is not JSON is booked `malformed` however it ended, and what it
#: ended as stays in its books (the detail goes on with that verdict's own; its repairs, injections
#: and cut cause are kept). `skipped` and `http_error` are not outranked: finish_fix did not read
#: those streams (from some event on), so it books no event of theirs.
MALFORMED_OUTRANKS = frozenset({Verdict.CLEAN, Verdict.REPAIRED, Verdict.INTERRUPTED, Verdict.UPSTREAM_ERROR})


class OnCut(enum.StrEnum):
    """What to send the client when the upstream stops before the stream finished (rule C6)."""

    # Append an explicit SSE error event and end the response: the client raises, nothing is faked.
    ERROR = "error"
    # Inject finishing events and [DONE]: the client sees success. It lies; opt-in only.
    STOP = "stop"
    # Change nothing; only record the interruption.
    PASS = "pass"


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairPolicy:
    """The repair's options (finish_fix's `finish_fix_empty_to_null`, `finish_fix_on_cut`,
    `finish_fix_idle_timeout`, `finish_fix_first_token_timeout`, `finish_fix_limit_reasons`,
    `finish_fix_responses_indexes` and `finish_fix_responses_fields`).

    Attributes:
        idle_timeout: seconds allowed between two events once the first event arrived (comments and
            keep-alive lines are not events); 0 = no limit.
        first_token_timeout: seconds allowed from the request going upstream to the first token
            (also to the response head, `_no_head`); 0 = no limit.
            The core has no clock: these act only through `StreamRepair.next_stall_check` and
            `receive_timer`, with times the caller passes in.
        limit_reasons: correct a reason the upstream got wrong at the request's token limit (rules
            C11, M8, R6), and count Messages' token deltas toward the limit when no usage came (M2).
        responses_indexes: fill in the `sequence_number`, `output_index` and `content_index` a
            Responses event lacks (rule R7).
        responses_fields: fill in the `created_at` and `model` a Responses `response.created` or
            `response.in_progress` snapshot lacks, from the request (rule R8).
    """

    empty_to_null: bool = True
    on_cut: OnCut = OnCut.ERROR
    idle_timeout: float = 0.0
    first_token_timeout: float = 0.0
    limit_reasons: bool = True
    responses_indexes: bool = True
    responses_fields: bool = True


class CutCause(enum.StrEnum):
    """Why a stream stopped before it finished."""

    # The upstream ended the body normally (e.g. closed a close-delimited body) without [DONE].
    CLEAN_END = "clean_end"
    # The upstream connection failed mid-body (incomplete chunked body, short Content-Length,
    # reset, HTTP/2 stream reset).
    TRANSPORT_ERROR = "transport_error"
    # The exchange ended on the client's side (the client went away, the flow was killed).
    CLIENT_GONE = "client_gone"
    # The upstream went silent past a deadline (`RepairPolicy.idle_timeout` or
    # `first_token_timeout`); the caller closed it.
    STALLED = "stalled"
    # No response head came within `first_token_timeout` of the request going upstream: there was
    # no stream to cut, the caller answered the client itself (`answer_no_head`) and closed the
    # upstream exchange.
    NO_RESPONSE_HEAD = "no_response_head"


@dataclass(frozen=True, slots=True, kw_only=True)
class Interruption:
    """How a stream was cut.

    Attributes:
        before_first_token: no chunk with content, reasoning or a tool call had arrived.
        cause: what ended it.
        reason: the transport's own words ("" for a clean end); for a stall, which deadline passed.
        dialect: the stream's dialect (its terminator names a clean end).
    """

    before_first_token: bool
    cause: CutCause
    reason: str = ""
    dialect: Dialect = Dialect.CHAT

    @property
    def how(self) -> str:
        """In words: "clean end without [DONE]" (or the dialect's terminator), "transport error:
        ...", "client gone: ...", "stalled: ..."."""
        return how_it_was_cut(self.cause, self.reason, self.dialect)


class InjectionKind(enum.StrEnum):
    """What an event finish_fix wrote into a stream is (`Injection.kind`). The values are the words
    of the ledger's `injected` list and of the `kind` label of finish_fix's metrics."""

    # A finishing event: Chat's finish chunk for one choice (C3), Messages' `message_delta` (M2).
    FINISH = "finish"
    # Chat's `data: [DONE]` (C4, and after a cut told as a success).
    DONE = "done"
    # The dialect's error event after a cut or stall (C6, M4, R3).
    ERROR_EVENT = "error_event"
    # Messages' `message_stop` (M2, M3).
    MESSAGE_STOP = "message_stop"
    # Messages' `content_block_stop` for a block left open (M2).
    CONTENT_BLOCK_STOP = "content_block_stop"
    # Responses' `response.failed` after the error event (R3).
    RESPONSE_FAILED = "response.failed"


class Correction(enum.StrEnum):
    """A rule that changed a value the upstream sent (where `InjectionKind` names what finish_fix
    added). The values are the words of the `rule` label of finish_fix's metrics; the ledger's
    `repairs` name the rule the same way (docs/repair-rules.md)."""

    # A reason that hides the token limit, said as the limit: Chat `stop` -> `length` (C11),
    # Messages `end_turn` -> `max_tokens` (M8), Responses `response.completed` -> `response.incomplete` (R6).
    LIMIT_REASON = "limit_reason"
    # Messages `end_turn` with a `stop_sequence` -> `stop_sequence` (M8).
    STOP_SEQUENCE_REASON = "stop_sequence_reason"
    # Responses events given the `sequence_number`, `output_index`, `content_index` they lacked (R7).
    RESPONSES_INDEXES = "responses_indexes"
    # A Responses snapshot given the `created_at` and `model` it lacked, from the request (R8).
    RESPONSES_FIELDS = "responses_fields"


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenUsage:
    """The token counts the upstream reported, in every dialect's terms made one (None: not reported).

    Attributes:
        input_tokens: every input token, cached ones included: Chat's `prompt_tokens`, Responses'
            `input_tokens`; Messages' `input_tokens` plus its `cache_read_input_tokens` and
            `cache_creation_input_tokens` (Anthropic counts those apart).
        output_tokens: Chat's `completion_tokens`, Responses' `output_tokens`, Messages' last
            `message_delta` count (`message_start`'s is a placeholder, not the answer's).
    """

    input_tokens: int | None = None
    output_tokens: int | None = None


class ClientEnding(NamedTuple):
    """How the client's response ends after a cut or a stall (`StreamRepair.receive_failure`,
    `receive_timer`). finish_fix's cut hook applies it as is."""

    # Bytes to send to the client now (body bytes; the transport adds its own framing).
    client_bytes: bytes
    # True: end the client's response normally after them (what was sent says how the stream
    # ended). False: let the client see the failure as it happened (on_cut=pass, or passthrough).
    end_response: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Booking:
    """What the books keep of one flow in scope, however it ended: a stream
    (`StreamReport.booking`), a whole response (`repair_completion`'s verdict, detail and repairs,
    with the body's length), or no response at all (`book_missing_response`). `to_json` is the one
    place the ledger's keys, their order and their values are made, so the three paths cannot
    write different lines.

    Counts a path does not have (a whole body has no events) are None; times are seconds in the
    caller's clock, None when it gave none. `cause` is the interruption's (None unless
    `interrupted`, or `malformed` and also cut); `time_to_first_token`, `finish_reasons` and `usage` are a stream's
    (`StreamReport` says what each holds).
    """

    verdict: Verdict
    detail: str
    model: str | None = None
    dialect: Dialect = Dialect.CHAT
    events: int | None = None
    upstream_bytes: int | None = None
    client_bytes: int | None = None
    time_to_first_event: float | None = None
    duration: float | None = None
    injected: tuple[Injection, ...] = ()
    repairs: tuple[str, ...] = ()
    # Not in the ledger line: what finish_fix's metrics and spans read besides the above.
    cause: CutCause | None = None
    time_to_first_token: float | None = None
    finish_reasons: tuple[str, ...] = ()
    usage: TokenUsage | None = None
    # The rules that changed an upstream value of this flow (their words are in `repairs`).
    corrections: tuple[Correction, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The flow's keys of its ledger line, in the ledger's order (docs/repair-rules.md, "The
        books"), times rounded to 0.1 ms; also what flow.metadata holds of it."""
        return {
            "model": self.model,
            "dialect": str(self.dialect),
            "verdict": str(self.verdict),
            "detail": self.detail,
            "events": self.events,
            "upstream_bytes": self.upstream_bytes,
            "client_bytes": self.client_bytes,
            "time_to_first_event": _seconds(self.time_to_first_event),
            "duration": _seconds(self.duration),
            "injected": [_plain(injection) for injection in self.injected],
            "repairs": list(self.repairs),
        }


# The verdicts that keep a cut's cause in the books.
_CUT_VERDICTS = frozenset({Verdict.INTERRUPTED, Verdict.MALFORMED})


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _plain(injection: Injection) -> dict[str, Any]:
    """An injection as plain JSON values (its kind as the word, not the enum member)."""
    return {**injection, "kind": str(injection["kind"])}


def book_missing_response(
    reason: str, *, client_gone: bool, model: str | None = None, dialect: Dialect = Dialect.CHAT
) -> Booking:
    """A flow in scope that ended without any response: the client left first (`skipped`, nothing
    went wrong upstream), or the upstream never answered (`http_error`: the client got the proxy's
    own error status, e.g. mitmproxy's 502). `reason` is the proxy's error message; `model` and
    `dialect` are the request's."""
    verdict = Verdict.SKIPPED if client_gone else Verdict.HTTP_ERROR
    return Booking(
        verdict=verdict, detail=no_response_detail(client_gone=client_gone, reason=reason), model=model, dialect=dialect
    )


class Injection(TypedDict, total=False):
    """One event finish_fix wrote into a stream (`StreamReport.injected`): its `kind`, and what the
    lab and the fuzz contracts need to know which event it was."""

    kind: Required[InjectionKind]
    # Chat `finish`: the choice it finished and the reason it gave.
    choice: int
    finish_reason: str
    # Messages `finish`: the stop_reason it gave; `content_block_stop`: the block it closed.
    stop_reason: str
    index: int
    # `error_event`: its code (Chat, Responses) or its error type (Messages) or status (Gemini).
    code: str
    type: str
    # Responses `response.failed`: the response's id, as the upstream's snapshot had it.
    id: object


@dataclass(slots=True, kw_only=True)
class StreamReport:
    """The running account of one stream; final once the stream ended.

    Times are in the caller's clock (seconds), counted from the `started_at` it gave (finish_fix
    gives the request's start); None when the caller passed no clock.

    Attributes (besides the ledger's own, `Booking`):
        time_to_first_token: until the first event that carried a token (content, reasoning, a
            refusal or a tool call: rules C7, M6, R5), where `time_to_first_event` counts any event.
        finish_reasons: the reasons the stream finished with as the client was sent them, the
            upstream's or injected: Chat's `finish_reason` per choice (by index), Messages'
            `stop_reason`; Responses' terminal event as a word, `completed`, or for
            `response.incomplete` its `incomplete_details.reason` (`max_output_tokens`,
            `content_filter`), else `incomplete`. Empty when none came (a cut, an error).
        usage: the token counts the upstream reported, if it did.
        malformed_events: events whose data was not JSON (rule C8), read before the stream's end
            (after `[DONE]`, a terminal or an error event nothing is read).
        first_malformed_event: the number of the first of them, counted from 1 over the stream's
            events as a client dispatches them (every event with data, Messages' `ping` included,
            so one more per ping than `events` counts; not comments or blank lines); the
            `malformed` detail names it.
        corrections: per rule that changed upstream events (`Correction`), how many it changed.
    """

    verdict: Verdict = Verdict.CLEAN
    detail: str = "clean"
    dialect: Dialect = Dialect.CHAT
    repairs: list[str] = field(default_factory=list)
    injected: list[Injection] = field(default_factory=list)
    interruption: Interruption | None = None
    model: str | None = None
    events: int = 0
    malformed_events: int = 0
    first_malformed_event: int | None = None
    upstream_bytes: int = 0
    client_bytes: int = 0
    dropped_incomplete_bytes: int = 0
    time_to_first_event: float | None = None
    time_to_first_token: float | None = None
    duration: float | None = None
    finish_reasons: list[str] = field(default_factory=list)
    usage: TokenUsage | None = None
    corrections: dict[Correction, int] = field(default_factory=dict)
    # The upstream error event's own message. Kept out of `detail` (which goes to the ledger) because
    # it may quote message content; mitmweb shows it in the flow's comment.
    upstream_error_message: str | None = None
    # Set when the repair hit a bug of its own and passed the rest of the stream through unchanged.
    internal_error: str | None = None

    def booking(self) -> Booking:
        """What the books keep of the stream (final once it ended)."""
        return Booking(
            verdict=self.verdict,
            detail=self.detail,
            model=self.model,
            dialect=self.dialect,
            events=self.events,
            upstream_bytes=self.upstream_bytes,
            client_bytes=self.client_bytes,
            time_to_first_event=self.time_to_first_event,
            duration=self.duration,
            injected=tuple(self.injected),
            repairs=tuple(self.repairs),
            # A cause only for an interrupted stream, or a malformed one that was also cut: a stream
            # given up on after its cut (a bug of ours passes it through) is booked `skipped`, and
            # the metrics know no cause for that.
            cause=self.interruption.cause if self.interruption is not None and self.verdict in _CUT_VERDICTS else None,
            time_to_first_token=self.time_to_first_token,
            finish_reasons=tuple(self.finish_reasons),
            usage=self.usage,
            corrections=tuple(self.corrections),
        )

    def as_json(self) -> dict[str, Any]:
        """A JSON-serializable copy (for flow.metadata): what `dataclasses.asdict` gives, made field
        by field (asdict's recursive copy costs a stream about 30 us, which showed in the bench's
        races of 200-event streams)."""
        record = {name: getattr(self, name) for name in _REPORT_FIELDS}
        record["repairs"] = list(self.repairs)
        record["finish_reasons"] = list(self.finish_reasons)
        record["usage"] = None if self.usage is None else asdict(self.usage)
        record["verdict"] = str(self.verdict)
        record["dialect"] = str(self.dialect)
        record["injected"] = [_plain(injection) for injection in self.injected]
        record["corrections"] = {str(rule): count for rule, count in self.corrections.items()}
        if self.interruption is not None:
            record["interruption"] = {
                "before_first_token": self.interruption.before_first_token,
                "cause": str(self.interruption.cause),
                "reason": self.interruption.reason,
                "how": self.interruption.how,
            }
        return record


# `StreamReport.as_json`'s keys, in the order `asdict` gives them.
_REPORT_FIELDS = tuple(field.name for field in fields(StreamReport))
