"""The Google Gemini dialect (`:streamGenerateContent`, `:generateContent`): what its chunks mean to
the repair machine.

Theory of operation
-------------------
A Gemini stream is a run of `GenerateContentResponse` chunks: `data: {…}` frames with no `event:`
names, no `[DONE]` and no terminator (`alt=sse`), or the same chunks as the elements of one JSON
array (no `alt`; `_json_array.GeminiFramer` frames both). The Gemini CLI's Code Assist backend wraps
each chunk: `{"response": {…}, "traceId": …}`. The only sign that a stream ended well is a
`finishReason` on its candidates' last chunk, so a cut at a chunk boundary looks like a clean end,
and most clients hand the partial answer on in silence (shared/notes/gemini.md §4). The machine
(`_repair.StreamRepair`) frames the chunks, counts them, runs the deadlines and keeps the books; these
rules meet it through `_rule_interface.StreamServices` only, and read each chunk for the few facts the rules need and writes the one frame a cut gets:

* every candidate seen has a `finishReason` (or the stream is a blocked prompt: a
  `promptFeedback.blockReason` and no candidates) -> the stream passes byte for byte (rule G1)
* the stream ends (clean close, reset, stall) before that, or with no chunk at all -> one appended
  `data: {"error": {"code": 503, "message", "status": "UNAVAILABLE"}}` frame, `error` first, no
  `event:` line; never a made-up finish reason, so `finish_fix_on_cut=stop` sends the error too
  (rules G2, G5); in the array form the frame is an element (`,{"error": …}`) and the array is
  closed, so the body stays JSON; a `]` that closes an unfinished array gets the element before it
* `"finishReason": ""` and `FINISH_REASON_UNSPECIFIED` count as none (rule G3)
* an upstream error chunk (`{"error": …}`) passes, and nothing is appended after it (rule G4)
* with `finish_fix_limit_reasons`, one candidate's `STOP` with `usageMetadata.candidatesTokenCount`
  at or past the request's `generationConfig.maxOutputTokens` is sent as `MAX_TOKENS` (rule G7)

The first token is the first part with non-empty `text` or a `functionCall` (the first-token
deadline, G5). The whole-body rule G6 is `repair_gemini_body`.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, NamedTuple, TypeGuard

from ._dialect import Dialect
from ._injected import sse_event
from ._json import UNREADABLE, json_or_unreadable
from ._json_array import ArrayPiece
from ._json_edit import JsonPath, edit_json, rewrite_event
from ._request import RequestFacts
from ._routine_chunks import MAY_STEADY, RoutineMatch
from ._rule_interface import StreamServices
from ._sse import Event
from ._verdict import Correction, InjectionKind, TokenUsage, Verdict
from ._wording import (
    compressed_body,
    http_error_detail,
    limit_reason_corrected,
    repaired_detail,
    skipped_detail,
    terminator_lost,
)

__all__ = [
    "CUT_ERROR_CODE",
    "CUT_ERROR_STATUS",
    "GeminiBody",
    "GeminiRules",
    "error_payload",
    "is_stream_path",
    "repair_gemini_body",
    "request_facts",
]

# What a cut is reported as: Google's own word and code for a backend that is not there (its error
# shape: `error.code` a number the SDKs read as the HTTP status: 503 makes google-genai raise
# ServerError, @google/genai ApiError, the AI SDK a retryable error).
CUT_ERROR_CODE = 503
CUT_ERROR_STATUS = "UNAVAILABLE"
# G3: reasons that say the model has not stopped (the SDK's docstring: "If empty, the model has not
# stopped generating"; proto3 omits the zero value, FINISH_REASON_UNSPECIFIED).
NO_REASONS = frozenset({"", "FINISH_REASON_UNSPECIFIED"})
# The kind `read` gives a chunk, an error chunk and the closing `]` of the array form.
CHUNK = "chunk"
ERROR = "error"
ARRAY_END = "]"
# Rule G7's id, as docs/repair-rules.md numbers it and the books name it.
_RULE = "G7"
# The model a path names: `/v1beta/models/gemini-2.5-flash:streamGenerateContent`, Vertex's
# `…/publishers/google/models/{model}:…`.
_MODEL_IN_PATH = re.compile(r"models/([^/:]+):[A-Za-z]+/?$")


def error_payload(message: str, *, code: int = CUT_ERROR_CODE, status: str = CUT_ERROR_STATUS) -> dict[str, Any]:
    """Gemini's error object, `error` its first and only key (google-genai raises on a chunk only
    when it re-dumps as `{"error": …`; @google/genai only when `code` is a number in 400-599)."""
    return {"error": {"code": code, "message": message, "status": status}}


def is_stream_path(path: str) -> bool:
    """Whether a request path (without the query) asks for a stream: `:streamGenerateContent`."""
    return path.rstrip("/").endswith(":streamGenerateContent")


def request_facts(facts: RequestFacts, path: str, query: str) -> RequestFacts:
    """A Gemini request's facts that its path says, not its body: whether it streams (the
    `:streamGenerateContent` suffix; the body has no `stream` flag), in which form (JSON array
    unless the query says `alt=sse`), and the model (`…/models/{model}:…`), when the body named
    none (it never does)."""
    stream = is_stream_path(path)
    array = stream and "alt=sse" not in query.split("&")
    named = _MODEL_IN_PATH.search(path)
    model = facts.model if facts.model is not None or named is None else named.group(1)
    return replace(facts, stream=stream, json_array_stream=array, model=model)


class GeminiRules:
    """The Gemini facts of one stream, read chunk by chunk for its `StreamRepair`."""

    dialect = Dialect.GEMINI
    keepalives: frozenset[str] = frozenset()
    # G2: a cut is never told as a finished answer (no finish reason is ever made up).
    may_stop = False

    def __init__(self, stream: StreamServices) -> None:
        self._stream = stream
        # The finish reason of each candidate (by its `index`) that came with one, and the
        # candidates seen without one so far.
        self._reasons: dict[int, str] = {}
        self._open: set[int] = set()
        self._blocked = False
        self._input_tokens: int | None = None
        self._output_tokens: int | None = None
        # The stream's form once its first piece showed it (None: nothing came yet): a JSON array;
        # then whether its `[`, an element, and its `]` went to the client (what a cut must add to
        # keep the body JSON), and whether the error element goes before an upstream `]`.
        self._array: bool | None = None
        self._bracket_sent = False
        self._element_sent = False
        self._array_closed = False
        self._closing = False

    # -- reading ------------------------------------------------------------------------------

    @staticmethod
    def read(event: Event) -> tuple[str | None, Any]:
        """(`chunk`, `error` or `]`, the parsed data)."""
        if isinstance(event, ArrayPiece) and event.closes:
            return ARRAY_END, None
        message = json_or_unreadable(event.data)
        if isinstance(message, dict) and "error" in message:
            return ERROR, message
        return CHUNK, message

    def on_routine(self, match: RoutineMatch) -> int:
        """A routine chunk the fast path matched (`_routine_facts.gemini_facts`: one candidate, one
        text part, no finishReason): what `on_event` would record of it, its candidate still open
        and its counts. The same again changes nothing, so the steady path may take the next (the
        machine hands the last one it took back here when it leaves)."""
        index = match.index
        if index not in self._reasons:
            self._open.add(index)
        counts = match.counts
        if counts is not None:
            if "promptTokenCount" in counts:
                self._input_tokens = counts["promptTokenCount"]
            if "candidatesTokenCount" in counts:
                self._output_tokens = counts["candidatesTokenCount"]
        return MAY_STEADY

    def note_sequence_number(self, number: int) -> None:  # pragma: no cover - no numbered shape
        """Gemini chunks carry no sequence number."""

    def on_event(self, event: Event, kind: str | None, message: Any) -> bytes:
        """The bytes to send for one chunk (`kind` from `read`, `message` its parsed data)."""
        stream = self._stream
        if self._array is None:
            self._array = isinstance(event, ArrayPiece)
        if kind == ARRAY_END:
            stream.report.events -= 1  # the array's end, not a chunk
            self._bracket_sent = self._array_closed = True
            if self.finished():
                return event.raw
            # An array closed before it finished: the error element goes before its `]` (G2).
            # (Its bytes before the `]`: whitespace, and the `[` of an array with no element.)
            self._closing = True
            return event.raw[:-1] + stream.cut_here() + event.raw[-1:]
        if self._array:
            self._bracket_sent = self._element_sent = True
        if kind == ERROR:  # G4: the upstream's own error, passed on; nothing after it
            error = message.get("error")
            if isinstance(error, dict):
                label = error.get("status") if isinstance(error.get("status"), str) else error.get("code")
                stream.upstream_error(label=label, message=error.get("message"))
            else:
                stream.upstream_error(label=None, message=json.dumps(error))
            return event.raw
        if message is UNREADABLE:  # not JSON, or not UTF-8: passed on as it came, booked `malformed` (rule C8)
            stream.malformed()
            return event.raw
        if not isinstance(message, dict):
            return event.raw
        # Code Assist (the Gemini CLI's Google login) wraps the chunk.
        wrapped = isinstance(message.get("response"), dict) and "candidates" not in message
        chunk = message["response"] if wrapped else message
        prefix: JsonPath = ("response",) if wrapped else ()
        stream.note_model(chunk.get("modelVersion"))
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, dict) and isinstance(feedback.get("blockReason"), str) and feedback["blockReason"]:
            self._blocked = True
        usage = chunk.get("usageMetadata")
        if isinstance(usage, dict):
            if _is_int(usage.get("promptTokenCount")):
                self._input_tokens = usage["promptTokenCount"]
            if _is_int(usage.get("candidatesTokenCount")):
                self._output_tokens = usage["candidatesTokenCount"]
        candidates = chunk.get("candidates")
        if not isinstance(candidates, list):
            return event.raw
        limited: int | None = None
        for position, candidate in enumerate(candidates):
            if not isinstance(candidate, dict):
                continue
            index = candidate.get("index")
            index = index if _is_int(index) else position
            if _has_token(candidate.get("content")):
                stream.token_seen()
            reason = candidate.get("finishReason")
            if isinstance(reason, str) and reason not in NO_REASONS:
                self._reasons[index] = reason
                self._open.discard(index)
                if reason == "STOP" and len(candidates) == 1 and self._at_limit():
                    limited = position
            elif index not in self._reasons:
                self._open.add(index)
        if limited is None:
            return event.raw
        return self._limit_reason(event, message, (*prefix, "candidates", limited, "finishReason"), candidates[limited])

    def _at_limit(self) -> bool:
        stream = self._stream
        limit = stream.request.max_tokens
        return (
            stream.policy.limit_reasons and limit is not None and self._output_tokens is not None and self._output_tokens >= limit
        )

    def _limit_reason(self, event: Event, message: dict[str, Any], path: JsonPath, candidate: dict[str, Any]) -> bytes:
        """G7: `STOP` at the request's `maxOutputTokens`, sent as `MAX_TOKENS`."""
        stream = self._stream
        candidate["finishReason"] = "MAX_TOKENS"  # `message` is what the edited chunk must parse as
        index = candidate.get("index")
        self._reasons[index if _is_int(index) else 0] = "MAX_TOKENS"
        edits = {path: b'"MAX_TOKENS"'}
        if isinstance(event, ArrayPiece) and event.data is not None:
            edited = edit_json(event.data, edits)
            if edited is None or json_or_unreadable(edited) != message:
                edited = json.dumps(message, separators=(",", ":")).encode()
            raw = event.raw[: len(event.raw) - len(event.data)] + edited
        else:
            raw = rewrite_event(event, edits, message, stream.line_ending())
        limit = stream.request.max_tokens or 0
        words = limit_reason_corrected(
            _RULE, upstream="STOP", corrected="MAX_TOKENS", output_tokens=self._output_tokens or 0, max_tokens=limit
        )
        stream.corrected(Correction.LIMIT_REASON, words)
        return raw

    def release_held(self) -> bytes:
        """Gemini holds no chunk back."""
        return b""

    def closing_books(self) -> None:
        """The finish reasons the client was sent, by candidate, and the usage seen."""
        report = self._stream.report
        if self._reasons:
            report.finish_reasons = [self._reasons[index] for index in sorted(self._reasons)]
        if self._input_tokens is not None or self._output_tokens is not None:
            report.usage = TokenUsage(input_tokens=self._input_tokens, output_tokens=self._output_tokens)

    # -- the end ------------------------------------------------------------------------------

    def finished(self) -> bool:
        """Every candidate seen has its finish reason, or the prompt was blocked (no candidates)."""
        if self._open:
            return False
        return bool(self._reasons) or self._blocked

    def terminator(self, how: str) -> bytes:
        """A finished stream lacks no terminator in SSE; a finished array lacks its `]`, added."""
        if not self._bracket_sent or self._array_closed:
            return b""
        self._array_closed = True
        self._stream.repaired(terminator_lost("]", how))
        return b"]"

    def cut_frames(self, message: str) -> bytes:
        """G2: the one error frame (SSE) or element (array) a cut ends with."""
        stream = self._stream
        stream.injected({"kind": InjectionKind.ERROR_EVENT, "type": CUT_ERROR_STATUS})
        payload = error_payload(message)
        array = self._array if self._array is not None else stream.request.json_array_stream
        if not array:
            return sse_event(payload, stream.line_ending())
        element = json.dumps(payload, separators=(",", ":")).encode()
        opener = b"" if self._bracket_sent else b"["
        separator = b"," if self._element_sent else b""
        closer = b"" if self._closing else b"]"
        self._bracket_sent = self._element_sent = self._array_closed = True
        return opener + separator + element + closer

    def stop_frames(self) -> bytes:  # pragma: no cover - `may_stop` is False
        raise AssertionError("finish_fix_on_cut=stop never makes up a Gemini finishReason (G2)")


