"""`python -m labs.grade server`: ask a server the checks' requests in one dialect and grade them.

No faults, no hub: the server is asked directly (`labs.grade.server_suites` says, per dialect, where,
what, and how each answer is judged). One request at a time: a server under test should not be asked
to be fast, only right. The stream's bytes come through `labs.grade.fetch`, the gateway grader's
fetcher too.
"""

from __future__ import annotations

import httpx
import trio

from finishline import Dialect
from labs.grade.card import Card, GradeError, shortened
from labs.grade.fetch import cannot_connect, failure_words, fetch_stream, grading_client, open_response, transport_words
from labs.grade.reading import CompletionReading, read_completion
from labs.grade.server_check import Readings, ServerSuite, request_body
from labs.grade.server_suites import SERVER_SUITES

__all__ = ["REQUEST_TIMEOUT_S", "grade_server", "read_server"]

#: Seconds a server has for one answer: between two reads of a stream, and for a non-streamed
#: answer's head, which comes only when the whole answer is made. The largest answer asked for is
#: the forced tool call's `TOOL_CALL_TOKENS`; a small model on a loaded 2-core machine was measured
#: at 2-3 tokens/s (SmolLM2-135M on llama.cpp, 40-60 idle), so 180 s leaves it room three times over.
REQUEST_TIMEOUT_S = 180.0
#: Seconds to open a connection.
CONNECT_TIMEOUT_S = 30.0
_WHAT = "the server"


async def _pick_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model `GET /models` lists: what a server with one model serves."""
    try:
        response = await client.get(f"{base_url}/models")
        models = response.json().get("data") if response.status_code == 200 else None
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        raise cannot_connect(_WHAT, base_url, error) from None
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        raise GradeError(f"no --model given and GET {base_url}/models failed ({failure_words(error)}); pass --model") from None
    if not models or not isinstance(models, list) or not isinstance(models[0], dict) or not models[0].get("id"):
        raise GradeError(
            f"no --model given and GET {base_url}/models listed no model (HTTP {response.status_code}); pass --model"
        )
    return str(models[0]["id"])


async def _fetch_completion(client: httpx.AsyncClient, url: str, body: dict, dialect: Dialect) -> CompletionReading:
    """The non-streamed answer to `body`, read; a transport failure is a reading whose `failure`
    says what happened, in words (`transport_words`), judged by the checks like any answer."""
    try:
        response, retry_note = await open_response(client, url, body, what=_WHAT)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        raise cannot_connect(_WHAT, url, error) from None
    except httpx.TransportError as error:
        words = transport_words(error, what=_WHAT, before_head=True, timeout_s=client.timeout.read)
        return read_completion(b"", status=0, request=body, dialect=dialect, failure=words)
    try:
        # Not streamed: httpx decodes any content coding, and the JSON is judged as a client reads it.
        content = await response.aread()
    except httpx.TransportError as error:
        words = transport_words(error, what=_WHAT, before_head=False, timeout_s=client.timeout.read)
        return read_completion(
            b"", status=response.status_code, request=body, dialect=dialect, failure=words, retry_note=retry_note
        )
    finally:
        await response.aclose()
    return read_completion(content, status=response.status_code, request=body, dialect=dialect, retry_note=retry_note)


async def read_server(
    base_url: str, *, model: str | None = None, api_key: str | None = None, suite: ServerSuite = SERVER_SUITES[Dialect.CHAT]
) -> tuple[Readings, str]:
    """Send every request of `suite` streamed and not; returns the readings and the model asked for.

    Raises:
        GradeError: the server is unreachable, lists no model (and none was given), or refuses the
            plainest request (a natural stop): nothing else can be judged then.
    """
    base_url = base_url.rstrip("/")
    url = f"{base_url}{suite.path}"
    client = grading_client(
        timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        api_key=api_key,
        headers=suite.headers,
        api_key_header=suite.api_key_header,
    )
    async with client:
        model = model or await _pick_model(client, base_url)
        streams, completions = {}, {}
        for request in suite.requests:
            body = request_body(request, model=model, stream=True)
            streams[request.name] = await fetch_stream(client, url, body, what=_WHAT, dialect=suite.dialect)
            if request.name == "stop" and streams["stop"].status in (401, 403, 404):
                raise GradeError(
                    f"{url} answered HTTP {streams['stop'].status} to a plain request for model {model!r}: "
                    f"{shortened(streams['stop'].body, 160)}; check --url, --model and --api-key"
                )
            if not request.stream_only:
                body = request_body(request, model=model, stream=False)
                completions[request.name] = await _fetch_completion(client, url, body, suite.dialect)
    return Readings(streams=streams, completions=completions, requests=suite.requests, dialect=suite.dialect), model


def grade_server(base_url: str, *, model: str | None = None, api_key: str | None = None, dialect: Dialect = Dialect.CHAT) -> Card:
    """The server's card in `dialect`: every check of its suite on one round of requests (runs its
    own trio loop: call it from synchronous code). Chat's card is the same as before dialects; the
    others' setup names the dialect and the Chat checks they do not run, and why."""
    suite = SERVER_SUITES[Dialect(dialect)]
    readings, model = trio.run(lambda: read_server(base_url, model=model, api_key=api_key, suite=suite))
    # What each answer was, in a line, for the JSON and HTML: a person checks the evidence against it.
    answers = {f"stream {name}": reading.summary() for name, reading in readings.streams.items()}
    answers.update({f"JSON {name}": r.summary() for name, r in readings.completions.items()})
    setup: dict = {"model": model, "answers": answers}
    if suite.dialect is not Dialect.CHAT:
        setup = {"dialect": str(suite.dialect), "path": suite.path, **setup}
    card = Card(kind="server", target=base_url.rstrip("/"), setup=setup, not_run=dict(suite.not_run))
    card.results.extend(check.run(readings) for check in suite.checks)
    return card
