"""The Chat Completions dialect (`/v1/chat/completions`): what its events mean to the repair machine.

Theory of operation
-------------------
A Chat stream is `data:` chunks with `choices[]`, ended by `data: [DONE]`. Per choice index these
rules remember whether the choice finished (and whether the upstream or finish_fix gave the
reason), and whether it carried tool or function calls (`_choices`); what they write into the stream
(finishing chunks, `[DONE]`, the error event) is built by `_injected`, what they change in an
upstream event (rules C2, C11) by the JSON editor `_json_edit`, their sentences by `_wording`. The rules act at these points:

* an event with `"finish_reason": ""`          -> rewritten to null (rule C2)
* a usage-only chunk, or `data: [DONE]`,        -> finishing events first for every choice that
  while some choice is unfinished                  carried deltas but never finished (rule C3; OpenAI
                                                   sends the finish chunk before the usage chunk)
* the upstream body ends cleanly                -> [DONE] appended if every choice finished (rule C4),
                                                   else the stream was cut (rules C6, C7)
* an error event (`event: error`, or a chunk with a top-level `error`) -> passed on, nothing
  injected after it (rule C5)
* a finish `stop` of the stream's one choice, when the request set a token limit
  (`RepairPolicy.limit_reasons`, rule C11): with usage in the same chunk, `length` if
  `completion_tokens` reached the limit; else, when the request asked for usage in the stream, the
  finish chunk is held until the next event, since OpenAI's order puts the usage chunk right after
  it: a usage chunk that shows the limit makes it `length`, anything else sends it as it came. This
  is the one event the machine ever holds back once it is whole (`release_held`).

A finish injected at a usage chunk counts for rule C4 only if no content followed it; otherwise the
usage chunk was not the end, and a stream that then stops is a cut, never a success. The fast path
(`_routine_chunks`) brings routine text chunks here through `on_routine`.

The rules see their stream only through `_rule_interface.StreamServices`; the per-choice table they
keep is `_choices`'.
"""

from __future__ import annotations

import json
from typing import Any

from ._choices import ChoiceState, all_finished, record_choice
from ._dialect import Dialect
from ._inference import infer_finish_reason
from ._injected import DONE, ERROR_CODE, done_event, error_event, finishing_event
from ._json import UNREADABLE, json_or_unreadable
from ._json_edit import JsonPath, rewrite_event
from ._routine_chunks import DECLINE, MAY_STEADY, NOT_STEADY, RoutineMatch
from ._rule_interface import StreamServices
from ._sse import Event
from ._verdict import Correction, InjectionKind, TokenUsage
from ._wording import (
    AFTER_CUT_STOPPED,
    BEFORE_DONE,
    BEFORE_USAGE_CHUNK,
    appended_done,
    content_after_injection,
    injected_finish,
    limit_reason_corrected,
    rewrote_empty_reasons,
)

__all__ = ["ChatRules"]

# Read once per `[DONE]` event, as a marker the rules compare by identity.
_DONE_EVENT: Any = object()
# Rule C11's id, as docs/repair-rules.md numbers it and the books name it.
_RULE = "C11"
_LENGTH = json.dumps("length").encode()
# The upstream's chunk fields a finishing chunk finish_fix writes repeats (C3), as they came last.
_CHUNK_FIELDS = ("id", "created", "model", "system_fingerprint")


