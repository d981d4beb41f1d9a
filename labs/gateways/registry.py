"""The lab's gateways as data: one `GatewayEntry` per gateway name, looked up by name.

Theory of operation
-------------------
An entry says what a gateway needs (`missing`: the install check, one line when something is not
there), how it is started for one run (`start`: an async function that gets a `GatewayContext` and
returns the `Gateway` the clients talk to), and how its books are read (`books_kind`, and
`read_books` for that kind, made by `labs.gateways.services.books_reader_from`). `open_gateways`
(labs.gateways.services) looks the requested names up here, checks every install first (so a
missing gateway is refused before anything starts), and starts each entry in registry order; the
running `Gateway` takes its books kind from its entry.

Processes belong to the context, not to an entry: `ctx.enter(cm)` keeps a process running until the
topology's gateways are closed, and `ctx.shared(key, factory)` starts one process that several
entries of one topology use. A run with several topologies opens one context per topology
(labs.topology), all sharing one `RunServices`: `ctx.run.shared_async(key, start)` starts a process
once for the whole run, entered with `ctx.run.enter`, which lives until the last topology's
gateways close. A run-wide service sees every topology of the run (`ctx.topologies`) and tells them
apart by the model-name prefix each topology's cells carry (`TopologyPlan.route_prefix`): one
LiteLLM proxy serves every LiteLLM variant of every topology through its model groups, which is
what keeps a run to one LiteLLM start (its slowest). The entries of one context start at once
(labs.gateways.services), so both kinds of sharing wait for a start already under way.

Upstreams: `ctx.primary_url` is the worker's tunnel (or the hub in front of it); `ctx.spare_url`,
when the scenario's pool has two workers, a second healthy worker. An entry that can have more than
one upstream configures both, with retry or fallback the way its own documentation tells an
operator to (see each module); `uses_spare` says which entries do.

Dialects and routes: an entry says, per dialect a client speaks to it, which dialect its route
speaks to the worker (`routes`: client dialect -> upstream dialect; Chat to Chat unless it says
more). A route whose two dialects differ translates: LiteLLM's Chat bridge answers a Messages
client from the worker's Chat stream. A cell of a dialect the entry has no route for is not run:
the matrix shows it `n/a`, with the sentence `unserved_reason` gives (the entry's own reason in
`unrouted`, else the path the lab does not route through it).

Adding a gateway: write a module `labs/gateways/<name>.py` that defines `ENTRIES` (a tuple of
`GatewayEntry`), and add the module's name to `_MODULES` below, at the place its columns should
appear in the matrix. An entry's `start` may import heavy things lazily; importing the module must
stay cheap (the LiteLLM proxy imports this package to load its books callback).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import trio

from finishline import Dialect
from labs.dialects import LAB_DIALECTS, UNLISTED_DIALECTS

__all__ = [
    "EVERY_DIALECT_ROUTES",
    "EXTERNAL",
    "BooksReader",
    "Gateway",
    "GatewayContext",
    "GatewayEntry",
    "RunServices",
    "NATIVE_ROUTES",
    "REQUEST_PATHS",
    "TopologyPlan",
    "UnknownGateway",
    "books_reader",
    "entries",
    "lookup",
    "missing_installs",
    "translates",
    "unserved_reason",
    "upstream_dialect",
]

T = TypeVar("T")

#: The name of the engineer's own gateway (`--gateway-url`); not one of the lab's gateways.
EXTERNAL = "external"

#: An entry's `routes` when it passes every dialect on as it is (a relay that reads no dialect, or
#: one that speaks each natively): each client dialect goes to the worker in the same dialect.
#: Gemini is in it only where the lab has run it through the gateway (`EVERY_DIALECT_ROUTES`):
#: elsewhere a Gemini cell is `n/a` (issue 29: LiteLLM's Gemini routes and Envoy come later).
NATIVE_ROUTES: Mapping[Dialect, Dialect] = MappingProxyType({dialect: dialect for dialect in UNLISTED_DIALECTS})
#: Every dialect of the lab, each as it is: `direct` and `finish_fix` (its default
#: `finish_fix_gemini_paths` repairs `:streamGenerateContent` under any prefix).
EVERY_DIALECT_ROUTES: Mapping[Dialect, Dialect] = MappingProxyType({dialect: dialect for dialect in LAB_DIALECTS})
#: The default `routes`: Chat Completions only.
CHAT_ONLY: Mapping[Dialect, Dialect] = MappingProxyType({Dialect.CHAT: Dialect.CHAT})
#: The path a dialect's requests take under a gateway's base URL (the clients' libraries add it to
#: the `/v1` root the lab gives them): what an `n/a` cell says the lab does not route.
REQUEST_PATHS: dict[Dialect, str] = {
    Dialect.CHAT: "/v1/chat/completions",
    Dialect.MESSAGES: "/v1/messages",
    Dialect.RESPONSES: "/v1/responses",
    Dialect.GEMINI: "/v1/models/{model}:streamGenerateContent",
}

#: Reads one cell's books: (every entry the gateway's books hold, the cell id) -> (the books' word,
#: `ok`/`error` from labs.outcome, or None; the entry it came from, or None when there is none).
BooksReader = Callable[[list[dict[str, Any]], str], "tuple[str | None, dict[str, Any] | None]"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Gateway:
    name: str
    base_url: str
    #: The JSON-lines file this gateway's books go to, or None (no books, or none read).
    books_path: Path | None = None
    #: Prefix the gateway needs on the model name (LiteLLM's topology and finish_fix routes).
    model_prefix: str = ""
    #: Per client dialect, what follows `model_prefix` (LiteLLM's route in that dialect); see
    #: `model_for`.
    route_prefixes: Mapping[Dialect, str] = field(default_factory=dict)
    #: Whose books: its registry entry's `books_kind`, which `open_gateways` gives every gateway it
    #: starts (an entry's `start` leaves it out: the entry says it, once).
    books_kind: str | None = None
    #: The API key the gateway wants (LiteLLM's master key of this run); None: any.
    api_key: str | None = None
    #: JSON lines of the streams finish_fix sent on (labs/gateways/stream_capture.py), or None.
    capture_path: Path | None = None
    #: Awaited with a scenario's request models before its fault is applied, for a gateway that
    #: must be told a model before it routes it (SMG, labs/gateways/smg.py); None for the rest.
    prepare: Callable[[Sequence[str]], Awaitable[None]] | None = None
    #: Awaited with a scenario's finish_fix options (full option names; empty: the lab's own) as
    #: it starts, for a gateway with finish_fix in its path (labs/gateways/finish_fix_proxy.py);
    #: gateways sharing one finish_fix share this callable. None for the rest.
    configure: Callable[[Mapping[str, str]], Awaitable[object]] | None = None

    #: Per client dialect, a root other than `base_url` (LiteLLM's native Gemini routes are under
    #: `/v1beta`, not `/v1`); see `base_url_for`.
    dialect_base_urls: Mapping[Dialect, str] = field(default_factory=dict)

    def base_url_for(self, dialect: Dialect) -> str:
        """The root a `dialect` client is given (its library adds the dialect's path)."""
        return self.dialect_base_urls.get(dialect, self.base_url)

    def model_for(self, dialect: Dialect, model: str) -> str:
        """The model name a `dialect` client asks this gateway for, to reach the worker's `model`."""
        return self.model_prefix + self.route_prefixes.get(dialect, "") + model


class UnknownGateway(ValueError):
    """A gateway name that is not in the registry; the message lists the valid ones."""


class _Shared:
    """Values started once per key; a second asker waits for a start already under way (the
    entries of a context start at once)."""

    def __init__(self) -> None:
        self._values: dict[Any, Any] = {}
        self._locks: dict[Any, trio.Lock] = {}

    async def get(self, key: Any, start: Callable[[], Awaitable[T]]) -> T:
        async with self._locks.setdefault(key, trio.Lock()):
            if key not in self._values:
                self._values[key] = await start()
        return self._values[key]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyPlan:
    """One topology of a run, as a run-wide service needs to know it before it starts."""

    #: `http://127.0.0.1:PORT` (no `/v1`): the tunnel, or the hub in front of it.
    primary_url: str | None
    #: A second, healthy worker, or None for a pool of one.
    spare_url: str | None = None
    #: Where this topology's gateways keep their logs and books.
    run_dir: Path
    #: The gateway names this topology runs.
    names: tuple[str, ...] = ()
    #: What the model names of this topology's cells start with at a run-wide service (`""` for
    #: the default topology; `hub/` for the hub's): how one process tells the topologies apart.
    route_prefix: str = ""
    #: Per (gateway name, client dialect), the models this topology's cells will name through it
    #: (without the gateway's prefixes), for a gateway that must be configured with every model
    #: before it starts (LiteLLM's routes to a `/v1/responses` upstream); empty when not known.
    models: Mapping[tuple[str, Dialect], tuple[str, ...]] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class RunServices:
    """The processes a whole run shares across its topologies (`GatewayContext.run`)."""

    #: The run's directory: a run-wide service keeps its logs and books here.
    run_dir: Path
    #: finish_fix's idle deadline in the run (`finish_fix_idle_timeout`): short for the simulated
    #: worker, whose stall scenario must end in finish_fix's error event within its deadline;
    #: longer for a real server, whose gaps between tokens on a loaded CPU pass 2 s
    #: (labs.workers.REAL_WORKER_IDLE_TIMEOUT_S).
    finish_fix_idle_timeout_s: float = 2.0
    stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    _shared: _Shared = field(default_factory=_Shared)

    async def enter(self, manager: AbstractAsyncContextManager[T]) -> T:
        """Keep `manager` (a running process) open until the run's last gateways close."""
        return await self.stack.enter_async_context(manager)

    async def shared_async(self, key: Any, start: Callable[[], Awaitable[T]]) -> T:
        """The value of `start()`, once per run under `key`; `start` enters its processes with
        `enter` (of this object, so they outlive the topology that happened to start them)."""
        return await self._shared.get(key, start)


@dataclass(slots=True, kw_only=True)
class GatewayContext:
    """What an entry's `start` gets: the upstreams, the run's directory, and the run's processes."""

    #: `http://127.0.0.1:PORT` (no `/v1`): the tunnel, or the hub in front of it.
    primary_url: str | None
    #: A second, healthy worker (`http://127.0.0.1:PORT`), or None for a pool of one.
    spare_url: str | None
    run_dir: Path
    #: Every gateway name of this topology (a shared service may serve several of them).
    names: tuple[str, ...] = ()
    external_url: str | None = None
    external_api_key: str | None = None
    #: This context's topology, a key of `topologies`.
    topology: str = ""
    #: Every topology of the run by label (this one included); filled in from this context's own
    #: upstreams when it is the run's only one.
    topologies: dict[str, TopologyPlan] = field(default_factory=dict)
    #: The processes shared by every topology of the run (`open_gateways` makes one of the context's
    #: own when it is the run's only topology).
    run: RunServices
    #: This topology's `TopologyPlan.models`, when it is the run's only one (`topologies` empty).
    models: Mapping[tuple[str, Dialect], tuple[str, ...]] = field(default_factory=dict)
    stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    _shared: _Shared = field(default_factory=_Shared)

    def __post_init__(self) -> None:
        if not self.topologies:
            self.topologies = {
                self.topology: TopologyPlan(
                    primary_url=self.primary_url,
                    spare_url=self.spare_url,
                    run_dir=self.run_dir,
                    names=self.names,
                    models=self.models,
                )
            }

    @property
    def plan(self) -> TopologyPlan:
        """This context's own topology."""
        return self.topologies[self.topology]

    async def enter(self, manager: AbstractAsyncContextManager[T]) -> T:
        """Keep `manager` (a running process) open until this topology's gateways close."""
        return await self.stack.enter_async_context(manager)

    async def shared(self, key: str, factory: Callable[[], AbstractAsyncContextManager[T]]) -> T:
        """The value of `factory()`, entered once per topology under `key` and shared by every
        entry of it that asks for the same key."""
        return await self._shared.get(key, lambda: self.enter(factory()))

    async def shared_async(self, key: str, start: Callable[[], Awaitable[T]]) -> T:
        """Like `shared`, for a start that enters its own processes with `enter` (a service that
        needs another shared service started first)."""
        return await self._shared.get(key, start)

    def upstream(self) -> str:
        """The primary upstream; an entry that needs one and gets none is a lab bug."""
        if not self.primary_url:
            raise ValueError("this gateway needs the worker's tunnel (primary_url)")
        return self.primary_url


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayEntry:
    #: The lab gateway name (`--gateway NAME`, the matrix heading).
    name: str
    #: One sentence for `python -m labs.gateways`: what this gateway is and how it is configured.
    summary: str
    start: Callable[[GatewayContext], Awaitable[Gateway]]
    #: The install check: None when everything it needs is there, else one line saying what is
    #: missing and how to install it.
    missing: Callable[[], str | None] = lambda: None
    #: Whose books: a key of `books_reader`; `none` for a gateway that keeps no per-request record;
    #: None for no gateway at all (`direct`, `external`: nothing to ask).
    books_kind: str | None = None
    #: How `books_kind` books are read (entries that share a kind may leave it to one of them).
    read_books: BooksReader | None = None
    #: Whether it takes the spare worker when the pool has one (single-upstream gateways do not);
    #: `python -m labs.gateways` says so.
    uses_spare: bool = False
    #: Per dialect the lab sends through it (the client's), the dialect its route speaks to the
    #: worker; a cell of any other dialect is `n/a` (`unserved_reason`). Chat to Chat by default.
    routes: Mapping[Dialect, Dialect] = CHAT_ONLY
    #: Why a dialect has no route here, in a few words a user reads after the gateway's name (for
    #: a dialect missing from `routes`); without one, the sentence says the lab does not route it.
    unrouted: Mapping[Dialect, str] = MappingProxyType({})
    #: Per routed dialect, how the route goes, in the words the report and `result.json["routes"]`
    #: show (e.g. LiteLLM's Chat bridge); without one, `summary` says it.
    route_texts: Mapping[Dialect, str] = MappingProxyType({})

    def route_text(self, dialect: Dialect) -> str:
        """How a `dialect` client's request goes through this gateway, in one phrase."""
        return self.route_texts.get(dialect, self.summary)

    @property
    def dialects(self) -> tuple[Dialect, ...]:
        """The dialects a client can speak to it in the lab, in `Dialect` order."""
        return tuple(d for d in LAB_DIALECTS if d in self.routes)


# The gateway modules, in matrix order (`external`, defined in labs.gateways.direct, goes last).
_MODULES = ("direct", "finish_fix_proxy", "litellm_proxy", "litellm_passthrough", "smg", "vllm_router", "envoy", "portkey")


def _load() -> dict[str, GatewayEntry]:
    registry: dict[str, GatewayEntry] = {}
    for module in _MODULES:
        for entry in importlib.import_module(f"labs.gateways.{module}").ENTRIES:
            if entry.name in registry:
                raise RuntimeError(f"gateway {entry.name!r} is defined twice (labs.gateways.{module})")
            registry[entry.name] = entry
    # `external` last: it is not one of the lab's gateways, and the matrix shows it after them.
    registry[EXTERNAL] = registry.pop(EXTERNAL)
    return registry


_REGISTRY: dict[str, GatewayEntry] | None = None


def entries() -> dict[str, GatewayEntry]:
    """Every gateway entry by name, in matrix order (the lab's own, then `external`)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _load()
    return _REGISTRY


def lookup(name: str) -> GatewayEntry:
    """The entry for `name`.

    Raises:
        UnknownGateway: `name` is not a gateway; the message lists the valid names.
    """
    try:
        return entries()[name]
    except KeyError:
        raise UnknownGateway(f"unknown gateway {name!r}; gateways: {', '.join(entries())}") from None


def missing_installs(names: tuple[str, ...] | list[str]) -> list[str]:
    """One line per requested gateway that is not installed (empty when all are)."""
    lines = []
    for name in dict.fromkeys(names):
        problem = lookup(name).missing()
        if problem:
            lines.append(f"{name}: {problem}")
    return lines


def unserved_reason(name: str, dialect: Dialect) -> str | None:
    """None when the lab sends `dialect` through gateway `name`; else why its cells are `n/a`, in
    one sentence a user reads in the matrix."""
    entry = lookup(name)
    if dialect in entry.routes:
        return None
    if dialect in entry.unrouted:
        return f"{name}: {entry.unrouted[dialect]}"
    return f"{name}: the lab does not route {REQUEST_PATHS[dialect]} through this gateway"


def upstream_dialect(name: str, dialect: Dialect) -> Dialect:
    """The dialect gateway `name` speaks to the worker for a client speaking `dialect` (its route).

    Raises:
        KeyError: the gateway has no route for `dialect` (`unserved_reason` says why).
    """
    return lookup(name).routes[dialect]


def translates(name: str, dialect: Dialect) -> bool:
    """Whether the gateway's route for a `dialect` client speaks another dialect to the worker."""
    routes = lookup(name).routes
    return dialect in routes and routes[dialect] != dialect


def books_reader(kind: str) -> BooksReader:
    """How books of `kind` are read (the entry that declares `read_books` for it)."""
    for entry in entries().values():
        if entry.books_kind == kind and entry.read_books is not None:
            return entry.read_books
    kinds = sorted({e.books_kind for e in entries().values() if e.read_books is not None and e.books_kind is not None})
    raise ValueError(f"no books reader for {kind!r}; books kinds: {', '.join(kinds)}")
