"""A mitmproxy script the lab loads after finish_fix (`-s addons/finish_fix.py -s this`), so each
cell's report can show the stream exactly as finish_fix sent it on (repaired, or ended with its
error event).

finish_fix attaches its bounded copy of what it sent to `flow.response.raw_content` in its
`response` and `error` hooks; a script loaded after it sees the flow after that. This one appends
one JSON line per flow to the file named by option `finishline_capture`: the request's model name
(which carries the lab's cell id) and the copy, decoded as UTF-8 (at most 64 KB: the report shows
it, nobody reads more). Lab-only: it records message content, which finish_fix's ledger never does.
"""

from __future__ import annotations

import json

from mitmproxy import ctx, http

LIMIT = 64 * 1024


class StreamCapture:
    def load(self, loader) -> None:
        loader.add_option("finishline_capture", str, "", "Append each flow's sent stream to this JSON-lines file (lab only).")

    def _write(self, flow: http.HTTPFlow) -> None:
        path = ctx.options.finishline_capture
        if not path or flow.response is None:
            return
        try:
            model = json.loads(flow.request.raw_content or b"{}").get("model")
        except (ValueError, AttributeError):
            model = None
        body = flow.response.raw_content or b""
        line = {"model": model, "status": flow.response.status_code, "stream": body[:LIMIT].decode("utf-8", "replace")}
        with open(path, "a", encoding="utf-8") as capture:
            capture.write(json.dumps(line) + "\n")

    def response(self, flow: http.HTTPFlow) -> None:
        self._write(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._write(flow)


addons = [StreamCapture()]
