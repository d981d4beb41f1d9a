"""Chat-completion SSE bodies for the scripted upstream: `chat.completion.chunk` events as an
OpenAI-compatible server sends them, with the knobs the bad servers turn (no final
`finish_reason`, `"finish_reason": ""` on every chunk, no `[DONE]`, CRLF or CR line endings)."""

from __future__ import annotations

from collections.abc import Sequence

from finishline import sse_event
from tests.feeding import OMITTED, chunk

__all__ = ["UNSET", "chat_chunk", "chat_stream", "sse_event"]

#: No `finish_reason` key at all (`tests.feeding.OMITTED`).
_UNSET = OMITTED


def chat_chunk(
    *,
    content: str | None = None,
    finish_reason: object = _UNSET,
    index: int = 0,
    chunk_id: str = "chatcmpl-e2e",
    model: str = "e2e-model",
    created: int = 1_700_000_000,
    usage: dict | None = None,
    choices: list | None = None,
) -> dict:
    """`tests.feeding.chunk` as the scripted upstream sends it: its own id and model, and
    `finish_reason` left out entirely unless given."""
    return chunk(
        content, index=index, finish_reason=finish_reason, usage=usage, choices=choices, id=chunk_id, model=model, created=created
    )


def chat_stream(
    texts: Sequence[str],
    *,
    finish_reason: object = "stop",
    every_chunk_reason: object = _UNSET,
    done: bool = True,
    line_ending: bytes = b"\n",
) -> list[bytes]:
    """SSE events for one choice streaming `texts`.

    Args:
        finish_reason: put on a final empty-delta chunk; `_UNSET`/None sends no final chunk.
        every_chunk_reason: put on every content chunk (e.g. "" for the empty-reason servers, None
            for servers that send an explicit null).
        done: end with `data: [DONE]`.
    """
    events = [
        sse_event(
            chat_chunk(content=text, finish_reason=every_chunk_reason),  # _UNSET is chat_chunk's default
            line_ending=line_ending,
        )
        for text in texts
    ]
    if finish_reason is not _UNSET and finish_reason is not None:
        events.append(sse_event(chat_chunk(finish_reason=finish_reason), line_ending=line_ending))
    if done:
        events.append(sse_event("[DONE]", line_ending=line_ending))
    return events


UNSET = _UNSET
