"""The per-stream repair machine: upstream bytes in, client bytes and a verdict out.

Theory of operation
-------------------
Bytes go through three stages: `EventFramer` (bytes -> events), `_on_event` (event -> the bytes to
send for it, plus anything injected before it) and the caller, who sends those bytes. Every complete
event leaves as soon as it arrived; only the current incomplete event is held.

The stream is in one `Phase` at a time; `_phases.TRANSITIONS` is the table of what moves it (the
dialect's terminator, an upstream error event, giving up), read by `_move` alone. What an event
means is the dialect's business: one rules object per stream, from the registry
(`_rules.DIALECT_RULES`), reads each event and says what to send for it, and at the end what the
terminator is, what a cut sends, and whether the stream finished. It sees the stream through
`StreamServices` and is asked through `DialectRules` (`_rule_interface`: the one interface between
the two, and the stream's books); how an end is told is `_cut_policy`'s. The machine does what
every dialect shares, at these points:

* an event                               -> counted (not a keep-alive such as `ping`), the first
                                            checked against the path's dialect, read by the rules
* the upstream body ends cleanly         -> the terminator appended if the stream finished (rules
                                            C4, M3), else the stream was cut (C6, C7, M4, R3)
* the upstream connection fails mid-body -> the stream was cut, unless it finished
* the caller's timer finds a deadline    -> the upstream stalled: a cut as above, and the caller
  passed (`receive_timer`)                  closes the upstream connection

Stall deadlines (`_deadlines`). The core has no clock: the caller passes `now` into every call and
sets its own timer for `next_stall_check(now)`. The machine notes when events arrive (once per
`receive_data` call that completed any, so a stream of many small events costs nothing extra per
event) and when the first token came.

Routine text chunks skip the JSON parse (`_routine_chunks`, `_on_routine_piece`, the rules'
`on_routine`), and a run of one routine shape is counted on the steady path at the top of
`receive_data`; `tests/test_core_fast_path*.py` hold both to the full parse.

Anything the machine cannot read (non-JSON data, invalid UTF-8, unknown shapes) passes through,
data that is not JSON booked `malformed` (`StreamServices.malformed`); a response it is told not to
repair (an HTTP error status, a compressed body) passes from its head on, its verdict decided
(`StreamServices.book_not_repaired`): the caller only applies it.
"""

from __future__ import annotations

from functools import partial

from ._cut_policy import book_client_gone, cut_ending, ends_response, incomplete_event, missing_blank_line, stream_end
from ._deadlines import StallDeadlines
from ._dialect import Dialect
from ._errors import LocalProtocolError
from ._phases import DEADLINES_RUN, TRANSITIONS, Phase, Signal
from ._request import RequestFacts
from ._routine_chunks import DECLINE, MAY_STEADY, RoutineChunks, ShapeSource
from ._rule_interface import DialectRules, StreamServices
from ._rules import DIALECT_FRAMERS, DIALECT_RULES, event_dialect
from ._sse import Event, EventFramer
from ._steady import NumberedSteady, Steady, SteadyShape, match_plain_text
from ._verdict import ClientEnding, CutCause, Interruption, RepairPolicy, StreamReport
from ._wording import completed_framing, event_too_long

__all__ = ["StreamRepair", "MAX_HELD_BYTES"]

# An event still open after this many bytes is not a chat chunk (rule C8 asks for 10 MB events to
# pass whole): stop framing and pass the stream through rather than hold it all.
MAX_HELD_BYTES = 16 * 1024 * 1024
# The phases the path of every piece compares with, as module names: reading an Enum member off its
# class costs a lookup that showed in mitmdump's profile.
_STREAMING = Phase.STREAMING
_PASSTHROUGH = Phase.PASSTHROUGH


