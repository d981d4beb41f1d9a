"""The lab's client drivers and the trio side that talks to them.

Drivers run in long-lived host processes, one per runtime (labs/clients/python_host.py for the
Python libraries, labs/clients/node/host.mjs for the Node ones), many requests per process, one JSON
line per request and per outcome. `labs.clients.hosts` starts them and sends them work.

A client name means one library in one dialect (each request line carries its `"dialect"`):
`langchain` is `ChatOpenAI` in Chat, `ChatAnthropic` in Messages, `ChatOpenAI(use_responses_api=
True)` in Responses and `ChatGoogleGenerativeAI` in Gemini; `google-genai` is Google's SDK in Gemini;
`pi-ai` is its `openai-completions`, `anthropic-messages`, `openai-responses` or
`google-generative-ai` API. A name's runtime is the same in every dialect (`runtime_of`), but for a
library that cannot share the lab's environment: langchain-google-genai needs google-genai below 3
while the lab has 3.3.0, so `langchain` in Gemini runs in a Python host started from an environment
of its own (`OWN_ENVIRONMENTS`).

The coding agents (`pi-coding-agent`, `claude-code`, `codex`, `gemini-cli`: labs.clients.agent_clis)
are clients too, each in the dialects it speaks; they have no long-lived host: every cell runs the
agent's command once, in a network namespace of its own (labs.clients.agent_host). They are in no
default set: a scenario runs them when its file says `agents = true` or when it is asked for by name.
"""

from __future__ import annotations

from finishline import Dialect
from labs.clients.agent_clis import AGENTS
from labs.dialects import LAB_DIALECTS

__all__ = [
    "AGENT_CLIENTS",
    "AGENT_CLIENTS_BY_DIALECT",
    "ALL_CLIENTS",
    "CLIENTS_BY_DIALECT",
    "DEFAULT_CLIENTS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_CLIENTS_BY_DIALECT",
    "EVERY_CLIENT",
    "LAB_API_KEY",
    "LIBRARY_CLIENTS_BY_DIALECT",
    "NODE_CLIENTS",
    "NODE_CLIENTS_BY_DIALECT",
    "OWN_ENVIRONMENTS",
    "PYTHON_CLIENTS",
    "PYTHON_CLIENTS_BY_DIALECT",
    "runtime_of",
]

#: Every client library the lab knows, per dialect, by the runtime whose host runs it; the matrix
#: shows them in this order, then the agents.
PYTHON_CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    Dialect.CHAT: ("openai-python", "openai-python-helper", "langchain", "litellm-sdk", "httpx-sse"),
    Dialect.MESSAGES: ("anthropic-python", "anthropic-python-helper", "langchain"),
    Dialect.RESPONSES: ("openai-python", "openai-python-helper", "langchain"),
    Dialect.GEMINI: ("google-genai", "langchain"),
}
NODE_CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    Dialect.CHAT: ("openai-node", "openai-node-helper", "ai-sdk-openai", "ai-sdk-compatible", "pi-ai"),
    Dialect.MESSAGES: ("anthropic-node", "anthropic-node-helper", "ai-sdk-anthropic", "pi-ai"),
    Dialect.RESPONSES: ("openai-node", "openai-node-helper", "ai-sdk-openai", "pi-ai"),
    Dialect.GEMINI: ("google-genai-node", "ai-sdk-google", "pi-ai"),
}
#: The client libraries (the drivers of labs.clients.hosts), per dialect.
LIBRARY_CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    dialect: PYTHON_CLIENTS_BY_DIALECT[dialect] + NODE_CLIENTS_BY_DIALECT[dialect] for dialect in LAB_DIALECTS
}
#: The coding agents, per dialect (Pi's agent in the three OpenAI and Anthropic ones, Claude Code,
#: Codex and gemini-cli in one each).
AGENT_CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    dialect: tuple(name for name, agent in AGENTS.items() if dialect in agent.dialects) for dialect in LAB_DIALECTS
}
#: The coding agents' names, in column order.
AGENT_CLIENTS: tuple[str, ...] = tuple(AGENTS)
#: Every client per dialect: the libraries, then the agents.
CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    dialect: LIBRARY_CLIENTS_BY_DIALECT[dialect] + AGENT_CLIENTS_BY_DIALECT[dialect] for dialect in LAB_DIALECTS
}
#: Every client name of any dialect, once each, in matrix order (Chat's libraries first, the agents last).
EVERY_CLIENT: tuple[str, ...] = (
    tuple(dict.fromkeys(name for dialect in LAB_DIALECTS for name in LIBRARY_CLIENTS_BY_DIALECT[dialect])) + AGENT_CLIENTS
)

