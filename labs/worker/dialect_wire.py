"""What each worker knob does in Messages, Responses and Gemini: settings in, the event builders' arguments out.

The answer is the same in every dialect (`labs.worker.answer.expected_answer`); this module says,
once per dialect, how the knobs that shape the stream's ending turn into `message_frames` /
`response_frames` arguments, and what the non-streaming body and the HTTP error body are.
`labs.worker.wire` frames the result (head, body framing) the same way as for Chat.

Messages, Responses and Gemini have no choices: the worker answers with choice 0 only (settings resolved
for these dialects have `n=1`; `labs.worker.wire.response_plan` applies that to unresolved ones too).

The endings, by knob (each knob's help in `labs.worker.knob_help` says the same to users):

| knob | Messages | Responses | Gemini |
|---|---|---|---|
| `finish=sent` | `message_delta` with the real `stop_reason` | the real terminal (`response.completed` / `response.incomplete`) | the last chunk's real `finishReason` (`STOP`, `MAX_TOKENS`) |
| `finish=omitted` | no `message_delta` at all | no terminal; `data: [DONE]` instead when `done` | no last chunk: no `finishReason` anywhere |
| `finish=empty` | `stop_reason: ""` | terminal with `status: ""` | `"finishReason": ""` |
| `null_reason` (wins over `finish`) | `stop_reason: null` (vLLM's abort) | terminal with `status: null` | `"finishReason": null` |
| `done=0` | no `message_stop` | no terminal event (nor `[DONE]`) | refused (no terminator to lose) |
| `error_after=N` | `event: error` (Anthropic type), nothing after | `event: error` (nested), then `response.failed` when `done` | `data: {"error": {code, message, status}}`, nothing after it |
| `bare_error` | that error as a bare `data: {"error":...}` frame | the same, nothing after it (vLLM) | no effect (its error frame is bare already) |
| `close_after_reasoning` | ends after the last `thinking_delta` | ends after the last reasoning delta (Ollama) | ends after the last thought part |
| `hide_limit` | `end_turn` where the limit was hit | `response.completed`, status `completed`, where the limit was hit (llama.cpp, Ollama) | `STOP` where the limit was hit |
| `responses_indexes=0` | no effect | no `sequence_number`, `output_index`, `content_index` on any event (llama.cpp) | refused |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from finishline import Dialect
from labs.worker.answer import (
    ExpectedAnswer,
    ExpectedChoice,
    Piece,
    anthropic_error,
    dialect_reason,
    error_object,
    expected_answer,
    interleaved_pieces,
    sent_reason,
)
from labs.worker.frames import Frame
from labs.worker.gemini_events import NO_REASON_KEY, array_frames, gemini_body, gemini_chunks, gemini_error, sse_frames
from labs.worker.messages_events import message_frames, message_object
from labs.worker.responses_events import AS_TERMINAL, response_body, response_frames
from labs.worker.settings import Finish, WorkerSettings

__all__ = ["DIALECT_WIRES", "DialectWire", "single_choice"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DialectWire:
    """A dialect's bytes for resolved, single-choice settings."""

    #: The stream's frames, with their segment kinds.
    stream_frames: Callable[[WorkerSettings], list[Frame]]
    #: The non-streaming 200 body (`stream` false).
    body: Callable[[WorkerSettings], dict[str, Any]]
    #: The JSON body of an HTTP error response: (status, model) -> body.
    error_body: Callable[[int, str], dict[str, Any]]
    #: Gemini's other stream form, one JSON array streamed element by element (no `alt=sse`):
    #: (settings, where `malformed_chunk` puts its element) -> frames; None in the other dialects.
    array_frames: Callable[[WorkerSettings, int | None], list[Frame]] | None = None


def single_choice(settings: WorkerSettings) -> WorkerSettings:
    """`settings` with one choice: `n` has no meaning in Messages and Responses (choice 0 only)."""
    return settings if settings.n == 1 else dataclasses.replace(settings, n=1)


