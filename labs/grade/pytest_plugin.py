"""finishline's pytest plugin: the graders' checks as tests, and the lab's parts as fixtures.

Registered by the package (`pytest11` entry point `finishline` in pyproject.toml), so any test
suite in an environment where finishline is installed has it:

    pytest --finishline-server-url=http://127.0.0.1:8000/v1            # the server checks
    pytest --finishline-server-url=URL --finishline-server-dialect=messages   # ... in another dialect
    pytest --finishline-gateway-url=http://127.0.0.1:4000/v1 --finishline-upstream-port=18080

Each option adds one test per check of the card (`finishline/server::stream-no-error`, ...); a
failing check fails with the card's evidence line, a check that is `not tested` or `not checked`
is skipped with it. Without the options the plugin adds nothing and imports nothing heavy.

Fixtures, for your own tests:

- `finishline_worker`: call it with worker settings (`"tokens=3; finish=omitted"`, or a
  `WorkerSettings`), get the base URL of a simulated worker serving with them as its defaults.
- `finishline_tunnel`: a toxiproxy tunnel in front of a worker; `tunnel.fault(kind, ...)` is a
  context manager that applies a fault (`faults.catalog`) for the block.
- `finishline_hub`: the hub in front of a tunnel, with its `on_tunnel_drop` policy settable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

_SERVER = "finishline/server"
_GATEWAY = "finishline/gateway"
#: `finishline.Dialect`'s values, Chat first (`tests/test_grade_plugin.py` holds them equal).
_DIALECTS = ("chat", "messages", "responses")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("finishline", "finishline graders (python -m labs.grade as tests)")
    group.addoption("--finishline-server-url", metavar="URL", help="grade this OpenAI-compatible server: one test per check")
    # The words of `finishline.Dialect`, typed here: the plugin imports nothing heavy until it grades.
    group.addoption("--finishline-server-dialect", choices=_DIALECTS, default=_DIALECTS[0], metavar="DIALECT",
                    help=f"the API to grade the server in: {', '.join(_DIALECTS)} (default chat)")
    group.addoption("--finishline-gateway-url", metavar="URL", help="grade this gateway (needs --finishline-upstream-port): one test per check")
    group.addoption("--finishline-upstream-port", type=int, metavar="P", help="the port the gateway uses as its upstream (the hub listens there)")
    group.addoption("--finishline-spare-port", type=int, metavar="Q", help="the gateway's second upstream (a healthy spare worker listens there)")
    group.addoption("--finishline-client", action="append", metavar="CLIENT", help="a client to grade the gateway with (repeatable)")
    group.addoption("--finishline-books", metavar="FILE", help="the gateway's books, JSON lines (see the README)")
    group.addoption("--finishline-stall-deadline", type=float, metavar="SECONDS", help="how long the gateway has to end a stall")
    group.addoption("--finishline-model", metavar="MODEL", help="model name to ask for")
    group.addoption("--finishline-api-key", metavar="KEY", help="API key to send")


class CheckFailed(Exception):
    """A graded check failed; the message is the card's evidence line."""


