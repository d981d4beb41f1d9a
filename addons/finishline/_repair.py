"""The per-stream repair machine: upstream bytes in, client bytes and a verdict out.

Theory of operation
-------------------
Bytes go through three stages: `EventFramer` (bytes -> events), `_on_event` (event -> the bytes to
send for it, plus anything injected before it) and the caller, who sends those bytes. Every complete
event leaves as soon as it arrived; only the current incomplete event is held.

The stream is in one `Phase` at a time; `_phases.TRANSITIONS` is the table of what moves it (the
dialect's terminator, an upstream error event, giving up) and `_move` is the only place that changes
it.

What an event means is the dialect's business: one rules object per stream (`_rules.DIALECT_RULES`:
`_chat.ChatRules`, `_messages.MessagesRules`, `_responses.ResponsesRules`) reads each event and says
what to send for it, and at the end what the terminator is, what a cut sends, and whether the
stream is finished. The machine does what every dialect shares, at these points:

* an event                                      -> counted (not a keep-alive such as `ping`), its
                                                   first one checked against the path's dialect
                                                   (another dialect's: passed untouched), then read
                                                   by the rules
* the upstream body ends cleanly                -> the terminator appended if the stream finished
                                                   (rules C4, M3), else the stream was cut (rules C6,
                                                   7, M4, R3)
* the upstream connection fails mid-body        -> the stream was cut, unless it finished
* the caller's timer finds a deadline passed     -> the upstream stalled: a cut as above, and the
  (`next_stall_check`, `receive_timer`)             caller closes the upstream connection

Stall deadlines. The core has no clock: the caller passes `now` into every call and sets its own
timer for `next_stall_check(now)`. The machine notes when events arrive (once per `receive_data`
call that completed any, so a stream of many small events costs nothing extra per event) and when
the first token came; a comment or keep-alive line is not an event and never moves a deadline.

Routine text chunks skip the JSON parse (`_routine_chunks`, `_on_routine_piece`, the rules'
`on_routine`), and a run of one routine shape is counted on the steady path at the top of
`receive_data`; both are held to the full parse by `tests/test_core_fast_path.py` and
`tests/test_core_fast_path_dialects.py`.

A response the core is told not to repair (an HTTP error status, a compressed body) starts in
passthrough with its verdict already decided (`http_error`, `skipped`): the caller only applies it.

Anything the machine cannot read (non-JSON data, invalid UTF-8, unknown shapes) passes through. An
event whose data is not JSON, read before the stream's end, is noted by the rules (`_malformed`)
and books the stream `malformed` when it ends (`_finish`; `MALFORMED_OUTRANKS` says over which
verdicts).
"""

from __future__ import annotations

import re

from . import _wording as wording
from ._choices import MAX_CHOICES
from ._deadlines import Deadline, earliest_deadline, next_check
from ._dialect import Dialect
from ._errors import LocalProtocolError
from ._injected import DONE
from ._json import UNREADABLE, json_or_unreadable
from ._phases import DEADLINES_RUN, TRANSITIONS, Phase, Signal
from ._request import RequestFacts
from ._responses import ResponsesRules
from ._routine_chunks import DECLINE, MAY_STEADY, RoutineChunks, match_plain_text, match_steady_numbered
from ._rules import DIALECT_FRAMERS, DIALECT_RULES, event_dialect
from ._sse import Event, EventFramer
from ._verdict import (
    MALFORMED_OUTRANKS,
    ClientEnding,
    Correction,
    CutCause,
    Interruption,
    OnCut,
    RepairPolicy,
    StreamReport,
    Verdict,
)

__all__ = ["StreamRepair", "MAX_HELD_BYTES", "MAX_CHOICES"]

# An event still open after this many bytes is not a chat chunk (rule C8 asks for 10 MB events to
# pass whole): stop framing and pass the stream through rather than hold it all.
MAX_HELD_BYTES = 16 * 1024 * 1024
# The phases the path of every piece compares with, as module names: reading an Enum member off its
# class costs a lookup that showed in mitmdump's profile.
_STREAMING = Phase.STREAMING
_PASSTHROUGH = Phase.PASSTHROUGH