def _answered(settings: WorkerSettings) -> tuple[ExpectedAnswer, ExpectedChoice, list[Piece]]:
    answer = expected_answer(settings)
    pieces = [piece for _, piece in interleaved_pieces(settings)][: answer.token_events]
    return answer, answer.choices[0], pieces


# -- Messages -------------------------------------------------------------------------------------

#: A defective `finish` -> what `message_delta.stop_reason` says instead of the real reason (the
#: non-streaming `message` too; in a stream `omitted` sends no `message_delta` at all).
_MESSAGES_STOP_REASONS: dict[Finish, Any] = {Finish.EMPTY: "", Finish.OMITTED: None}


def _messages_stop_reason(settings: WorkerSettings, choice: ExpectedChoice) -> str | None:
    if settings.null_reason:
        return None
    if settings.finish is Finish.SENT:
        return dialect_reason(sent_reason(choice.finish_reason, hide_limit=settings.hide_limit), Dialect.MESSAGES)
    return _MESSAGES_STOP_REASONS[settings.finish]


def _messages_stream(settings: WorkerSettings) -> list[Frame]:
    answer, choice, pieces = _answered(settings)
    common: dict[str, Any] = dict(model=settings.model_name, input_tokens=settings.prompt_tokens)
    if answer.error is not None:
        # Anthropic's own error event, or (bare_error) the OpenAI-shaped frame a Chat-minded server
        # sends, which the Anthropic SDKs skip.
        shown = answer.error if settings.bare_error else anthropic_error(settings.error_status, settings.model_name)
        return message_frames(pieces, error_object=shown, bare=settings.bare_error, **common)
    if settings.close_after_reasoning:
        return message_frames(pieces, closed=False, **common)
    return message_frames(
        pieces,
        output_tokens=choice.completion_tokens,
        stop_reason=_messages_stop_reason(settings, choice),
        send_message_delta=settings.null_reason or settings.finish is not Finish.OMITTED,
        send_message_stop=settings.done,
        **common,
    )


def _messages_body(settings: WorkerSettings) -> dict[str, Any]:
    answer, choice, pieces = _answered(settings)
    if answer.error is not None:
        # Like Chat's 200 with a top-level `error`: the defect is visible without streaming too.
        return _messages_error_body(settings.error_status, settings.model_name)
    return message_object(
        pieces,
        model=settings.model_name,
        stop_reason=_messages_stop_reason(settings, choice),
        input_tokens=settings.prompt_tokens,
        output_tokens=choice.completion_tokens,
    )


def _messages_error_body(status: int, model: str) -> dict[str, Any]:
    return {"type": "error", "error": anthropic_error(status, model)}


# -- Responses ------------------------------------------------------------------------------------

#: `finish` -> the terminal response's `status` (AS_TERMINAL: the terminal event's own word).
_RESPONSES_STATUSES: dict[Finish, Any] = {Finish.SENT: AS_TERMINAL, Finish.EMPTY: "", Finish.OMITTED: None}


def _responses_status(settings: WorkerSettings) -> Any:
    return None if settings.null_reason else _RESPONSES_STATUSES[settings.finish]


def _responses_stream(settings: WorkerSettings) -> list[Frame]:
    answer, choice, pieces = _answered(settings)
    common: dict[str, Any] = dict(
        model=settings.model_name,
        input_tokens=settings.prompt_tokens,
        max_output_tokens=settings.max_tokens,
        indexes=settings.responses_indexes,
    )
    if answer.error is not None:
        return response_frames(pieces, error_object=answer.error, send_failed=settings.done, bare=settings.bare_error, **common)
    if settings.close_after_reasoning:
        return response_frames(pieces, closed=False, **common)
    # The terminal event is the reason and the terminator at once: `done=0` loses it; `finish=omitted`
    # loses it too but keeps an end marker, `[DONE]`, the way a gateway bridging from Chat ends it.
    omitted = settings.finish is Finish.OMITTED and not settings.null_reason
    word = dialect_reason(sent_reason(choice.finish_reason, hide_limit=settings.hide_limit), Dialect.RESPONSES)
    return response_frames(
        pieces,
        output_tokens=choice.completion_tokens,
        terminal=("response.incomplete" if word == "incomplete" else "response.completed")
        if settings.done and not omitted
        else None,
        status=_responses_status(settings),
        done_marker=settings.done and omitted,
        **common,
    )


