"""The finish_fix addon: mitmproxy's hooks, what each flow in scope goes through, and its books.

Loaded by its script (`addons/finish_fix.py` in a checkout, `finishline/addon/finish_fix.py` in the
package: `finish-fix --addon-path`), which only makes one `FinishFix`:

    mitmdump -s addons/finish_fix.py --mode reverse:https://api.example.com

Streams every `text/event-stream` response; those whose request path matches `finish_fix_paths`
(Chat Completions), `finish_fix_messages_paths` (Anthropic Messages), `finish_fix_responses_paths`
(OpenAI Responses) or `finish_fix_gemini_paths` (Google Gemini, whose `:streamGenerateContent`
without `alt=sse` streams one JSON array as `application/json`) go through finishline's repair core (the `finishline` package, standard library
only) in that dialect: a missing or empty `finish_reason` (Messages: `stop_reason`) is supplied before the
terminator, and a stream the upstream cut gets the dialect's explicit error event instead of just
stopping, and so does one that goes silent past a deadline
(`finish_fix_idle_timeout`, `finish_fix_first_token_timeout`). A cut is never turned into a success
unless `finish_fix_on_cut=stop`.
Each flow in scope gets a verdict (flow.metadata["finish_fix"], a mark and comment in mitmweb, and a
line in the optional ledger). The rules are in docs/repair-rules.md; this module only adapts them to mitmproxy.

Optionally the books also go where operators look: Prometheus metrics (`finish_fix_metrics`,
`finishline.addon.metrics`) and one OpenTelemetry span per flow (`finish_fix_otlp`,
`finishline.addon.traces`), both updated when a flow's books close, never per piece, and imported
only when their option is set.

Only the script hot-reloads (a new `FinishFix` takes over); this module and the rest of the package
(the core, the options, the stream callable, the cut hook, books, view, metrics, traces) are
imported once, so editing those needs a restart.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import replace
from typing import Any

from mitmproxy import contentviews, ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from finishline import (
    Booking,
    Dialect,
    RepairPolicy,
    RequestFacts,
    ShapeBook,
    StreamRepair,
    Verdict,
    book_missing_response,
    gemini_request_facts,
    is_stream_path,
    repair_completion,
)
from finishline.addon import cut_hook
from finishline.addon.books import BodyCopy, Ledger, parse_size
from finishline.addon.options import (
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    PATH_OPTIONS,
    POLICY_OPTIONS,
    declare_options,
    path_regex,
    read_policy,
)
from finishline.addon.stream import ClientStream, GeminiBodyWait, HeadWait, stream_of
from finishline.addon.telemetry import Telemetry
from finishline.addon.view import SseChatView

__all__ = ["METADATA_KEY", "FinishFix"]

logger = logging.getLogger(__name__)

METADATA_KEY = "finish_fix"
# At most this many request paths' dialects are remembered (`FinishFix._dialect_of`).
_KNOWN_PATHS = 1024
MARKS = {Verdict.REPAIRED: ":wrench:", Verdict.INTERRUPTED: ":warning:", Verdict.MALFORMED: ":x:"}


def _request_facts(flow: http.HTTPFlow, dialect: Dialect | None) -> RequestFacts:
    """The request's facts, with the time it was sent in whole Unix seconds (rule R8's `created_at`);
    a Gemini request's also from its path (whether and how it streams, its model)."""
    facts = RequestFacts.from_body(flow.request.raw_content, created_at=int(flow.request.timestamp_start))
    if dialect is Dialect.GEMINI:
        path, _, query = flow.request.path.partition("?")
        return gemini_request_facts(facts, path, query)
    return facts


