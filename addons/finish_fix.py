"""finish_fix: make every OpenAI-compatible chat-completion stream end the way the spec says.

    mitmdump -s addons/finish_fix.py --mode reverse:https://api.example.com

Streams every `text/event-stream` response; those whose request path matches `finish_fix_paths` go
through finishline's repair core (`addons/finishline/`, standard library only): a missing or empty
`finish_reason` is supplied before `[DONE]`, and a stream the upstream cut gets an explicit SSE error
event instead of just stopping. A cut is never turned into a success unless `finish_fix_on_cut=stop`.
Each flow in scope gets a verdict (flow.metadata["finish_fix"], a mark and comment in mitmweb, and a
line in the optional ledger). The rules are in README.md; this module only adapts them to mitmproxy.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter

from mitmproxy import contentviews, ctx, exceptions, http

import finish_fix_cut_hook
from finish_fix_books import BodyCopy, Ledger, parse_size
from finish_fix_view import SseChatView
from finishline import OnCut, RepairPolicy, RequestFacts, StreamRepair, Verdict, repair_completion

logger = logging.getLogger(__name__)

METADATA_KEY = "finish_fix"
DEFAULT_PATHS = r"(^|/)chat/completions/?$"
MARKS = {Verdict.REPAIRED: ":wrench:", Verdict.INTERRUPTED: ":warning:"}


class _Flow:
    """finish_fix's state for one flow in scope: the repair (None when passing through), the copy of
    what the client was sent, and the verdict once known."""

    __slots__ = ("repair", "copy", "skipped_because", "broken")

    def __init__(self, repair: StreamRepair | None, copy: BodyCopy, skipped_because: str | None = None):
        self.repair = repair
        self.copy = copy
        self.skipped_because = skipped_because
        self.broken = False


class FinishFix:
    def __init__(self) -> None:
        self.paths = re.compile(DEFAULT_PATHS)
        self.policy = RepairPolicy()
        self.copy_limit = 4 * 1024 * 1024
        self.ledger: Ledger | None = None
        self.flows: dict[str, _Flow] = {}
        self.verdicts: Counter[str] = Counter()

    # -- options ------------------------------------------------------------------------------

    def load(self, loader) -> None:
        loader.add_option(
            "finish_fix_paths", str, DEFAULT_PATHS,
            "Regex (Python syntax, searched in the request path without the query) selecting the "
            "requests whose responses finish_fix repairs. The default matches any path ending in "
            "chat/completions, e.g. /v1/chat/completions.",
        )
        loader.add_option(
            "finish_fix_on_cut", str, "error",
            "What the client gets when the upstream stops before the stream finished. "
            "'error': an SSE error event (code stream_interrupted), then the end of the response; "
            "the client raises. 'stop': finishing events and [DONE]; the client sees a success, "
            "which is a lie about an incomplete answer; use only for clients that cannot handle "
            "errors. 'pass': change nothing, only record it.",
            choices=[policy.value for policy in OnCut],
        )
        loader.add_option(
            "finish_fix_empty_to_null", bool, True,
            'Rewrite "finish_reason": "" to null in stream chunks (clients that test the value, '
            "not its truthiness, take \"\" as a real finish reason).",
        )
        loader.add_option(
            "finish_fix_ledger", str, "",
            "Append one JSON line per flow in scope to this file: time, method, URL without query, "
            "status, model, verdict, events, bytes, time to first event, duration, injections. "
            "Never headers, keys or message content. Empty: no ledger.",
        )
        loader.add_option(
            "finish_fix_body_copy", str, "4MB",
            "Keep up to this much of each repaired stream, as sent to the client, so mitmweb can "
            "show it (streamed bodies are otherwise 'content missing'); longer streams keep their "
            "start and end. A size like 4MB, 512KB or 1048576; 0 keeps nothing.",
        )
        contentviews.add(SseChatView)

    def configure(self, updated: set[str]) -> None:
        options = ctx.options
        if "finish_fix_paths" in updated:
            try:
                self.paths = re.compile(options.finish_fix_paths)
            except re.error as e:
                raise exceptions.OptionsError(
                    f"finish_fix_paths: {options.finish_fix_paths!r} is not a valid regex ({e})"
                ) from None
        if "finish_fix_on_cut" in updated or "finish_fix_empty_to_null" in updated:
            valid = [policy.value for policy in OnCut]
            if options.finish_fix_on_cut not in valid:
                raise exceptions.OptionsError(
                    f"finish_fix_on_cut: {options.finish_fix_on_cut!r} is not one of {', '.join(valid)}"
                )
            self.policy = RepairPolicy(
                empty_to_null=options.finish_fix_empty_to_null, on_cut=OnCut(options.finish_fix_on_cut)
            )
        if "finish_fix_body_copy" in updated:
            try:
                self.copy_limit = parse_size(options.finish_fix_body_copy)
            except ValueError as e:
                raise exceptions.OptionsError(f"finish_fix_body_copy: {e}") from None
        if "finish_fix_ledger" in updated:
            if self.ledger is not None:
                self.ledger.close()
            self.ledger = None
            if options.finish_fix_ledger:
                try:
                    self.ledger = Ledger(options.finish_fix_ledger)
                except OSError as e:
                    raise exceptions.OptionsError(
                        f"finish_fix_ledger: cannot append to {options.finish_fix_ledger!r} ({e.strerror})"
                    ) from None

    def running(self) -> None:
        # Installed here rather than in load: a hot reload calls done() on the old instance first.
        finish_fix_cut_hook.install(self._on_cut)

    def done(self) -> None:
        finish_fix_cut_hook.uninstall()
        if self.verdicts:
            counts = ", ".join(f"{count} {verdict}" for verdict, count in self.verdicts.most_common())
            logger.info(f"finish_fix: {sum(self.verdicts.values())} flows in scope: {counts}")
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None

    # -- hooks --------------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self._in_scope(flow):
            # Compressed streams cannot be repaired in flight (mitmproxy does not decode streamed
            # bodies), so ask the upstream for the plain body. Reaches it before the request head.
            flow.request.headers["accept-encoding"] = "identity"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        if not _is_event_stream(response):
            return  # buffered by mitmproxy; rule 9 runs in `response`
        if not self._in_scope(flow):
            response.stream = True
            return
        copy = BodyCopy(self.copy_limit)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if response.status_code >= 400:
            state = _Flow(None, copy)
        elif encoding not in ("", "identity"):
            state = _Flow(None, copy, f"compressed body ({encoding}) passed through untouched")
        else:
            repair = StreamRepair(
                request=RequestFacts.from_body(flow.request.raw_content),
                policy=self.policy,
                started_at=flow.request.timestamp_start,
            )
            state = _Flow(repair, copy)
            _let_the_body_length_change(flow)
        self.flows[flow.id] = state
        response.stream = lambda data: self._on_body(flow, state, data)

    def response(self, flow: http.HTTPFlow) -> None:
        state = self.flows.pop(flow.id, None)
        if state is not None:
            self._close_books(flow, state)
        elif self._in_scope(flow) and flow.response is not None and not flow.response.stream:
            self._on_whole_response(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        state = self.flows.pop(flow.id, None)
        if state is None:
            if self._in_scope(flow) and flow.response is None and flow.error is not None:
                # mitmproxy answered the client itself (e.g. 502): no stream to repair.
                self._book(flow, Verdict.HTTP_ERROR, f"http_error: no upstream response ({flow.error.msg})", {})
            return
        repair = state.repair
        if repair is not None and not state.broken and not repair.ended:
            # Not an upstream cut (that comes through the hook first): the client went away or the
            # flow was killed. Nothing can be sent any more; close the books.
            repair.receive_abort(flow.error.msg if flow.error else "unknown error", now=time.time())
        self._close_books(flow, state)

    # -- streaming ----------------------------------------------------------------------------

    def _on_body(self, flow: http.HTTPFlow, state: _Flow, data: bytes) -> bytes | list[bytes]:
        """The response's stream callable. Must never raise (mitmproxy would drop the piece and
        corrupt the client's body) and never return b"" mid-stream (that ends a chunked body)."""
        repair = state.repair
        out = data
        if repair is not None and not state.broken:
            try:
                out = repair.receive_data(data, now=time.time()) if data else repair.receive_end(now=time.time())
            except Exception:
                out = self._give_up(flow, state) + data
        state.copy.add(out)
        return [out] if out else []

    def _on_cut(self, flow: http.HTTPFlow, message: str) -> finish_fix_cut_hook.CutAction | None:
        """The upstream died mid-body (called from the one private hook)."""
        state = self.flows.get(flow.id)
        if state is None or state.repair is None or state.broken:
            return None
        try:
            out = state.repair.receive_failure(message, now=time.time())
        except Exception:
            self._give_up(flow, state)
            return None
        state.copy.add(out)
        return finish_fix_cut_hook.CutAction(out, end_response=state.repair.ends_cleanly)

    def _give_up(self, flow: http.HTTPFlow, state: _Flow) -> bytes:
        """An internal error: pass the rest of this flow through unchanged, and say so once."""
        logger.exception(f"finish_fix: internal error on {_url(flow)}; passing this flow through unchanged")
        state.broken = True
        assert state.repair is not None
        try:
            return state.repair.abandon()
        except Exception:
            return b""

    # -- non-streaming (rule 9) ----------------------------------------------------------------

    def _on_whole_response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        if response.status_code >= 400:
            self._book(flow, Verdict.HTTP_ERROR, f"http_error: HTTP {response.status_code}", {})
            return
        if "json" not in response.headers.get("content-type", ""):
            self._book(flow, Verdict.SKIPPED, "skipped: not an event stream or a JSON chat completion", {})
            return
        body = response.get_content(strict=False)
        if body is None:
            self._book(flow, Verdict.SKIPPED, "skipped: body could not be decoded", {})
            return
        repaired = repair_completion(body, RequestFacts.from_body(flow.request.raw_content))
        if repaired is None:
            self._book(flow, Verdict.CLEAN, "clean", {"bytes": len(body)})
            return
        new_body, repairs = repaired
        response.set_content(new_body)
        self._book(flow, Verdict.REPAIRED, "repaired: " + "; ".join(repairs), {"bytes": len(new_body), "repairs": repairs})

    # -- books --------------------------------------------------------------------------------

    def _close_books(self, flow: http.HTTPFlow, state: _Flow) -> None:
        if flow.response is not None and state.copy.limit:
            flow.response.raw_content = state.copy.value()
        repair = state.repair
        if repair is None or state.broken:
            if flow.response is not None and flow.response.status_code >= 400:
                self._book(flow, Verdict.HTTP_ERROR, f"http_error: HTTP {flow.response.status_code}", {})
            else:
                why = "internal error, passed through unchanged" if state.broken else state.skipped_because
                self._book(flow, Verdict.SKIPPED, f"skipped: {why}", {})
            return
        report = repair.report
        self._book(flow, report.verdict, report.detail, report.as_json())

    def _book(self, flow: http.HTTPFlow, verdict: Verdict, detail: str, record: dict) -> None:
        record = {**record, "verdict": str(verdict), "detail": detail}
        flow.metadata[METADATA_KEY] = record
        if verdict in MARKS:
            flow.marked = MARKS[verdict]
        if verdict is not Verdict.CLEAN:
            flow.comment = f"finish_fix: {detail}"
        self.verdicts[str(verdict)] += 1
        if self.ledger is not None:
            self.ledger.write(flow, record)

    def _in_scope(self, flow: http.HTTPFlow) -> bool:
        return self.paths.search(flow.request.path.partition("?")[0]) is not None


def _is_event_stream(response: http.Response) -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip().lower() == "text/event-stream"


def _let_the_body_length_change(flow: http.HTTPFlow) -> None:
    """A repair adds bytes, so the upstream's Content-Length would make the client stop reading
    before the finish or the error event. mitmproxy sends the headers as the addon leaves them:
    drop the length and, for an HTTP/1.1 client, chunk the body (HTTP/2 ends streams by itself;
    HTTP/1.0 reads to the close)."""
    headers = flow.response.headers
    if "content-length" not in headers:
        return
    del headers["content-length"]
    if flow.request.http_version == "HTTP/1.1" and not flow.response.is_http2 and not flow.response.is_http3:
        headers["transfer-encoding"] = "chunked"


def _url(flow: http.HTTPFlow) -> str:
    return flow.request.pretty_url.partition("?")[0]


addons = [FinishFix()]
