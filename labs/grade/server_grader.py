"""`python -m labs.grade server`: ask an OpenAI-compatible server the checks' requests and grade them.

No faults, no hub: the server is asked directly (`labs.grade.server_checks` says what and how each
answer is judged). Blocking httpx, one request at a time: a server under test should not be asked
to be fast, only right.
"""

from __future__ import annotations

import httpx

from labs.grade.card import Card, GradeError
from labs.grade.reading import CLEAN_END, CompletionReading, StreamReading, read_completion, read_stream
from labs.grade.server_checks import REQUESTS, SERVER_CHECKS, Readings, ServerRequest, request_body

__all__ = ["REQUEST_TIMEOUT_S", "grade_server", "read_server"]

#: Seconds a server has for one answer (connect, and between two reads of a stream).
REQUEST_TIMEOUT_S = 60.0


def _headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _pick_model(client: httpx.Client, base_url: str) -> str:
    """The first model `GET /models` lists: what a server with one model serves."""
    try:
        response = client.get(f"{base_url}/models")
        models = response.json().get("data") if response.status_code == 200 else None
    except httpx.ConnectError as error:
        raise GradeError(f"cannot connect to {base_url} ({error}); is the server running? check --url") from None
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        raise GradeError(f"no --model given and GET {base_url}/models failed ({error}); pass --model") from None
    if not models or not isinstance(models, list) or not isinstance(models[0], dict) or not models[0].get("id"):
        raise GradeError(f"no --model given and GET {base_url}/models listed no model (HTTP {response.status_code}); pass --model")
    return str(models[0]["id"])


def _fetch_stream(client: httpx.Client, url: str, body: dict) -> StreamReading:
    chunks: list[bytes] = []
    status, content_type, ending = 0, "", CLEAN_END
    try:
        with client.stream("POST", url, json=body) as response:
            status, content_type = response.status_code, response.headers.get("content-type", "")
            try:
                for chunk in response.iter_raw():
                    chunks.append(chunk)
            except httpx.TimeoutException:
                ending = f"timeout: no byte for {REQUEST_TIMEOUT_S:.0f} s"
            except httpx.TransportError as error:
                ending = f"transport error: {error or type(error).__name__}"
    except httpx.ConnectError as error:
        raise GradeError(f"cannot connect to {url} ({error}); is the server running? check --url") from None
    except httpx.TimeoutException:
        raise GradeError(f"{url} sent no response head within {REQUEST_TIMEOUT_S:.0f} s; check --url") from None
    return read_stream(b"".join(chunks), status=status, content_type=content_type, ending=ending, request=body)


def _fetch_completion(client: httpx.Client, url: str, body: dict) -> CompletionReading:
    try:
        response = client.post(url, json=body)
    except httpx.ConnectError as error:
        raise GradeError(f"cannot connect to {url} ({error}); is the server running? check --url") from None
    except httpx.HTTPError as error:
        return read_completion(f"transport error: {error}".encode(), status=0, request=body)
    return read_completion(response.content, status=response.status_code, request=body)


def read_server(
    base_url: str, *, model: str | None = None, api_key: str | None = None, requests: tuple[ServerRequest, ...] = REQUESTS
) -> tuple[Readings, str]:
    """Send every request streamed and not; returns the readings and the model asked for.

    Raises:
        GradeError: the server is unreachable, lists no model (and none was given), or refuses the
            plainest request (a natural stop): nothing else can be judged then.
    """
    base_url = base_url.rstrip("/")
    url = f"{base_url}/chat/completions"
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S)
    with httpx.Client(timeout=timeout, headers=_headers(api_key)) as client:
        model = model or _pick_model(client, base_url)
        streams, completions = {}, {}
        for request in requests:
            streams[request.name] = _fetch_stream(client, url, request_body(request, model=model, stream=True))
            if request.name == "stop" and streams["stop"].status in (401, 403, 404):
                raise GradeError(
                    f"{url} answered HTTP {streams['stop'].status} to a plain request for model {model!r}: "
                    f"{streams['stop'].body[:160].decode('utf-8', 'replace')}; check --url, --model and --api-key"
                )
            if not request.stream_only:
                completions[request.name] = _fetch_completion(client, url, request_body(request, model=model, stream=False))
    return Readings(streams=streams, completions=completions), model


def grade_server(base_url: str, *, model: str | None = None, api_key: str | None = None) -> Card:
    """The server's card: every check of `SERVER_CHECKS` on one round of requests."""
    readings, model = read_server(base_url, model=model, api_key=api_key)
    # What each answer was, in a line, for the JSON and HTML: a person checks the evidence against it.
    answers = {f"stream {name}": reading.summary() for name, reading in readings.streams.items()}
    answers.update({f"JSON {name}": f"HTTP {r.status}; the core says {r.detail}" for name, r in readings.completions.items()})
    card = Card(kind="server", target=base_url.rstrip("/"), setup={"model": model, "answers": answers})
    card.results.extend(check.run(readings) for check in SERVER_CHECKS)
    return card
