"""The lab's finish_fix serves its Prometheus metrics (`finish_fix_metrics=127.0.0.1:0`: the kernel
picks the port, and mitmdump's log names it); when the run ends, the last scrape is kept next to
the ledger (`<label>-metrics.prom`), so the run's folder has finish_fix's counters as they stood,
to hold against its books."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import trio

__all__ = ["METRICS_OPTION", "keep_last_scrape", "metrics_url_in"]

#: The `--set` value: metrics on 127.0.0.1, on a port the kernel picks (no race for a free port).
METRICS_OPTION = "finish_fix_metrics=127.0.0.1:0"
# What finish_fix logs once it serves them (`finishline.addon.telemetry.Telemetry.serve_metrics`).
_SERVING = re.compile(r"finish_fix: metrics at (http://127\.0\.0\.1:\d+/metrics)")
_SCRAPE_TIMEOUT_S = 5.0


def metrics_url_in(log_text: str) -> str | None:
    """The metrics URL finish_fix logged in a mitmdump's output (it does so before mitmdump says it
    listens), or None."""
    found = _SERVING.search(log_text)
    return found.group(1) if found else None


async def keep_last_scrape(url: str | None, path: Path) -> None:
    """Writes what `url` serves now to `path`; nothing when there is no URL or it does not answer
    (the run's own results do not depend on it). Runs even while the run is being cancelled."""
    if url is None:
        return

    def scrape() -> None:
        try:
            response = httpx.get(url, timeout=_SCRAPE_TIMEOUT_S, trust_env=False)
        except httpx.HTTPError:
            return
        if response.status_code == 200:
            path.write_text(response.text)

    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(scrape)
