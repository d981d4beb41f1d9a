"""What the request tells the repair: the token limit, the model, whether it asked for a stream and
for usage in it, and how many choices (in every dialect)."""

from __future__ import annotations

from dataclasses import dataclass

from ._json import json_or_unreadable

__all__ = ["RequestFacts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFacts:
    """Facts from the request body that the repair needs.

    Attributes:
        max_tokens: `max_completion_tokens`, else `max_tokens` (Chat, Messages), else
            `max_output_tokens` (Responses), else `generationConfig.maxOutputTokens` (Gemini), when
            a positive integer.
        model: the requested model name, used only when no upstream chunk named one.
        stream: the request asked for a stream (`"stream": true`); the books' spans say so.
        stream_usage: the request asked for usage in the stream (Chat's
            `stream_options.include_usage`), so a usage chunk should follow the finish (rule C11).
        choices: Chat's `n` (1 when absent or not a positive integer). With several choices the
            usage counts them all, so no one choice's limit can be read from it (rules C3, C11).
        json_array_stream: the request asked for Gemini's JSON-array stream (a
            `:streamGenerateContent` path without `alt=sse`): what a cut before any byte is
            written in (the caller reads it from the path; the body does not say).
        created_at: when the request went upstream, in whole Unix seconds, from the caller's clock
            (the core has none): what rule R8 gives a Responses snapshot without its `created_at`.
    """

    max_tokens: int | None = None
    model: str | None = None
    stream: bool = False
    stream_usage: bool = False
    choices: int = 1
    created_at: int | None = None
    json_array_stream: bool = False

    @classmethod
    def from_body(cls, body: bytes | None, *, created_at: int | None = None) -> RequestFacts:
        """Reads a JSON request body. Anything unreadable gives empty facts, never an error: the
        repair then infers `stop` rather than `length`, which is what it would do without a limit."""
        request = json_or_unreadable(body) if body else None
        if not isinstance(request, dict):
            return cls(created_at=created_at)
        max_tokens = None
        config = request.get("generationConfig")
        gemini = config if isinstance(config, dict) else {}
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens", "maxOutputTokens"):
            value = (gemini if key == "maxOutputTokens" else request).get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                max_tokens = value
                break
        model = request.get("model")
        options = request.get("stream_options")
        choices = request.get("n")
        return cls(
            max_tokens=max_tokens,
            model=model if isinstance(model, str) else None,
            stream=request.get("stream") is True,
            stream_usage=isinstance(options, dict) and options.get("include_usage") is True,
            choices=choices if isinstance(choices, int) and not isinstance(choices, bool) and choices > 1 else 1,
            created_at=created_at,
        )
