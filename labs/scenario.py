"""A scenario is data: worker settings, one fault, what the clients ask, and which clients and
gateways run it. Scenarios live as TOML files in `labs/scenarios/` (one per file, the file name is
the scenario's name); this module reads them and derives what the runner needs: the model name
that carries the settings to the worker, and the worker's true answer.

File format (every table optional except `title`):

    title = "Cut after 5 tokens (FIN)"      # what the report shows
    deadline_s = 12                         # a cell that has not ended by then is a `hang`
    clients = ["openai-python", "pi-ai"]    # default: every client (of each dialect)
    gateways = ["direct", "finish_fix"]     # default: every gateway
    dialects = ["chat", "messages"]         # the dialects it runs in; default: chat, messages, responses
    default_dialects = ["chat"]             # the default run's (default: all of `dialects`)
    upstream_dialect = "chat"               # the worker speaks this one in every cell (see below)
    order = 80                              # row order in the matrix
    default = false                         # not in the default run (`--all` or `--scenario` runs it)
    agents = true                           # the coding agents run in it too (labs.clients.agent_clis)
    requests_per_cell = 20                  # each cell sends this many requests, one after another

    [worker]                                # labs.worker.settings.WorkerSettings fields
    tokens = 12
    finish = "omitted"

    [request]                               # what each client asks for
    max_tokens = 6
    tools = true                            # declare the worker's tool (get_weather)

    [fault]                                 # faults: see labs/fault_plan.py for the kinds
    kind = "cut_after_tokens"
    n = 5

    [hub]                                   # put the hub between the gateways and the tunnel
    on_tunnel_drop = "close"                # close | error_event | abort (labs/hub/policy.py)

    [pool]                                  # the gateways' upstream workers
    workers = 2                             # 1 (default) or 2: a second, healthy worker (the spare)

    [finish_fix]                            # finish_fix's options while this scenario runs
    first_token_timeout = 1                 # finish_fix_first_token_timeout (also idle_timeout)

Requests per cell: a cell is one request, unless `requests_per_cell` says more (a flapping
primary's run of 20): the cell's client sends them one after another under one cell id, so the
workers count them as one cell's attempts; each request is judged, and the cell's outcome is the
worst of them with the count of each word (`labs.cell_requests`).

Dialects: the scenario runs once per dialect it lists (`chat`, `messages`, `responses`: the words
of `finishline.Dialect`), each time with the same worker settings, which the worker speaks in the
request's dialect; the client set is the dialect's (`labs.clients.CLIENTS_BY_DIALECT`), and the
true answer's reason is in the dialect's words (`Scenario.expected`). `default_dialects` narrows
what the default run (`python -m labs` without `--all` or `--scenario`) takes of it.

Translation: a gateway's route may speak another dialect to the worker than the client speaks to
it (LiteLLM's Chat bridge answers a Messages client from the worker's Chat stream; its registry
entry's `routes`). Such a cell's worker speaks the route's dialect, its fault is laid out on that
dialect's bytes, and it is judged in the client's: it runs when the scenario lists both dialects
(the settings mean something in each). `upstream_dialect` pins the worker's dialect for every cell
of the scenario instead: only the gateways whose route brings that dialect to the client's run it
(`external`, whose routes the lab cannot know, is taken to translate as the scenario says).

`[finish_fix]`: every finish_fix of the run (the `finish_fix` gateway's, and the one behind each
`...+finish_fix` gateway) runs the scenario's cells with these deadlines instead of the lab's
(labs/gateways/finish_fix_proxy.py `open_finish_fix`), set as the scenario starts and put back after it.

No `[hub]` table: the gateways talk to the tunnel itself. With `workers = 2` every gateway that can
have more than one upstream also gets the spare, reachable without the tunnel (and without the
hub); `direct` and single-upstream gateways use the first only. Scenarios of one topology (hub or
not, one worker or two) share one set of gateways (`Topology`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finishline import Dialect
from labs.cell_ids import CELL_ID_TEMPLATE, MAX_CELLS, cell_id_of
from labs.clients import AGENT_CLIENTS, DEFAULT_MAX_TOKENS, EVERY_CLIENT
from labs.dialects import LAB_DIALECTS, UNLISTED_DIALECTS
from labs.gateways import GATEWAYS
from labs.hub.policy import TunnelDropPolicy, parse_policy
from labs.outcome import Expected
from labs.worker.answer import TOOL_NAME, dialect_reason, expected_answer
from labs.worker.settings import SettingsError, WorkerSettings, parse_settings

__all__ = [
    "AGENT_DEADLINE_S",
    "CELL_ID_TEMPLATE",
    "MAX_CELLS",
    "PINNED_MAX_TOKENS",
    "POOL_SIZES",
    "SCENARIO_DIR",
    "Scenario",
    "ScenarioError",
    "Topology",
    "cell_id_of",
    "load_scenario",
    "load_scenarios",
    "run_label",
]

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

#: The one tool the worker calls (labs.worker.answer.TOOL_NAME), declared OpenAI-style.
WORKER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}

DEFAULT_DEADLINE_S = 20.0
#: The least time a coding agent's cell is given, whatever the scenario's deadline: an agent
#: retries a failed turn on its own (Pi's agent 3 times, 2, 4 and 8 s apart; Codex 5 times in about
#: 6 s), and the cell shows where its retries end. Claude Code's ladder for a 5xx (10 retries, up to
#: 32 s apart, over 3 minutes) is longer: such a cell is a `hang` with its tries counted.
AGENT_DEADLINE_S = 60.0
#: The worker's output limit when a scenario sets none (`[request] max_tokens`): above every
#: answer the scenarios ask for, so it never cuts one, and pinned, so that what a client asks for
#: does not change the bytes. The worker echoes its settings in the response head and, in
#: Responses, `max_output_tokens` in the response objects; the Anthropic SDKs ask for 4096, Claude
#: Code for 32000, Pi's agent for its model's `maxTokens`. A byte-exact cut is laid out from the
#: scenario's settings, so an echoed limit of another length would move it.
PINNED_MAX_TOKENS = DEFAULT_MAX_TOKENS
#: `[pool] workers`: the primary alone, or the primary and one healthy spare.
POOL_SIZES = (1, 2)
#: `[finish_fix]` keys: finish_fix's deadlines (`finish_fix_<key>`, seconds >= 0).
FINISH_FIX_KEYS = ("first_token_timeout", "idle_timeout")


@dataclass(frozen=True, slots=True, order=True)
class Topology:
    """What sits between the gateways and the workers: the hub or not, one worker or two."""

    hub: bool = False
    workers: int = 1

    @property
    def label(self) -> str:
        """`tunnel`, `hub`, `tunnel+spare` or `hub+spare`: for reports and run folders."""
        return ("hub" if self.hub else "tunnel") + ("+spare" if self.workers == 2 else "")


class ScenarioError(ValueError):
    """A scenario file is invalid; the message names the file and the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    title: str
    worker: WorkerSettings
    fault: dict[str, Any] | None = None
    max_tokens: int | None = None
    tools: bool = False
    deadline_s: float = DEFAULT_DEADLINE_S
    clients: tuple[str, ...] | None = None
    gateways: tuple[str, ...] | None = None
    order: int = 1000
    #: In the default run (`python -m labs` without `--all` or `--scenario`), in some dialect.
    default: bool = True
    #: The dialects it runs in (`dialects = [...]`), in `Dialect` order.
    dialects: tuple[Dialect, ...] = UNLISTED_DIALECTS
    #: Those the default run takes (`default_dialects = [...]`; none when `default = false`).
    default_dialects: tuple[Dialect, ...] = UNLISTED_DIALECTS
    #: Every dialect the file lists, kept when a run narrows `dialects` (`--dialect`, the default
    #: run): the dialects the worker may speak for a translating gateway's cells.
    listed_dialects: tuple[Dialect, ...] = UNLISTED_DIALECTS
    #: `upstream_dialect`: the dialect the worker speaks in every cell; None: each gateway's route's.
    upstream_dialect: Dialect | None = None
    source: str = ""
    prompt: str = "Say the sentence about the fox."
    #: `[hub] on_tunnel_drop`, None: no hub.
    hub_policy: TunnelDropPolicy | None = None
    #: `[pool] workers`.
    pool_workers: int = 1
    #: `agents = true`: the coding agents run in it (they also run in every scenario asked for by name).
    agents: bool = False
    #: `[finish_fix]`, as finish_fix's option names and `--set` values (empty: the lab's options).
    finish_fix_options: dict[str, str] = dataclasses.field(default_factory=dict)
    #: `requests_per_cell`: the requests each cell sends, one after another, under its cell id.
    requests_per_cell: int = 1

    @property
    def topology(self) -> Topology:
        return Topology(hub=self.hub_policy is not None, workers=self.pool_workers)

    @property
    def resolved(self) -> WorkerSettings:
        """The settings the worker resolves for a cell's request. Request-dependent fields are
        pinned (see `load_scenario`) and every cell's model name has the same length, so these
        give every cell's response layout."""
        return self.worker.for_request({"model": self.model_name(CELL_ID_TEMPLATE.format(0))})

    def model_name(self, cell_id: str) -> str:
        """The request's model: the cell id as its name part (`labs.worker.settings`: a name item
        without `=` is ignored by the worker), then the settings. Gateways record the model name
        in their books, which is how a cell finds its books entry."""
        return self.worker.to_model_name(cell_id)

    def deadline_for(self, client: str) -> float:
        """The cell's deadline for `client`: the scenario's, and for an agent at least `AGENT_DEADLINE_S`."""
        return max(self.deadline_s, AGENT_DEADLINE_S) if client in AGENT_CLIENTS else self.deadline_s

    def label(self, dialect: Dialect) -> str:
        """The scenario in one dialect, as progress lines and timings name it (`run_label`)."""
        return run_label(self.name, dialect)

    def speaks(self, upstream: Dialect, dialect: Dialect) -> bool:
        """Whether a cell whose client speaks `dialect` may have the worker speak `upstream`: the
        scenario's pinned `upstream_dialect` if it has one, else one the file lists for both."""
        if self.upstream_dialect is not None:
            return upstream == self.upstream_dialect
        return upstream == dialect or (upstream in self.listed_dialects and dialect in self.listed_dialects)

    def expected(self, dialect: Dialect = Dialect.CHAT) -> Expected:
        """The worker's true answer, the same in every dialect, with its reason in `dialect`'s words."""
        settings = self.resolved
        answer = expected_answer(settings)
        if not answer.choices:
            # `http_error`: the worker answers with an error status and body before any stream;
            # the client must raise (an `error` cell).
            return Expected(text="", finish_reason=None, http_error=settings.http_error, dialect=dialect)
        choice = answer.choices[0]
        return Expected(
            text=choice.content,
            finish_reason=dialect_reason(choice.finish_reason, dialect),
            tool_calls=tuple({"name": call.name, "arguments": call.arguments} for call in choice.tool_calls),
            dialect=dialect,
        )

    def request(self) -> dict[str, Any]:
        """The request fields every driver gets (besides id, client, base URL and model)."""
        request: dict[str, Any] = {"messages": [{"role": "user", "content": self.prompt}]}
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        if self.tools:
            request["tools"] = [WORKER_TOOL]
        return request


