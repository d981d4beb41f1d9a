"""Every sentence finishline writes: the error event's message, the verdict details in the books, the
repairs listed there. The state machine decides what happened; this module only says it.

The words are contracts in places: the error message starts with "stream was interrupted" because
pi-ai's `isRetryableAssistantError` (1.6.0) matches that phrase and retries the turn; verdict details
start with the verdict word so that a ledger line reads on its own. Only plain values come in (counts,
strings, seconds, the exception of a bug), so the module depends on nothing else in the package.
"""

from __future__ import annotations

from typing import NamedTuple

from ._json import plural

__all__ = [
    "AFTER_CUT_STOPPED",
    "BEFORE_DONE",
    "BEFORE_MESSAGE_STOP",
    "BEFORE_USAGE_CHUNK",
    "TERMS",
    "Terms",
    "appended_done",
    "client_gone_detail",
    "completed_framing",
    "compressed_body",
    "content_after_injection",
    "cut_detail",
    "cut_message",
    "event_too_long",
    "filled_indexes",
    "how_it_was_cut",
    "http_error_detail",
    "injected_finish",
    "injected_stop_reason",
    "limit_reason_corrected",
    "internal_error",
    "malformed_detail",
    "no_head_detail",
    "no_head_message",
    "no_head_reason",
    "no_response_detail",
    "one_line",
    "repaired_detail",
    "rewrote_empty_reasons",
    "seconds",
    "set_finish_reason",
    "set_stop_reason",
    "skipped_detail",
    "stop_sequence_reason_corrected",
    "terminator_lost",
    "wrong_dialect",
    "stall_reason",
    "upstream_error_detail",
]


class Terms(NamedTuple):
    """A dialect's own words for what its sentences name."""

    # The API, as a person names it.
    name: str
    # What a stream that ends well ends with.
    terminator: str
    # What a cut stream never got.
    missing: str


# Keyed by the `Dialect` values (this module takes plain values only).
TERMS = {
    "chat": Terms("Chat Completions", "[DONE]", "a finish_reason"),
    "messages": Terms("Anthropic Messages", "message_stop", "a stop_reason"),
    "responses": Terms("OpenAI Responses", "a terminal event", "a terminal event"),
    "gemini": Terms("Gemini", "a finishReason", "a finishReason"),
}

# What finish_fix tells the client after the events it sent (OnCut values -> words in the books).
_OUTCOMES = {
    "error": "sent an error event",
    "stop": "finished as success (on_cut=stop)",
    "pass": "passed on unchanged",
}


def one_line(text: str, limit: int = 200) -> str:
    """`text` with its whitespace folded, cut to `limit` characters (for books and comments)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def seconds(value: float) -> str:
    """2 -> "2", 0.5 -> "0.5", 1.25 -> "1.25" (timeouts as the operator wrote them)."""
    return f"{value:g}"


# -- interruptions --------------------------------------------------------------------------------


def how_it_was_cut(cause: str, reason: str, dialect: str = "chat") -> str:
    """`Interruption.how`: "clean end without [DONE]" (Messages: "... without message_stop",
    Responses: "... without a terminal event"), "transport error: ...", "client gone: ...",
    "stalled: ..." (`cause` is a `CutCause` value, `dialect` a `Dialect` one)."""
    if cause == "clean_end":
        return f"clean end without {TERMS[dialect].terminator}"
    label = {
        "transport_error": "transport error",
        "client_gone": "client gone",
        "stalled": "stalled",
        "no_response_head": "no response head",
    }[cause]
    return f"{label}: {reason}"


def stall_reason(*, first_token: bool, timeout: float, events: int) -> str:
    """Which deadline passed: "no token within 60 s of the request", "no event for 30 s after 12
    events" (the first-token deadline counts from the request going upstream)."""
    if first_token:
        return f"no token within {seconds(timeout)} s of the request"
    return f"no event for {seconds(timeout)} s after {plural(events, 'event')}"


def _when(events: int, elapsed: float | None) -> str:
    when = f"after {plural(events, 'event')}"
    return when if elapsed is None else when + f" and {elapsed:.1f} s"


def _phase(before_first_token: bool) -> str:
    return "before the first token" if before_first_token else "after the first token"


def cut_message(
    *, cause: str, reason: str, before_first_token: bool, events: int, elapsed: float | None, dialect: str = "chat"
) -> str:
    """The message of the error event sent for a cut or a stall (rule C6, M4, R3)."""
    if cause == "stalled":
        return f"stream was interrupted: {reason}; the upstream stalled (finish_fix)"
    upstream_did = "ended the response" if cause == "clean_end" else f"connection failed ({reason})"
    return (
        f"stream was interrupted: the upstream {upstream_did} {_when(events, elapsed)}, "
        f"{_phase(before_first_token)}, without {TERMS[dialect].missing}; the response is incomplete (finish_fix)"
    )


def cut_detail(*, how: str, before_first_token: bool, events: int, elapsed: float | None, on_cut: str) -> str:
    """The `interrupted` verdict's detail: where, how, when, and what the client was told."""
    return f"interrupted {_phase(before_first_token)} ({how}) {_when(events, elapsed)}; {_OUTCOMES[on_cut]}"


def client_gone_detail(*, how: str, events: int) -> str:
    return f"interrupted: {how} after {plural(events, 'event')}, before the stream finished"


# -- repairs --------------------------------------------------------------------------------------


# Where a finish was injected (rule C3; rule C6 with on_cut=stop): the last words of `injected_finish`.
BEFORE_DONE = "before [DONE]"
BEFORE_USAGE_CHUNK = "before the usage chunk"
BEFORE_MESSAGE_STOP = "before message_stop"
AFTER_CUT_STOPPED = "after the cut (finish_fix_on_cut=stop)"


