"""Google Gemini `GenerateContentResponse` chunks, byte for byte: one builder per chunk, and whole
streams in both of Gemini's stream forms.

The worker (`labs.worker.wire.response_plan(..., dialect=Dialect.GEMINI)`) builds its Gemini
answers here. The wire (shared/notes/gemini.md sections 1-3):

- `:streamGenerateContent?alt=sse`: every chunk is one `data: {GenerateContentResponse}` frame with
  no `event:` line, no `[DONE]` and no terminator: the stream ends with the body. Frames end with
  `\\r\\n\\r\\n`, as Google's own servers send them (Vertex; the @google/genai parser's regex has
  that ending for this reason), so `SSE_LINE_ENDING` is CRLF.
- the same path without `alt=sse`: one JSON array streamed element by element, `[{…}`, `,\\r\\n{…}`,
  …, `]` (`array_frames`).
- `:generateContent`: one whole `GenerateContentResponse` (`gemini_body`).

A chunk carries one candidate (index 0) whose `content.parts` hold what is new: a `text` part per
content token, a `{"text", "thought": true}` part per reasoning token, and a whole `functionCall`
part per tool call (Gemini never streams a call's arguments piecemeal). `usageMetadata`
(cumulative), `modelVersion` and `responseId` ride on every chunk, as AI Studio sends them.

`finishReason` comes only on the last candidate chunk. The worker sends it in a chunk of its own
(an empty text part, as Vertex's last chunk often is) after the last token, so a cut after the last
token and a stream without a reason differ by that one chunk, as the other dialects' finish events
do. Segment kinds (`labs.worker.wire.Segment`): `token` for each chunk that carries a token,
`finish` for the reason's chunk, `error` for an error frame, `done` for the array's closing `]`.

The worker's answer has tool calls as token events (an opening piece, then argument pieces:
`labs.worker.answer.choice_pieces`). In Gemini a call is one token event, sent whole at its opening
piece; its argument pieces send nothing. A call cut short (by `max_tokens` or `error_after` inside
its arguments) is not sent at all: a Gemini model never sends half a call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from labs.worker.answer import TOOL_ARGUMENT_PIECES, TOOL_NAME, Piece
from labs.worker.frames import Frame, compact_json, sse_frame

__all__ = [
    "MALFORMED_ELEMENT",
    "NO_REASON_KEY",
    "RESPONSE_ID",
    "SSE_LINE_ENDING",
    "STATUS_WORDS",
    "array_frames",
    "gemini_body",
    "gemini_chunk",
    "gemini_chunks",
    "gemini_error",
    "sse_frames",
    "status_word",
]

#: Every response has the same id: same settings, same bytes.
RESPONSE_ID = "finishline"
#: How Google ends a line of its SSE frames (module docstring).
SSE_LINE_ENDING = b"\r\n"
#: Google's status word per HTTP status (https://ai.google.dev/gemini-api/docs/troubleshooting,
#: google.rpc.Code); other 5xx are `INTERNAL`, other 4xx `FAILED_PRECONDITION`.
STATUS_WORDS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
#: What `finishReason` a key absent means: the chunk has none (`finish=omitted`).
NO_REASON_KEY = object()


def status_word(status: int) -> str:
    """Google's status word for an HTTP status, e.g. 429 -> `RESOURCE_EXHAUSTED`."""
    return STATUS_WORDS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def gemini_error(status: int, message: str | None = None) -> dict[str, Any]:
    """Gemini's error body and mid-stream error frame, `error` its first and only key:
    `{"error": {"code": status, "message", "status": <word>}}` (google-genai raises on a chunk only
    when it re-dumps as `{"error": …`; @google/genai only when `code` is a number in 400-599)."""
    if message is None:
        if status == 429:
            message = "Resource has been exhausted (e.g. check quota) (simulated by finishline)."
        elif status == 503:
            message = "The model is overloaded. Please try again later (simulated by finishline)."
        elif status >= 500:
            message = f"An internal error has occurred (simulated {status})."
        else:
            message = f"Simulated client error {status}."
    return {"error": {"code": status, "message": message, "status": status_word(status)}}


def _part(piece: Piece) -> dict[str, Any]:
    if piece.kind == "reasoning":
        return {"text": piece.text, "thought": True}
    if piece.kind == "content":
        return {"text": piece.text}
    return {"functionCall": {"name": TOOL_NAME, "args": json.loads("".join(TOOL_ARGUMENT_PIECES))}}


def _usage(prompt_tokens: int, output_tokens: int, thoughts_tokens: int) -> dict[str, int]:
    usage = {
        "promptTokenCount": prompt_tokens,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": prompt_tokens + output_tokens + thoughts_tokens,
    }
    if thoughts_tokens:
        usage["thoughtsTokenCount"] = thoughts_tokens
    return usage


def gemini_chunk(
    parts: Sequence[Mapping[str, Any]],
    *,
    model: str,
    prompt_tokens: int,
    output_tokens: int,
    thoughts_tokens: int = 0,
    finish_reason: Any = NO_REASON_KEY,
) -> dict[str, Any]:
    """One `GenerateContentResponse` with candidate 0 carrying `parts`; `finish_reason` as given
    (`NO_REASON_KEY`: no `finishReason` key; None and `""` are sent as they are)."""
    candidate: dict[str, Any] = {"content": {"parts": [dict(p) for p in parts], "role": "model"}}
    if finish_reason is not NO_REASON_KEY:
        candidate["finishReason"] = finish_reason
    candidate["index"] = 0
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(prompt_tokens, output_tokens, thoughts_tokens),
        "modelVersion": model,
        "responseId": RESPONSE_ID,
    }


