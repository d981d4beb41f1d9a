"""The lab's client drivers and the trio side that talks to them.

Drivers run in long-lived host processes, one per runtime (labs/clients/python_host.py for the
Python libraries, labs/clients/node/host.mjs for the Node ones), many requests per process, one JSON
line per request and per outcome. `labs.clients.hosts` starts them and sends them work.
"""

#: Every client the lab knows, by the runtime whose host runs it; the matrix shows them in this order.
PYTHON_CLIENTS = ("openai-python", "openai-python-helper", "langchain", "litellm-sdk", "httpx-sse")
NODE_CLIENTS = ("openai-node", "openai-node-helper", "ai-sdk-openai", "ai-sdk-compatible", "pi-ai")
ALL_CLIENTS = PYTHON_CLIENTS + NODE_CLIENTS

#: The API key the lab's clients send when a gateway wants none of its own (the worker and
#: finish_fix accept any; LiteLLM sends this one upstream). One constant: the Node host receives it
#: in each request's `api_key`.
LAB_API_KEY = "sk-finishline-lab"
