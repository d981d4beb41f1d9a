"""The per-stream repair machine: upstream bytes in, client bytes and a verdict out.

Theory of operation
-------------------
Bytes go through three stages: `EventFramer` (bytes -> events), `_on_event` (event -> the bytes to
send for it, plus anything injected before it) and the caller, who sends those bytes. Every complete
event leaves as soon as it arrived; only the current incomplete event is held.

The stream is in one `_Phase` at a time:

    STREAMING --data: [DONE]------------> AFTER_DONE         (the stream ended as the spec says)
    STREAMING --error event-------------> AFTER_ERROR_EVENT  (the upstream said it failed, rule 5)
    any       --a bug of ours, or an event
                 over MAX_HELD_BYTES----> PASSTHROUGH        (everything from here on unchanged)

Per choice index it remembers whether the choice finished (and whether the upstream or finish_fix
gave the reason), and whether it carried tool or function calls. The rules act at four points:

* an event with `"finish_reason": ""`          -> rewritten to null (rule 2)
* a usage-only chunk, or `data: [DONE]`,        -> finishing events first for every choice that
  while some choice is unfinished                  carried deltas but never finished (rule 3; OpenAI
                                                   sends the finish chunk before the usage chunk)
* the upstream body ends cleanly                -> [DONE] appended if every choice finished (rule 4),
                                                   else the stream was cut (rules 6, 7)
* the upstream connection fails mid-body        -> the stream was cut (rule 6), unless it finished

A finish injected at a usage chunk counts for rule 4 only if no content followed it; otherwise the
usage chunk was not the end, and a stream that then stops is a cut, never a success.
Anything the machine cannot read (non-JSON data, invalid UTF-8, unknown shapes) passes through.
"""

from __future__ import annotations

import enum
import json
import re
from typing import NamedTuple

from ._errors import LocalProtocolError
from ._inference import infer_finish_reason
from ._json import UNREADABLE, maybe_parse_json, plural
from ._request import RequestFacts
from ._sse import Event, EventFramer, split_lines
from ._verdict import CutCause, Interruption, OnCut, RepairPolicy, StreamReport, Verdict

__all__ = ["FailureOutput", "StreamRepair", "MAX_HELD_BYTES", "MAX_CHOICES"]

# An event still open after this many bytes is not a chat chunk (rule 8 asks for 10 MB events to
# pass whole): stop framing and pass the stream through rather than hold it all.
MAX_HELD_BYTES = 16 * 1024 * 1024
# Choice indices tracked per stream; more distinct indices than this are data, not choices.
MAX_CHOICES = 1024
# Delta keys that mean the model produced something: the first such chunk is the "first token".
_TOKEN_KEYS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")
# `"finish_reason": ""` as JSON text. Inside a JSON string the quotes would be escaped, so this
# cannot match message content; the rewrite is still checked by parsing it back (`_rewrite_empty`).
_EMPTY_REASON = re.compile(rb'("finish_reason"\s*:\s*)""')
_DONE = b"[DONE]"
_ERROR_CODE = "stream_interrupted"


class _Phase(enum.Enum):
    # Events are being repaired.
    STREAMING = enum.auto()
    # `data: [DONE]` went by: the client stops reading here; later bytes pass as sent.
    AFTER_DONE = enum.auto()
    # The upstream sent an error event: nothing is ever injected after it (rule 5).
    AFTER_ERROR_EVENT = enum.auto()
    # finish_fix gave up on this stream (a bug of its own, or an event too big to hold).
    PASSTHROUGH = enum.auto()


class FailureOutput(NamedTuple):
    """What `receive_failure` asks the caller to do."""

    # Bytes to send to the client now.
    client_bytes: bytes
    # True: end the client's response normally after them (what was sent says how the stream
    # ended). False: let the client see the cut as it happened (on_cut=pass, or passthrough).
    end_response: bool


class _Choice:
    __slots__ = ("finish_reason", "finished_by_upstream", "content_after_injection", "tool_calls", "function_call")

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.finished_by_upstream = False
        self.content_after_injection = False
        self.tool_calls = False
        self.function_call = False


