"""The gateways a lab puts between a client and the worker, each on 127.0.0.1.

Each gateway is an entry in the registry (labs.gateways.registry), defined in one module per
gateway: `direct` and `external` (labs.gateways.direct), `finish_fix` (finish_fix_proxy),
the LiteLLM variants (litellm_proxy; its Gemini pass-through in litellm_passthrough), and the
routers and proxies in the modules the registry lists. `python -m labs.gateways` lists them, each with a sentence and whether it is
installed.
"""

from labs.gateways.registry import EXTERNAL, entries

__all__ = ["EXTERNAL", "GATEWAYS"]

#: The lab's own gateways, in the order the matrix shows them (built from the registry).
GATEWAYS = tuple(name for name in entries() if name != EXTERNAL)
