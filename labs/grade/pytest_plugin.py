"""The graders' side of finishline's pytest plugin: the card's checks as pytest items, and what the
fixtures are built from.

The plugin pytest loads is `finishline.pytest_plugin` (addons/finishline/pytest_plugin.py: the options, the
hooks and the fixtures' names and contracts, importing only the standard library, pytest and the core). It
imports this module only when a `--finishline-*-url` option is used or a finishline fixture is
requested, so this one imports the graders and the lab's parts at the top like any other module.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from faults import catalog
from faults.catalog import FAULT_NAMES
from faults.toxiproxy_server import run_toxiproxy_server
from finishline import Dialect
from labs.entry import error_line
from labs.grade.background import serving_in_thread
from labs.grade.card import Card, GradeError, Mark
from labs.grade.gateway_checks import DEFAULT_GATEWAY_CLIENTS_BY_DIALECT
from labs.grade.gateway_grader import grade_gateway
from labs.grade.gateway_plan import GatewayTarget, card_check_ids
from labs.grade.server_grader import grade_server
from labs.grade.server_suites import SERVER_SUITES
from labs.hub import Hub, open_hub
from labs.worker.server import open_worker
from labs.worker.settings import WorkerSettings, parse_settings
from labs.worker.wire import response_plan

__all__ = [
    "CheckFailed",
    "GradedCard",
    "GradedCheck",
    "Tunnel",
    "graded_checks",
    "hub",
    "record_selected",
    "tunnel",
    "worker_factory",
]

_SERVER = "finishline/server"
_GATEWAY = "finishline/gateway"


class CheckFailed(Exception):
    """A graded check failed; the message is the card's evidence line."""


