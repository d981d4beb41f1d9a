"""The gateways a lab puts between a client and the worker, each on 127.0.0.1.

Each gateway is an entry in the registry (labs.gateways.registry), defined in one module per
gateway: `direct` and `external` (labs.gateways.direct), `finish_fix` (finish_fix_proxy),
`litellm` and `litellm+finish_fix` (litellm_proxy), and the routers and proxies in the modules
the registry lists. `python -m labs.gateways` lists them, each with a sentence and whether it is
installed.
"""

#: The name of the engineer's own gateway (`--gateway-url`); not one of the lab's gateways.
EXTERNAL = "external"

#: Environment variable naming the file LiteLLM's books callback (labs.gateways.litellm_books)
#: appends to; here so the runner need not import LiteLLM to know it.
LITELLM_BOOKS_ENV = "FINISHLINE_LITELLM_BOOKS"

# After the names above: the gateway modules import them while the registry loads.
from labs.gateways.registry import entries as _entries  # noqa: E402

#: The lab's own gateways, in the order the matrix shows them (built from the registry).
GATEWAYS = tuple(name for name in _entries() if name != EXTERNAL)