class StreamRepair:
    """Repairs one streamed response in its dialect: Chat Completions, Messages, Responses, Gemini.

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
        shapes: the caller's `ShapeBook`, shapes its other streams learned: taken without probing.

    `receive_data` and `receive_end` return the bytes to send to the client now (possibly b"");
    `receive_failure` and `receive_timer` return a `ClientEnding`. None of them raises on anything the
    upstream sent. `report` is the running account (final once `ended`).
    """

    # Slots, the cheapest attributes, for the path of every piece (`__dict__` stays for tests).
    __slots__ = (
        ("_started_at", "_deadlines", "_framer", "_phase", "_ended", "_first_token_seen", "_last_event_at", "_event_at")
        + ("_routine", "_steady", "_steady_gapped", "_steady_numbered", "_steady_last", "_rules", "_services", "_dialect")
        + ("_first_event", "report", "__dict__")
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
        shapes: ShapeSource | None = None,
    ) -> None:
        self._started_at = started_at
        # The first-token deadline counts from the request going upstream (`_deadlines`).
        self._deadlines = StallDeadlines(policy, sent_at=sent_at if sent_at is not None else started_at)
        self._framer = DIALECT_FRAMERS.get(Dialect(dialect), EventFramer)()
        self._phase = Phase.STREAMING
        self._ended = False
        self._first_token_seen = False
        # The caller's clock at the last `receive_data` that completed an event (the idle deadline).
        self._last_event_at: float | None = None
        # The time of the event the rules are reading (`_on_event`), for a rule that ends the stream there.
        self._event_at: float | None = None
        self._dialect = dialect = Dialect(dialect)
        # Shapes of routine text chunks seen so far (and by `shapes`' streams), for `_on_routine_piece`.
        self._routine = RoutineChunks(enabled=fast_path, dialect=dialect, book=shapes)
        # The steady path's shape (`RoutineMatch.steady`) while it may be taken, and the last piece it took.
        self._steady: Steady | None = None
        self._steady_last: bytes | None = None
        # Of a shape with more gaps (`RoutineMatch.gapped_steady`: Responses' numbers, OpenAI's padding).
        self._steady_gapped: SteadyShape | None = None
        # For a shape of the text and a number only, what its check reads in `receive_data`.
        self._steady_numbered: NumberedSteady | None = None
        self.report = StreamReport(model=request.model, dialect=dialect)
        # What the dialect's rules may use of this stream, and its books (`_rule_interface`).
        self._services = services = StreamServices(
            request=request,
            policy=policy,
            report=self.report,
            started_at=started_at,
            framer=self._framer,
            token_seen=self._token_seen,
            terminated=partial(self._move, Signal.DONE),
            error_event=partial(self._move, Signal.ERROR_EVENT),
            cut_here=self._cut_here,
        )
        # What the dialect's events mean (the registry's rules: `_chat`, `_messages`, `_responses`).
        self._rules: DialectRules = DIALECT_RULES[dialect](self._services)
        # No event has been read yet: the first one is checked against the dialect.
        self._first_event = True
        if services.book_not_repaired(status=status, content_encoding=content_encoding):
            self._move(Signal.GIVE_UP)

    # -- input --------------------------------------------------------------------------------

    def receive_data(self, data: bytes, *, now: float | None = None) -> bytes:
        """Takes the next piece of the upstream body."""
        steady = self._steady
        if steady is not None:
            # The steady path (`_on_routine_piece` says when it holds): the piece is the routine
            # shape seen last, with plain text (Gemini's: and counts), and nothing else changes.
            prefix, suffix, text_start, suffix_length, middle = steady
            size = len(data)
            if data.startswith(prefix) and data.endswith(suffix) and middle(data, text_start, size - suffix_length) is not None:
                report = self.report
                report.events += 1
                report.upstream_bytes += size
                report.client_bytes += size
                self._last_event_at, self._steady_last = now, data
                return data
        elif self._steady_numbered is not None:
            # A Responses delta: the same check, with the next sequence number in the head or the
            # tail (`SteadyShape` predicts it); after it, the number after that.
            head, tail, head_length, tail_length, digits, last_digit = self._steady_numbered
            size = len(data)
            if (
                data.startswith(head)
                and data.endswith(tail)
                and match_plain_text(data, head_length, size - tail_length) is not None
            ):
                report = self.report
                report.events += 1
                report.upstream_bytes += size
                report.client_bytes += size
                self._last_event_at = now
                digit = digits[last_digit]
                if digit != 0x39:  # not a 9: only the last digit changes
                    digits[last_digit] = digit + 1
                else:
                    self._steady_numbered = self._steady_gapped.carry()  # type: ignore[union-attr]  # set with it
                return data
        elif self._steady_gapped is not None:
            # More than one string gap (OpenAI's padding): the shape's own check.
            if self._steady_gapped.take(data):
                report = self.report
                report.events += 1
                report.upstream_bytes += len(data)
                report.client_bytes += len(data)
                self._last_event_at = now
                return data
        if self._ended:
            self._check_open("receive_data")
        if self._framer.idle and self._phase is _STREAMING and (parts := self._framer.split_events(data)):
            return self._each_event(parts, now)
        self._leave_steady()
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
            out += self._pass_through_from_here(event_too_long(MAX_HELD_BYTES))
        if self._phase is Phase.PASSTHROUGH and self._framer.held_bytes:
            # The machine stopped reading (an event too long, or another dialect's first event in
            # this piece): the start of the next event, held by the framer, goes on as it came.
            out += self._framer.take_buffered()
        return self._sent(out)

    def _each_event(self, parts: list[bytes], now: float | None) -> bytes:
        """A piece of several events (`EventFramer.split_events`): each part as if it came alone, so
        routine ones take the fast path. After our bug in a part, it and the rest pass as they came."""
        out = []
        for part in parts:
            upstream_bytes = self.report.upstream_bytes
            try:
                out.append(self.receive_data(part, now=now))
            except Exception as error:
                out.append(self.give_up(error, part, upstream_bytes))
        return b"".join(out)

    def receive_end(self, *, now: float | None = None) -> bytes:
        """The upstream body ended cleanly (chunked terminator, Content-Length reached, EOF of a
        close-delimited body, HTTP/2 END_STREAM)."""
        if self._close_input("receive_end", now):
            return b""
        return self._sent(self._end(CutCause.CLEAN_END, "", now))

    def receive_failure(self, reason: str, *, now: float | None = None) -> ClientEnding:
        """The upstream connection failed mid-body (incomplete chunked body, short Content-Length,
        reset, HTTP/2 stream reset). `reason` is the transport's own words."""
        return self._end_broken("receive_failure", CutCause.TRANSPORT_ERROR, reason, now)

    def next_stall_check(self, now: float) -> float | None:
        """When (in the caller's clock) to call `receive_timer` next, or None when no timer is
        needed: no deadline is set, the stream ended, or it is past `[DONE]`, an error event or in
        passthrough. Until the idle deadline runs the caller is asked to look again at least every
        idle timeout (`_deadlines.next_check` says why)."""
        if self._ended or self._phase not in DEADLINES_RUN:
            return None
        return self._deadlines.next_check(self._last_event_at, self._first_token_seen, now=now)

    def receive_timer(self, now: float) -> ClientEnding | None:
        """The caller's timer went off. None when no deadline has passed (set the next timer from
        `next_stall_check`); else the upstream stalled: the stream is over, the caller sends the
        ending as after `receive_failure` and closes the upstream connection."""
        self._check_open("receive_timer")
        if self._phase not in DEADLINES_RUN:
            return None
        reason = self._deadlines.maybe_stalled(self._last_event_at, self._first_token_seen, events=self.report.events, now=now)
        return None if reason is None else self._end_broken("receive_timer", CutCause.STALLED, reason, now)

    def _end_broken(self, method: str, cause: CutCause, reason: str, now: float | None) -> ClientEnding:
        """The stream ended without its clean end (a transport failure, a stall)."""
        if self._close_input(method, now):
            return ClientEnding(b"", end_response=False)
        out = self._sent(self._end(cause, reason, now))
        # The phase as it is now: `_end` may have given up (passthrough).
        return ClientEnding(out, end_response=ends_response(rules=self._rules, stream=self._services, phase=self._phase))

    def _end(self, cause: CutCause, reason: str, now: float | None) -> bytes:
        """The upstream's stream ended (`cause`): what its incomplete last event and its end send."""
        leftover = self._framer.receive_end()
        try:
            out = b"" if leftover is None else self._on_leftover(leftover, cause is CutCause.CLEAN_END, now)
            cut = self._interruption(cause, reason)
            out += stream_end(cut, rules=self._rules, stream=self._services, phase=self._phase, now=now)
        except Exception as error:  # a bug of ours: the leftover goes on as it came
            out = self._pass_through_from_here(error)
            out += b"" if leftover is None else leftover.raw
        self._finish(now)
        return out

    def receive_client_gone(self, reason: str, *, now: float | None = None) -> None:
        """The exchange ended on the client's side (the client went away, the flow was killed):
        nothing more can be sent, so this only closes the books."""
        if self._close_input("receive_client_gone", now):
            return
        self._framer.receive_end()
        if self._phase is Phase.STREAMING:
            book_client_gone(self._interruption(CutCause.CLIENT_GONE, reason), stream=self._services)
        self._finish(now)

    def _close_input(self, method: str, now: float | None) -> bool:
        """The stream ends here; True when that is all (a stream passed through closes its books)."""
        self._check_open(method)
        self._ended = True
        self._leave_steady()
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return True
        return False

    def _interruption(self, cause: CutCause, reason: str = "") -> Interruption:
        return Interruption(before_first_token=not self._first_token_seen, cause=cause, reason=reason, dialect=self._dialect)

    @property
    def ended(self) -> bool:
        """True once the stream ended: `receive_end`, `receive_failure`, `receive_client_gone`, or a
        `receive_timer` that found it stalled."""
        return self._ended

    @property
    def request(self) -> RequestFacts:
        """The request's facts the repair was made with."""
        return self._services.request

    @property
    def repairing(self) -> bool:
        """False once every byte passes unchanged: an error status, a compressed body, or given up
        (then the upstream's Content-Length still holds)."""
        return self._phase is not Phase.PASSTHROUGH

    def give_up(self, error: Exception, piece: bytes = b"", upstream_bytes_before: int | None = None) -> bytes:
        """For the caller whose call to this machine raised (our bug, or a misuse): pass all from here
        on unchanged, book the stream `skipped` with the error, and return what the machine held (a
        C11 finish, an event's start: finish_fix never drops a client's byte), then `piece`, whose
        call raised, booked as received and sent: from `upstream_bytes_before`, the count before that
        call (None: the count now), as the call may have counted it (the full path counts first)."""
        report = self.report
        before = report.upstream_bytes if upstream_bytes_before is None else upstream_bytes_before
        held = b""
        if self._phase is not Phase.PASSTHROUGH:
            held = self._sent(self._pass_through_from_here(error) + self._framer.take_buffered())
        report.upstream_bytes = before + len(piece)
        report.client_bytes += len(piece)
        return held + piece

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
            self._services.keepalives += 1
            return event.raw
        report = self.report
        report.events += 1
        if report.time_to_first_event is None and now is not None and self._started_at is not None:
            report.time_to_first_event = now - self._started_at
        if self._phase is not Phase.STREAMING:
            return event.raw
        if self._first_event:  # another dialect's first event: passed through untouched, `skipped`
            self._first_event = False
            seen = event_dialect(message, kind)
            if seen is not None and seen is not self._dialect:
                self._move(Signal.GIVE_UP)
                self._services.book_wrong_dialect(seen)
                return event.raw
        self._event_at = now  # for a rule that ends the stream at this event (`_cut_here`)
        out = rules.on_event(event, kind, message)
        # The event carried the first token: its time is the machine's (the rules only flag it).
        if self._first_token_seen and report.time_to_first_token is None and now is not None and self._started_at is not None:
            report.time_to_first_token = now - self._started_at
        if self._phase is _STREAMING:  # the fast path learns the shapes of routine events it read
            self._routine.learn(event.raw, event.data, message, report.events)
        return out

    # -- what the rules tell the machine (`StreamServices`) -----------------------------------

    def _token_seen(self) -> None:
        self._first_token_seen = True

    def _cut_here(self) -> bytes:
        """`StreamServices.cut_here`: a clean-end cut at the event being read (R3), then past the end."""
        out = cut_ending(self._interruption(CutCause.CLEAN_END), rules=self._rules, stream=self._services, now=self._event_at)
        self._move(Signal.DONE)
        return out

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
        if match.has_text:  # a routine piece's text is a token in every dialect (C7, M6, R5)
            self._first_token_seen = True
        report = self.report
        report.events += 1
        self._last_event_at = now
        if report.time_to_first_event is None and now is not None and self._started_at is not None:
            report.time_to_first_event = now - self._started_at
        if self._first_token_seen and report.time_to_first_token is None and now is not None and self._started_at is not None:
            report.time_to_first_token = now - self._started_at
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
            elif match.gapped_steady is not None:
                self._steady_gapped = gapped = match.gapped_steady.start(match.number)
                self._steady_numbered = gapped.numbered
        return True

    # -- the end ------------------------------------------------------------------------------

    def _on_leftover(self, leftover: Event, clean: bool, now: float | None) -> bytes:
        """Bytes after the last blank line at the end: at a `clean` end read, if the server meant
        them whole (`missing_blank_line`); else an incomplete event, i.e. a cut (`incomplete_event`)."""
        streaming = self._phase is Phase.STREAMING
        missing = missing_blank_line(leftover, self._services.line_ending()) if clean and streaming else None
        if missing is None:
            return incomplete_event(leftover.raw, rules=self._rules, stream=self._services, phase=self._phase)
        out = self._on_event(Event(raw=leftover.raw + missing, data=leftover.data, event_type=leftover.event_type), now)
        self._services.repaired(completed_framing())
        return out

    # -- books --------------------------------------------------------------------------------

    def _move(self, signal: Signal) -> None:
        self._phase = TRANSITIONS[self._phase][signal]
        self._leave_steady()

    def _leave_steady(self) -> None:
        """No steady path from here; what it took unread (a sequence number, counts) goes to the rules."""
        self._steady = None
        last, self._steady_last = self._steady_last, None
        if last is not None and self._routine.counted and (match := self._routine.maybe_match(last)) is not None:
            self._rules.on_routine(match)  # Gemini's counts: the last piece's replaced every one before
        gapped = self._steady_gapped
        if gapped is not None:
            self._steady_gapped = self._steady_numbered = None
            number = gapped.last_number
            if number is not None:
                # Only a Responses shape is numbered (`RoutineSpec.numbered`).
                self._rules.note_sequence_number(number)

    def _pass_through_from_here(self, cause: Exception | str) -> bytes:
        """Gives up (`skipped`, and why); returns an event the rules held (C11), which goes on as
        it came before anything that follows."""
        held = self._rules.release_held()
        self._move(Signal.GIVE_UP)
        self._services.book_given_up(cause)
        return held

    def _finish(self, now: float | None) -> None:
        self._rules.closing_books()
        self._services.close(now)

    def _sent(self, out: bytes) -> bytes:
        self.report.client_bytes += len(out)
        return out

    def _check_open(self, method: str) -> None:
        if self._ended:
            raise LocalProtocolError(
                f"{method}() called after the stream ended (receive_end, receive_failure, receive_client_gone, "
                "or receive_timer that found a stall)"
            )
