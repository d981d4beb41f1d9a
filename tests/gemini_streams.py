"""Google Gemini stream bodies for the core's tests and the scripted upstream, in every form Gemini
sends them: SSE (`alt=sse`), one JSON array (no `alt`), and the Code Assist wrapping.

    gemini_chunks(["Hel", "lo"])                          # well formed: the last chunk says STOP
    gemini_chunks(["Hel"], finish=None)                   # G2: no finishReason anywhere
    gemini_chunks(["Hel"], finish="")                     # G3: an empty one
    sse_body(chunks)                                      # `data: {…}` frames, blank line after each
    array_body(chunks)                                    # `[{…}`, `,\\r\\n{…}`, …, `]` (pretty-printed elements)
    code_assist(chunk)                                    # {"response": chunk, "traceId": …}

The chunks are shaped like AI Studio's (shared/notes/gemini.md §2): text parts, `role`, `index`,
and `usageMetadata`, `modelVersion`, `responseId` on every chunk.
"""

from __future__ import annotations

import json
from typing import Any

from finishline import sse_event

__all__ = ["MODEL", "array_body", "code_assist", "gemini_chunk", "gemini_chunks", "gemini_error", "sse_body"]

MODEL = "gemini-2.5-flash"


def gemini_chunk(
    text: str | None = None,
    *,
    finish: str | None = None,
    index: int = 0,
    tokens: int = 1,
    function_call: dict[str, Any] | None = None,
    prompt_tokens: int = 4,
) -> dict[str, Any]:
    """One `GenerateContentResponse` with one candidate (`finish`: its finishReason, None: no key)."""
    parts: list[dict[str, Any]] = []
    if text is not None:
        parts.append({"text": text})
    if function_call is not None:
        parts.append({"functionCall": function_call})
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = index
    return {
        "candidates": [candidate],
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": tokens,
            "totalTokenCount": prompt_tokens + tokens,
        },
        "modelVersion": MODEL,
        "responseId": "IZI2acSKMoWl0-kPmYj2yQc",
    }


def gemini_chunks(texts: list[str], *, finish: str | None = "STOP") -> list[dict[str, Any]]:
    """One chunk per text, the last one with `finish` (None: no finishReason at all); the usage
    counts one token per chunk, cumulatively, as Gemini's does."""
    return [
        gemini_chunk(text, finish=finish if number == len(texts) else None, tokens=number) for number, text in enumerate(texts, 1)
    ]


def gemini_error(code: int = 503, message: str = "The model is overloaded.", status: str = "UNAVAILABLE") -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


def code_assist(chunk: dict[str, Any]) -> dict[str, Any]:
    """The Gemini CLI's Code Assist wrapping of a chunk."""
    return {"response": chunk, "traceId": "7a1c0e5f2b"}


def sse_body(chunks: list[dict[str, Any]], *, ending: bytes = b"\n") -> bytes:
    """`data: {…}` frames (JSON spaced as Google's), each ended by a blank line in `ending`."""
    return b"".join(sse_event(json.dumps(chunk).encode(), ending) for chunk in chunks)


def array_elements(chunks: list[dict[str, Any]], *, closed: bool = True) -> list[bytes]:
    """The JSON-array form, one piece per element as Google streams it (`[{…}`, then `,\\r\\n{…}`),
    pretty-printed, then `]` (unless `closed` is False)."""
    pieces = [(b"[" if number == 0 else b",\r\n") + json.dumps(chunk, indent=2).encode() for number, chunk in enumerate(chunks)]
    if closed:
        pieces.append(b"]" if chunks else b"[]")
    return pieces


def array_body(chunks: list[dict[str, Any]], *, closed: bool = True) -> bytes:
    return b"".join(array_elements(chunks, closed=closed))