class FinishFix:
    def __init__(self) -> None:
        # Per dialect, the compiled path regex (None: that dialect is off).
        self.paths: dict[Dialect, re.Pattern[str] | None] = {
            dialect: re.compile(default) for dialect, (_, default) in PATH_OPTIONS.items()
        }
        # `_dialect_of`'s answers by path: each flow asks three times (request head, request,
        # response head), and a proxy serves few paths. Emptied when the paths change.
        self._dialect_by_path: dict[str, Dialect | None] = {}
        self.policy = RepairPolicy(
            idle_timeout=float(DEFAULT_IDLE_TIMEOUT), first_token_timeout=float(DEFAULT_FIRST_TOKEN_TIMEOUT)
        )
        # The routine delta shapes this proxy's streams learned, templates for the next streams'
        # (`finishline.ShapeBook`: a stream then learns its own without probe parses).
        self.shapes = ShapeBook()
        self.copy_limit = 4 * 1024 * 1024
        self.ledger: Ledger | None = None
        self.verdicts: Counter[str] = Counter()
        # The metrics and spans, while `finish_fix_metrics` and `finish_fix_otlp` ask for them.
        self.telemetry = Telemetry()

    # -- options ------------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        declare_options(loader)
        contentviews.add(SseChatView)

    def configure(self, updated: set[str]) -> None:
        try:
            self._apply_options(updated)
        except exceptions.OptionsError as refused:
            ours = {name for name in ctx.options.keys() if name.startswith("finish_fix_")}
            if not ours <= updated:
                raise  # a change while running: mitmproxy keeps the old value and shows this line
            # Every option at once is the script loader's call (at start, or a hot reload), which
            # logs what configure raises with its traceback around the one line that matters. The
            # line alone, logged as an error at start, makes mitmdump and mitmweb exit 1 all the
            # same (their ErrorCheck addon).
            logger.error(str(refused))

    def _apply_options(self, updated: set[str]) -> None:
        options = ctx.options
        for dialect, (option, _) in PATH_OPTIONS.items():
            if option in updated:
                self.paths[dialect] = path_regex(option, getattr(options, option))
                self._dialect_by_path.clear()
        if POLICY_OPTIONS & updated:
            self.policy = read_policy(options)
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
        if "finish_fix_metrics" in updated:
            self._serve_metrics(options.finish_fix_metrics)
        if "finish_fix_otlp" in updated:
            self._export_spans(options.finish_fix_otlp)

    def _serve_metrics(self, address: str) -> None:
        try:
            self.telemetry.serve_metrics(address)
        except ValueError as e:
            raise exceptions.OptionsError(f"finish_fix_metrics: {e}") from None

    def _export_spans(self, url: str) -> None:
        try:
            self.telemetry.export_spans(url)
        except ValueError as e:
            raise exceptions.OptionsError(f"finish_fix_otlp: {e}") from None

    def running(self) -> None:
        # The hook finds each flow's handler on the flow (its ClientStream), not on this instance:
        # flows streaming across a hot reload keep their state.
        cut_hook.install()

    def done(self) -> None:
        """Shutdown, or the old instance on a hot reload (the new one installs the hook again)."""
        cut_hook.uninstall()
        if self.verdicts:
            counts = ", ".join(f"{count} {verdict}" for verdict, count in self.verdicts.most_common())
            logger.info(f"finish_fix: {sum(self.verdicts.values())} flows in scope: {counts}")
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None
        self.telemetry.close()

    # -- hooks --------------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self._dialect_of(flow) is not None:
            # Compressed streams cannot be repaired in flight (mitmproxy does not decode streamed
            # bodies), so ask the upstream for the plain body. Reaches it before the request head.
            flow.request.headers["accept-encoding"] = "identity"

    def request(self, flow: http.HTTPFlow) -> None:
        # The first-token deadline starts when the request goes upstream (the cut hook says when),
        # so that a response head that never comes is caught too. Only for a request that asked
        # for a stream: a whole answer's head comes with the answer, after all its tokens.
        dialect = self._dialect_of(flow)
        if dialect is None or self.policy.first_token_timeout <= 0:
            return
        request = _request_facts(flow, dialect)
        if request.stream:
            cut_hook.watch_head(flow, HeadWait(dialect, self.policy, request, flow.request.timestamp_start))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        dialect = self._dialect_of(flow)
        if not _is_event_stream(response) and not _is_gemini_array_stream(flow, dialect):
            if dialect is Dialect.GEMINI:  # G6, even for a body the upstream cuts before its end
                cut_hook.watch_whole_body(flow, GeminiBodyWait.of(response, _request_facts(flow, dialect), self.policy))
            return  # buffered by mitmproxy; rules C9 and G6 run in `response`
        if dialect is None:
            response.stream = True
            return
        encoding = _content_encoding(response)
        # The request's watch, if it waited for this head: the first-token deadline counts from the
        # moment the request went upstream, not from this head, and its facts are read already.
        watch = cut_hook.head_watch_of(flow)
        waited = watch if isinstance(watch, HeadWait) else None
        repair = StreamRepair(
            dialect=dialect,
            request=waited.request if waited is not None else _request_facts(flow, dialect),
            policy=self.policy,
            started_at=flow.request.timestamp_start,
            sent_at=waited.sent_at if waited is not None else None,
            status=response.status_code,
            content_encoding=encoding,
            shapes=self.shapes,
        )
        if repair.repairing:
            _let_the_body_length_change(flow)
        stream = response.stream = ClientStream(repair, BodyCopy(self.copy_limit, plain=not encoding))
        stream.in_flight = self.telemetry.stream_started(dialect)

    def response(self, flow: http.HTTPFlow) -> None:
        stream = stream_of(flow)
        if stream is not None:
            if not stream.called and flow.response is not None:  # (it is: the stream is on it)
                # mitmproxy never streamed this body (it was empty): what the repair adds is sent
                # as the body, since for such a response the `response` hook runs before sending.
                flow.response.content = stream.finish_unstreamed()
            self._close_books(flow, stream)
        elif flow.response is not None and not flow.response.stream and (dialect := self._dialect_of(flow)) is not None:
            self._on_whole_response(flow, dialect)

    def error(self, flow: http.HTTPFlow) -> None:
        stream = stream_of(flow)
        if stream is None:
            body_wait = cut_hook.whole_body_watch_of(flow)
            if isinstance(body_wait, GeminiBodyWait) and body_wait.answer is not None:
                # A whole body cut mid-way: the cut hook answered the client with the core's answer (G6).
                self._book(flow, body_wait.booking(body_wait.answer), body_wait.request)
                return
            watch = cut_hook.head_watch_of(flow)
            if isinstance(watch, HeadWait) and watch.answer is not None:
                # No response head in time: the cut hook answered the client with the core's answer.
                self._book(flow, watch.answer.booking, watch.request)
                return
            dialect = self._dialect_of(flow)
            if dialect is not None and flow.response is None and flow.error is not None:
                client_gone = flow.error.msg.lower().startswith("client disconnected")
                request = _request_facts(flow, dialect)
                missing = book_missing_response(flow.error.msg, client_gone=client_gone, model=request.model, dialect=dialect)
                self._book(flow, missing, request)
            return
        # An upstream cut or a stall came through the hook first; anything else ended on the client's side.
        stream.on_client_gone(flow.error.msg if flow.error else "unknown error")
        self._close_books(flow, stream)

    # -- non-streaming (rule C9) ----------------------------------------------------------------

    def _on_whole_response(self, flow: http.HTTPFlow, dialect: Dialect) -> None:
        response = flow.response
        assert response is not None
        request = _request_facts(flow, dialect)
        wait = cut_hook.whole_body_watch_of(flow)
        if isinstance(wait, GeminiBodyWait):  # G6, G7
            answer = wait.judge(response.raw_content or b"", cut=False)
            if answer.status != response.status_code:  # a cut body: the core's 503 (G6)
                flow.response = http.Response.make(
                    answer.status, answer.body, {"content-type": "application/json; charset=UTF-8"}
                )
            elif answer.verdict is Verdict.REPAIRED:
                response.content = answer.body
            self._book(flow, wait.booking(answer), wait.request)
            return
        result = repair_completion(
            response.raw_content or b"",
            request,
            status=response.status_code,
            content_type=response.headers.get("content-type", ""),
            content_encoding=_content_encoding(response),
            dialect=dialect,
            policy=self.policy,
        )
        if result.verdict is Verdict.REPAIRED:
            response.content = result.body
        self._book(
            flow,
            Booking(
                verdict=result.verdict,
                detail=result.detail,
                model=request.model,
                dialect=dialect,
                client_bytes=len(result.body),
                repairs=tuple(result.repairs),
                corrections=result.corrections,
            ),
            request,
        )

    # -- books --------------------------------------------------------------------------------

    def _close_books(self, flow: http.HTTPFlow, stream: ClientStream) -> None:
        if flow.response is not None and stream.copy.limit:
            flow.response.raw_content = stream.copy.value()
        report = stream.repair.report
        if stream.in_flight is not None:
            stream.in_flight.stream_ended(report.dialect)
            stream.in_flight = None
        comment = report.detail
        if report.upstream_error_message:
            comment += f": {report.upstream_error_message}"
        self._book(
            flow,
            report.booking(),
            stream.repair.request,
            account=report.as_json(),
            comment=comment,
        )

    def _book(
        self,
        flow: http.HTTPFlow,
        booking: Booking,
        request: RequestFacts,
        *,
        account: dict[str, Any] | None = None,
        comment: str | None = None,
    ) -> None:
        """Books one flow: its metadata (the booking, over a stream's fuller `account`), mark,
        comment, ledger line, metrics and span (`request`: what its request body said)."""
        if booking.duration is None and flow.response is not None and flow.response.timestamp_end:
            booking = replace(booking, duration=flow.response.timestamp_end - flow.request.timestamp_start)
        flow.metadata[METADATA_KEY] = {**(account or {}), **booking.to_json()}
        verdict = booking.verdict
        if verdict in MARKS:
            flow.marked = MARKS[verdict]
        if verdict is not Verdict.CLEAN:
            flow.comment = f"finish_fix: {comment or booking.detail}"
        self.verdicts[str(verdict)] += 1
        if self.ledger is not None:
            self.ledger.write(flow, booking)
        if self.telemetry.on:
            self.telemetry.booked(
                booking,
                request,
                server=(flow.request.host, flow.request.port),
                headers=flow.request.headers,
                started_at=flow.request.timestamp_start,
            )

    def _dialect_of(self, flow: http.HTTPFlow) -> Dialect | None:
        """The dialect whose path option matches the request's path (without the query), tried in
        the order Chat, Messages, Responses, Gemini; None when the flow is not in scope."""
        path = flow.request.path.partition("?")[0]
        known = self._dialect_by_path
        if path in known:
            return known[path]
        found = None
        for dialect, regex in self.paths.items():
            if regex is not None and regex.search(path) is not None:
                found = dialect
                break
        if len(known) >= _KNOWN_PATHS:  # paths with ids in them: keep the memory bounded
            known.clear()
        known[path] = found
        return found


