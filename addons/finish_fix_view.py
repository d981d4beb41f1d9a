"""A mitmweb content view that shows an SSE chat-completion stream as numbered events plus the
answer reassembled per choice (finishline's transcript)."""

from __future__ import annotations

from mitmproxy import contentviews

from finishline import looks_like_chat_stream, transcribe_chat_stream


class SseChatView(contentviews.Contentview):
    name = "SSE chat"

    def prettify(self, data: bytes, metadata: contentviews.Metadata) -> str:
        return transcribe_chat_stream(data)

    def render_priority(self, data: bytes, metadata: contentviews.Metadata) -> float:
        if (metadata.content_type or "").startswith("text/event-stream") and looks_like_chat_stream(data):
            return 2
        return -1