#: The Chat client libraries, by the names code outside this package has always used.
PYTHON_CLIENTS = PYTHON_CLIENTS_BY_DIALECT[Dialect.CHAT]
NODE_CLIENTS = NODE_CLIENTS_BY_DIALECT[Dialect.CHAT]
ALL_CLIENTS = LIBRARY_CLIENTS_BY_DIALECT[Dialect.CHAT]
#: The clients of the default run (`make lab`; `--all` or `--client` lifts it), so that it stays
#: within minutes with every gateway in the matrix. Left out: the two that gave openai-python's
#: word in every scenario, through direct and finish_fix (measured with every scenario, 2026-12):
#: httpx-sse (the baseline SSE reader) and litellm-sdk (1.108.7 invents `stop` where openai-python
#: surfaces none; the word is the same). LangChain stays: it raises on a body without any chunk.
DEFAULT_CLIENTS = tuple(c for c in ALL_CLIENTS if c not in ("litellm-sdk", "httpx-sse"))
#: The default run's clients per dialect: Chat's as above, every library of the two new dialects
#: (the lab chooses which of their cells run by default). No agent: they add a minute or more to a
#: run that must stay within minutes (docs/lab.md, "The coding agents").
DEFAULT_CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    Dialect.CHAT: DEFAULT_CLIENTS,
    Dialect.MESSAGES: LIBRARY_CLIENTS_BY_DIALECT[Dialect.MESSAGES],
    Dialect.RESPONSES: LIBRARY_CLIENTS_BY_DIALECT[Dialect.RESPONSES],
    Dialect.GEMINI: LIBRARY_CLIENTS_BY_DIALECT[Dialect.GEMINI],
}

_RUNTIME_OF: dict[str, str] = {
    name: runtime
    for runtime, by_dialect in (
        ("python", PYTHON_CLIENTS_BY_DIALECT),
        ("node", NODE_CLIENTS_BY_DIALECT),
        ("agent", AGENT_CLIENTS_BY_DIALECT),
    )
    for names in by_dialect.values()
    for name in names
}


#: The Python clients that run, in one dialect, in an environment of their own (`.tools/clients/NAME`,
#: made by `make setup` from labs/clients/requirements/NAME.txt), by (client, dialect): NAME is also
#: the runtime of the driver host that runs them there, the Python host started from that
#: environment's interpreter (labs.clients.hosts). The same name stays one client in every dialect.
OWN_ENVIRONMENTS: dict[tuple[str, Dialect], str] = {
    # langchain-google-genai 4.4.2 needs google-genai below 3; the lab's google-genai is 3.3.0.
    ("langchain", Dialect.GEMINI): "langchain-google",
}


def runtime_of(client: str, dialect: Dialect | None = None) -> str:
    """The driver host that runs this client in `dialect`: `"python"` or `"node"` for a library,
    `"agent"` for a coding agent (labs.clients.agent_host runs each cell's command), or the name of
    the environment of its own that runs it in that dialect (`OWN_ENVIRONMENTS`). Without a
    dialect: the runtime of its dialects that have no environment of their own.

    The dialect is an optional argument, not a second table, because only such an environment
    makes a name's runtime differ by dialect: every other (client, dialect) keeps its name's runtime.

    Raises:
        LookupError: no dialect has a client of that name.
    """
    if dialect is not None and (client, dialect) in OWN_ENVIRONMENTS:
        return OWN_ENVIRONMENTS[client, dialect]
    try:
        return _RUNTIME_OF[client]
    except KeyError:
        raise LookupError(f"no client named {client!r}; known: {', '.join(EVERY_CLIENT)}") from None


#: The API key the lab's clients send when a gateway wants none of its own (the worker and
#: finish_fix accept any; LiteLLM sends this one upstream). One constant: the Node host receives it
#: in each request's `api_key`.
LAB_API_KEY = "sk-finishline-lab"

#: The token limit the lab's clients ask for when a scenario gives none and their API wants one (the
#: Messages API rejects a request without `max_tokens`): far above any answer the worker streams,
#: so the worker's own knobs decide where it stops. A scenario pins the worker's `max_tokens` to it
#: too (labs.scenario): the worker echoes its limit in its response head, and a byte-exact cut
#: needs every client's request to get the same bytes. labs/clients/node/drivers.mjs has the same
#: number.
DEFAULT_MAX_TOKENS = 4096