def _is_event_stream(response: http.Response) -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip().lower() == "text/event-stream"


def _is_gemini_array_stream(flow: http.HTTPFlow, dialect: Dialect | None) -> bool:
    """A Gemini stream as one JSON array (no `alt=sse`): repaired like an event stream, not buffered."""
    response = flow.response
    assert response is not None
    stream = dialect is Dialect.GEMINI and is_stream_path(flow.request.path.partition("?")[0])
    return stream and response.status_code < 400 and "json" in response.headers.get("content-type", "").lower()


def _content_encoding(response: http.Response) -> str:
    """The body's content coding, or "" when it is plain."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    return "" if encoding in ("", "identity") else encoding


def _let_the_body_length_change(flow: http.HTTPFlow) -> None:
    """A repair adds bytes, so the upstream's Content-Length would make the client stop reading
    before the finish or the error event. mitmproxy sends the headers as the addon leaves them:
    drop the length and, between HTTP/1.1 peers, chunk the body (HTTP/2 ends streams by itself; an
    HTTP/1.0 response is read to the close)."""
    response = flow.response
    assert response is not None  # called from `responseheaders`
    headers = response.headers
    if "content-length" not in headers:
        return
    del headers["content-length"]
    if flow.request.http_version == "HTTP/1.1" and response.http_version == "HTTP/1.1":
        headers["transfer-encoding"] = "chunked"
