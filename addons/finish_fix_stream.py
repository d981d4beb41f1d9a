"""A response's stream callable, carrying finish_fix's state for that flow.

mitmproxy calls `flow.response.stream` with each piece of the body; this object runs the pieces
through the repair core and keeps the bounded copy of what the client was sent. The state lives on
the flow (the callable is `flow.response.stream`), not on the addon instance, and this module is a
sibling of the addon script, which mitmproxy does not re-import on a hot reload: a flow that is
streaming while the script reloads is still repaired, cut and booked by the new instance.
"""

from __future__ import annotations

import logging
import time

from mitmproxy import http

from finish_fix_books import BodyCopy
from finish_fix_cut_hook import CutAction
from finishline import StreamRepair

__all__ = ["ClientStream", "stream_of", "on_upstream_failure"]

logger = logging.getLogger(__name__)


class ClientStream:
    """The stream callable of one flow in finish_fix's scope.

    Args:
        repair: the repair machine, or None to pass the body through (and only keep the copy).
        copy: the bounded copy of what the client was sent.
        skipped_because: why the body is passed through, when `repair` is None.
    """

    def __init__(self, repair: StreamRepair | None, copy: BodyCopy, skipped_because: str | None = None) -> None:
        self.repair = repair
        self.copy = copy
        self.skipped_because = skipped_because
        self.called = False
        self._logged = False

    def __call__(self, data: bytes) -> list[bytes]:
        """Must never raise (mitmproxy would drop the piece and corrupt the client's body) and never
        return b"" mid-stream (on HTTP/1.1 that is written as the chunked terminator)."""
        self.called = True
        out = data
        repair = self.repair
        if repair is not None:
            try:
                out = repair.receive_data(data, now=time.time()) if data else repair.receive_end(now=time.time())
            except Exception:
                # The core passes its own bugs through exactly; reaching here means misuse (e.g. data
                # after the end). Pass the piece on and stop repairing.
                logger.exception("finish_fix: repair failed; passing the rest of this flow through unchanged")
                self.repair = None
                self.skipped_because = "internal error, passed through unchanged"
                out = data
            self.log_internal_error_once()
        self.copy.add(out)
        return [out] if out else []

    def finish_unstreamed(self) -> bytes:
        """For a response mitmproxy never streamed (an empty body: Content-Length 0, or HTTP/2
        headers that end the stream): the bytes the repair adds at the end (rule 7)."""
        self.called = True
        if self.repair is None or self.repair.ended:
            return b""
        out = self.repair.receive_end(now=time.time())
        self.copy.add(out)
        return out

    def on_upstream_failure(self, message: str) -> CutAction | None:
        if self.repair is None or self.repair.ended:
            return None
        failure = self.repair.receive_failure(message, now=time.time())
        self.log_internal_error_once()
        self.copy.add(failure.client_bytes)
        return CutAction(failure.client_bytes, end_response=failure.end_response)

    def on_client_gone(self, message: str) -> None:
        if self.repair is not None and not self.repair.ended:
            self.repair.receive_client_gone(message, now=time.time())

    def log_internal_error_once(self) -> None:
        if self.repair is not None and self.repair.report.internal_error and not self._logged:
            self._logged = True
            logger.error(f"finish_fix: {self.repair.report.detail}")


def stream_of(flow: http.HTTPFlow) -> ClientStream | None:
    """The flow's ClientStream, if finish_fix attached one."""
    stream = flow.response.stream if flow.response is not None else None
    return stream if isinstance(stream, ClientStream) else None


def on_upstream_failure(flow: http.HTTPFlow, message: str) -> CutAction | None:
    """The cut hook's handler: the upstream died mid-body."""
    stream = stream_of(flow)
    return stream.on_upstream_failure(message) if stream is not None else None