def load_scenario(path: Path) -> Scenario:
    """Read and check one scenario file.

    Raises:
        ScenarioError: not TOML, an unknown key, a value of the wrong type, an unknown client or
            gateway, or worker settings the worker would refuse; the message names file and key.
    """
    data = _read_toml(path)
    # Checked in the file's reading order, so that the first mistake is the one reported.
    _check_top_level(path, data)
    requests_per_cell = _requests_per_cell(path, data)
    deadline_s = _deadline_s(path, data)
    clients = _names(path, data, "clients", EVERY_CLIENT)
    gateways = _names(path, data, "gateways", GATEWAYS)
    dialects, default_dialects = _dialects(path, data)
    upstream_dialect = _upstream_dialect(path, data)
    request = data.get("request", {})
    worker = _worker_settings(path, data.get("worker", {}))
    if Dialect.GEMINI in dialects:
        try:
            worker.check_gemini()
        except SettingsError as error:
            raise ScenarioError(f"{path}: [worker]: {error} (or leave gemini out of `dialects`)") from None
    max_tokens = _request_max_tokens(path, request)
    return Scenario(
        name=path.stem,
        title=data["title"],
        worker=_pinned(worker, max_tokens),
        fault=_fault_table(path, data.get("fault")),
        max_tokens=max_tokens,
        tools=bool(request.get("tools", False)),
        deadline_s=float(deadline_s),
        clients=clients,
        gateways=gateways,
        order=data.get("order", 1000),
        default=bool(default_dialects),
        dialects=dialects,
        default_dialects=default_dialects,
        listed_dialects=dialects,
        upstream_dialect=upstream_dialect,
        source=str(path),
        hub_policy=_hub_policy(path, data.get("hub")),
        pool_workers=_pool_workers(path, data.get("pool", {})),
        agents=bool(data.get("agents", False)),
        finish_fix_options=_finish_fix_options(path, data.get("finish_fix", {})),
        requests_per_cell=requests_per_cell,
        **({"prompt": data["prompt"]} if "prompt" in data else {}),
    )


