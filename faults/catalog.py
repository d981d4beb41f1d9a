"""The faults, as data: which toxics (or a disabled proxy) produce each one.

Every builder is named after the fault a user reads in a report and returns a `Fault`; nothing
here touches the network. `Fault.applied(client, proxy)` (`faults.fault`) puts it in place for
the duration of a `with` / `async with` block and always takes it away.

Byte-exact faults take a `layout` (`faults.layout.ResponseLayout`): the worker's computed
`ResponsePlan`, or a `CapturedLayout` probed from a real upstream.

toxiproxy facts these rely on (v2.12.0, `toxics/*.go` and `link.go`; checked by tests/test_faults*):
- `limit_data` passes exactly `bytes` in its direction, then closes the client side (FIN).
- A `reset_peer` toxic present when a connection opens makes toxiproxy set SO_LINGER 0 on both of
  its sockets, so any later close is a TCP reset; with `toxicity: 0` it never fires by itself.
- `slow_close` holds a close back for `delay` ms: after `limit_data`, the client has its bytes and
  an open, silent connection, which is a hung worker as the client sees it.
- Toxics in one direction act in the order they were added.
"""

from __future__ import annotations

from faults.fault import Fault
from faults.layout import ResponseLayout
from faults.toxiproxy_client import Toxic

__all__ = [
    "FAULT_NAMES",
    "Fault",
    "bandwidth",
    "cut_after_tokens",
    "cut_during_prefill",
    "down",
    "latency",
    "slice",
    "stall_after_tokens",
]

#: A day: "forever" for a test or a lab run, yet finite if a toxic is ever left behind.
STALL_MILLISECONDS = 24 * 3600 * 1000


def _token_events(n: int) -> str:
    return "1 token event" if n == 1 else f"{n} token events"


def _limit(name: str, count: int) -> Toxic:
    return Toxic(name=f"{name}_limit_data", type="limit_data", stream="downstream", attributes={"bytes": count})


def _reset_arm(name: str) -> Toxic:
    return Toxic(name=f"{name}_reset_arm", type="reset_peer", stream="upstream", toxicity=0.0, attributes={"timeout": 0})


def cut_during_prefill(layout: ResponseLayout, *, reset: bool = False, after_seconds: float = 0.0) -> Fault:
    """The tunnel drops after the response head (200 and headers) and before any event.

    With `after_seconds`, the drop comes that long after the head (a `slow_close` holds it back):
    a tunnel that dies in the middle of a long prefill, as in the post-mortem (13.7 s).
    """
    if after_seconds < 0:
        raise ValueError(f"after_seconds must be >= 0, got {after_seconds}")
    name = "cut_during_prefill"
    toxics = (_reset_arm(name),) if reset else ()
    how = "reset" if reset else "FIN"
    hold: tuple[Toxic, ...] = ()
    if after_seconds:
        delay = round(after_seconds * 1000)
        hold = (Toxic(name=f"{name}_slow_close", type="slow_close", stream="downstream", attributes={"delay": delay}),)
    return Fault(
        name=name,
        summary=f"the client gets the {layout.head_length}-byte response head, then a {how}"
        + (f" {after_seconds:g} s later" if after_seconds else ""),
        toxics=(*toxics, _limit(name, layout.head_length), *hold),
    )


def cut_after_tokens(n: int, layout: ResponseLayout, *, reset: bool = False) -> Fault:
    """The tunnel drops right after the n-th token event: a FIN, or a TCP reset with `reset=True`.

    Raises:
        ValueError: n is negative or the response has fewer token events.
    """
    name = "cut_after_tokens"
    count = layout.offset_after_tokens(n)
    toxics = (_reset_arm(name),) if reset else ()
    how = "reset" if reset else "FIN"
    return Fault(
        name=name,
        summary=f"the client gets {_token_events(n)} ({count} bytes), then a {how}",
        toxics=(*toxics, _limit(name, count)),
    )


def stall_after_tokens(n: int, layout: ResponseLayout) -> Fault:
    """The stream goes silent right after the n-th token event and the connection stays open.

    The connection closes (FIN) when the fault is removed.
    """
    name = "stall_after_tokens"
    count = layout.offset_after_tokens(n)
    hold = Toxic(name=f"{name}_slow_close", type="slow_close", stream="downstream", attributes={"delay": STALL_MILLISECONDS})
    return Fault(
        name=name,
        summary=f"the client gets {_token_events(n)} ({count} bytes), then silence on an open connection",
        toxics=(_limit(name, count), hold),
    )


def slice(*, average_size: int = 3, size_variation: int = 2, delay_microseconds: int = 100) -> Fault:
    """Tiny TCP segments at random split points (an SSE parser torture test). Bytes are unchanged."""
    if not 0 <= size_variation < average_size:
        raise ValueError(f"slice needs 0 <= size_variation < average_size, got {size_variation} and {average_size}")
    if delay_microseconds < 0:
        raise ValueError(f"slice delay must be >= 0 microseconds, got {delay_microseconds}")
    attributes = {"average_size": average_size, "size_variation": size_variation, "delay": delay_microseconds}
    return Fault(
        name="slice",
        summary=f"the client gets every byte in segments of {average_size}±{size_variation} bytes",
        toxics=(Toxic(name="slice_slicer", type="slicer", stream="downstream", attributes=attributes),),
    )


def latency(*, milliseconds: int = 100, jitter: int = 50) -> Fault:
    """Every downstream chunk is delayed by `milliseconds` ± `jitter` (uniform)."""
    if milliseconds < 0 or not 0 <= jitter:
        raise ValueError(f"latency needs milliseconds >= 0 and jitter >= 0, got {milliseconds} and {jitter}")
    attributes = {"latency": milliseconds, "jitter": jitter}
    return Fault(
        name="latency",
        summary=f"every chunk arrives {milliseconds}±{jitter} ms late",
        toxics=(Toxic(name="latency_latency", type="latency", stream="downstream", attributes=attributes),),
    )


def bandwidth(*, kilobytes_per_second: int = 1) -> Fault:
    """Downstream throughput limited to `kilobytes_per_second` KB/s."""
    if kilobytes_per_second < 1:
        raise ValueError(f"bandwidth needs at least 1 KB/s, got {kilobytes_per_second}")
    return Fault(
        name="bandwidth",
        summary=f"the stream arrives at {kilobytes_per_second} KB/s",
        toxics=(
            Toxic(name="bandwidth_bandwidth", type="bandwidth", stream="downstream", attributes={"rate": kilobytes_per_second}),
        ),
    )


def down() -> Fault:
    """The proxy is disabled: new connections are refused; live ones are closed (FIN)."""
    return Fault(name="down", summary="connections are refused", disables_proxy=True)


#: Every fault name, as the CLI and the lab's scenarios spell them.
FAULT_NAMES = (
    "cut_during_prefill",
    "cut_after_tokens",
    "stall_after_tokens",
    "slice",
    "latency",
    "bandwidth",
    "down",
)