def _has_token(content: object) -> bool:
    """Whether a candidate's content has a part with text or a function call (G5's first token)."""
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return False
    return any(isinstance(part, dict) and (bool(part.get("text")) or "functionCall" in part) for part in parts)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# -- whole bodies (G6) --------------------------------------------------------------------------

#: The status a cut whole body is answered with (its error body's `code` is the same number).
CUT_BODY_STATUS = 503


class GeminiBody(NamedTuple):
    """What `repair_gemini_body` decided: the status and body to send, the verdict and its words."""

    status: int
    body: bytes
    verdict: Verdict
    detail: str
    repairs: tuple[str, ...] = ()
    corrections: tuple[Correction, ...] = ()


def repair_gemini_body(
    body: bytes,
    *,
    status: int,
    limit_reasons: bool,
    max_tokens: int | None,
    expected_length: int | None = None,
    content_encoding: str = "",
) -> GeminiBody:
    """G6: a whole `:generateContent` body. Valid JSON passes with its candidates' reasons as they
    are (with `limit_reasons`, one candidate's `STOP` at `max_tokens` is sent as `MAX_TOKENS`, G7);
    a cut body (not JSON, or shorter than its `expected_length`, the Content-Length) becomes HTTP
    503 with Gemini's error body, whose `code` is that status: the SDKs judge a whole body by its
    status alone, so a 200 with an error body would read as an empty answer."""
    if status >= 400:
        return GeminiBody(status, body, Verdict.HTTP_ERROR, http_error_detail(status))
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity"):  # cannot be read (rule C10's reason)
        return GeminiBody(status, body, Verdict.SKIPPED, skipped_detail(compressed_body(encoding)))
    parsed = json_or_unreadable(body)
    short = expected_length is not None and len(body) < expected_length
    if parsed is UNREADABLE or short:
        why = f"{len(body)} of {expected_length} bytes" if short else f"{len(body)} bytes, not JSON"
        message = f"the upstream's response body was cut ({why}); the response is incomplete (finish_fix)"
        answer = json.dumps(error_payload(message, code=CUT_BODY_STATUS), separators=(",", ":")).encode()
        detail = f"interrupted: whole body cut ({why}), answered HTTP {CUT_BODY_STATUS}"
        return GeminiBody(CUT_BODY_STATUS, answer, Verdict.INTERRUPTED, detail)
    candidates = parsed.get("candidates") if isinstance(parsed, dict) else None
    usage = parsed.get("usageMetadata") if isinstance(parsed, dict) else None
    output_tokens = usage.get("candidatesTokenCount") if isinstance(usage, dict) else None
    if (
        limit_reasons
        and max_tokens is not None
        and isinstance(candidates, list)
        and len(candidates) == 1
        and isinstance(candidates[0], dict)
        and candidates[0].get("finishReason") == "STOP"
        and _is_int(output_tokens)
        and output_tokens >= max_tokens
    ):
        candidates[0]["finishReason"] = "MAX_TOKENS"
        edited = edit_json(body, {("candidates", 0, "finishReason"): b'"MAX_TOKENS"'})
        if edited is None or json_or_unreadable(edited) != parsed:
            edited = json.dumps(parsed, separators=(",", ":")).encode()
        words = limit_reason_corrected(
            _RULE, upstream="STOP", corrected="MAX_TOKENS", output_tokens=output_tokens, max_tokens=max_tokens
        )
        return GeminiBody(status, edited, Verdict.REPAIRED, repaired_detail([words]), (words,), (Correction.LIMIT_REASON,))
    return GeminiBody(status, body, Verdict.CLEAN, "clean")