class StreamRepair:
    """Repairs one `text/event-stream` chat-completion response.

    Args:
        request: facts from the request (token limit, model).
        policy: the repair options.
        started_at: the caller's clock when the request started, if it has one; with `now` on the
            `receive_*` calls it gives the times in the report and the error message.

    `receive_data` and `receive_end` return the bytes to send to the client now (possibly b"");
    `receive_failure` returns a `FailureOutput`. None of them raises on anything the upstream sent.
    """

    def __init__(
        self,
        *,
        request: RequestFacts = RequestFacts(),
        policy: RepairPolicy = RepairPolicy(),
        started_at: float | None = None,
    ) -> None:
        self._request = request
        self._policy = policy
        self._started_at = started_at
        self._framer = EventFramer()
        self._phase = _Phase.STREAMING
        self._ended = False
        self._choices: dict[int, _Choice] = {}
        self._chunk_fields: dict = {}
        self._completion_tokens: int | None = None
        self._first_token_seen = False
        self._empty_rewritten = 0
        self.report = StreamReport(model=request.model)

    # -- input --------------------------------------------------------------------------------

    def receive_data(self, data: bytes, *, now: float | None = None) -> bytes:
        """Takes the next piece of the upstream body."""
        self._check_open("receive_data")
        self.report.upstream_bytes += len(data)
        if self._phase is _Phase.PASSTHROUGH:
            return self._sent(data)
        out = self._on_events(self._framer.receive_data(data), now)
        if self._phase is not _Phase.PASSTHROUGH and self._framer.held_bytes > MAX_HELD_BYTES:
            self._pass_through_from_here(f"an event grew past {MAX_HELD_BYTES} bytes without ending")
            out += self._framer.take_buffered()
        return self._sent(out)

    def receive_end(self, *, now: float | None = None) -> bytes:
        """The upstream body ended cleanly (chunked terminator, Content-Length reached, EOF of a
        close-delimited body, HTTP/2 END_STREAM)."""
        self._check_open("receive_end")
        self._ended = True
        if self._phase is _Phase.PASSTHROUGH:
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

    def receive_failure(self, reason: str, *, now: float | None = None) -> FailureOutput:
        """The upstream connection failed mid-body (incomplete chunked body, short Content-Length,
        reset, HTTP/2 stream reset). `reason` is the transport's own words."""
        self._check_open("receive_failure")
        self._ended = True
        if self._phase is _Phase.PASSTHROUGH:
            self._finish(now)
            return FailureOutput(b"", end_response=False)
        leftover = self._framer.receive_end()
        try:
            out = b"" if leftover is None else self._drop_or_pass(leftover)
            cut = Interruption(before_first_token=not self._first_token_seen, cause=CutCause.TRANSPORT_ERROR, reason=reason)
            out += self._on_stream_end(cut, now)
        except Exception as error:
            self._pass_through_from_here(error)
            out = b"" if leftover is None else leftover.raw
        self._finish(now)
        end_response = self._phase is not _Phase.PASSTHROUGH and (
            self._phase is not _Phase.STREAMING or self._policy.on_cut is not OnCut.PASS or self._all_finished()
        )
        return FailureOutput(self._sent(out), end_response=end_response)

    def receive_client_gone(self, reason: str, *, now: float | None = None) -> None:
        """The exchange ended on the client's side (the client went away, the flow was killed):
        nothing more can be sent, so this only closes the books."""
        self._check_open("receive_client_gone")
        self._ended = True
        if self._phase is _Phase.PASSTHROUGH:
            self._finish(now)
            return
        self._framer.receive_end()
        if self._phase is _Phase.STREAMING:
            cut = Interruption(before_first_token=not self._first_token_seen, cause=CutCause.CLIENT_GONE, reason=reason)
            self.report.interruption = cut
            self._set(Verdict.INTERRUPTED, f"interrupted: {cut.how} after {plural(self.report.events, 'event')}, before the stream finished")
        self._finish(now)

    @property
    def ended(self) -> bool:
        """True once `receive_end`, `receive_failure` or `receive_client_gone` was called."""
        return self._ended

    # -- events -------------------------------------------------------------------------------

    def _on_events(self, events: list[Event], now: float | None) -> bytes:
        out = []
        for position, event in enumerate(events):
            if self._phase is _Phase.PASSTHROUGH:
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
        if event.data is None and event.event_type != b"error":
            return event.raw
        self.report.events += 1
        if self.report.time_to_first_event is None and now is not None and self._started_at is not None:
            self.report.time_to_first_event = now - self._started_at
        if self._phase is not _Phase.STREAMING:
            return event.raw
        data = event.data or b""
        if data.startswith(_DONE):
            before = self._finish_choices("before [DONE]")
            self._phase = _Phase.AFTER_DONE
            return before + event.raw
        chunk = maybe_parse_json(data)
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
            before = self._finish_choices("before the usage chunk")
        empty_reasons = 0
        for choice in choices:
            if isinstance(choice, dict):
                empty_reasons += self._on_choice(choice)
        raw = event.raw
        if empty_reasons and self._policy.empty_to_null:
            raw = self._rewrite_empty(event, chunk)
            self._empty_rewritten += empty_reasons
        return before + raw

    def _on_choice(self, choice: dict) -> int:
        """Records one choice of a chunk; returns 1 if its finish_reason is the empty string."""
        index = choice.get("index", 0)
        if not isinstance(index, int) or isinstance(index, bool):
            return 0
        state = self._choices.get(index)
        if state is None:
            if len(self._choices) >= MAX_CHOICES:
                return 0
            state = self._choices[index] = _Choice()
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("tool_calls"):
                state.tool_calls = True
            if delta.get("function_call"):
                state.function_call = True
            if any(delta.get(key) for key in _TOKEN_KEYS):
                self._first_token_seen = True
                if state.finish_reason is not None and not state.finished_by_upstream:
                    state.content_after_injection = True
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            state.finish_reason = reason
            state.finished_by_upstream = True
        return 1 if reason == "" else 0

    def _on_error_event(self, event: Event, chunk: dict | None) -> bytes:
        self._phase = _Phase.AFTER_ERROR_EVENT
        error = chunk.get("error") if chunk is not None else None
        if isinstance(error, dict):
            message = error.get("message")
            label = error.get("code") or error.get("type")
        else:
            message = error if chunk is not None else (event.data or b"").decode("utf-8", "replace")
            label = None
        self.report.upstream_error_message = _one_line(str(message)) if message else None
        self._set(Verdict.UPSTREAM_ERROR, "upstream_error: error event" + (f" ({_one_line(str(label), 60)})" if label else ""))
        return event.raw

    def _remember_chunk(self, chunk: dict) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk:
                self._chunk_fields[key] = chunk[key]
        if self.report.model is None and isinstance(chunk.get("model"), str):
            self.report.model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                self._completion_tokens = tokens

    def _rewrite_empty(self, event: Event, chunk: dict) -> bytes:
        """Rule 2: `"finish_reason": ""` -> null, touching nothing else. The textual rewrite is
        accepted only if it parses back to the intended JSON; else the data is re-serialized."""
        for choice in chunk["choices"]:
            if isinstance(choice, dict) and choice.get("finish_reason") == "":
                choice["finish_reason"] = None
        rewritten = _EMPTY_REASON.sub(rb"\1null", event.raw)
        again = EventFramer().receive_data(rewritten)
        if len(again) == 1 and maybe_parse_json(again[0].data) == chunk:
            return rewritten
        lines = [line for line in split_lines(event.raw) if line]
        other_fields = tuple(line for line in lines if not (line == b"data" or line.startswith(b"data:")))
        return self._event(chunk, extra_lines=other_fields)

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
            out.append(self._finishing_event(index, reason))
            self.report.injected.append({"kind": "finish", "choice": index, "finish_reason": reason})
            self._repaired(f"injected finish_reason {reason!r} for choice {index} {where}")
        return b"".join(out)

    def _finishing_event(self, index: int, reason: str) -> bytes:
        fields = self._chunk_fields
        chunk = {
            "id": fields.get("id", ""),
            "object": "chat.completion.chunk",
            "created": fields.get("created", 0),
            "model": fields.get("model", self._request.model or ""),
        }
        if "system_fingerprint" in fields:
            chunk["system_fingerprint"] = fields["system_fingerprint"]
        chunk["choices"] = [{"index": index, "delta": {}, "finish_reason": reason}]
        return self._event(chunk)

    def _event(self, payload: dict | bytes, *, extra_lines: tuple[bytes, ...] = ()) -> bytes:
        """An event in the stream's own line endings (LF until the stream showed another)."""
        ending = self._framer.line_ending or b"\n"
        data = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
        return b"".join(line + ending for line in extra_lines) + b"data: " + data + ending + ending

    # -- the end ------------------------------------------------------------------------------

    def _on_unterminated(self, leftover: Event, now: float | None) -> bytes:
        """Bytes after the last blank line at a clean end. A server that ended on `data: [DONE]` or a
        whole JSON chunk but forgot the blank line meant it: finish the framing and read it. Anything
        else is an incomplete event, i.e. a cut."""
        data = leftover.data
        readable = data is not None and (data.startswith(_DONE) or maybe_parse_json(data) is not UNREADABLE)
        if not readable or self._phase is not _Phase.STREAMING:
            return self._drop_or_pass(leftover)
        ending = self._framer.line_ending or b"\n"
        missing = ending if leftover.raw.endswith((b"\n", b"\r")) else ending + ending
        out = self._on_event(Event(raw=leftover.raw + missing, data=data, event_type=leftover.event_type), now)
        self._repaired("completed the framing of the last event")
        return out

    def _drop_or_pass(self, leftover: Event) -> bytes:
        # An incomplete event is discarded by every SSE client (WHATWG: "the incomplete event is not
        # dispatched"), and bytes appended after it would merge into its last line and corrupt
        # whatever finish_fix adds. So it is dropped, and counted, unless nothing will be added.
        if self._policy.on_cut is OnCut.PASS or self._phase is not _Phase.STREAMING:
            return leftover.raw
        self.report.dropped_incomplete_bytes += len(leftover.raw)
        return b""

    def _all_finished(self) -> bool:
        """Every choice finished, by the upstream or by an injection that nothing contradicted."""
        return bool(self._choices) and all(
            c.finish_reason is not None and not c.content_after_injection for c in self._choices.values()
        )

    def _on_stream_end(self, cut: Interruption, now: float | None) -> bytes:
        if self._phase is not _Phase.STREAMING:
            return b""
        if self._all_finished():
            # Rule 4: every choice finished, only [DONE] is missing.
            self._repaired(f"appended [DONE] ({cut.how})")
            self.report.injected.append({"kind": "done"})
            return self._event(_DONE)
        return self._on_cut(cut, now)

    def _on_cut(self, cut: Interruption, now: float | None) -> bytes:
        self.report.interruption = cut
        phase = "before the first token" if cut.before_first_token else "after the first token"
        when = f"after {plural(self.report.events, 'event')}"
        if now is not None and self._started_at is not None:
            when += f" and {now - self._started_at:.1f} s"
        if cut.cause is CutCause.CLEAN_END:
            upstream_did = "ended the response"
        else:
            upstream_did = f"connection failed ({cut.reason})"
        message = (
            f"stream was interrupted: the upstream {upstream_did} {when}, {phase}, "
            "without a finish_reason; the response is incomplete (finish_fix)"
        )
        policy = self._policy.on_cut
        if policy is OnCut.ERROR:
            self._set(Verdict.INTERRUPTED, f"interrupted {phase} ({cut.how}) {when}; sent an error event")
            self.report.injected.append({"kind": "error_event", "code": _ERROR_CODE})
            return self._event({"error": {"message": message, "type": "server_error", "code": _ERROR_CODE}})
        if policy is OnCut.STOP:
            if not self._choices:
                self._choices[0] = _Choice()
            finishing = self._finish_choices("after the cut (finish_fix_on_cut=stop)")
            self.report.injected.append({"kind": "done"})
            # The books stay true even when the client is told a story.
            self._set(Verdict.INTERRUPTED, f"interrupted {phase} ({cut.how}) {when}; finished as success (on_cut=stop)")
            return finishing + self._event(_DONE)
        self._set(Verdict.INTERRUPTED, f"interrupted {phase} ({cut.how}) {when}; passed on unchanged")
        return b""

    # -- books --------------------------------------------------------------------------------

    def _pass_through_from_here(self, cause: Exception | str) -> None:
        self._phase = _Phase.PASSTHROUGH
        why = cause if isinstance(cause, str) else f"internal error ({type(cause).__name__}: {cause})"
        if not isinstance(cause, str):
            self.report.internal_error = why
        self._set(Verdict.SKIPPED, f"skipped: {_one_line(why)}; passed through unchanged from event {self.report.events + 1}")

    def _repaired(self, what: str) -> None:
        self.report.repairs.append(what)
        if self.report.verdict is Verdict.CLEAN:
            self.report.verdict = Verdict.REPAIRED

    def _set(self, verdict: Verdict, detail: str) -> None:
        self.report.verdict = verdict
        self.report.detail = detail

    def _finish(self, now: float | None) -> None:
        if self._empty_rewritten:
            self.report.repairs.insert(0, f"rewrote {plural(self._empty_rewritten, 'empty finish_reason value')} to null")
            if self.report.verdict is Verdict.CLEAN:
                self.report.verdict = Verdict.REPAIRED
        if any(c.content_after_injection for c in self._choices.values()):
            self.report.repairs.append("content arrived after a finish injected at a usage chunk")
        if self.report.verdict is Verdict.REPAIRED:
            self.report.detail = "repaired: " + "; ".join(self.report.repairs)
        if now is not None and self._started_at is not None:
            self.report.duration = now - self._started_at

    def _sent(self, out: bytes) -> bytes:
        self.report.client_bytes += len(out)
        return out

    def _check_open(self, method: str) -> None:
        if self._ended:
            raise LocalProtocolError(f"{method}() called after the stream ended (receive_end, receive_failure or receive_client_gone)")


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