class GradedCheck(pytest.Item):
    """One check of a card; the card is graded once, by the first check that runs."""

    def __init__(self, *, card_key: str, check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.card_key = card_key
        self.check = check

    def runtest(self) -> None:
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

    # `-> Any`: pytest types it `str | TerminalRepr`, and TerminalRepr lives in a private module.
    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self.card_key, None, f"{self.card_key}::{self.check}"


def _could_not_run(error: Exception) -> CheckFailed:
    """The one line for a grader that could not run: a GradeError's own message, or for anything
    else (toxiproxy missing, a helper that did not start, an exception group) the lab's one line."""
    why = str(error) if isinstance(error, GradeError) else error_line(error).removeprefix("error: ")
    return CheckFailed(f"the grader could not run: {why}")


class GradedCard(pytest.Collector):
    """The checks of one card (the server's or the gateway's), as items."""

    def __init__(self, *, checks: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checks = checks

    def collect(self) -> list[pytest.Item]:
        return [GradedCheck.from_parent(self, name=check, card_key=self.name, check=check) for check in self.checks]


_CARDS = pytest.StashKey[dict[str, "Card | CheckFailed"]]()
_SELECTED = pytest.StashKey[dict[str, list[str]]]()


def graded_checks(session: pytest.Session, config: pytest.Config) -> list[pytest.Item]:
    """One item per check of each card the options ask for (the server's, the gateway's)."""
    items: list[pytest.Item] = []
    if config.getoption("--finishline-server-url"):
        suite = SERVER_SUITES[Dialect(config.getoption("--finishline-server-dialect"))]
        card = GradedCard.from_parent(session, name=_SERVER, nodeid=_SERVER, checks=tuple(c.check for c in suite.checks))
        items.extend(card.collect())
    if config.getoption("--finishline-gateway-url"):
        checks = card_check_ids(*_gateway_dialects(config))
        card = GradedCard.from_parent(session, name=_GATEWAY, nodeid=_GATEWAY, checks=checks)
        items.extend(card.collect())
    return items


def record_selected(session: pytest.Session) -> None:
    """Note the checks left after `-k`/`-m`: the gateway grader runs only those (each costs seconds)."""
    selected: dict[str, list[str]] = {}
    for item in session.items:
        if isinstance(item, GradedCheck):
            selected.setdefault(item.card_key, []).append(item.check)
    session.config.stash[_SELECTED] = selected


def _gateway_dialects(config: pytest.Config) -> tuple[Dialect, Dialect | None]:
    """The gateway card's dialect and upstream dialect (None: the same), as the options say."""
    upstream = config.getoption("--finishline-upstream-dialect")
    return Dialect(config.getoption("--finishline-gateway-dialect")), Dialect(upstream) if upstream else None


def _grade(config: pytest.Config, key: str) -> Card:
    option = config.getoption
    if key == _SERVER:
        return grade_server(
            option("--finishline-server-url"),
            model=option("--finishline-model"),
            api_key=option("--finishline-api-key"),
            dialect=Dialect(option("--finishline-server-dialect")),
        )
    books = option("--finishline-books")
    dialect, upstream = _gateway_dialects(config)
    target = GatewayTarget(
        url=option("--finishline-gateway-url").rstrip("/"),
        upstream_port=option("--finishline-upstream-port"),
        spare_port=option("--finishline-spare-port"),
        clients=tuple(option("--finishline-client") or DEFAULT_GATEWAY_CLIENTS_BY_DIALECT[dialect]),
        dialect=dialect,
        upstream_dialect=upstream,
        books_path=Path(books) if books else None,
        stall_deadline_s=option("--finishline-stall-deadline"),
        model=option("--finishline-model"),
        api_key=option("--finishline-api-key"),
        option_prefix="--finishline-",
        results_dir=Path(config.rootpath) / "lab-results",
        only=tuple(config.stash.get(_SELECTED, {}).get(key, ())) or None,
    )
    return trio.run(grade_gateway, target)


# -- what the fixtures are built from ------------------------------------------------------------


def _settings(settings: WorkerSettings | str | None) -> WorkerSettings:
    if settings is None:
        return WorkerSettings()
    return settings if isinstance(settings, WorkerSettings) else parse_settings(str(settings))


@contextmanager
def worker_factory() -> Iterator[Any]:
    """`finishline_worker`: a `start(settings=None, *, port=0)` returning a running worker's base
    URL; every worker it started stops when the block ends."""
    with ExitStack() as stack:

        def start(settings: WorkerSettings | str | None = None, *, port: int = 0) -> str:
            worker = stack.enter_context(
                serving_in_thread(lambda: open_worker(_settings(settings), port=port), name="finishline worker")
            )
            return worker.base_url

        yield start


class Tunnel:
    """A toxiproxy proxy in front of a worker: `url` is the worker's base URL through the tunnel."""

    def __init__(self, *, toxiproxy: Any, proxy: Any, worker_settings: WorkerSettings) -> None:
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
        if kind not in FAULT_NAMES:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULT_NAMES)}")
        builder = getattr(catalog, kind)
        if "layout" in inspect.signature(builder).parameters:
            arguments["layout"] = response_plan(self.worker_settings.for_request(request or {}))
        return builder(**arguments).applied(self.toxiproxy.client, self.proxy.name)


@contextmanager
def tunnel(settings: WorkerSettings | str | None) -> Iterator[Tunnel]:
    """`finishline_tunnel`: a worker with `settings` behind a toxiproxy tunnel, until the block ends."""
    worker_settings = _settings(settings)
    with (
        serving_in_thread(lambda: open_worker(worker_settings), name="finishline worker") as worker,
        run_toxiproxy_server() as toxiproxy,
    ):
        proxy = toxiproxy.client.create_proxy("finishline-tunnel", upstream=f"127.0.0.1:{worker.port}")
        yield Tunnel(toxiproxy=toxiproxy, proxy=proxy, worker_settings=worker_settings)


@contextmanager
def hub(in_front_of: Tunnel) -> Iterator[Hub]:
    """`finishline_hub`: the lab's hub with `in_front_of` as its upstream, until the block ends."""
    with serving_in_thread(lambda: open_hub(upstream_port=in_front_of.port), name="finishline hub") as running:
        yield running