def injected_finish(reason: str, index: int, where: str) -> str:
    """`where` is one of `BEFORE_DONE`, `BEFORE_USAGE_CHUNK`, `AFTER_CUT_STOPPED`."""
    return f"injected finish_reason {reason!r} for choice {index} {where}"


def injected_stop_reason(reason: str, where: str) -> str:
    """M2 (and on_cut=stop in Messages): `where` is `BEFORE_MESSAGE_STOP` or `AFTER_CUT_STOPPED`."""
    return f"injected stop_reason {reason!r} {where}"


def terminator_lost(terminator: str, how: str) -> str:
    """M3: the stop_reason came, only the terminator did not."""
    return f"terminator lost: appended {terminator} ({how})"


def set_stop_reason(reason: str) -> str:
    """M7's repair of a whole (non-streaming) Messages `message`."""
    return f"set stop_reason {reason!r}"


def set_finish_reason(reason: str, index: object) -> str:
    """Rule C9's repair of a whole (non-streaming) completion."""
    return f"set finish_reason {reason!r} for choice {index}"


def limit_reason_corrected(rule: str, *, upstream: str, corrected: str, output_tokens: int, max_tokens: int) -> str:
    """C11, M8, R6: a reason that hid the token limit, said as the limit (`rule`: the rule's id)."""
    return (
        f"limit reason ({rule}): {upstream!r} at {output_tokens} output tokens of the request's {max_tokens} "
        f"sent as {corrected!r}"
    )


def stop_sequence_reason_corrected(rule: str) -> str:
    """M8: `end_turn` with a `stop_sequence` said as `stop_sequence`."""
    return f"stop sequence reason ({rule}): 'end_turn' with a stop_sequence sent as 'stop_sequence'"


def filled_indexes(rule: str, counts: dict[str, int]) -> str:
    """R7: which indexes were filled in on how many events, e.g. {"sequence_number": 12, ...}."""
    filled = ", ".join(f"{name} on {plural(count, 'event')}" for name, count in counts.items() if count)
    return f"responses indexes ({rule}): filled in {filled}"


def filled_fields(rule: str, fields: dict[str, int]) -> str:
    """R8: which snapshot fields were filled in on how many events, e.g. {"created_at": 2, ...}."""
    filled = ", ".join(f"{name} on {plural(count, 'event')}" for name, count in fields.items() if count)
    return f"responses fields ({rule}): filled in {filled} from the request"


def appended_done(how: str) -> str:
    return f"appended [DONE] ({how})"


def completed_framing() -> str:
    return "completed the framing of the last event"


def rewrote_empty_reasons(count: int) -> str:
    return f"rewrote {plural(count, 'empty finish_reason value')} to null"


def content_after_injection() -> str:
    return "content arrived after a finish injected at a usage chunk"


def repaired_detail(repairs: list[str]) -> str:
    return "repaired: " + "; ".join(repairs)


# -- the other verdicts ---------------------------------------------------------------------------


def upstream_error_detail(label: str | None) -> str:
    return "upstream_error: error event" + (f" ({one_line(label, 60)})" if label else "")


def malformed_detail(*, event: int, count: int, other: str | None) -> str:
    """`malformed`: the number of the first event whose data is not JSON (from 1, among the events
    a client dispatches), how many there were, and the detail of what else the stream ended as
    (`other`, None for a stream that was otherwise clean), which starts with its own verdict word."""
    detail = f"malformed: event {event}'s data is not JSON"
    detail += f" ({count} such events in all); passed on as they came" if count > 1 else "; passed on as it came"
    return detail if other is None else f"{detail}; {other}"


def skipped_detail(why: str, *, from_event: int | None = None) -> str:
    """`skipped`, and why; `from_event` when the stream was repaired up to there."""
    if from_event is None:
        return f"skipped: {one_line(why)}"
    return f"skipped: {one_line(why)}; passed through unchanged from event {from_event}"


def wrong_dialect(*, path_dialect: str, event_dialect: str) -> str:
    """Why a stream whose first event belongs to another dialect than its path's passes untouched."""
    return (
        f"the first event is {TERMS[event_dialect].name}, not {TERMS[path_dialect].name} as the path says; "
        "passed through untouched"
    )


def compressed_body(encoding: str) -> str:
    """Why a compressed stream is `skipped` (rule C10)."""
    return f"compressed body ({encoding}) passed through untouched"


def event_too_long(limit: int) -> str:
    """Why a stream whose open event outgrew the framer's limit passes through from there."""
    return f"an event grew past {limit} bytes without ending"


def internal_error(error: Exception) -> str:
    """A bug of finishline's, as the books and `StreamReport.internal_error` name it."""
    return f"internal error ({type(error).__name__}: {error})"


def http_error_detail(status: int) -> str:
    return f"http_error: HTTP {status}"


def no_head_reason(timeout: float) -> str:
    """Why a request got no response: "no response head within 2 s of the request"."""
    return f"no response head within {seconds(timeout)} s of the request"


def no_head_message(timeout: float) -> str:
    """The message of the error body a client is answered with when no response head came."""
    return f"{no_head_reason(timeout)}; the upstream did not answer (finish_fix)"


def no_head_detail(*, timeout: float, status: int) -> str:
    """The `interrupted` verdict's detail for a request that got no response head."""
    return f"interrupted before the response head ({no_head_reason(timeout)}); answered HTTP {status}"


def no_response_detail(*, client_gone: bool, reason: str) -> str:
    """A flow that ended without any response."""
    if client_gone:
        return "skipped: the client went away before the response"
    # mitmproxy answered the client itself, e.g. 502 for an unreachable upstream.
    return f"http_error: no upstream response ({reason})"
