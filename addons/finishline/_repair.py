"""The per-stream repair machine: upstream bytes in, client bytes and a verdict out.

Theory of operation
-------------------
Bytes go through three stages: `EventFramer` (bytes -> events), `_on_event` (event -> the bytes to
send for it, plus anything injected before it) and the caller, who sends those bytes. Every complete
event leaves as soon as it arrived; only the current incomplete event is held.

The stream is in one `Phase` at a time; `_phases.TRANSITIONS` is the table of what moves it
(`[DONE]`, an upstream error event, giving up) and `_move` is the only place that changes it.

Per choice index it remembers whether the choice finished (and whether the upstream or finish_fix
gave the reason), and whether it carried tool or function calls (`_choices`); what it writes into
the stream (finishing chunks, `[DONE]`, the error event, rule 2's rewrite) is built by `_injected`,
its sentences by `_wording`. The rules act at these points:

* an event with `"finish_reason": ""`          -> rewritten to null (rule 2)
* a usage-only chunk, or `data: [DONE]`,        -> finishing events first for every choice that
  while some choice is unfinished                  carried deltas but never finished (rule 3; OpenAI
                                                   sends the finish chunk before the usage chunk)
* the upstream body ends cleanly                -> [DONE] appended if every choice finished (rule 4),
                                                   else the stream was cut (rules 6, 7)
* the upstream connection fails mid-body        -> the stream was cut (rule 6), unless it finished
* the caller's timer finds a deadline passed     -> the upstream stalled: a cut as above, and the
  (`next_stall_check`, `receive_timer`)             caller closes the upstream connection

Stall deadlines. The core has no clock: the caller passes `now` into every call and sets its own
timer for `next_stall_check(now)`. The machine notes when events arrive (once per `receive_data`
call that completed any, so a stream of many small events costs nothing extra per event) and when
the first token came; a comment or keep-alive line is not an event and never moves a deadline.

Routine text chunks skip the JSON parse (`_routine_chunks`, `_on_routine_piece`), and a run of one
routine shape is counted on the steady path at the top of `receive_data`; both are held to the full
parse by `tests/test_core_fast_path.py`.

A response the core is told not to repair (an HTTP error status, a compressed body) starts in
passthrough with its verdict already decided (`http_error`, `skipped`): the caller only applies it.

A finish injected at a usage chunk counts for rule 4 only if no content followed it; otherwise the
usage chunk was not the end, and a stream that then stops is a cut, never a success.
Anything the machine cannot read (non-JSON data, invalid UTF-8, unknown shapes) passes through.
"""

from __future__ import annotations

from . import _wording as wording
from ._choices import MAX_CHOICES, ChoiceState, all_finished, record_choice
from ._deadlines import Deadline, earliest_deadline, next_check
from ._errors import LocalProtocolError
from ._inference import infer_finish_reason
from ._injected import DONE, ERROR_CODE, done_event, error_event, finishing_event, rewrite_empty_reasons
from ._json import UNREADABLE, json_or_unreadable
from ._phases import DEADLINES_RUN, TRANSITIONS, Phase, Signal
from ._request import RequestFacts
from ._routine_chunks import RoutineChunks, match_plain_text
from ._sse import Event, EventFramer
from ._verdict import ClientEnding, CutCause, Interruption, OnCut, RepairPolicy, StreamReport, Verdict

__all__ = ["StreamRepair", "MAX_HELD_BYTES", "MAX_CHOICES"]

# An event still open after this many bytes is not a chat chunk (rule 8 asks for 10 MB events to
# pass whole): stop framing and pass the stream through rather than hold it all.
MAX_HELD_BYTES = 16 * 1024 * 1024
# The phases the path of every piece compares with, as module names: reading an Enum member off its
# class costs a lookup that showed in mitmdump's profile.
_STREAMING = Phase.STREAMING
_PASSTHROUGH = Phase.PASSTHROUGH