def _responses_body(settings: WorkerSettings) -> dict[str, Any]:
    answer, choice, pieces = _answered(settings)
    common: dict[str, Any] = dict(
        model=settings.model_name,
        input_tokens=settings.prompt_tokens,
        output_tokens=choice.completion_tokens,
        max_output_tokens=settings.max_tokens,
    )
    if answer.error is not None:
        failure = {"code": answer.error.get("code") or "server_error", "message": answer.error["message"]}
        return response_body(pieces, status="failed", error=failure, **common)
    word = dialect_reason(sent_reason(choice.finish_reason, hide_limit=settings.hide_limit), Dialect.RESPONSES)
    status = word if settings.finish is Finish.SENT and not settings.null_reason else _responses_status(settings)
    return response_body(pieces, status=status, incomplete_reason="max_output_tokens" if word == "incomplete" else None, **common)


# -- Gemini ---------------------------------------------------------------------------------------

#: A defective `finish` -> the last chunk's `finishReason` (`NO_REASON_KEY`: no reason chunk at all,
#: so no `finishReason` anywhere; in the whole body, no `finishReason` key).
_GEMINI_REASONS: dict[Finish, Any] = {Finish.EMPTY: "", Finish.OMITTED: NO_REASON_KEY}


def _gemini_reason(settings: WorkerSettings, choice: ExpectedChoice) -> Any:
    if settings.null_reason:
        return None  # what translating gateways write (`"finishReason": null`)
    if settings.finish is Finish.SENT:
        return dialect_reason(sent_reason(choice.finish_reason, hide_limit=settings.hide_limit), Dialect.GEMINI)
    return _GEMINI_REASONS[settings.finish]


def _gemini_chunk_list(settings: WorkerSettings) -> list[tuple[str, dict[str, Any]]]:
    answer, choice, pieces = _answered(settings)
    common: dict[str, Any] = dict(model=settings.model_name, prompt_tokens=settings.prompt_tokens)
    if answer.error is not None:
        # Google's mid-stream error: a `data: {"error": {code, message, status}}` frame, then the close.
        return gemini_chunks(pieces, error=gemini_error(settings.error_status), **common)
    if settings.close_after_reasoning:
        return gemini_chunks(pieces, closed=False, **common)
    return gemini_chunks(pieces, finish_reason=_gemini_reason(settings, choice), **common)


def _gemini_stream(settings: WorkerSettings) -> list[Frame]:
    return sse_frames(_gemini_chunk_list(settings))


def _gemini_array(settings: WorkerSettings, malformed_at: int | None) -> list[Frame]:
    return array_frames(_gemini_chunk_list(settings), malformed_at)


def _gemini_body(settings: WorkerSettings) -> dict[str, Any]:
    answer, choice, pieces = _answered(settings)
    if answer.error is not None:
        # Like Chat's 200 with a top-level `error` (the SDKs read it as an empty answer).
        return gemini_error(settings.error_status)
    return gemini_body(
        pieces, model=settings.model_name, prompt_tokens=settings.prompt_tokens, finish_reason=_gemini_reason(settings, choice)
    )


def _gemini_error_body(status: int, model: str) -> dict[str, Any]:
    return gemini_error(status)


def _openai_error_body(status: int, model: str) -> dict[str, Any]:
    return {"error": error_object(status, model)}


#: The dialects the worker speaks besides Chat (`labs.worker.wire` keeps Chat's own bytes).
DIALECT_WIRES: dict[Dialect, DialectWire] = {
    Dialect.MESSAGES: DialectWire(stream_frames=_messages_stream, body=_messages_body, error_body=_messages_error_body),
    Dialect.RESPONSES: DialectWire(stream_frames=_responses_stream, body=_responses_body, error_body=_openai_error_body),
    Dialect.GEMINI: DialectWire(
        stream_frames=_gemini_stream, body=_gemini_body, error_body=_gemini_error_body, array_frames=_gemini_array
    ),
}