def _sent_pieces(pieces: Sequence[Piece]) -> list[tuple[Piece, int]]:
    """The pieces that send a part, each with how many token events it stands for: every text or
    thought piece one; a tool call's opening piece stands for the whole call, sent only when all its
    argument pieces are in `pieces` (module docstring)."""
    sent: list[tuple[Piece, int]] = []
    for at, piece in enumerate(pieces):
        if piece.kind == "tool_arguments":
            continue
        if piece.kind == "tool_call":
            arguments = [p for p in pieces[at + 1 :] if p.kind == "tool_arguments" and p.tool_index == piece.tool_index]
            if len(arguments) < len(TOOL_ARGUMENT_PIECES):
                continue  # cut inside the call: Gemini sends no half call
            sent.append((piece, 1 + len(arguments)))
        else:
            sent.append((piece, 1))
    return sent


def gemini_chunks(
    pieces: Sequence[Piece],
    *,
    model: str,
    prompt_tokens: int,
    finish_reason: Any = "STOP",
    error: Mapping[str, Any] | None = None,
    closed: bool = True,
) -> list[tuple[str, dict[str, Any]]]:
    """A Gemini stream carrying `pieces` (candidate 0's, in order) as (segment kind, chunk) pairs.

    Args:
        finish_reason: the last chunk's `finishReason` (`NO_REASON_KEY`: no last chunk at all, so no
            `finishReason` anywhere; None and `""` are sent as they are).
        error: end with this error object (`gemini_error(...)`) right after the pieces, nothing
            after it.
        closed: False ends right after the last piece, with no reason chunk.
    """
    chunks: list[tuple[str, dict[str, Any]]] = []
    output = thoughts = 0
    for piece, weight in _sent_pieces(pieces):
        if piece.kind == "reasoning":
            thoughts += weight
        else:
            output += weight
        chunk = gemini_chunk(
            [_part(piece)], model=model, prompt_tokens=prompt_tokens, output_tokens=output, thoughts_tokens=thoughts
        )
        chunks.append(("token", chunk))
    if error is not None:
        chunks.append(("error", dict(error)))
        return chunks
    if closed and finish_reason is not NO_REASON_KEY:
        last = gemini_chunk(
            [{"text": ""}],
            model=model,
            prompt_tokens=prompt_tokens,
            output_tokens=output,
            thoughts_tokens=thoughts,
            finish_reason=finish_reason,
        )
        chunks.append(("finish", last))
    return chunks


def sse_frames(chunks: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Frame]:
    """The `alt=sse` form: one `data:` frame per chunk, CRLF line endings."""
    return [Frame(kind, sse_frame(chunk, line_ending=SSE_LINE_ENDING)) for kind, chunk in chunks]


def array_frames(chunks: Sequence[tuple[str, Mapping[str, Any]]], malformed_at: int | None = None) -> list[Frame]:
    """The JSON-array form: `[` before the first element, `,\\r\\n` before each next one, and a
    closing `]` (kind `done`) unless the stream ends with an error element (the close comes right
    after it, as Google's does). An empty stream is `[]`. `malformed_at`: the index before which an
    element cut in half goes (`malformed_chunk`)."""
    frames: list[Frame] = []
    for at, (kind, chunk) in enumerate(chunks):
        if at == malformed_at:
            frames.append(Frame("malformed", (b"," if frames else b"[") + MALFORMED_ELEMENT))
        opener = b"[" if not frames else b",\r\n"
        frames.append(Frame(kind, opener + compact_json(chunk)))
    if malformed_at is not None and malformed_at >= len(chunks):
        frames.append(Frame("malformed", (b"," if frames else b"[") + MALFORMED_ELEMENT))
    if not chunks or chunks[-1][0] != "error":
        frames.append(Frame("done", b"]" if frames else b"[]"))
    return frames


#: `malformed_chunk`: a token chunk cut in half (not JSON), as a broken upstream sends it.
MALFORMED_ELEMENT = b'{"candidates":[{"content":{"parts":[{"text":'


def gemini_body(
    pieces: Sequence[Piece],
    *,
    model: str,
    prompt_tokens: int,
    finish_reason: Any = "STOP",
) -> dict[str, Any]:
    """The whole `:generateContent` answer: one candidate whose parts are the thoughts (one part),
    the text (one part) and each whole call, and the final usage."""
    parts: list[dict[str, Any]] = []
    thoughts = "".join(p.text for p in pieces if p.kind == "reasoning")
    text = "".join(p.text for p in pieces if p.kind == "content")
    if thoughts:
        parts.append({"text": thoughts, "thought": True})
    if text:
        parts.append({"text": text})
    sent = _sent_pieces(pieces)
    parts += [_part(piece) for piece, _ in sent if piece.kind == "tool_call"]
    thought_tokens = sum(weight for piece, weight in sent if piece.kind == "reasoning")
    output = sum(weight for piece, weight in sent if piece.kind != "reasoning")
    return gemini_chunk(
        parts,
        model=model,
        prompt_tokens=prompt_tokens,
        output_tokens=output,
        thoughts_tokens=thought_tokens,
        finish_reason=finish_reason,
    )