#: The keys a scenario file may have at its top level.
_SCENARIO_KEYS = frozenset(
    {
        "title",
        "deadline_s",
        "clients",
        "gateways",
        "dialects",
        "default_dialects",
        "upstream_dialect",
        "order",
        "worker",
        "request",
        "fault",
        "prompt",
        "hub",
        "pool",
        "default",
        "agents",
        "finish_fix",
        "requests_per_cell",
    }
)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read: {error.strerror}") from None


def _check_top_level(path: Path, data: dict[str, Any]) -> None:
    """The file's keys are known, its title is there, and its plain values have their types."""
    unknown = set(data) - _SCENARIO_KEYS
    if unknown:
        raise ScenarioError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(_SCENARIO_KEYS)}")
    if "title" not in data:
        raise ScenarioError(f"{path}: missing `title`")
    _check_type(path, "title", data["title"], str, "a string")
    for key in ("worker", "request", "fault", "hub", "pool", "finish_fix"):
        _check_type(path, f"[{key}]", data.get(key, {}), dict, "a table")
    if "prompt" in data:
        _check_type(path, "prompt", data["prompt"], str, "a string")
    if "order" in data:
        _check_type(path, "order", data["order"], int, "an integer")
    if "default" in data:
        _check_type(path, "default", data["default"], bool, "true or false")
    if "agents" in data:
        _check_type(path, "agents", data["agents"], bool, "true or false")


