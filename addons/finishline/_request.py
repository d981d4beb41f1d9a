"""What the request tells the repair: the token limit, the model and whether it asked for a stream
(in every dialect)."""

from __future__ import annotations

from dataclasses import dataclass

from ._json import json_or_unreadable

__all__ = ["RequestFacts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFacts:
    """Facts from the request body that the repair needs.

    Attributes:
        max_tokens: `max_completion_tokens`, else `max_tokens` (Chat, Messages), else
            `max_output_tokens` (Responses), when a positive integer.
        model: the requested model name, used only when no upstream chunk named one.
        stream: the request asked for a stream (`"stream": true`); the books' spans say so.
    """

    max_tokens: int | None = None
    model: str | None = None
    stream: bool = False

    @classmethod
    def from_body(cls, body: bytes | None) -> RequestFacts:
        """Reads a JSON request body. Anything unreadable gives empty facts, never an error: the
        repair then infers `stop` rather than `length`, which is what it would do without a limit."""
        request = json_or_unreadable(body) if body else None
        if not isinstance(request, dict):
            return cls()
        max_tokens = None
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            value = request.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                max_tokens = value
                break
        model = request.get("model")
        return cls(max_tokens=max_tokens, model=model if isinstance(model, str) else None, stream=request.get("stream") is True)