class GradedCheck(pytest.Item):
    """One check of a card; the card is graded once, by the first check that runs."""

    def __init__(self, *, card_key: str, check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.card_key = card_key
        self.check = check

    def runtest(self) -> None:
        from labs.grade.card import Mark

        cards = self.config.stash.setdefault(_CARDS, {})
        if self.card_key not in cards:
            try:
                cards[self.card_key] = _grade(self.config, self.card_key)
            except Exception as error:  # whatever stopped the grader: once, then every check says it
                cards[self.card_key] = _could_not_run(error)
        card = cards[self.card_key]
        if isinstance(card, CheckFailed):
            raise CheckFailed(str(card))  # a new one per check: a raised exception keeps its traceback
        row = card.result(self.check)
        if row.mark is Mark.FAIL:
            raise CheckFailed(row.evidence)
        if row.mark is not Mark.PASS:
            pytest.skip(f"{row.mark}: {row.evidence}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self.card_key, None, f"{self.card_key}::{self.check}"


def _could_not_run(error: Exception) -> CheckFailed:
    """The one line for a grader that could not run: a GradeError's own message, or for anything
    else (toxiproxy missing, a helper that did not start, an exception group) the lab's one line."""
    from labs.entry import error_line
    from labs.grade.card import GradeError

    why = str(error) if isinstance(error, GradeError) else error_line(error).removeprefix("error: ")
    return CheckFailed(f"the grader could not run: {why}")


class GradedCard(pytest.Collector):
    """The checks of one card (the server's or the gateway's), as items."""

    def __init__(self, *, checks: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checks = checks

    def collect(self) -> list[pytest.Item]:
        return [GradedCheck.from_parent(self, name=check, card_key=self.name, check=check) for check in self.checks]


_CARDS = pytest.StashKey[dict]()


# tryfirst: before `-k`/`-m` deselect, so they select among the checks like among any tests.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--finishline-server-url"):
        from finishline import Dialect
        from labs.grade.server_suites import SERVER_SUITES

        suite = SERVER_SUITES[Dialect(config.getoption("--finishline-server-dialect"))]
        card = GradedCard.from_parent(session, name=_SERVER, nodeid=_SERVER, checks=tuple(c.check for c in suite.checks))
        items.extend(card.collect())
    if config.getoption("--finishline-gateway-url"):
        if not config.getoption("--finishline-upstream-port"):
            raise pytest.UsageError("--finishline-gateway-url needs --finishline-upstream-port P (the port your gateway's upstream is)")
        from labs.grade.gateway_checks import GATEWAY_CHECK_IDS

        card = GradedCard.from_parent(session, name=_GATEWAY, nodeid=_GATEWAY, checks=GATEWAY_CHECK_IDS)
        items.extend(card.collect())


_SELECTED = pytest.StashKey[dict]()


def pytest_collection_finish(session: pytest.Session) -> None:
    # The checks left after `-k`/`-m`: the gateway grader runs only those (each costs seconds).
    selected: dict[str, list[str]] = {}
    for item in session.items:
        if isinstance(item, GradedCheck):
            selected.setdefault(item.card_key, []).append(item.check)
    session.config.stash[_SELECTED] = selected


def _grade(config: pytest.Config, key: str) -> Any:
    option = config.getoption
    if key == _SERVER:
        from labs.grade.server_grader import grade_server

        return grade_server(option("--finishline-server-url"), model=option("--finishline-model"), api_key=option("--finishline-api-key"),
                            dialect=option("--finishline-server-dialect"))
    from pathlib import Path

    import trio

    from labs.grade.gateway_checks import DEFAULT_GATEWAY_CLIENTS
    from labs.grade.gateway_grader import GatewayTarget, grade_gateway

    books = option("--finishline-books")
    target = GatewayTarget(
        url=option("--finishline-gateway-url").rstrip("/"), upstream_port=option("--finishline-upstream-port"),
        spare_port=option("--finishline-spare-port"), clients=tuple(option("--finishline-client") or DEFAULT_GATEWAY_CLIENTS),
        books_path=Path(books) if books else None, stall_deadline_s=option("--finishline-stall-deadline"),
        model=option("--finishline-model"), api_key=option("--finishline-api-key"), option_prefix="--finishline-",
        results_dir=Path(config.rootpath) / "lab-results", only=tuple(config.stash.get(_SELECTED, {}).get(key, ())) or None,
    )
    return trio.run(grade_gateway, target)


# -- fixtures -------------------------------------------------------------------------------------


def _settings(settings: Any) -> Any:
    from labs.worker.settings import WorkerSettings, parse_settings

    if settings is None:
        return WorkerSettings()
    return settings if isinstance(settings, WorkerSettings) else parse_settings(str(settings))


@pytest.fixture
def finishline_worker() -> Iterator[Any]:
    """A factory: `finishline_worker("tokens=3; finish=omitted")` returns the base URL
    (`http://127.0.0.1:PORT/v1`) of a simulated worker with those default settings, running until
    the test ends. Requests may still override settings with their model name or header."""
    from labs.grade.background import serving_in_thread
    from labs.worker.server import open_worker

    with ExitStack() as stack:

        def start(settings: Any = None, *, port: int = 0) -> str:
            worker = stack.enter_context(serving_in_thread(lambda: open_worker(_settings(settings), port=port), name="finishline worker"))
            return worker.base_url

        yield start


class Tunnel:
    """A toxiproxy proxy in front of a worker: `url` is the worker's base URL through the tunnel."""

    def __init__(self, *, toxiproxy: Any, proxy: Any, worker_settings: Any) -> None:
        self.toxiproxy = toxiproxy
        self.proxy = proxy
        self.worker_settings = worker_settings

    @property
    def port(self) -> int:
        return self.proxy.listen_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def fault(self, kind: str, *, request: dict[str, Any] | None = None, **arguments: Any) -> Any:
        """A context manager applying fault `kind` (a `faults.catalog` builder name) for its block.

        Cuts and stalls are exact for `request` (the body your test sends, default `{}`): the
        worker's response layout is computed from its settings resolved for that body.
        """
        import inspect

        from faults import catalog
        from faults.catalog import FAULT_NAMES
        from labs.worker.wire import response_plan

        if kind not in FAULT_NAMES:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULT_NAMES)}")
        builder = getattr(catalog, kind)
        if "layout" in inspect.signature(builder).parameters:
            arguments["layout"] = response_plan(self.worker_settings.for_request(request or {}))
        return builder(**arguments).applied(self.toxiproxy.client, self.proxy.name)


@pytest.fixture
def finishline_tunnel(request: pytest.FixtureRequest) -> Iterator[Tunnel]:
    """A worker (settings from `@pytest.mark.finishline_worker("...")`, default defaults) behind a
    toxiproxy tunnel; needs the toxiproxy server (`make setup`, or $FINISHLINE_TOXIPROXY_SERVER)."""
    from faults.toxiproxy_server import run_toxiproxy_server
    from labs.grade.background import serving_in_thread
    from labs.worker.server import open_worker

    marker = request.node.get_closest_marker("finishline_worker")
    settings = _settings(marker.args[0] if marker and marker.args else None)
    with serving_in_thread(lambda: open_worker(settings), name="finishline worker") as worker, run_toxiproxy_server() as toxiproxy:
        proxy = toxiproxy.client.create_proxy("finishline-tunnel", upstream=f"127.0.0.1:{worker.port}")
        yield Tunnel(toxiproxy=toxiproxy, proxy=proxy, worker_settings=settings)


@pytest.fixture
def finishline_hub(finishline_tunnel: Tunnel) -> Iterator[Any]:
    """The lab's hub (`labs.hub.Hub`) in front of `finishline_tunnel`: its `url` is what a gateway's
    upstream is set to, `port` its port; set `hub.on_tunnel_drop` to `close`, `error_event` or
    `abort` (default `close`, the post-mortem's hub) for the requests that follow."""
    from labs.grade.background import serving_in_thread
    from labs.hub import open_hub

    with serving_in_thread(lambda: open_hub(upstream_port=finishline_tunnel.port), name="finishline hub") as hub:
        yield hub


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "finishline_worker(settings): worker settings for the finishline_tunnel fixture")
