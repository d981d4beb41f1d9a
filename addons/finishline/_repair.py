"""The per-stream repair machine: upstream bytes in, client bytes and a verdict out.

Theory of operation
-------------------
Bytes go through three stages: `EventFramer` (bytes -> events), `_on_event` (event -> the bytes to
send for it, plus anything injected before it) and the caller, who sends those bytes. Every complete
event leaves as soon as it arrived; only the current incomplete event is held.

Per choice index the machine remembers whether it carried deltas, whether it got a non-empty
`finish_reason`, and whether it carried tool or function calls. The rules (issue 2) act at four points:

* an event with `"finish_reason": ""`          -> rewritten to null (rule 2)
* a usage-only chunk, or `data: [DONE]`,        -> finishing events first for every choice that
  while some choice is unfinished                  carried deltas but never finished (rule 3; OpenAI
                                                   sends the finish chunk before the usage chunk)
* the upstream body ends cleanly                -> [DONE] appended if every choice finished (rule 4),
                                                   else the stream was cut (rules 6, 7)
* the upstream connection fails mid-body        -> the stream was cut (rule 6), unless it already
                                                   finished

After an error event (rule 5) nothing is ever injected. A cut is reported per `RepairPolicy.on_cut`.
Anything the machine cannot read (non-JSON data, invalid UTF-8, unknown shapes) passes through.
"""

from __future__ import annotations

import json
import re

from ._errors import LocalProtocolError
from ._inference import infer_finish_reason
from ._request import RequestFacts
from ._sse import Event, EventFramer
from ._verdict import Interruption, OnCut, RepairPolicy, StreamReport, Verdict

__all__ = ["StreamRepair"]

# Delta keys that mean the model produced something: the first such chunk is the "first token".
_TOKEN_KEYS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")
# `"finish_reason": ""` as JSON text. Inside a JSON string the quotes would be escaped, so this
# cannot match message content; the rewrite is still checked by parsing it back (`_rewrite_empty`).
_EMPTY_REASON = re.compile(rb'("finish_reason"\s*:\s*)""')
_DONE = b"[DONE]"
_ERROR_CODE = "stream_interrupted"


class _Choice:
    __slots__ = ("finish_reason", "tool_calls", "function_call")

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.tool_calls = False
        self.function_call = False