def _requests_per_cell(path: Path, data: dict[str, Any]) -> int:
    requests_per_cell = data.get("requests_per_cell", 1)
    if isinstance(requests_per_cell, bool) or not isinstance(requests_per_cell, int) or requests_per_cell < 1:
        raise ScenarioError(f"{path}: `requests_per_cell` must be a whole number of requests above 0, not {requests_per_cell!r}")
    return requests_per_cell


def _deadline_s(path: Path, data: dict[str, Any]) -> int | float:
    deadline_s = data.get("deadline_s", DEFAULT_DEADLINE_S)
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or deadline_s <= 0:
        raise ScenarioError(f"{path}: `deadline_s` must be a number of seconds above 0, not {deadline_s!r}")
    return deadline_s


def _upstream_dialect(path: Path, data: dict[str, Any]) -> Dialect | None:
    if "upstream_dialect" not in data:
        return None
    valid = [d.value for d in LAB_DIALECTS]
    if data["upstream_dialect"] not in valid:
        raise ScenarioError(f"{path}: `upstream_dialect` must be one of {', '.join(valid)}, not {data['upstream_dialect']!r}")
    return Dialect(data["upstream_dialect"])


def _request_max_tokens(path: Path, request: dict[str, Any]) -> int | None:
    """The `[request]` table checked; its `max_tokens`, if any."""
    unknown_request = set(request) - {"max_tokens", "tools"}
    if unknown_request:
        raise ScenarioError(f"{path}: [request]: unknown keys {sorted(unknown_request)}; known: max_tokens, tools")
    max_tokens = request.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ScenarioError(f"{path}: [request]: `max_tokens` must be a positive integer, not {max_tokens!r}")
    if "tools" in request:
        _check_type(path, "[request] tools", request["tools"], bool, "true or false")
    return max_tokens


def _worker_settings(path: Path, worker_items: dict[str, Any]) -> WorkerSettings:
    """The `[worker]` table as the worker's settings."""
    try:
        # Through the worker's own text encoding, so a scenario accepts exactly what a model name
        # or header does, with the same error messages.
        worker = parse_settings(";".join(f"{key}={_text(value)}" for key, value in worker_items.items()))
    except ValueError as error:
        raise ScenarioError(f"{path}: [worker]: {error}") from None
    if worker.n is not None and worker.n != 1:
        # Drivers read choice 0 only (labs/clients/python_drivers.py); a matrix about n > 1 would
        # need a judgement per choice, which the lab does not make.
        raise ScenarioError(f"{path}: [worker]: n = {worker.n}: the lab judges one choice; use n = 1 or leave it out")
    return worker


def _pinned(worker: WorkerSettings, max_tokens: int | None) -> WorkerSettings:
    """`worker` with what it would otherwise take from a request pinned."""
    # Pin everything the worker would otherwise take from the request (n, usage, max_tokens): a
    # gateway may add `stream_options` or rename fields, a client asks for its own limit, and every
    # cell must get the same bytes (`PINNED_MAX_TOKENS` says where a limit shows).
    return dataclasses.replace(
        worker,
        n=worker.n if worker.n is not None else 1,
        include_usage=worker.include_usage if worker.include_usage is not None else False,
        max_tokens=next(limit for limit in (worker.max_tokens, max_tokens, PINNED_MAX_TOKENS) if limit is not None),
    )


def _fault_table(path: Path, fault: dict[str, Any] | None) -> dict[str, Any] | None:
    if fault is not None and not isinstance(fault.get("kind"), str):
        raise ScenarioError(f'{path}: [fault] needs a `kind` (a fault name, e.g. "cut_after_tokens")')
    return fault


