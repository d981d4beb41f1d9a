"""A mitmweb content view that shows an event stream in any of the three dialects as numbered events
plus the answer reassembled per choice, content block or output item (finishline's transcript)."""

from __future__ import annotations

from mitmproxy import contentviews

from finishline import stream_dialect, transcribe_stream


class SseChatView(contentviews.Contentview):
    name = "SSE chat"

    def prettify(self, data: bytes, metadata: contentviews.Metadata) -> str:
        dialect = stream_dialect(data)
        return transcribe_stream(data, dialect) if dialect is not None else data.decode("utf-8", "replace")

    def render_priority(self, data: bytes, metadata: contentviews.Metadata) -> float:
        if (metadata.content_type or "").startswith("text/event-stream") and stream_dialect(data) is not None:
            return 2
        return -1
