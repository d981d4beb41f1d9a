"""The lab's client drivers and the trio side that talks to them.

Drivers run in long-lived host processes, one per runtime (labs/clients/python_host.py for the
Python libraries, labs/clients/node/host.mjs for the Node ones), many requests per process, one JSON
line per request and per outcome. `labs.clients.hosts` starts them and sends them work.
"""

#: Every client the lab knows, by the runtime whose host runs it; the matrix shows them in this order.
PYTHON_CLIENTS = ("openai-python", "openai-python-helper", "langchain", "litellm-sdk", "httpx-sse")
NODE_CLIENTS = ("openai-node", "openai-node-helper", "ai-sdk-openai", "ai-sdk-compatible", "pi-ai")
ALL_CLIENTS = PYTHON_CLIENTS + NODE_CLIENTS
#: The clients of the default run (`make lab`; `--all` or `--client` lifts it), so that it stays
#: within minutes with every gateway in the matrix. Left out: the two that gave openai-python's
#: word in every scenario, through direct and finish_fix (measured with every scenario, 2026-12):
#: httpx-sse (the baseline SSE reader) and litellm-sdk (1.108.7 invents `stop` where openai-python
#: surfaces none; the word is the same). LangChain stays: it raises on a body without any chunk.
DEFAULT_CLIENTS = tuple(c for c in ALL_CLIENTS if c not in ("litellm-sdk", "httpx-sse"))

#: The API key the lab's clients send when a gateway wants none of its own (the worker and
#: finish_fix accept any; LiteLLM sends this one upstream). One constant: the Node host receives it
#: in each request's `api_key`.
LAB_API_KEY = "sk-finishline-lab"
