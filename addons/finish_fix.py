"""finish_fix: make every OpenAI-compatible stream end the way its spec says, in four dialects.

    mitmdump -s addons/finish_fix.py --mode reverse:https://api.example.com

Streams every `text/event-stream` response; those whose request path matches `finish_fix_paths`
(Chat Completions), `finish_fix_messages_paths` (Anthropic Messages), `finish_fix_responses_paths`
(OpenAI Responses) or `finish_fix_gemini_paths` (Google Gemini, whose `:streamGenerateContent`
without `alt=sse` streams one JSON array as `application/json`) go through finishline's repair core (`addons/finishline/`, standard library only)
in that dialect: a missing or empty `finish_reason` (Messages: `stop_reason`) is supplied before the
terminator, and a stream the upstream cut gets the dialect's explicit error event instead of just
stopping, and so does one that goes silent past a deadline
(`finish_fix_idle_timeout`, `finish_fix_first_token_timeout`). A cut is never turned into a success
unless `finish_fix_on_cut=stop`.
Each flow in scope gets a verdict (flow.metadata["finish_fix"], a mark and comment in mitmweb, and a
line in the optional ledger). The rules are in docs/repair-rules.md; this module only adapts them to mitmproxy.

Optionally the books also go where operators look: Prometheus metrics (`finish_fix_metrics`,
addons/finish_fix_metrics.py) and one OpenTelemetry span per flow (`finish_fix_otlp`,
addons/finish_fix_traces.py), both updated when a flow's books close, never per piece, and imported
only when their option is set.

Only this file hot-reloads; its sibling modules (the core, the stream callable, the cut hook, books,
view, metrics, traces) are imported once, so editing those needs a restart.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import replace
from typing import Any

from mitmproxy import contentviews, ctx, exceptions, http

import finish_fix_cut_hook
from finish_fix_books import BodyCopy, Ledger, parse_size
from finish_fix_stream import ClientStream, GeminiBodyWait, HeadWait, stream_of
from finish_fix_telemetry import Telemetry
from finish_fix_view import SseChatView
from finishline import (
    Booking,
    Dialect,
    NumberRefused,
    OnCut,
    RepairPolicy,
    RequestFacts,
    StreamRepair,
    Verdict,
    book_missing_response,
    gemini_request_facts,
    is_stream_path,
    read_number,
    repair_completion,
)

logger = logging.getLogger(__name__)

METADATA_KEY = "finish_fix"
DEFAULT_PATHS = r"(^|/)chat/completions/?$"
DEFAULT_MESSAGES_PATHS = r"(^|/)messages/?$"
DEFAULT_RESPONSES_PATHS = r"(^|/)responses/?$"
# Every client and gateway puts its own prefix before the model (`/v1/models/…`, `/v1beta/…`,
# Vertex's `/v1beta1/projects/…`, LiteLLM's `/models/…` and `/gemini/…`, Code Assist's
# `/v1internal`): only the method suffix is common to them all.
DEFAULT_GEMINI_PATHS = r":(streamGenerateContent|generateContent)$"
# Each dialect's path option and its default, in the order a path is tried against them.
PATH_OPTIONS = {
    Dialect.CHAT: ("finish_fix_paths", DEFAULT_PATHS),
    Dialect.MESSAGES: ("finish_fix_messages_paths", DEFAULT_MESSAGES_PATHS),
    Dialect.RESPONSES: ("finish_fix_responses_paths", DEFAULT_RESPONSES_PATHS),
    Dialect.GEMINI: ("finish_fix_gemini_paths", DEFAULT_GEMINI_PATHS),
}
MARKS = {Verdict.REPAIRED: ":wrench:", Verdict.INTERRUPTED: ":warning:", Verdict.MALFORMED: ":x:"}
BOOLEANS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "1": True, "0": False}
# Stall deadlines, in seconds (docs/options.md "Why the deadlines' defaults" says why these values).
DEFAULT_IDLE_TIMEOUT = "120"
DEFAULT_FIRST_TOKEN_TIMEOUT = "600"
POLICY_OPTIONS = {
    "finish_fix_on_cut",
    "finish_fix_empty_to_null",
    "finish_fix_idle_timeout",
    "finish_fix_first_token_timeout",
    "finish_fix_limit_reasons",
    "finish_fix_responses_indexes",
    "finish_fix_responses_fields",
}


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
        self.policy = RepairPolicy(
            idle_timeout=float(DEFAULT_IDLE_TIMEOUT), first_token_timeout=float(DEFAULT_FIRST_TOKEN_TIMEOUT)
        )
        self.copy_limit = 4 * 1024 * 1024
        self.ledger: Ledger | None = None
        self.verdicts: Counter[str] = Counter()
        # The metrics and spans, while `finish_fix_metrics` and `finish_fix_otlp` ask for them.
        self.telemetry = Telemetry()

    # -- options ------------------------------------------------------------------------------

    def load(self, loader) -> None:
        loader.add_option(
            "finish_fix_paths",
            str,
            DEFAULT_PATHS,
            "Regex (Python syntax, searched in the request path without the query) selecting the "
            "requests whose responses finish_fix repairs as Chat Completions. The default matches any "
            "path ending in chat/completions, e.g. /v1/chat/completions. Empty: Chat is off.",
        )
        loader.add_option(
            "finish_fix_messages_paths",
            str,
            DEFAULT_MESSAGES_PATHS,
            "Regex searched in the request path selecting the requests repaired as Anthropic "
            "Messages. The default matches any path ending in messages, e.g. /v1/messages or "
            "/anthropic/v1/messages, but not /v1/messages/count_tokens. Empty: Messages is off.",
        )
        loader.add_option(
            "finish_fix_responses_paths",
            str,
            DEFAULT_RESPONSES_PATHS,
            "Regex searched in the request path selecting the requests repaired as OpenAI "
            "Responses. The default matches any path ending in responses, e.g. /v1/responses. "
            "Empty: Responses is off.",
        )
        loader.add_option(
            "finish_fix_gemini_paths",
            str,
            DEFAULT_GEMINI_PATHS,
            "Regex searched in the request path (without the query, so ?alt=sse does not matter) "
            "selecting the requests repaired as Google Gemini: streams (SSE, or the JSON array "
            "without alt=sse) and whole :generateContent bodies. The default matches any path ending "
            "in :streamGenerateContent or :generateContent, e.g. "
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent. Empty: Gemini is off.",
        )
        loader.add_option(
            "finish_fix_on_cut",
            str,
            "error",
            "What the client gets when the upstream stops before the stream finished. "
            "'error': an SSE error event (code stream_interrupted), then the end of the response; "
            "the client raises. 'stop': finishing events and [DONE]; the client sees a success, "
            "which is a lie about an incomplete answer; use only for clients that cannot handle "
            "errors. 'pass': change nothing, only record it.",
            choices=[policy.value for policy in OnCut],
        )
        loader.add_option(
            # A str, not a bool: mitmproxy silently ignores a --set value that does not parse for a
            # script's bool option, so a typo would go unnoticed. Validated in `configure`.
            "finish_fix_empty_to_null",
            str,
            "true",
            'Rewrite "finish_reason": "" to null in stream chunks (true or false; clients that test '
            'the value, not its truthiness, take "" as a real finish reason).',
            choices=sorted(BOOLEANS),
        )
        loader.add_option(
            "finish_fix_limit_reasons",
            str,
            "true",
            "Correct a finish reason that hides the request's token limit (true or false): with the "
            "output tokens at or past max_tokens / max_completion_tokens / max_output_tokens, Chat "
            "'stop' becomes 'length' (when usage is in the stream or body), Messages 'end_turn' "
            "becomes 'max_tokens' (and 'end_turn' with a stop_sequence becomes 'stop_sequence'), and "
            "a Responses 'response.completed' becomes 'response.incomplete' with incomplete_details "
            "reason max_output_tokens (llama.cpp and Ollama never say incomplete). Streams and whole "
            "bodies; a request without a limit is never touched.",
            choices=sorted(BOOLEANS),
        )
        loader.add_option(
            "finish_fix_responses_indexes",
            str,
            "true",
            "Fill in the sequence_number, output_index and content_index a Responses event lacks "
            "(true or false), from the stream's own order: llama.cpp sends none, and openai-python's "
            "responses.stream() helper then fails. A value the server sent is never changed.",
            choices=sorted(BOOLEANS),
        )
        loader.add_option(
            "finish_fix_responses_fields",
            str,
            "true",
            "Fill in the created_at and model a Responses response.created or response.in_progress "
            "lacks (true or false), from the request: its model, and the time it was sent. llama.cpp "
            "sends neither there, and the AI SDK then fails the whole stream. A value the server sent "
            "is never changed.",
            choices=sorted(BOOLEANS),
        )
        loader.add_option(
            "finish_fix_ledger",
            str,
            "",
            "Append one JSON line per flow in scope to this file: time, method, URL without query, "
            "status, model, dialect (chat, messages or responses), verdict, events, bytes, time to "
            "first event, duration, injections. "
            "Never headers, keys or message content. Empty: no ledger.",
        )
        loader.add_option(
            "finish_fix_body_copy",
            str,
            "4MB",
            "Keep up to this much of each repaired stream, as sent to the client, so mitmweb can "
            "show it (streamed bodies are otherwise 'content missing'); longer streams keep their "
            "start and end. A size like 4MB, 512KB or 1048576; 0 keeps nothing.",
        )
        loader.add_option(
            # Seconds as a str: mitmproxy's --set cannot parse a float option.
            "finish_fix_idle_timeout",
            str,
            DEFAULT_IDLE_TIMEOUT,
            "Seconds allowed between two SSE events once the first token arrived (once the first "
            "event arrived when finish_fix_first_token_timeout is 0, since until the first token "
            "that deadline governs); comments and keep-alive lines do not count, so they cannot "
            "hide a stall. Past it the client gets an "
            "error event (code stream_interrupted; finish_fix_on_cut applies), its response ends, "
            "and the upstream connection is closed. 0 = no limit. The default, 120, is above the "
            "60-100 s idle timeouts of common load balancers and far above any pause between "
            "tokens of a live stream.",
        )
        loader.add_option(
            "finish_fix_first_token_timeout",
            str,
            DEFAULT_FIRST_TOKEN_TIMEOUT,
            "Seconds allowed from the moment a streaming request went upstream to its first token "
            "(content, reasoning, a refusal or a tool call); past it the stream ends as for "
            "finish_fix_idle_timeout, and a request whose response head has not even come is "
            "answered at once with HTTP 504 and the dialect's error body (the upstream connection "
            "is closed). 0 = no limit. The default, 600, is the OpenAI SDKs' own request timeout: "
            "a reasoning model may think for minutes, or a long prompt prefill, before its first "
            "token (a role-only chunk sent at once does not start the idle deadline while this one runs).",
        )
        loader.add_option(
            "finish_fix_metrics",
            str,
            "",
            "Serve finish_fix's Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464; "
            "port 0 picks a free one, logged) from a thread of its own: flows by dialect, verdict and "
            "cause, injections, streams in flight, time to first token, durations, events per "
            "stream. Label values come from closed sets: no model, path or id. Empty: off.",
        )
        loader.add_option(
            "finish_fix_otlp",
            str,
            "",
            "Send one OpenTelemetry span per flow in scope, following the GenAI semantic conventions "
            "v1.41.0, to this OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces; a URL "
            "without a path gets /v1/traces), in batches from a thread of its own; a request's "
            "traceparent makes the span its child. A collector that does not answer costs one "
            "warning in the log, never a stream. Empty: off.",
        )
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
                self.paths[dialect] = _path_regex(option, getattr(options, option))
        if POLICY_OPTIONS & updated:
            valid = [policy.value for policy in OnCut]
            if options.finish_fix_on_cut not in valid:
                raise exceptions.OptionsError(
                    f"finish_fix_on_cut: {options.finish_fix_on_cut!r} is not one of {', '.join(valid)}"
                )
            self.policy = RepairPolicy(
                empty_to_null=_boolean("finish_fix_empty_to_null", options.finish_fix_empty_to_null),
                on_cut=OnCut(options.finish_fix_on_cut),
                idle_timeout=_seconds("finish_fix_idle_timeout", options.finish_fix_idle_timeout),
                first_token_timeout=_seconds("finish_fix_first_token_timeout", options.finish_fix_first_token_timeout),
                limit_reasons=_boolean("finish_fix_limit_reasons", options.finish_fix_limit_reasons),
                responses_indexes=_boolean("finish_fix_responses_indexes", options.finish_fix_responses_indexes),
                responses_fields=_boolean("finish_fix_responses_fields", options.finish_fix_responses_fields),
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
        finish_fix_cut_hook.install()

    def done(self) -> None:
        """Shutdown, or the old instance on a hot reload (the new one installs the hook again)."""
        finish_fix_cut_hook.uninstall()
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
            finish_fix_cut_hook.watch_head(flow, HeadWait(dialect, self.policy, request, flow.request.timestamp_start))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        dialect = self._dialect_of(flow)
        if not _is_event_stream(response) and not _is_gemini_array_stream(flow, dialect):
            if dialect is Dialect.GEMINI:  # G6, even for a body the upstream cuts before its end
                wait = GeminiBodyWait.of(response, _request_facts(flow, dialect), self.policy)
                finish_fix_cut_hook.watch_whole_body(flow, wait)
            return  # buffered by mitmproxy; rules C9 and G6 run in `response`
        if dialect is None:
            response.stream = True
            return
        encoding = _content_encoding(response)
        # The request's watch, if it waited for this head: the first-token deadline counts from the
        # moment the request went upstream, not from this head, and its facts are read already.
        watch = finish_fix_cut_hook.head_watch_of(flow)
        waited = watch if isinstance(watch, HeadWait) else None
        repair = StreamRepair(
            dialect=dialect,
            request=waited.request if waited is not None else _request_facts(flow, dialect),
            policy=self.policy,
            started_at=flow.request.timestamp_start,
            sent_at=waited.sent_at if waited is not None else None,
            status=response.status_code,
            content_encoding=encoding,
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
            body_wait = finish_fix_cut_hook.whole_body_watch_of(flow)
            if isinstance(body_wait, GeminiBodyWait) and body_wait.answer is not None:
                # A whole body cut mid-way: the cut hook answered the client with the core's answer (G6).
                self._book(flow, body_wait.booking(body_wait.answer), body_wait.request)
                return
            watch = finish_fix_cut_hook.head_watch_of(flow)
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
        wait = finish_fix_cut_hook.whole_body_watch_of(flow)
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
        for dialect, regex in self.paths.items():
            if regex is not None and regex.search(path) is not None:
                return dialect
        return None


def _path_regex(option: str, text: str) -> re.Pattern[str] | None:
    """A path option's compiled regex; the empty string turns its dialect off."""
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as e:
        raise exceptions.OptionsError(f"{option}: {text!r} is not a valid regex ({e})") from None


def _boolean(option: str, text: str) -> bool:
    value = BOOLEANS.get(text.strip().lower())
    if value is None:
        raise exceptions.OptionsError(f"{option}: {text!r} is not one of true, false")
    return value


def _seconds(option: str, text: str) -> float:
    try:
        return read_number(text, at_least=0)
    except NumberRefused:
        raise exceptions.OptionsError(
            f"{option}: {text!r} is not a number of seconds >= 0 (0 = no limit), e.g. 120 or 2.5"
        ) from None


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


addons = [FinishFix()]
