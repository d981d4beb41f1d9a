"""A mitmweb content view that shows an event stream in any of the four dialects as numbered events
plus the answer reassembled per choice, content block, output item or candidate (finishline's
transcript); Gemini's JSON-array stream (`application/json`) too."""

from __future__ import annotations

from mitmproxy import contentviews

from finishline import Dialect, stream_dialect, transcribe_stream


class SseChatView(contentviews.Contentview):
    name = "SSE chat"

    def prettify(self, data: bytes, metadata: contentviews.Metadata) -> str:
        dialect = stream_dialect(data)
        return transcribe_stream(data, dialect) if dialect is not None else data.decode("utf-8", "replace")

    def render_priority(self, data: bytes, metadata: contentviews.Metadata) -> float:
        content_type = metadata.content_type or ""
        dialect = stream_dialect(data)
        if content_type.startswith("text/event-stream") and dialect is not None:
            return 2
        if content_type.startswith("application/json") and dialect is Dialect.GEMINI and data.lstrip()[:1] == b"[":
            return 2  # Gemini's JSON-array stream: the answer per candidate, like its SSE form
        return -1