class StreamRepair:
    """Repairs one `text/event-stream` chat-completion response.

    Args:
        request: facts from the request (token limit, model).
        policy: the repair options.
        started_at: the caller's clock when the request started, if it has one; with `now` on the
            `receive_*` calls it gives the times in the report and the error message.
        head_at: the caller's clock when the response head arrived; the first-token deadline counts
            from it (from `started_at` when not given).
        status: the response's HTTP status. An error status (>= 400) is not repaired: its body
            passes unchanged and the verdict is `http_error`.
        content_encoding: the response's content coding ("" or "identity" for none). A compressed
            body cannot be read in flight: it passes unchanged and the verdict is `skipped`.
        fast_path: False reads every event through the full parse (the differential tests compare
            both; the output and report are the same either way).

    `receive_data` and `receive_end` return the bytes to send to the client now (possibly b"");
    `receive_failure` and `receive_timer` return a `ClientEnding`. None of them raises on anything the
    upstream sent. `report` is the running account (final once `ended`).
    """

    # Slots: the path of every piece reads and writes a few of these, and slots are the cheapest
    # attributes there are (`__dict__` stays, for tests that replace a method on an instance).
    __slots__ = (
        "_request", "_policy", "_started_at", "_head_at", "_framer", "_phase", "_ended", "_choices",
        "_chunk_fields", "_fields_from", "_completion_tokens", "_first_token_seen", "_last_event_at",
        "_empty_rewritten", "_routine", "_steady", "report", "__dict__",
    )

    def __init__(
        self,
        *,
        request: RequestFacts = RequestFacts(),
        policy: RepairPolicy = RepairPolicy(),
        started_at: float | None = None,
        head_at: float | None = None,
        status: int = 200,
        content_encoding: str = "",
        fast_path: bool = True,
    ) -> None:
        self._request = request
        self._policy = policy
        self._started_at = started_at
        self._head_at = head_at if head_at is not None else started_at
        self._framer = EventFramer()
        self._phase = Phase.STREAMING
        self._ended = False
        self._choices: dict[int, ChoiceState] = {}
        self._chunk_fields: dict = {}
        # The routine shape whose fields `_chunk_fields` holds as they are (None after the full path wrote).
        self._fields_from: dict | None = None
        self._completion_tokens: int | None = None
        self._first_token_seen = False
        # The caller's clock at the last `receive_data` that completed an event (the idle deadline).
        self._last_event_at: float | None = None
        self._empty_rewritten = 0
        # Shapes of routine text chunks seen so far, for the fast path (`_on_routine_piece`).
        self._routine = RoutineChunks(enabled=fast_path)
        # The steady path's shape (`RoutineMatch.steady`) while it may be taken, else None.
        self._steady: tuple[bytes, bytes, int, int] | None = None
        self.report = StreamReport(model=request.model)
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
            if data.startswith(prefix) and data.endswith(suffix) and match_plain_text(data, text_start, size - suffix_length) is not None:
                report = self.report
                report.events += 1
                report.upstream_bytes += size
                report.client_bytes += size
                self._last_event_at = now
                return data
            self._steady = None
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
            self._pass_through_from_here(wording.event_too_long(MAX_HELD_BYTES))
            out += self._framer.take_buffered()
        return self._sent(out)

    def receive_end(self, *, now: float | None = None) -> bytes:
        """The upstream body ended cleanly (chunked terminator, Content-Length reached, EOF of a
        close-delimited body, HTTP/2 END_STREAM)."""
        self._check_open("receive_end")
        self._ended = True
        self._steady = None
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return b""
        leftover = self._framer.receive_end()
        try:
            out = b"" if leftover is None else self._on_unterminated(leftover, now)
            out += self._on_stream_end(Interruption(before_first_token=not self._first_token_seen, cause=CutCause.CLEAN_END), now)
        except Exception as error:  # a bug of ours: the leftover goes on as it came
            self._pass_through_from_here(error)
            out = b"" if leftover is None else leftover.raw
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
            self._policy, head_at=self._head_at, last_event_at=self._last_event_at,
            first_token_seen=self._first_token_seen, now=now,
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
            self._policy, head_at=self._head_at, last_event_at=self._last_event_at, first_token_seen=self._first_token_seen
        )

    def _end_broken(self, cause: CutCause, reason: str, now: float | None) -> ClientEnding:
        """The stream ended without its clean end (a transport failure, a stall)."""
        self._ended = True
        self._steady = None
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return ClientEnding(b"", end_response=False)
        leftover = self._framer.receive_end()
        try:
            out = b"" if leftover is None else self._drop_or_pass(leftover)
            cut = Interruption(before_first_token=not self._first_token_seen, cause=cause, reason=reason)
            out += self._on_stream_end(cut, now)
        except Exception as error:
            self._pass_through_from_here(error)
            out = b"" if leftover is None else leftover.raw
        self._finish(now)
        end_response = self._phase is not Phase.PASSTHROUGH and (
            self._phase is not Phase.STREAMING or self._policy.on_cut is not OnCut.PASS or all_finished(self._choices)
        )
        return ClientEnding(self._sent(out), end_response=end_response)

    def receive_client_gone(self, reason: str, *, now: float | None = None) -> None:
        """The exchange ended on the client's side (the client went away, the flow was killed):
        nothing more can be sent, so this only closes the books."""
        self._check_open("receive_client_gone")
        self._ended = True
        self._steady = None
        if self._phase is Phase.PASSTHROUGH:
            self._finish(now)
            return
        self._framer.receive_end()
        if self._phase is Phase.STREAMING:
            cut = Interruption(before_first_token=not self._first_token_seen, cause=CutCause.CLIENT_GONE, reason=reason)
            self.report.interruption = cut
            self._set(Verdict.INTERRUPTED, wording.client_gone_detail(how=cut.how, events=self.report.events))
        self._finish(now)

    @property
    def ended(self) -> bool:
        """True once the stream ended: `receive_end`, `receive_failure`, `receive_client_gone`, or a
        `receive_timer` that found it stalled."""
        return self._ended

    @property
    def repairing(self) -> bool:
        """False once every byte passes unchanged: an error status, a compressed body, or given up
        (then the upstream's Content-Length still holds)."""
        return self._phase is not Phase.PASSTHROUGH

    def give_up(self, error: Exception) -> None:
        """For the caller that caught an exception from this machine (a bug of finishline's): pass
        everything from here on unchanged and book the stream `skipped` with the error."""
        if self._phase is not Phase.PASSTHROUGH:
            self._pass_through_from_here(error)

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
                self._pass_through_from_here(error)
                out.extend(later.raw for later in events[position:])
                out.append(self._framer.take_buffered())
                break
        return b"".join(out)

    def _on_event(self, event: Event, now: float | None) -> bytes:
        # No data field: a comment, a keep-alive, an `id:`-only or a data-less `event: error` block.
        # Clients dispatch no event for it (WHATWG: an empty data buffer is not dispatched), so it is
        # not an event here either: it passes, counts for nothing, and moves no deadline.
        if event.data is None:
            return event.raw
        self.report.events += 1
        if self.report.time_to_first_event is None and now is not None and self._started_at is not None:
            self.report.time_to_first_event = now - self._started_at
        if self._phase is not Phase.STREAMING:
            return event.raw
        data = event.data or b""
        if data.startswith(DONE):
            before = self._finish_choices(wording.BEFORE_DONE)
            self._move(Signal.DONE)
            return before + event.raw
        chunk = json_or_unreadable(data)
        if event.event_type == b"error":
            return self._on_error_event(event, chunk if isinstance(chunk, dict) else None)
        if chunk is UNREADABLE:  # not JSON, or not UTF-8: data, not our business (rule 8)
            self.report.malformed_events += 1
            return event.raw
        if not isinstance(chunk, dict):
            return event.raw
        if chunk.get("error") is not None:
            return self._on_error_event(event, chunk)
        self._remember_chunk(chunk)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return event.raw
        before = b""
        if not choices and isinstance(chunk.get("usage"), dict):
            # A usage-only chunk closes the stream; the finish chunk belongs before it.
            before = self._finish_choices(wording.BEFORE_USAGE_CHUNK)
        empty_reasons = 0
        for choice in choices:
            if isinstance(choice, dict):
                empty_reasons += self._on_choice(choice)
        raw = event.raw
        if empty_reasons and self._policy.empty_to_null:
            raw = rewrite_empty_reasons(event, chunk, self._line_ending())
            self._empty_rewritten += empty_reasons
        self._routine.learn(event.raw, data, chunk, self.report.events)
        return before + raw

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
        state = self._choices.get(match.index)
        if state is None:
            return False
        report = self.report
        report.events += 1
        self._last_event_at = now
        if report.time_to_first_event is None and now is not None and self._started_at is not None:
            report.time_to_first_event = now - self._started_at
        if match.remembered is not self._fields_from:  # the same shape again: its fields are there
            self._chunk_fields.update(match.remembered)
            self._fields_from = match.remembered
        if match.has_text:
            self._first_token_seen = True
            if state.finish_reason is not None and not state.finished_by_upstream:
                state.content_after_injection = True
        # The steady path may take the next pieces if, for another piece of this shape, all of the
        # above would change nothing but the counts and the time of the last event. Whatever could
        # change that goes through the full path or ends the stream, and both clear it.
        if (
            match.steady is not None
            and self._first_token_seen
            and (report.time_to_first_event is not None or self._started_at is None)
            and (state.finish_reason is None or state.finished_by_upstream or state.content_after_injection)
        ):
            self._steady = match.steady
        return True

    def _on_choice(self, choice: dict) -> int:
        """Records one choice of a chunk (`_choices.record_choice`); returns 1 if its finish_reason
        is the empty string."""
        empty, token = record_choice(self._choices, choice)
        if token:
            self._first_token_seen = True
        return empty

    def _on_error_event(self, event: Event, chunk: dict | None) -> bytes:
        self._move(Signal.ERROR_EVENT)
        error = chunk.get("error") if chunk is not None else None
        if isinstance(error, dict):
            message = error.get("message")
            label = error.get("code") or error.get("type")
        else:
            message = error if chunk is not None else (event.data or b"").decode("utf-8", "replace")
            label = None
        self.report.upstream_error_message = wording.one_line(str(message)) if message else None
        self._set(Verdict.UPSTREAM_ERROR, wording.upstream_error_detail(str(label) if label else None))
        return event.raw

    def _remember_chunk(self, chunk: dict) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk:
                self._chunk_fields[key] = chunk[key]
                self._fields_from = None
        if self.report.model is None and isinstance(chunk.get("model"), str):
            self.report.model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                self._completion_tokens = tokens

    # -- injected events ----------------------------------------------------------------------

    def _finish_choices(self, where: str) -> bytes:
        """Rule 3: one finishing event per choice that carried deltas but never finished."""
        out = []
        for index in sorted(self._choices):
            state = self._choices[index]
            if state.finish_reason is not None:
                continue
            reason = infer_finish_reason(
                tool_calls=state.tool_calls,
                function_call=state.function_call,
                completion_tokens=self._completion_tokens,
                max_tokens=self._request.max_tokens,
            )
            state.finish_reason = reason
            fields, model = self._chunk_fields, self._request.model or ""
            out.append(finishing_event(index, reason, chunk_fields=fields, model=model, line_ending=self._line_ending()))
            self.report.injected.append({"kind": "finish", "choice": index, "finish_reason": reason})
            self._repaired(wording.injected_finish(reason, index, where))
        return b"".join(out)

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
        # (With on_cut=pass nothing is added at a cut, but rule 4 still appends [DONE] to a stream
        # whose choices all finished: the fuzz contracts found that merge.)
        if self._phase is not Phase.STREAMING or (self._policy.on_cut is OnCut.PASS and not all_finished(self._choices)):
            return leftover.raw
        self.report.dropped_incomplete_bytes += len(leftover.raw)
        return b""

    def _on_stream_end(self, cut: Interruption, now: float | None) -> bytes:
        if self._phase is not Phase.STREAMING:
            return b""
        if all_finished(self._choices):
            # Rule 4: every choice finished, only [DONE] is missing.
            self._repaired(wording.appended_done(cut.how))
            self.report.injected.append({"kind": "done"})
            return done_event(self._line_ending())
        return self._on_cut(cut, now)

    def _on_cut(self, cut: Interruption, now: float | None) -> bytes:
        self.report.interruption = cut
        elapsed = now - self._started_at if now is not None and self._started_at is not None else None
        policy = self._policy.on_cut
        # The books stay true whatever the client is told (on_cut=stop tells it a story).
        self._set(Verdict.INTERRUPTED, wording.cut_detail(
            how=cut.how, before_first_token=cut.before_first_token, events=self.report.events, elapsed=elapsed,
            on_cut=str(policy),
        ))
        if policy is OnCut.ERROR:
            message = wording.cut_message(
                cause=str(cut.cause), reason=cut.reason, before_first_token=cut.before_first_token,
                events=self.report.events, elapsed=elapsed,
            )
            self.report.injected.append({"kind": "error_event", "code": ERROR_CODE})
            return error_event(message, self._line_ending())
        if policy is OnCut.STOP:
            if not self._choices:
                self._choices[0] = ChoiceState()
            finishing = self._finish_choices(wording.AFTER_CUT_STOPPED)
            self.report.injected.append({"kind": "done"})
            return finishing + done_event(self._line_ending())
        return b""

    # -- books --------------------------------------------------------------------------------

    def _move(self, signal: Signal) -> None:
        self._phase = TRANSITIONS[self._phase][signal]
        self._steady = None

    def _pass_through_from_here(self, cause: Exception | str) -> None:
        self._move(Signal.GIVE_UP)
        why = cause if isinstance(cause, str) else wording.internal_error(cause)
        if not isinstance(cause, str):
            self.report.internal_error = why
        self._set(Verdict.SKIPPED, wording.skipped_detail(why, from_event=self.report.events + 1))

    def _repaired(self, what: str) -> None:
        self.report.repairs.append(what)
        if self.report.verdict is Verdict.CLEAN:
            self.report.verdict = Verdict.REPAIRED

    def _set(self, verdict: Verdict, detail: str) -> None:
        self.report.verdict = verdict
        self.report.detail = detail

    def _finish(self, now: float | None) -> None:
        if self._empty_rewritten:
            self.report.repairs.insert(0, wording.rewrote_empty_reasons(self._empty_rewritten))
            if self.report.verdict is Verdict.CLEAN:
                self.report.verdict = Verdict.REPAIRED
        if any(c.content_after_injection for c in self._choices.values()):
            self.report.repairs.append(wording.content_after_injection())
        if self.report.verdict is Verdict.REPAIRED:
            self.report.detail = wording.repaired_detail(self.report.repairs)
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
