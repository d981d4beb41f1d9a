"""The gateways a lab puts between a client and the worker's tunnel (toxiproxy), each on 127.0.0.1.

- `direct`: the client talks to the tunnel itself.
- `finish_fix`: `mitmdump --mode reverse:<tunnel> -s addons/finish_fix.py` in front of the tunnel
  (the client-side placement).
- `litellm`: the real LiteLLM proxy, its deployment's `api_base` the tunnel.
- `litellm+finish_fix`: LiteLLM whose deployment goes through finish_fix to the tunnel (the
  gateway-side placement).
- `external`: a URL the engineer gives (their own gateway); the lab does not start it, has no
  books for it, and its worker is whatever that gateway talks to.
"""

#: The lab's own gateways, in the order the matrix shows them.
GATEWAYS = ("direct", "finish_fix", "litellm", "litellm+finish_fix")
EXTERNAL = "external"

#: Environment variable naming the file LiteLLM's books callback (labs.gateways.litellm_books)
#: appends to; here so the runner need not import LiteLLM to know it.
LITELLM_BOOKS_ENV = "FINISHLINE_LITELLM_BOOKS"