class StreamRepair:
    """Repairs one `text/event-stream` response: Chat Completions, Anthropic Messages or OpenAI
    Responses.

    Args:
        request: facts from the request (token limit, model).
        policy: the repair options.
        started_at: the caller's clock when the request started, if it has one; with `now` on the
            `receive_*` calls it gives the times in the report and the error message.
        sent_at: the caller's clock when the request went upstream; the first-token deadline counts
            from it (from `started_at` when not given), not from the response head (`_deadlines`).
        status: the response's HTTP status. An error status (>= 400) is not repaired: its body
            passes unchanged and the verdict is `http_error`.
        content_encoding: the response's content coding ("" or "identity" for none). A compressed
            body cannot be read in flight: it passes unchanged and the verdict is `skipped`.
        fast_path: False reads every event through the full parse (the differential tests compare
            both; the output and report are the same either way).
        dialect: the API the stream speaks (finish_fix picks it from the request path). A stream
            whose first event belongs to another dialect passes through untouched (`skipped`).

    `receive_data` and `receive_end` return the bytes to send to the client now (possibly b"");
    `receive_failure` and `receive_timer` return a `ClientEnding`. None of them raises on anything the
    upstream sent. `report` is the running account (final once `ended`).
    """

    # Slots: the path of every piece reads and writes a few of these, and slots are the cheapest
    # attributes there are (`__dict__` stays, for tests that replace a method on an instance).
    __slots__ = (
        "_request",
        "_policy",
        "_started_at",
        "_sent_at",
        "_framer",
        "_phase",
        "_ended",
        "_first_token_seen",
        "_last_event_at",
        "_event_at",
        "_routine",
        "_steady",
        "_steady_numbered",
        "_steady_number",
        "_rules",
        "_dialect",
        "_first_event",
        "_keepalives",
        "report",
        "__dict__",
    )

    def __init__(
        self,
        *,
        request: RequestFacts = RequestFacts(),
        policy: RepairPolicy = RepairPolicy(),
        started_at: float | None = None,
        sent_at: float | None = None,
        status: int = 200,
        content_encoding: str = "",
        fast_path: bool = True,
        dialect: Dialect = Dialect.CHAT,
    ) -> None:
        self._request = request
        self._policy = policy
        self._started_at = started_at
        self._sent_at = sent_at if sent_at is not None else started_at
        self._framer = DIALECT_FRAMERS.get(Dialect(dialect), EventFramer)()
        self._phase = Phase.STREAMING
        self._ended = False
        self._first_token_seen = False
        # The caller's clock at the last `receive_data` that completed an event (the idle deadline).
        self._last_event_at: float | None = None
        # The time of the event the rules are reading (`_on_event`), for a rule that ends the stream there.
        self._event_at: float | None = None
        self._dialect = dialect = Dialect(dialect)
        # Shapes of routine text chunks seen so far, for the fast path (`_on_routine_piece`).
        self._routine = RoutineChunks(enabled=fast_path, dialect=dialect)
        # The steady path's shape (`RoutineMatch.steady`) while it may be taken, else None.
        self._steady: tuple[bytes, bytes, int, int] | None = None
        # The steady path of a Responses delta shape (`RoutineMatch.numbered_steady`), and the match
        # of the last sequence number it took, read when it leaves (`_leave_steady`).
        self._steady_numbered: tuple[bool, bytes, bytes, bytes, int] | None = None
        self._steady_number: re.Match[bytes] | None = None
        # What the dialect's events mean (`_chat`, `_messages`, `_responses`).
        self._rules = DIALECT_RULES[dialect](self)
        # No event has been read yet: the first one is checked against the dialect.
        self._first_event = True
        # Keep-alive events (`ping`) so far: not in `report.events`, but a client and mitmweb's view
        # number them, so the number of a malformed event counts them (`_malformed`).
        self._keepalives = 0
        self.report = StreamReport(model=request.model, dialect=dialect)
        encoding = content_encoding.strip().lower()
        if status >= 400:
            self._move(Signal.GIVE_UP)
            self._set(Verdict.HTTP_ERROR, wording.http_error_detail(status))
        elif encoding not in ("", "identity"):
            self._move(Signal.GIVE_UP)
            self._set(Verdict.SKIPPED, wording.skipped_detail(wording.compressed_body(encoding)))

    # -- input --------------------------------------------------------------------------------

    def receive_data(self, data: bytes, *, now: float | None = None) -> bytes:
        """Takes the next piece of the upstream body."""
        steady = self._steady
        if steady is not None:
            # The steady path (`_on_routine_piece` says when it holds): the piece is the routine
            # shape seen last, with plain text, and nothing but the counts can change.
            prefix, suffix, text_start, suffix_length = steady
            size = len(data)
            if (
                data.startswith(prefix)
                and data.endswith(suffix)
                and match_plain_text(data, text_start, size - suffix_length) is not None
            ):
                report = self.report
                report.events += 1
                report.upstream_bytes += size
                report.client_bytes += size
                self._last_event_at = now
                return data
            self._steady = None
        elif self._steady_numbered is not None:
            number = match_steady_numbered(data, self._steady_numbered)
            if number is not None:
                report = self.report
                report.events += 1
                report.upstream_bytes += len(data)
                report.client_bytes += len(data)
                self._last_event_at = now
                self._steady_number = number
                return data
            self._leave_steady()
        if self._ended:
            self._check_open("receive_data")
        report = self.report
        report.upstream_bytes += len(data)
        if self._phase is _PASSTHROUGH or self._on_routine_piece(data, now):
            report.client_bytes += len(data)  # what `_sent` does, inline on the path of most pieces
            return data
        events_before = self.report.events
        out = self._on_events(self._framer.receive_data(data), now)
        if self.report.events != events_before:
            self._last_event_at = now
        if self._phase is not Phase.PASSTHROUGH and self._framer.held_bytes > MAX_HELD_BYTES:
            out += self._pass_through_from_here(wording.event_too_long(MAX_HELD_BYTES))
            out += self._framer.take_buffered()
        elif self._phase is Phase.PASSTHROUGH and self._framer.held_bytes:
            # An event of this piece made the machine stop reading (another dialect's first event):
            # the start of the next event, held by the framer, goes on as it came.
            out += self._framer.take_buffered()
        return self._sent(out)

    def receive_end(self, *, now: float | None = None) -> bytes:
        """The upstream body ended cleanly (chunked terminator, Content-Length reached, EOF of a
        close-delimited body, HTTP/2 END_STREAM)."""
        self._check_open("receive_end")
        self._ended = True
        self._leave_steady()
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return b""
        leftover = self._framer.receive_end()
        try:
            out = b"" if leftover is None else self._on_unterminated(leftover, now)
            out += self._on_stream_end(
                Interruption(before_first_token=not self._first_token_seen, cause=CutCause.CLEAN_END, dialect=self._dialect), now
            )
        except Exception as error:  # a bug of ours: the leftover goes on as it came
            out = self._pass_through_from_here(error)
            out += b"" if leftover is None else leftover.raw
        self._finish(now)
        return self._sent(out)

    def receive_failure(self, reason: str, *, now: float | None = None) -> ClientEnding:
        """The upstream connection failed mid-body (incomplete chunked body, short Content-Length,
        reset, HTTP/2 stream reset). `reason` is the transport's own words."""
        self._check_open("receive_failure")
        return self._end_broken(CutCause.TRANSPORT_ERROR, reason, now)

    def next_stall_check(self, now: float) -> float | None:
        """When (in the caller's clock) to call `receive_timer` next, or None when no timer is
        needed: no deadline is set, the stream ended, or it is past `[DONE]`, an error event or in
        passthrough. Until the idle deadline runs the caller is asked to look again at least every
        idle timeout (`_deadlines.next_check` says why)."""
        if self._ended or self._phase not in DEADLINES_RUN:
            return None
        return next_check(
            self._policy,
            sent_at=self._sent_at,
            last_event_at=self._last_event_at,
            first_token_seen=self._first_token_seen,
            now=now,
        )

    def receive_timer(self, now: float) -> ClientEnding | None:
        """The caller's timer went off. None when no deadline has passed (set the next timer from
        `next_stall_check`); else the upstream stalled: the stream is over, the caller sends the
        ending as after `receive_failure` and closes the upstream connection."""
        self._check_open("receive_timer")
        if self._phase not in DEADLINES_RUN:
            return None
        deadline = self._stall_deadline()
        if deadline is None or now < deadline.at:
            return None
        reason = wording.stall_reason(first_token=deadline.first_token, timeout=deadline.timeout, events=self.report.events)
        return self._end_broken(CutCause.STALLED, reason, now)

    def _stall_deadline(self) -> Deadline | None:
        return earliest_deadline(
            self._policy, sent_at=self._sent_at, last_event_at=self._last_event_at, first_token_seen=self._first_token_seen
        )

    def _end_broken(self, cause: CutCause, reason: str, now: float | None) -> ClientEnding:
        """The stream ended without its clean end (a transport failure, a stall)."""
        self._ended = True
        self._leave_steady()
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return ClientEnding(b"", end_response=False)
        leftover = self._framer.receive_end()
        try:
            out = b"" if leftover is None else self._drop_or_pass(leftover)
            cut = Interruption(before_first_token=not self._first_token_seen, cause=cause, reason=reason, dialect=self._dialect)
            out += self._on_stream_end(cut, now)
        except Exception as error:
            out = self._pass_through_from_here(error)
            out += b"" if leftover is None else leftover.raw
        self._finish(now)
        # `repairing` reads the phase as it is now: the `except` above may have given up (passthrough)
        # since the check at the top (`self._phase` would still look narrowed by it to a type checker).
        end_response = self.repairing and (
            self._phase is not Phase.STREAMING or self._policy.on_cut is not OnCut.PASS or self._finished()
        )
        return ClientEnding(self._sent(out), end_response=end_response)

    def receive_client_gone(self, reason: str, *, now: float | None = None) -> None:
        """The exchange ended on the client's side (the client went away, the flow was killed):
        nothing more can be sent, so this only closes the books."""
        self._check_open("receive_client_gone")
        self._ended = True
        self._leave_steady()
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return
        self._framer.receive_end()
        if self._phase is Phase.STREAMING:
            cut = Interruption(
                before_first_token=not self._first_token_seen, cause=CutCause.CLIENT_GONE, reason=reason, dialect=self._dialect
            )
            self.report.interruption = cut
            self._set(Verdict.INTERRUPTED, wording.client_gone_detail(how=cut.how, events=self.report.events))
        self._finish(now)

    @property
    def ended(self) -> bool:
        """True once the stream ended: `receive_end`, `receive_failure`, `receive_client_gone`, or a
        `receive_timer` that found it stalled."""
        return self._ended

    @property
    def request(self) -> RequestFacts:
        """The request's facts the repair was made with."""
        return self._request

    @property
    def repairing(self) -> bool:
        """False once every byte passes unchanged: an error status, a compressed body, or given up
        (then the upstream's Content-Length still holds)."""
        return self._phase is not Phase.PASSTHROUGH

    def give_up(self, error: Exception) -> bytes:
        """For the caller that caught an exception from this machine (a bug of finishline's): pass
        everything from here on unchanged and book the stream `skipped` with the error. Returns
        the bytes this machine still held, to send before anything else (finish_fix never drops a
        client's bytes): an event the rules held (Chat's finish before its usage chunk, C11), then
        the start of an event the framer held (later pieces go on unread, so it would be lost)."""
        if self._phase is Phase.PASSTHROUGH:
            return b""
        held = self._pass_through_from_here(error) + self._framer.take_buffered()
        return self._sent(held)

    # -- events -------------------------------------------------------------------------------

    def _on_events(self, events: list[Event], now: float | None) -> bytes:
        out = []
        for position, event in enumerate(events):
            if self._phase is Phase.PASSTHROUGH:
                out.append(event.raw)
                continue
            events_before = self.report.events
            try:
                out.append(self._on_event(event, now))
            except Exception as error:  # a bug of ours: this event and all after it go on as they came
                self.report.events = events_before
                out.append(self._pass_through_from_here(error))
                out.extend(later.raw for later in events[position:])
                out.append(self._framer.take_buffered())
                break
        return b"".join(out)

    def _on_event(self, event: Event, now: float | None) -> bytes:
        # No data field: a comment, a keep-alive, an `id:`-only or a data-less `event: error` block.
        # Clients dispatch no event for it (WHATWG: an empty data buffer is not dispatched), so it is
        # not an event here either: it passes, counts for nothing, and moves no deadline.
        if event.data is None:
            # (After an event the rules held, C11: it goes first, as it came, keeping the order.)
            return self._rules.release_held() + event.raw
        rules = self._rules
        kind, message = rules.read(event)
        if kind in rules.keepalives:  # `ping`: a keep-alive, like a comment (M6)
            self._keepalives += 1
            return event.raw
        self.report.events += 1
        if self.report.time_to_first_event is None and now is not None and self._started_at is not None:
            self.report.time_to_first_event = now - self._started_at
        if self._phase is not Phase.STREAMING:
            return event.raw
        if self._first_event:
            self._first_event = False
            if self._maybe_wrong_dialect(message, kind):
                return event.raw
        self._event_at = now  # for a rule that ends the stream at this event (`_cut_at_done`)
        out = rules.on_event(event, kind, message)
        if self._first_token_seen and self.report.time_to_first_token is None:
            self._note_first_token(now)
        if self._phase is _STREAMING:  # the fast path learns the shapes of routine events it read
            self._routine.learn(event.raw, event.data, message, self.report.events)
        return out

    def _maybe_wrong_dialect(self, message: object, kind: str | None) -> bool:
        """Whether the first event belongs to another dialect than the path's; if so the stream
        passes through untouched from here, `skipped`, and why."""
        seen = event_dialect(message, kind)
        if seen is None or seen is self._dialect:
            return False
        self._move(Signal.GIVE_UP)
        self._set(Verdict.SKIPPED, wording.skipped_detail(wording.wrong_dialect(path_dialect=self._dialect, event_dialect=seen)))
        return True

    # -- services for the dialect rules (`_chat`, `_messages`, `_responses`) -----------------------

    def _cut_at_done(self) -> bytes:
        """The upstream ended a stream that never finished with a `[DONE]` of its own (Responses,
        which has no such terminator): a clean-end cut at this event, told before the `[DONE]` every
        client stops reading at (R3), and from here on the stream is past its end."""
        cut = Interruption(before_first_token=not self._first_token_seen, cause=CutCause.CLEAN_END, dialect=self._dialect)
        out = self._on_cut(cut, self._event_at)
        self._move(Signal.DONE)
        return out

    def _malformed(self) -> None:
        """The event the rules are reading has data that is not JSON (or not UTF-8): it passes as it
        came (rule C8), and the stream is booked `malformed` when it ends (`_finish`), naming the
        first such event by its place among the stream's events (keep-alives included, as a client
        dispatches them). Called only for such an event: one that parsed costs nothing here."""
        report = self.report
        report.malformed_events += 1
        if report.first_malformed_event is None:
            report.first_malformed_event = report.events + self._keepalives

    def _token_seen(self) -> None:
        self._first_token_seen = True

    def _note_first_token(self, now: float | None) -> None:
        """The event just read carried the first token: its time goes to the report. (The rules
        only flag the token; the time is the machine's, which has the caller's clock.)"""
        if now is not None and self._started_at is not None:
            self.report.time_to_first_token = now - self._started_at

    def _note_model(self, model: object) -> None:
        if self.report.model is None and isinstance(model, str):
            self.report.model = model

    def _upstream_error(self, *, label: object, message: object) -> None:
        """The upstream said it failed (an error event, `response.failed`): passed on, nothing is
        injected after it (rule C5, M5, R4)."""
        self._move(Signal.ERROR_EVENT)
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self.report.upstream_error_message = wording.one_line(str(message)) if message else None
        self._set(Verdict.UPSTREAM_ERROR, wording.upstream_error_detail(str(label) if label else None))

    def _finished(self) -> bool:
        """A clean end now lacks only the terminator: every choice finished (Chat), the
        stop_reason came (Messages); never in Responses."""
        return self._rules.finished()

    def _on_routine_piece(self, data: bytes, now: float | None) -> bool:
        """The fast path (`_routine_chunks`): `data` is exactly one event of a routine chunk shape
        this stream had before, with only its text different. Does what `_on_event` would do for it
        and returns True; False leaves `data` to the full path. `tests/test_core_fast_path.py` holds
        the two paths to the same bytes and report."""
        if self._phase is not _STREAMING or not self._framer.idle:
            return False
        match = self._routine.maybe_match(data)
        if match is None:
            return False
        verdict = self._rules.on_routine(match)
        if verdict is DECLINE:
            return False
        report = self.report
        report.events += 1
        self._last_event_at = now
        if report.time_to_first_event is None and now is not None and self._started_at is not None:
            report.time_to_first_event = now - self._started_at
        if self._first_token_seen and report.time_to_first_token is None:
            self._note_first_token(now)
        # The steady path may take the next pieces if, for another piece of this shape, all of the
        # above would change nothing but the counts and the time of the last event. Whatever could
        # change that goes through the full path or ends the stream, and both clear it.
        if (
            verdict is MAY_STEADY
            and self._first_token_seen
            and (report.time_to_first_event is not None or self._started_at is None)
        ):
            if match.steady is not None:
                self._steady = match.steady
            elif match.numbered_steady is not None:
                self._steady_numbered = match.numbered_steady
        return True

    # -- injected events ----------------------------------------------------------------------

    def _line_ending(self) -> bytes:
        """The stream's own line ending for what finish_fix writes (LF until it showed another)."""
        return self._framer.line_ending or b"\n"

    # -- the end ------------------------------------------------------------------------------

    def _on_unterminated(self, leftover: Event, now: float | None) -> bytes:
        """Bytes after the last blank line at a clean end. A server that ended on `data: [DONE]` or a
        whole JSON chunk but forgot the blank line meant it: finish the framing and read it. Anything
        else is an incomplete event, i.e. a cut."""
        data = leftover.data
        readable = data is not None and (data.startswith(DONE) or json_or_unreadable(data) is not UNREADABLE)
        if not readable or self._phase is not Phase.STREAMING:
            return self._drop_or_pass(leftover)
        ending = self._line_ending()
        missing = ending if leftover.raw.endswith((b"\n", b"\r")) else ending + ending
        out = self._on_event(Event(raw=leftover.raw + missing, data=data, event_type=leftover.event_type), now)
        self._repaired(wording.completed_framing())
        return out

    def _drop_or_pass(self, leftover: Event) -> bytes:
        # An incomplete event is discarded by every SSE client (WHATWG: "the incomplete event is not
        # dispatched"), and bytes appended after it would merge into its last line and corrupt
        # whatever finish_fix adds. So it is dropped, and counted, unless nothing will be added.
        # (With on_cut=pass nothing is added at a cut, but rule C4 still appends [DONE] to a stream
        # whose choices all finished: the fuzz contracts found that merge.)
        if self._phase is not Phase.STREAMING or (self._policy.on_cut is OnCut.PASS and not self._finished()):
            return leftover.raw
        self.report.dropped_incomplete_bytes += len(leftover.raw)
        return b""

    def _on_stream_end(self, cut: Interruption, now: float | None) -> bytes:
        # An event the rules held (Chat's finish, waiting for its usage chunk: C11) goes first, as it came.
        held = self._rules.release_held()
        if self._phase is not Phase.STREAMING:
            return held
        if not self._finished():
            return held + self._on_cut(cut, now)
        # Rules C4 and M3: the stream finished, only its terminator is missing.
        return held + self._rules.terminator(cut.how)

    def _on_cut(self, cut: Interruption, now: float | None) -> bytes:
        self.report.interruption = cut
        elapsed = now - self._started_at if now is not None and self._started_at is not None else None
        policy = self._policy.on_cut
        rules = self._rules
        if policy is OnCut.STOP and not rules.may_stop:
            policy = OnCut.ERROR  # Responses: no made-up response.completed, ever (R2)
        # The books stay true whatever the client is told (on_cut=stop tells it a story).
        self._set(
            Verdict.INTERRUPTED,
            wording.cut_detail(
                how=cut.how,
                before_first_token=cut.before_first_token,
                events=self.report.events,
                elapsed=elapsed,
                on_cut=str(policy),
            ),
        )
        if policy is OnCut.ERROR:
            message = wording.cut_message(
                cause=str(cut.cause),
                reason=cut.reason,
                before_first_token=cut.before_first_token,
                events=self.report.events,
                elapsed=elapsed,
                dialect=self._dialect,
            )
            return rules.cut_frames(message)
        if policy is OnCut.STOP:
            return rules.stop_frames()
        return b""

    # -- books --------------------------------------------------------------------------------

    def _move(self, signal: Signal) -> None:
        self._phase = TRANSITIONS[self._phase][signal]
        self._leave_steady()

    def _leave_steady(self) -> None:
        """No steady path from here; the last sequence number it took goes to the rules."""
        self._steady = None
        if self._steady_numbered is not None:
            self._steady_numbered = None
            if self._steady_number is not None:
                # Only a Responses shape is numbered (`RoutineSpec.numbered`): no other rules have
                # a steady numbered path.
                if isinstance(self._rules, ResponsesRules):
                    self._rules.note_sequence_number(int(self._steady_number.group()))
                self._steady_number = None

    def _pass_through_from_here(self, cause: Exception | str) -> bytes:
        """Gives up (`skipped`, and why); returns an event the rules held (C11), which goes on as
        it came before anything that follows."""
        held = self._rules.release_held()
        self._move(Signal.GIVE_UP)
        why = cause if isinstance(cause, str) else wording.internal_error(cause)
        if not isinstance(cause, str):
            self.report.internal_error = why
        self._set(Verdict.SKIPPED, wording.skipped_detail(why, from_event=self.report.events + 1))
        return held

    def _corrected(self, rule: Correction, what: str | None) -> None:
        """A rule changed an upstream event (C11, M8, R6, R7): counted per rule, and booked as a
        repair in `what`'s words (None: the rule books its words once at the end, R7)."""
        corrections = self.report.corrections
        corrections[rule] = corrections.get(rule, 0) + 1
        if what is None:
            self._repaired_verdict()
        else:
            self._repaired(what)

    def _repaired(self, what: str) -> None:
        self.report.repairs.append(what)
        self._repaired_verdict()

    def _repaired_verdict(self) -> None:
        if self.report.verdict is Verdict.CLEAN:
            self.report.verdict = Verdict.REPAIRED

    def _set(self, verdict: Verdict, detail: str) -> None:
        self.report.verdict = verdict
        self.report.detail = detail

    def _finish(self, now: float | None) -> None:
        self._rules.closing_books()
        report = self.report
        if report.verdict is Verdict.REPAIRED:
            report.detail = wording.repaired_detail(report.repairs)
        if report.first_malformed_event is not None and report.verdict in MALFORMED_OUTRANKS:
            # The client read garbage: that is what the books say first, and what else the stream
            # ended as follows in the detail (its repairs, injections and cut stay as they are).
            report.detail = wording.malformed_detail(
                event=report.first_malformed_event,
                count=report.malformed_events,
                other=None if report.verdict is Verdict.CLEAN else report.detail,
            )
            report.verdict = Verdict.MALFORMED
        if now is not None and self._started_at is not None:
            self.report.duration = now - self._started_at

    def _sent(self, out: bytes) -> bytes:
        self.report.client_bytes += len(out)
        return out

    def _check_open(self, method: str) -> None:
        if self._ended:
            raise LocalProtocolError(
                f"{method}() called after the stream ended (receive_end, receive_failure, receive_client_gone, "
                "or receive_timer that found a stall)"
            )