class StreamRepair:
    """Repairs one `text/event-stream` chat-completion response.

    Args:
        request: facts from the request (token limit, model).
        policy: the repair options.
        started_at: the caller's clock when the response started, if it has one; with `now` on the
            `receive_*` calls it gives the times in the report and the error message.

    Each `receive_*` method returns the bytes to send to the client now (possibly b"").
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
        self.report = StreamReport(model=request.model)
        self._choices: dict[int, _Choice] = {}
        self._chunk_fields: dict = {}
        self._completion_tokens: int | None = None
        self._first_token_seen = False
        self._done_seen = False
        self._failed = False
        self._ended = False
        self._empty_rewritten = 0

    # -- input --------------------------------------------------------------------------------

    def receive_data(self, data: bytes, *, now: float | None = None) -> bytes:
        """Takes the next piece of the upstream body."""
        self._check_open("receive_data")
        self.report.upstream_bytes += len(data)
        out = [self._on_event(event, now) for event in self._framer.receive_data(data)]
        return self._sent(b"".join(out))

    def receive_end(self, *, now: float | None = None) -> bytes:
        """The upstream body ended cleanly (chunked terminator, Content-Length reached, EOF of a
        close-delimited body, HTTP/2 END_STREAM)."""
        self._check_open("receive_end")
        self._ended = True
        out = []
        leftover = self._framer.receive_end()
        if leftover is not None:
            out.append(self._on_unterminated(leftover, now))
        out.append(self._on_stream_end("clean end without [DONE]", now))
        self._finish(now)
        return self._sent(b"".join(out))

    def receive_failure(self, reason: str, *, now: float | None = None) -> bytes:
        """The upstream connection failed mid-body (incomplete chunked body, short Content-Length,
        reset, HTTP/2 stream reset). `reason` is the transport's own words."""
        self._check_open("receive_failure")
        self._ended = True
        out = []
        leftover = self._framer.receive_end()
        if leftover is not None:
            out.append(self._drop_or_pass(leftover))
        out.append(self._on_stream_end(f"transport error: {reason}", now))
        self._finish(now)
        return self._sent(b"".join(out))

    def receive_abort(self, reason: str, *, now: float | None = None) -> None:
        """The exchange ended for a reason other than the upstream (the client went away, the flow
        was killed): nothing more can be sent, so this only closes the books."""
        self._check_open("receive_abort")
        self._ended = True
        self._framer.receive_end()
        if not (self._done_seen or self._failed):
            interruption = Interruption(before_first_token=not self._first_token_seen, how=f"aborted: {reason}")
            self.report.interruption = interruption
            events = self.report.events
            self._set(Verdict.INTERRUPTED, f"interrupted: {reason} after {events} event{'' if events == 1 else 's'}, before the stream finished")
        self._finish(now)

    def abandon(self) -> bytes:
        """Stops repairing (the caller hit an internal error): returns the bytes held back for the
        current incomplete event, so that passing everything on unchanged from here loses nothing."""
        self._ended = True
        return self._framer.take_buffered()

    @property
    def ended(self) -> bool:
        """True once `receive_end`, `receive_failure` or `abandon` was called."""
        return self._ended

    @property
    def ends_cleanly(self) -> bool:
        """Whether the bytes sent so far end the stream properly ([DONE], an error event, or the
        repair's own ending). After `receive_failure`, True means the caller should end the client's
        response normally so the client reads that ending; False (only with on_cut=pass) means the
        client should see the cut as it happened."""
        return self._done_seen or self._failed or self._policy.on_cut is not OnCut.PASS

    # -- events -------------------------------------------------------------------------------

    def _on_event(self, event: Event, now: float | None) -> bytes:
        if event.data is None:
            return event.raw
        self.report.events += 1
        if self.report.time_to_first_event is None and now is not None and self._started_at is not None:
            self.report.time_to_first_event = now - self._started_at
        if event.data.startswith(_DONE):
            before = b"" if (self._failed or self._done_seen) else self._finish_choices("before [DONE]")
            self._done_seen = True
            return before + event.raw
        if event.event_type == b"error":
            return self._on_error_event(event, None)
        try:
            chunk = json.loads(event.data)
        except ValueError:  # not JSON, or not UTF-8: data, not our business (rule 8)
            self.report.malformed_events += 1
            return event.raw
        if not isinstance(chunk, dict):
            return event.raw
        if "error" in chunk:
            return self._on_error_event(event, chunk)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return event.raw
        self._remember_chunk(chunk)
        raw = event.raw
        before = b""
        if not choices and isinstance(chunk.get("usage"), dict) and not self._done_seen:
            # A usage-only chunk closes the stream; the finish chunk belongs before it.
            before = self._finish_choices("before the usage chunk")
        empty_reasons = 0
        for choice in choices:
            if isinstance(choice, dict):
                empty_reasons += self._on_choice(choice)
        if empty_reasons and self._policy.empty_to_null:
            raw = self._rewrite_empty(event, chunk)
            self._empty_rewritten += empty_reasons
        return before + raw

    def _on_choice(self, choice: dict) -> int:
        """Records one choice of a chunk; returns 1 if its finish_reason is the empty string."""
        index = choice.get("index", 0)
        if not isinstance(index, int):
            return 0
        state = self._choices.setdefault(index, _Choice())
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("tool_calls"):
                state.tool_calls = True
            if delta.get("function_call"):
                state.function_call = True
            if not self._first_token_seen and any(delta.get(key) for key in _TOKEN_KEYS):
                self._first_token_seen = True
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            state.finish_reason = reason
        return 1 if reason == "" else 0

    def _on_error_event(self, event: Event, chunk: dict | None) -> bytes:
        self._failed = True
        message = ""
        if chunk is not None:
            error = chunk.get("error")
            message = error.get("message", "") if isinstance(error, dict) else str(error)
        elif event.data:
            message = event.data.decode("utf-8", "replace")
        self._set(Verdict.UPSTREAM_ERROR, f"upstream_error: {_one_line(message) or 'error event'}")
        return event.raw

    def _remember_chunk(self, chunk: dict) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk:
                self._chunk_fields[key] = chunk[key]
        if isinstance(chunk.get("model"), str):
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
        framer = EventFramer()
        again = framer.receive_data(rewritten)
        try:
            if len(again) == 1 and json.loads(again[0].data or b"") == chunk:
                return rewritten
        except ValueError:
            pass
        return self._event(chunk, extra_lines=_non_data_lines(event.raw))

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
        readable = data is not None and data.startswith(_DONE)
        if data is not None and not readable:
            try:
                json.loads(data)
                readable = True
            except ValueError:
                readable = False
        if not readable:
            return self._drop_or_pass(leftover)
        ending = self._framer.line_ending or b"\n"
        missing = ending if leftover.raw.endswith((b"\n", b"\r")) else ending + ending
        self._repaired("completed the framing of the last event")
        return self._on_event(Event(raw=leftover.raw + missing, data=data, event_type=leftover.event_type), now)

    def _drop_or_pass(self, leftover: Event) -> bytes:
        # An incomplete event is discarded by every SSE client (WHATWG: "the incomplete event is not
        # dispatched"), and bytes appended after it would merge into its last line and corrupt
        # whatever finish_fix adds. So it is dropped, and counted, unless the policy is to change nothing.
        if self._policy.on_cut is OnCut.PASS or self._done_seen or self._failed:
            return leftover.raw
        self.report.dropped_incomplete_bytes += len(leftover.raw)
        return b""

    def _on_stream_end(self, how: str, now: float | None) -> bytes:
        if self._done_seen or self._failed:
            return b""
        if self._choices and all(c.finish_reason is not None for c in self._choices.values()):
            # Rule 4: every choice finished, only [DONE] is missing.
            self._repaired(f"appended [DONE] ({how})")
            self.report.injected.append({"kind": "done"})
            return self._event(_DONE)
        return self._on_cut(how, now)

    def _on_cut(self, how: str, now: float | None) -> bytes:
        interruption = Interruption(before_first_token=not self._first_token_seen, how=how)
        self.report.interruption = interruption
        phase = "before the first token" if interruption.before_first_token else "after the first token"
        events = self.report.events
        when = f"after {events} event{'' if events == 1 else 's'}"
        if now is not None and self._started_at is not None:
            when += f" and {now - self._started_at:.1f} s"
        if how.startswith("clean"):
            upstream_did = "closed the connection"
        else:
            upstream_did = f"connection failed ({how.removeprefix('transport error: ')})"
        message = (
            f"stream was interrupted: the upstream {upstream_did} {when}, {phase}, "
            "without a finish_reason; the response is incomplete (finish_fix)"
        )
        policy = self._policy.on_cut
        if policy is OnCut.ERROR:
            detail = f"interrupted {phase} ({how}) {when}; sent an error event"
            self._set(Verdict.INTERRUPTED, detail)
            self.report.injected.append({"kind": "error_event", "code": _ERROR_CODE})
            error = {"error": {"message": message, "type": "server_error", "code": _ERROR_CODE}}
            return self._event(error)
        if policy is OnCut.STOP:
            if not self._choices:
                self._choices[0] = _Choice()
            finishing = self._finish_choices("after the cut (finish_fix_on_cut=stop)")
            self.report.injected.append({"kind": "done"})
            # The books stay true even when the client is told a story.
            self._set(Verdict.INTERRUPTED, f"interrupted {phase} ({how}) {when}; finished as success (on_cut=stop)")
            return finishing + self._event(_DONE)
        self._set(Verdict.INTERRUPTED, f"interrupted {phase} ({how}) {when}; passed on unchanged")
        return b""

    # -- books --------------------------------------------------------------------------------

    def _repaired(self, what: str) -> None:
        self.report.repairs.append(what)
        if self.report.verdict is Verdict.CLEAN:
            self.report.verdict = Verdict.REPAIRED

    def _set(self, verdict: Verdict, detail: str) -> None:
        self.report.verdict = verdict
        self.report.detail = detail

    def _finish(self, now: float | None) -> None:
        if self._empty_rewritten:
            self.report.repairs.insert(0, f"rewrote {self._empty_rewritten} empty finish_reason values to null")
            if self.report.verdict is Verdict.CLEAN:
                self.report.verdict = Verdict.REPAIRED
        if self.report.verdict is Verdict.REPAIRED:
            self.report.detail = "repaired: " + "; ".join(self.report.repairs)
        if now is not None and self._started_at is not None:
            self.report.duration = now - self._started_at

    def _sent(self, out: bytes) -> bytes:
        self.report.client_bytes += len(out)
        return out

    def _check_open(self, method: str) -> None:
        if self._ended:
            raise LocalProtocolError(f"{method}() called after the stream ended (receive_end or receive_failure)")


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _non_data_lines(raw: bytes) -> tuple[bytes, ...]:
    """The event's lines other than data lines (event:, id:, retry:, comments), in order."""
    lines = [line for line in re.split(rb"\r\n|\r|\n", raw) if line]
    return tuple(line for line in lines if not (line == b"data" or line.startswith(b"data:")))
