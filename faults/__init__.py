"""Faults for the lab, driven through the real toxiproxy server.

- `faults.catalog`: each fault as data (`cut_during_prefill`, `cut_after_tokens`,
  `stall_after_tokens`, `slice`, `latency`, `bandwidth`, `down`); `fault.applied(client, proxy)` is a
  `with` / `async with` block that applies it and always removes it (`faults.fault`).
- `faults.layout` / `faults.probe`: where token events end, computed (the worker) or captured (any
  upstream), so that "cut after n tokens" is exact.
- `faults.toxiproxy_server`: start/stop toxiproxy-server (port 0: the port it binds is read back);
  `faults.toxiproxy_client`: our wrapper around toxiproxy-python (per-server address, timeouts).
- `python -m faults --help`: the same from a shell.
"""

from faults.catalog import (
    FAULT_NAMES,
    Fault,
    bandwidth,
    cut_after_tokens,
    cut_during_prefill,
    down,
    latency,
    slice,
    stall_after_tokens,
)
from faults.fault import ScopedFault
from faults.layout import CapturedLayout, ResponseLayout, layout_from_capture
from faults.probe import UnstableUpstream, probe_layout
from faults.toxiproxy_client import ProxyInfo, Toxic, ToxiproxyClient, ToxiproxyError, ToxiproxyUnavailable
from faults.toxiproxy_server import ToxiproxyServer, open_toxiproxy_server, run_toxiproxy_server

__all__ = [
    "FAULT_NAMES",
    "CapturedLayout",
    "Fault",
    "ProxyInfo",
    "ResponseLayout",
    "ScopedFault",
    "Toxic",
    "ToxiproxyClient",
    "ToxiproxyError",
    "ToxiproxyServer",
    "ToxiproxyUnavailable",
    "UnstableUpstream",
    "bandwidth",
    "cut_after_tokens",
    "cut_during_prefill",
    "down",
    "latency",
    "layout_from_capture",
    "open_toxiproxy_server",
    "probe_layout",
    "run_toxiproxy_server",
    "slice",
    "stall_after_tokens",
]
