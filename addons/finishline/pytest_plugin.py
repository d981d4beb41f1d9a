"""finishline's pytest plugin: the graders' checks as tests, and the lab's parts as fixtures.

Registered by the package (`pytest11` entry point `finishline` in pyproject.toml), so any test
suite in an environment where finishline is installed has it:

    pytest --finishline-server-url=http://127.0.0.1:8000/v1            # the server checks
    pytest --finishline-server-url=URL --finishline-server-dialect=messages   # ... in another dialect
    pytest --finishline-server-url=http://127.0.0.1:8000/v1beta --finishline-server-dialect=gemini
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

Why this module imports so little: pytest imports every installed `pytest11` plugin at the start
of every run, in every project. If that import reached `labs` (the graders live in `labs.grade`), a
project with its own `labs` package could not start pytest at all (its `labs` has no `grade`), and
one that did start would find our `labs` in `sys.modules` in place of its own. So the entry point is
this module of the `finishline` package, importing only the standard library, pytest and the core
(standard library only). The graders' side (`labs.grade.pytest_plugin`) is imported when an option
is used or a fixture is requested, after `finishline.install.maybe_shadowed` has checked that
`labs` and `faults` are finishline's: if a project's own package hides ours, that is one line, not
a traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from finishline import Dialect
from finishline.install import maybe_shadowed

#: The dialects' words, as the core spells them (`Dialect`): the graders speak every one the lab
#: does (`labs.dialects.LAB_DIALECTS`, which this module must not import: see above), Gemini too.
#: tests/test_packaging.py holds the two to the same words, and to the server grader's suites.
_DIALECTS = tuple(dialect.value for dialect in Dialect)
#: The options that add graded checks; any of them imports the graders.
_CARD_OPTIONS = ("--finishline-server-url", "--finishline-gateway-url")
_OPTIONS = "the --finishline-* options"
#: What grades the same in a project whose own package hides ours: the command runs in a process of
#: its own, whose sys.path does not start with the project's folder.
_INSTEAD = "run `finishline grade server|gateway ...` outside this project instead"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("finishline", "finishline graders (python -m labs.grade as tests)")
    group.addoption("--finishline-server-url", metavar="URL", help="grade this OpenAI-compatible server: one test per check")
    group.addoption(
        "--finishline-server-dialect",
        choices=_DIALECTS,
        default=Dialect.CHAT.value,
        metavar="DIALECT",
        help=f"the API to grade the server in: {', '.join(_DIALECTS)} (default chat; gemini: the URL ends with "
        "the API version, e.g. http://127.0.0.1:8000/v1beta)",
    )
    group.addoption(
        "--finishline-gateway-url",
        metavar="URL",
        help="grade this gateway (needs --finishline-upstream-port): one test per check",
    )
    group.addoption(
        "--finishline-upstream-port",
        type=int,
        metavar="P",
        help="the port the gateway uses as its upstream (the hub listens there)",
    )
    group.addoption(
        "--finishline-spare-port",
        type=int,
        metavar="Q",
        help="the gateway's second upstream (a healthy spare worker listens there)",
    )
    group.addoption(
        "--finishline-gateway-dialect",
        choices=_DIALECTS,
        default=Dialect.CHAT.value,
        metavar="DIALECT",
        help=f"the API the clients speak to the gateway: {', '.join(_DIALECTS)} (default chat)",
    )
    group.addoption(
        "--finishline-upstream-dialect",
        choices=_DIALECTS,
        metavar="DIALECT",
        help="the API the lab's worker speaks behind the gateway, for a route that translates (default: the gateway dialect)",
    )
    group.addoption(
        "--finishline-client", action="append", metavar="CLIENT", help="a client to grade the gateway with (repeatable)"
    )
    group.addoption(
        "--finishline-books", metavar="FILE", help="the gateway's books, JSON lines (see docs/grading.md: the books file)"
    )
    group.addoption("--finishline-stall-deadline", type=float, metavar="SECONDS", help="how long the gateway has to end a stall")
    group.addoption("--finishline-model", metavar="MODEL", help="model name to ask for")
    group.addoption("--finishline-api-key", metavar="KEY", help="API key to send")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "finishline_worker(settings): worker settings for the finishline_tunnel fixture")


def _grading(config: pytest.Config) -> bool:
    return any(config.getoption(option) for option in _CARD_OPTIONS)


def _graders_side() -> ModuleType:
    """`labs.grade.pytest_plugin`, for the options, once `labs` and `faults` are known to be finishline's.

    Raises:
        pytest.UsageError: another package hides one of ours (the line names it and where it is).
    """
    if (line := _maybe_hidden(_OPTIONS)) is not None:
        raise pytest.UsageError(f"{line}; {_INSTEAD}")
    return _import_graders_side()


def _maybe_hidden(what: str) -> str | None:
    shadowed = maybe_shadowed()
    return None if shadowed is None else f"{what} cannot run: {shadowed}"


def _import_graders_side() -> ModuleType:
    # Lazy: the graders (trio, httpx, mitmproxy, our `labs`) load only when an option or a fixture asks.
    # By name in sys.modules, not `from labs.grade import pytest_plugin` (an attribute of the package
    # first): pytester's in-process runs drop the modules a run imported, and the package's stale
    # attribute would mix that old copy of the graders with freshly imported httpx internals.
    return importlib.import_module("labs.grade.pytest_plugin")


# tryfirst: before `-k`/`-m` deselect, so they select among the checks like among any tests.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _grading(config):
        return
    if config.getoption("--finishline-gateway-url") and not config.getoption("--finishline-upstream-port"):
        raise pytest.UsageError(
            "--finishline-gateway-url needs --finishline-upstream-port P (the port your gateway's upstream is)"
        )
    items.extend(_graders_side().graded_checks(session, config))


def pytest_collection_finish(session: pytest.Session) -> None:
    if _grading(session.config):
        _graders_side().record_selected(session)


# -- fixtures: the graders' side builds them; here, their names and contracts --------------------


def _fixtures_side(fixture: str) -> ModuleType:
    """`labs.grade.pytest_plugin`, for a fixture: if another package hides ours, the test errors at
    setup with the one line."""
    if (line := _maybe_hidden(f"the {fixture} fixture")) is not None:
        pytest.fail(line, pytrace=False)
    return _import_graders_side()


@pytest.fixture
def finishline_worker() -> Iterator[Any]:
    """A factory: `finishline_worker("tokens=3; finish=omitted")` returns the base URL
    (`http://127.0.0.1:PORT/v1`) of a simulated worker with those default settings, running until
    the test ends. Requests may still override settings with their model name or header."""
    with _fixtures_side("finishline_worker").worker_factory() as start:
        yield start


@pytest.fixture
def finishline_tunnel(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A worker (settings from `@pytest.mark.finishline_worker("...")`, default defaults) behind a
    toxiproxy tunnel (`url`, `port`; `fault(kind, ...)` applies a `faults.catalog` fault for a `with`
    block); needs the toxiproxy server (`make setup`, or $FINISHLINE_TOXIPROXY_SERVER)."""
    marker = request.node.get_closest_marker("finishline_worker")
    with _fixtures_side("finishline_tunnel").tunnel(marker.args[0] if marker and marker.args else None) as tunnel:
        yield tunnel


@pytest.fixture
def finishline_hub(finishline_tunnel: Any) -> Iterator[Any]:
    """The lab's hub (`labs.hub.Hub`) in front of `finishline_tunnel`: its `url` is what a gateway's
    upstream is set to, `port` its port; set `hub.on_tunnel_drop` to `close`, `error_event` or
    `abort` (default `close`, the post-mortem's hub) for the requests that follow."""
    with _fixtures_side("finishline_hub").hub(finishline_tunnel) as hub:
        yield hub
