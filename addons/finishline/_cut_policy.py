"""How a stream's end is told: the terminator a finished stream lacks, or a cut's ending by
`RepairPolicy.on_cut` read against what the dialect may say.

When the upstream's stream ends (a clean end, a transport failure, a stall), an event the rules held
(Chat's finish waiting for its usage chunk, C11) goes first, as it came. Then a stream that was
still streaming either finished, and only its terminator is missing (rules C4, M3: the rules'
`terminator`), or it was cut. A cut is booked `interrupted`, with where, how and when, whatever the
client is told; the client is told what `on_cut` says:

    error   the dialect's error ending (rules C6, M4, R3: the rules' `cut_frames`), with the cut's
            message in the dialect's words
    stop    the dialect's finish and terminator (the rules' `stop_frames`): a story, the books
            still say interrupted; a dialect that may not finish what it did not see (Responses'
            `may_stop` is False: no made-up `response.completed`, R2) is told as `error`
    pass    nothing: the client sees the stream end where the upstream's did

A last event without its blank line is read at a clean end if the server meant it whole
(`missing_blank_line`), else dropped before anything is added (`incomplete_event`); the client's
response is ended normally after a broken end unless on_cut=pass left a cut as it was
(`ends_response`).
"""

from __future__ import annotations

from ._injected import DONE
from ._json import UNREADABLE, json_or_unreadable
from ._phases import Phase
from ._rule_interface import DialectRules, StreamServices
from ._sse import Event
from ._verdict import Interruption, OnCut, Verdict
from ._wording import client_gone_detail, cut_detail, cut_message

__all__ = ["book_client_gone", "cut_ending", "ends_response", "incomplete_event", "missing_blank_line", "stream_end"]


def stream_end(cut: Interruption, *, rules: DialectRules, stream: StreamServices, phase: Phase, now: float | None) -> bytes:
    """What the client is sent when the upstream's stream ended as `cut` says, at `now` (the
    caller's clock, if it has one), the stream in `phase`."""
    held = rules.release_held()
    if phase is not Phase.STREAMING:  # it had ended already: its terminator, an error event, given up
        return held
    if not rules.finished():
        return held + cut_ending(cut, rules=rules, stream=stream, now=now)
    # Rules C4 and M3: the stream finished, only its terminator is missing.
    return held + rules.terminator(cut.how)


def cut_ending(cut: Interruption, *, rules: DialectRules, stream: StreamServices, now: float | None) -> bytes:
    """Books the cut `cut` at `now` (the caller's clock, if it has one) and returns the frames the
    client is sent for it."""
    elapsed = stream.elapsed(now)
    report = stream.report
    report.interruption = cut
    told = stream.policy.on_cut
    if told is OnCut.STOP and not rules.may_stop:
        told = OnCut.ERROR
    # The books stay true whatever the client is told (on_cut=stop tells it a story).
    stream.book_verdict(
        Verdict.INTERRUPTED,
        cut_detail(
            how=cut.how, before_first_token=cut.before_first_token, events=report.events, elapsed=elapsed, on_cut=str(told)
        ),
    )
    if told is OnCut.ERROR:
        message = cut_message(
            cause=str(cut.cause),
            reason=cut.reason,
            before_first_token=cut.before_first_token,
            events=report.events,
            elapsed=elapsed,
            dialect=report.dialect,
        )
        return rules.cut_frames(message)
    if told is OnCut.STOP:
        return rules.stop_frames()
    return b""


def missing_blank_line(leftover: Event, line_ending: bytes) -> bytes | None:
    """At a clean end, the line endings that finish a last event the server meant whole: one that
    ended on `data: [DONE]` or a whole JSON chunk but forgot the blank line. None for anything
    else: an incomplete event, i.e. a cut."""
    data = leftover.data
    if data is None or not (data.startswith(DONE) or json_or_unreadable(data) is not UNREADABLE):
        return None
    return line_ending if leftover.raw.endswith((b"\n", b"\r")) else line_ending + line_ending


def incomplete_event(raw: bytes, *, rules: DialectRules, stream: StreamServices, phase: Phase) -> bytes:
    """The bytes of an incomplete last event at the end (the stream in `phase`): dropped (and
    counted), unless nothing will be added after them."""
    # An incomplete event is discarded by every SSE client (WHATWG: "the incomplete event is not
    # dispatched"), and bytes appended after it would merge into its last line and corrupt
    # whatever finish_fix adds. So it is dropped, and counted, unless nothing will be added.
    # (With on_cut=pass nothing is added at a cut, but rule C4 still appends [DONE] to a stream
    # whose choices all finished: the fuzz contracts found that merge.)
    if phase is not Phase.STREAMING or (stream.policy.on_cut is OnCut.PASS and not rules.finished()):
        return raw
    stream.report.dropped_incomplete_bytes += len(raw)
    return b""


def ends_response(*, rules: DialectRules, stream: StreamServices, phase: Phase) -> bool:
    """Whether the client's response ends normally after a broken end's frames
    (`ClientEnding.end_response`): what was sent says how the stream ended (it had ended already,
    its terminator was added, or a cut's ending), unless on_cut=pass left a cut stream as it was,
    and the client sees the failure as it happened. A stream passed through (given up, maybe at
    its end) is left as it was."""
    if phase is Phase.PASSTHROUGH:
        return False
    return phase is not Phase.STREAMING or stream.policy.on_cut is not OnCut.PASS or rules.finished()


def book_client_gone(cut: Interruption, *, stream: StreamServices) -> None:
    """The client went away while the stream was streaming: `interrupted`, and nothing is sent."""
    stream.report.interruption = cut
    stream.book_verdict(Verdict.INTERRUPTED, client_gone_detail(how=cut.how, events=stream.report.events))
