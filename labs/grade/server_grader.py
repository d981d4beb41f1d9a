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
from labs.grade.reading import CompletionReading, StreamReading, read_completion
from labs.grade.server_check import Readings, ServerSuite
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
    """The first model `GET /models` lists: what a server with one model serves. OpenAI's list
    (`{"data": [{"id": ...}]}`) or Gemini's (`{"models": [{"name": "models/..."}]}`, whose name
    loses its `models/`)."""
    try:
        response = await client.get(f"{base_url}/models")
        listing = response.json() if response.status_code == 200 else None
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        raise cannot_connect(_WHAT, base_url, error) from None
    except (httpx.HTTPError, ValueError) as error:
        raise GradeError(f"no --model given and GET {base_url}/models failed ({failure_words(error)}); pass --model") from None
    name = _first_model(listing)
    if name is None:
        raise GradeError(
            f"no --model given and GET {base_url}/models listed no model (HTTP {response.status_code}); pass --model"
        )
    return name


def _first_model(listing: object) -> str | None:
    """The first model of an OpenAI or a Gemini model list, or None."""
    if not isinstance(listing, dict):
        return None
    for key, field in (("data", "id"), ("models", "name")):
        models = listing.get(key)
        if isinstance(models, list) and models and isinstance(models[0], dict) and isinstance(models[0].get(field), str):
            return models[0][field].removeprefix("models/") or None
    return None


async def _fetch_completion(client: httpx.AsyncClient, url: str, body: dict | bytes, dialect: Dialect) -> CompletionReading:
    """The non-streamed answer to `body` (a JSON body, or bytes sent as they are), read; a transport
    failure is a reading whose `failure` says what happened, in words (`transport_words`), judged by
    the checks like any answer."""
    request = body if isinstance(body, dict) else None
    try:
        response, retry_note = await open_response(client, url, body, what=_WHAT)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        raise cannot_connect(_WHAT, url, error) from None
    except httpx.TransportError as error:
        words = transport_words(error, what=_WHAT, before_head=True, timeout_s=client.timeout.read)
        return read_completion(b"", status=0, request=request, dialect=dialect, failure=words)
    try:
        # Not streamed: httpx decodes any content coding, and the JSON is judged as a client reads it.
        content = await response.aread()
    except httpx.TransportError as error:
        words = transport_words(error, what=_WHAT, before_head=False, timeout_s=client.timeout.read)
        return read_completion(
            b"", status=response.status_code, request=request, dialect=dialect, failure=words, retry_note=retry_note
        )
    finally:
        await response.aclose()
    return read_completion(content, status=response.status_code, request=request, dialect=dialect, retry_note=retry_note)


async def read_server(
    base_url: str, *, model: str | None = None, api_key: str | None = None, suite: ServerSuite = SERVER_SUITES[Dialect.CHAT]
) -> tuple[Readings, str]:
    """Send every request of `suite` streamed and not; returns the readings and the model asked for.

    Raises:
        GradeError: the server is unreachable, lists no model (and none was given), or refuses the
            plainest request (a natural stop): nothing else can be judged then.
    """
    base_url = base_url.rstrip("/")
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
            url = suite.url(base_url, model=model, stream=True)
            body = suite.body(request, model=model, stream=True)
            streams[request.name] = await fetch_stream(client, url, body, what=_WHAT, dialect=suite.dialect)
            if request.name == "stop" and streams["stop"].status in _REFUSED:
                raise _refused(suite, url, model, streams["stop"])
            if not request.stream_only:
                body = suite.body(request, model=model, stream=False)
                url = suite.url(base_url, model=model, stream=False)
                completions[request.name] = await _fetch_completion(client, url, body, suite.dialect)
        bad_request = None
        if suite.bad_request is not None:
            url = suite.url(base_url, model=model, stream=False)
            bad_request = await _fetch_completion(client, url, suite.bad_request, suite.dialect)
    readings = Readings(
        streams=streams, completions=completions, requests=suite.requests, dialect=suite.dialect, bad_request=bad_request
    )
    return readings, model


#: The answers to the plainest request after which nothing can be judged: the URL, the model or
#: the key is wrong (405: a server that routes the path elsewhere, as an OpenAI server does a
#: Gemini one).
_REFUSED = (401, 403, 404, 405)


def _refused(suite: ServerSuite, url: str, model: str, stream: StreamReading) -> GradeError:
    """The one line for a refused plain request: in Gemini a 404 or 405 most likely means the
    server does not speak it at all (llama.cpp, vLLM: OpenAI's routes only), and the line says so."""
    answered = f"{url} answered HTTP {stream.status} to a plain request for model {model!r}: {shortened(stream.body, 160)}"
    if suite.dialect is Dialect.GEMINI and stream.status in (404, 405):
        return GradeError(
            f"{answered}; the server does not speak Gemini there (POST .../models/MODEL:streamGenerateContent): "
            "check --url (Gemini's base URL ends with its version, e.g. http://HOST:PORT/v1beta) and --model"
        )
    return GradeError(f"{answered}; check --url, --model and --api-key")


def grade_server(base_url: str, *, model: str | None = None, api_key: str | None = None, dialect: Dialect = Dialect.CHAT) -> Card:
    """The server's card in `dialect`: every check of its suite on one round of requests (runs its
    own trio loop: call it from synchronous code). Chat's card is the same as before dialects; the
    others' setup names the dialect and the Chat checks they do not run, and why."""
    suite = SERVER_SUITES[Dialect(dialect)]
    readings, model = trio.run(lambda: read_server(base_url, model=model, api_key=api_key, suite=suite))
    # What each answer was, in a line, for the JSON and HTML: a person checks the evidence against it.
    answers = {f"stream {name}": reading.summary() for name, reading in readings.streams.items()}
    answers.update({f"JSON {name}": r.summary() for name, r in readings.completions.items()})
    if readings.bad_request is not None:
        answers["JSON a bad request"] = readings.bad_request.summary()
    setup: dict = {"model": model, "answers": answers}
    if suite.dialect is not Dialect.CHAT:
        paths = {"path": suite.path} | ({"stream_path": suite.stream_path} if suite.stream_path else {})
        setup = {"dialect": str(suite.dialect), **paths, **setup}
    card = Card(kind="server", target=base_url.rstrip("/"), setup=setup, not_run=dict(suite.not_run))
    card.results.extend(check.run(readings) for check in suite.checks)
    return card
