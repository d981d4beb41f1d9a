"""The three streaming dialects finish_fix speaks, by the words the ledger and the lab use."""

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
