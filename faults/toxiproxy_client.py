"""Our one wrapper around toxiproxy-python (0.1.1): a client bound to one server, with timeouts.

toxiproxy-python keeps the server address in class attributes of `APIConsumer` (so two servers, or
two tests, would share one address process-wide) and calls `requests` without a timeout (so a hung
server hangs the lab). Rather than patching those globals, each `ToxiproxyClient` makes its own
subclass of `APIConsumer` with its address and a default timeout, and talks to the API through it.
toxiproxy-python's `Proxy` and `Toxiproxy` objects call the global `APIConsumer` directly, so this
module does not use their methods; it keeps the library's HTTP layer, its response validation and
its exceptions (`ProxyExists`, `NotFound`, `InvalidToxic`).

Everything here is blocking and fast (loopback); trio code calls it through
`trio.to_thread.run_sync` (see `faults.fault`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

__all__ = [
    "InvalidToxic",
    "NotFound",
    "ProxyExists",
    "ProxyInfo",
    "Toxic",
    "ToxiproxyClient",
    "ToxiproxyError",
    "ToxiproxyUnavailable",
]

#: Seconds for any API call; toxiproxy answers loopback calls in milliseconds.
DEFAULT_TIMEOUT = 5.0


class ToxiproxyError(RuntimeError):
    """The toxiproxy API refused a call; the message has its answer."""


class ToxiproxyUnavailable(ToxiproxyError):
    """Nothing answers at the toxiproxy address (not running, wrong port, or hung)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Toxic:
    """One toxic as toxiproxy's API takes it. `stream`: `downstream` is upstream server to client."""

    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyInfo:
    """A proxy as the server reports it; `listen_port` is the port clients connect to."""

    name: str
    listen: str
    upstream: str
    enabled: bool

    @property
    def listen_host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


class ToxiproxyClient:
    """A client for one toxiproxy server at `host:port`, every call bounded by `timeout` seconds."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 8474, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self._api = _bound_consumer(host, port, timeout)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- server -------------------------------------------------------------------------------

    def version(self) -> str:
        """The server's version, e.g. `2.12.0` (v2.12 answers JSON, older servers plain text)."""
        text = self._call("get", "/version").text.strip()
        try:
            return str(json.loads(text)["version"])
        except (ValueError, KeyError, TypeError):
            return text

    def reset(self) -> None:
        """Re-enable every proxy and remove every toxic (between runs)."""
        self._call("post", "/reset")

    def proxies(self) -> dict[str, ProxyInfo]:
        return {name: _proxy_info(values) for name, values in self._call("get", "/proxies").json().items()}

    # -- proxies ------------------------------------------------------------------------------

    def create_proxy(self, name: str, *, upstream: str, listen: str = "127.0.0.1:0") -> ProxyInfo:
        """Create a proxy; `listen` port 0 lets toxiproxy pick a free port (see `.listen_port`).

        Raises:
            ProxyExists: a proxy of that name exists.
        """
        body = {"name": name, "upstream": upstream, "listen": listen, "enabled": True}
        return _proxy_info(self._call("post", "/proxies", json=body).json())

    def delete_proxy(self, name: str) -> None:
        self._call("delete", f"/proxies/{name}")

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Disabled: new connections are refused, live ones are closed (FIN on both sides)."""
        self._call("post", f"/proxies/{name}", json={"enabled": enabled})

    # -- toxics -------------------------------------------------------------------------------

    def add_toxic(self, proxy: str, toxic: Toxic) -> None:
        """Add a toxic at the end of its direction's chain (toxics act in the order added)."""
        self._call("post", f"/proxies/{proxy}/toxics", json=toxic.to_json())

    def remove_toxic(self, proxy: str, name: str, *, missing_ok: bool = True) -> None:
        try:
            self._call("delete", f"/proxies/{proxy}/toxics/{name}")
        except NotFound:
            if not missing_ok:
                raise

    def toxics(self, proxy: str) -> list[Toxic]:
        return [
            Toxic(
                name=t["name"],
                type=t["type"],
                stream=t["stream"],
                toxicity=t["toxicity"],
                attributes=t.get("attributes") or {},
            )
            for t in self._call("get", f"/proxies/{proxy}/toxics").json()
        ]

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = getattr(self._api, method)(path, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise ToxiproxyUnavailable(
                f"toxiproxy is not answering at {self.url} ({type(exc).__name__}); is the server running?"
            ) from None
        if response.status_code >= 400:
            raise ToxiproxyError(f"toxiproxy {method.upper()} {path}: {response.status_code} {response.text.strip()}")
        return response


def _bound_consumer(host: str, port: int, timeout: float) -> type[APIConsumer]:
    """A subclass of toxiproxy-python's `APIConsumer` with its own address and a default timeout."""

    class BoundAPIConsumer(APIConsumer):
        @classmethod
        def get(cls, url: str, params: Any = None, **kwargs: Any) -> requests.Response:
            kwargs.setdefault("timeout", timeout)
            return super().get(url, params, **kwargs)

        @classmethod
        def post(cls, url: str, data: Any = None, json: Any = None, **kwargs: Any) -> requests.Response:
            kwargs.setdefault("timeout", timeout)
            return super().post(url, data, json, **kwargs)

        @classmethod
        def delete(cls, url: str, **kwargs: Any) -> requests.Response:
            kwargs.setdefault("timeout", timeout)
            return super().delete(url, **kwargs)

    BoundAPIConsumer.host = host
    BoundAPIConsumer.port = port
    return BoundAPIConsumer


def _proxy_info(values: Mapping[str, Any]) -> ProxyInfo:
    return ProxyInfo(name=values["name"], listen=values["listen"], upstream=values["upstream"], enabled=values["enabled"])