class ChatRules:
    """The Chat facts of one stream, read event by event for its `StreamRepair`."""

    dialect = Dialect.CHAT
    keepalives: frozenset[str] = frozenset()
    may_stop = True
    __slots__ = (
        "_stream",
        "choices",
        "chunk_fields",
        "fields_from",
        "completion_tokens",
        "empty_rewritten",
        "held",
        "_token_told",
    )

    def __init__(self, stream: StreamServices) -> None:
        self._stream = stream
        self.choices: dict[int, ChoiceState] = {}
        # The upstream's `id`, `created`, `model`, `system_fingerprint` so far (for finishing chunks).
        self.chunk_fields: dict[str, Any] = {}
        # The routine shape whose fields `chunk_fields` holds as they are (None after the full path wrote).
        self.fields_from: dict[str, Any] | None = None
        self.completion_tokens: int | None = None
        self.empty_rewritten = 0
        # C11: the finish chunk waiting for its usage chunk (the event, its parsed data).
        self.held: tuple[Event, dict[str, Any]] | None = None
        # The machine was told a token came (once is enough: most chunks carry one, and a flag read
        # costs less than a call on the full path of every chunk).
        self._token_told = False

    # -- reading ------------------------------------------------------------------------------

    @staticmethod
    def read(event: Event) -> tuple[str | None, Any]:
        """(the event's type, its parsed data): `[DONE]` is its own marker, never parsed."""
        data = event.data or b""
        if data.startswith(DONE):
            return None, _DONE_EVENT
        chunk = json_or_unreadable(data)
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        return (kind if isinstance(kind, str) else None), chunk

    def on_event(self, event: Event, kind: str | None, chunk: Any) -> bytes:
        """The bytes to send for one event (after a held finish chunk, C11)."""
        if self.held is None:
            return self._read(event, chunk)
        return self._release(chunk) + self._read(event, chunk)

    def _read(self, event: Event, chunk: Any) -> bytes:
        stream = self._stream
        if chunk is _DONE_EVENT:
            before = self._finish_choices(BEFORE_DONE)
            stream.terminated()
            return before + event.raw
        if event.event_type == b"error":
            return self._on_error_event(event, chunk if isinstance(chunk, dict) else None)
        if chunk is UNREADABLE:  # not JSON, or not UTF-8: passed on as it came, booked `malformed` (rule C8)
            stream.malformed()
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
            before = self._finish_choices(BEFORE_USAGE_CHUNK)
        empty_reasons = 0
        for choice in choices:
            if isinstance(choice, dict):
                empty_reasons += self._on_choice(choice)
        raw = event.raw
        if empty_reasons and stream.policy.empty_to_null:
            raw = self._rewrite_empty_reasons(event, chunk)
            self.empty_rewritten += empty_reasons
        if stream.policy.limit_reasons and self._limit_may_hide_in(choices):
            if isinstance(chunk.get("usage"), dict):
                return before + self._maybe_at_the_limit(event, chunk, chunk)
            if stream.request.stream_usage:
                self.held = (event, chunk)
                return before
        return before + raw

    def _rewrite_empty_reasons(self, event: Event, chunk: dict[str, Any]) -> bytes:
        """Rule C2: `"finish_reason": ""` -> null, touching nothing else."""
        edits: dict[JsonPath, bytes] = {}
        for position, choice in enumerate(chunk["choices"]):
            if isinstance(choice, dict) and choice.get("finish_reason") == "":
                choice["finish_reason"] = None
                edits[("choices", position, "finish_reason")] = b"null"
        return rewrite_event(event, edits, chunk, self._stream.line_ending())

    def _limit_may_hide_in(self, choices: list[Any]) -> bool:
        """C11: this chunk finishes the stream's one choice with `stop` and the request set a limit
        for one choice (with `n` > 1 the usage counts every choice, so none's limit shows in it)."""
        request = self._stream.request
        return (
            request.max_tokens is not None
            and request.choices == 1
            and len(self.choices) == 1
            and len(choices) == 1
            and isinstance(choices[0], dict)
            and choices[0].get("finish_reason") == "stop"
        )

    def _maybe_at_the_limit(self, event: Event, chunk: dict[str, Any], usage_from: object) -> bytes:
        """C11: the finish chunk `event` (its data `chunk`), as `length` when the usage in
        `usage_from` shows the completion tokens at or past the request's limit, else as it came."""
        usage = usage_from.get("usage") if isinstance(usage_from, dict) else None
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        limit = self._stream.request.max_tokens
        if limit is None or not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < limit:
            return event.raw
        choice = chunk["choices"][0]
        expected = {**chunk, "choices": [{**choice, "finish_reason": "length"}]}
        index = choice.get("index", 0)
        if isinstance(index, int) and index in self.choices:
            self.choices[index].finish_reason = "length"
        stream = self._stream
        stream.corrected(
            Correction.LIMIT_REASON,
            limit_reason_corrected(_RULE, upstream="stop", corrected="length", output_tokens=tokens, max_tokens=limit),
        )
        return rewrite_event(event, {("choices", 0, "finish_reason"): _LENGTH}, expected, stream.line_ending())

    def _release(self, chunk: Any) -> bytes:
        """C11: the held finish chunk, decided by the event after it (`chunk`, its parsed data)."""
        assert self.held is not None
        (event, held_chunk), self.held = self.held, None
        return self._maybe_at_the_limit(event, held_chunk, chunk)

    def release_held(self) -> bytes:
        """The held finish chunk as it came: the stream ended or was given up before its usage."""
        if self.held is None:
            return b""
        (event, _), self.held = self.held, None
        return event.raw

    def on_routine(self, match: RoutineMatch) -> int:
        """The fast path matched a routine text chunk: the bookkeeping `on_event` would do for it
        (`DECLINE` for a choice never seen, which the full path must read)."""
        state = self.choices.get(match.index)
        if state is None or self.held is not None:  # (a held finish goes out before it: C11)
            return DECLINE
        if match.remembered is not self.fields_from:  # the same shape again: its fields are there
            self.chunk_fields.update(match.remembered)
            self.fields_from = match.remembered
        if state.finish_reason is not None and not state.finished_by_upstream and match.has_text:
            state.content_after_injection = True
        # Another piece of this shape changes nothing but the counts unless a finish finish_fix
        # injected is still believed: text after it would make it a cut.
        if state.finish_reason is None or state.finished_by_upstream or state.content_after_injection:
            return MAY_STEADY
        return NOT_STEADY

    def note_sequence_number(self, number: int) -> None:
        """Chat numbers no events: its steady path is never numbered."""

    def _on_choice(self, choice: dict[str, Any]) -> int:
        """Records one choice of a chunk (`_choices.record_choice`); returns 1 if its finish_reason
        is the empty string."""
        empty, token = record_choice(self.choices, choice)
        if token and not self._token_told:
            self._token_told = True
            self._stream.token_seen()
        return empty

    def _on_error_event(self, event: Event, chunk: dict[str, Any] | None) -> bytes:
        error = chunk.get("error") if chunk is not None else None
        if isinstance(error, dict):
            self._stream.upstream_error(label=error.get("code") or error.get("type"), message=error.get("message"))
        else:
            self._stream.upstream_error(label=None, message=error if chunk is not None else event.data or b"")
        return event.raw

    def _remember_chunk(self, chunk: dict[str, Any]) -> None:
        for key in _CHUNK_FIELDS:
            if key in chunk:
                self.chunk_fields[key] = chunk[key]
                self.fields_from = None
        self._stream.note_model(chunk.get("model"))
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                self.completion_tokens = tokens
            prompt_tokens = usage.get("prompt_tokens")
            self._stream.report.usage = TokenUsage(
                input_tokens=prompt_tokens if isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) else None,
                output_tokens=self.completion_tokens,
            )

    # -- the end ------------------------------------------------------------------------------

    def finished(self) -> bool:
        """Every choice finished, by the upstream or by an injection nothing contradicted."""
        return all_finished(self.choices)

    def terminator(self, how: str) -> bytes:
        """Rule C4: every choice finished, only [DONE] is missing."""
        stream = self._stream
        stream.repaired(appended_done(how))
        stream.injected({"kind": InjectionKind.DONE})
        return done_event(stream.line_ending())

    def cut_frames(self, message: str) -> bytes:
        """Rule C6: the one error event a cut ends with."""
        self._stream.injected({"kind": InjectionKind.ERROR_EVENT, "code": ERROR_CODE})
        return error_event(message, self._stream.line_ending())

    def stop_frames(self) -> bytes:
        """finish_fix_on_cut=stop: finishing events and [DONE] (the books still say interrupted)."""
        if not self.choices:
            self.choices[0] = ChoiceState()
        finishing = self._finish_choices(AFTER_CUT_STOPPED)
        self._stream.injected({"kind": InjectionKind.DONE})
        return finishing + done_event(self._stream.line_ending())

    def closing_books(self) -> None:
        """What the report says at the end about the whole stream (rule C2's count, content after an
        injected finish, each choice's finish reason)."""
        report = self._stream.report
        report.finish_reasons = [
            state.finish_reason for _, state in sorted(self.choices.items()) if state.finish_reason is not None
        ]
        if self.empty_rewritten:
            report.repairs.insert(0, rewrote_empty_reasons(self.empty_rewritten))
            self._stream.repaired_verdict()
        if any(choice.content_after_injection for choice in self.choices.values()):
            report.repairs.append(content_after_injection())

    def _finish_choices(self, where: str) -> bytes:
        """Rule C3: one finishing event per choice that carried deltas but never finished."""
        stream = self._stream
        out = []
        for index in sorted(self.choices):
            state = self.choices[index]
            if state.finish_reason is not None:
                continue
            reason = infer_finish_reason(
                tool_calls=state.tool_calls,
                function_call=state.function_call,
                completion_tokens=self.completion_tokens,
                max_tokens=stream.request.max_tokens,
            )
            state.finish_reason = reason
            fields, model = self.chunk_fields, stream.request.model or ""
            out.append(finishing_event(index, reason, chunk_fields=fields, model=model, line_ending=stream.line_ending()))
            stream.injected({"kind": InjectionKind.FINISH, "choice": index, "finish_reason": reason})
            stream.repaired(injected_finish(reason, index, where))
        return b"".join(out)