def _dialects(path: Path, data: dict[str, Any]) -> tuple[tuple[Dialect, ...], tuple[Dialect, ...]]:
    """`dialects` (default: chat, messages and responses, `UNLISTED_DIALECTS`: Gemini runs where a
    scenario names it) and `default_dialects` (default: all of `dialects`, none with `default =
    false`), each in `Dialect` order."""
    valid = tuple(d.value for d in LAB_DIALECTS)
    named = _names(path, data, "dialects", valid)
    if named is not None and not named:
        unlisted = ", ".join(d.value for d in UNLISTED_DIALECTS)
        raise ScenarioError(f"{path}: `dialects` is empty: list at least one of {', '.join(valid)} (or leave it out: {unlisted})")
    dialects = tuple(d for d in LAB_DIALECTS if (d in UNLISTED_DIALECTS if named is None else d.value in named))
    in_default = _names(path, data, "default_dialects", valid)
    if in_default is None:
        return dialects, dialects if data.get("default", True) else ()
    if data.get("default", True) is False and in_default:
        raise ScenarioError(f"{path}: `default = false` and `default_dialects` {list(in_default)} contradict: keep one")
    outside = [d for d in in_default if d not in dialects]
    if outside:
        raise ScenarioError(
            f"{path}: `default_dialects`: {', '.join(map(repr, outside))} not in `dialects` ({', '.join(dialects)})"
        )
    return dialects, tuple(d for d in dialects if d.value in in_default)


def _hub_policy(path: Path, hub: dict[str, Any] | None) -> TunnelDropPolicy | None:
    if hub is None:
        return None
    unknown = set(hub) - {"on_tunnel_drop"}
    if unknown:
        raise ScenarioError(f"{path}: [hub]: unknown keys {sorted(unknown)}; known: on_tunnel_drop")
    if "on_tunnel_drop" not in hub:
        raise ScenarioError(f"{path}: [hub] needs `on_tunnel_drop` (close, error_event or abort)")
    try:
        return parse_policy(hub["on_tunnel_drop"])
    except ValueError as error:
        raise ScenarioError(f"{path}: [hub]: {error}") from None


def _pool_workers(path: Path, pool: dict[str, Any]) -> int:
    unknown = set(pool) - {"workers"}
    if unknown:
        raise ScenarioError(f"{path}: [pool]: unknown keys {sorted(unknown)}; known: workers")
    workers = pool.get("workers", 1)
    if isinstance(workers, bool) or workers not in POOL_SIZES:
        raise ScenarioError(f"{path}: [pool]: `workers` must be 1 or 2, not {workers!r}")
    return workers


def _finish_fix_options(path: Path, table: dict[str, Any]) -> dict[str, str]:
    unknown = set(table) - set(FINISH_FIX_KEYS)
    if unknown:
        raise ScenarioError(f"{path}: [finish_fix]: unknown keys {sorted(unknown)}; known: {', '.join(FINISH_FIX_KEYS)}")
    options = {}
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ScenarioError(f"{path}: [finish_fix]: `{key}` must be a number of seconds >= 0 (0 = no limit), not {value!r}")
        options[f"finish_fix_{key}"] = f"{value:g}"
    return options


def _check_type(path: Path, key: str, value: Any, kind: type, described: str) -> None:
    # bool is an int to Python, never to a scenario's author.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ScenarioError(f"{path}: `{key}` must be {described}, not {value!r}")


def _names(path: Path, data: dict[str, Any], key: str, valid: tuple[str, ...]) -> tuple[str, ...] | None:
    """A list of client or gateway names, each one the lab knows (a string is not a list of names)."""
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ScenarioError(f"{path}: `{key}` must be a list of names, e.g. [{valid[0]!r}], not {value!r}")
    unknown = [item for item in value if item not in valid]
    if unknown:
        raise ScenarioError(f"{path}: `{key}`: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    return tuple(value)


def load_scenarios(directory: Path = SCENARIO_DIR) -> list[Scenario]:
    """Every `*.toml` in `directory`, in their `order`, then by name."""
    scenarios = [load_scenario(path) for path in sorted(directory.glob("*.toml"))]
    return sorted(scenarios, key=lambda s: (s.order, s.name))


def run_label(name: str, dialect: Dialect) -> str:
    """A scenario in one dialect, as the lab's progress and timings name it: the scenario's name in
    Chat (as before there were dialects), `name (messages)` in another."""
    return name if dialect == Dialect.CHAT else f"{name} ({Dialect(dialect).value})"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
