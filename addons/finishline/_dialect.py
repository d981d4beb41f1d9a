"""The four streaming dialects finish_fix speaks, by the words the ledger and the lab use (the lab
speaks the first three: `labs.dialects.LAB_DIALECTS`)."""

from __future__ import annotations

import enum

__all__ = ["Dialect"]


class Dialect(enum.StrEnum):
    """Which API a stream speaks. The values are the words in the ledger's `dialect` column, the
    lab's `--dialect` option and `result.json`."""

    # OpenAI Chat Completions (`/v1/chat/completions`): `data:` chunks with `choices[]`, `[DONE]`.
    CHAT = "chat"
    # Anthropic Messages (`/v1/messages`): `event: <type>` frames, `message_delta` carries the
    # `stop_reason`, `message_stop` ends the stream.
    MESSAGES = "messages"
    # OpenAI Responses (`/v1/responses`): `event: response.*` frames with `sequence_number`; only
    # `response.completed`, `response.incomplete`, `response.failed` or `error` end the stream.
    RESPONSES = "responses"
    # Google Gemini (`:streamGenerateContent`, `:generateContent`): `data: {GenerateContentResponse}`
    # frames (or one JSON array of them without `alt=sse`) with no terminator and no event names;
    # only a `finishReason` on the last candidate chunk says the stream ended well.
    GEMINI = "gemini"
