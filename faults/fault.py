"""A fault as data (`Fault`), and applying it to a toxiproxy proxy for the duration of a block.

`Fault` is what `faults.catalog` builds; `Fault.applied(...)` gives a `ScopedFault`, which puts the
fault in place and always takes it away. They live together because each needs the other.

Like toxiproxy's Ruby client (`proxy.down do ... end`): entering adds the fault's toxics (and
disables the proxy for `down`), leaving removes exactly those toxics and re-enables the proxy,
also when the block raised or was cancelled. Usable from plain code (`with`) and from trio
(`async with`: the blocking API calls run in a worker thread so other tasks keep streaming).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

import trio

from faults.toxiproxy_client import Toxic, ToxiproxyClient

__all__ = ["Fault", "ScopedFault"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One fault: its name, what the client sees, and the toxics that make it."""

    #: The fault's name, as the CLI, the lab's scenarios and reports spell it.
    name: str
    #: One line: what the client will see.
    summary: str
    toxics: tuple[Toxic, ...] = ()
    #: Disable the proxy (connections refused) instead of, or besides, adding toxics.
    disables_proxy: bool = False

    def applied(self, client: ToxiproxyClient, proxy: str) -> ScopedFault:
        """A context manager (`with` or `async with`) that applies this fault to `proxy` and undoes it.

        Apply it before the client opens its connection: the reset variant arms at connection
        start, and `limit_data` counts bytes per connection from the moment it is added.
        """
        return ScopedFault(client=client, proxy=proxy, fault=self)


class ScopedFault:
    """A fault applied to one proxy while the context is entered; not reentrant."""

    def __init__(self, *, client: ToxiproxyClient, proxy: str, fault: Fault) -> None:
        self.client = client
        self.proxy = proxy
        self.fault = fault
        self._added: list[str] = []
        self._disabled = False

    def __repr__(self) -> str:
        return f"<ScopedFault {self.fault.name} on {self.proxy}: {self.fault.summary}>"

    # -- sync ---------------------------------------------------------------------------------

    def __enter__(self) -> ScopedFault:
        if self._added or self._disabled:
            raise RuntimeError(f"{self!r} is already applied")
        try:
            for toxic in self.fault.toxics:
                self.client.add_toxic(self.proxy, toxic)
                self._added.append(toxic.name)
            if self.fault.disables_proxy:
                self.client.set_enabled(self.proxy, False)
                self._disabled = True
        except BaseException:
            # Half-applied is worse than not applied: undo what was added, then raise.
            self._undo()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._undo()

    def _undo(self) -> None:
        # Remove in reverse order: the last toxic added sits at the end of the chain.
        errors = []
        if self._disabled:
            try:
                self.client.set_enabled(self.proxy, True)
                self._disabled = False
            except Exception as exc:  # keep removing the rest, report below
                errors.append(exc)
        while self._added:
            name = self._added.pop()
            try:
                self.client.remove_toxic(self.proxy, name)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- trio ---------------------------------------------------------------------------------

    async def __aenter__(self) -> ScopedFault:
        await trio.to_thread.run_sync(self.__enter__)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        # Shielded: a cancelled lab run must still take its toxics away.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._undo)
