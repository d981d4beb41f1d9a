"""Start the lab's gateways and read their books.

One mitmdump with finish_fix serves both finish_fix placements (the client's, and LiteLLM's
upstream), and one LiteLLM proxy serves both LiteLLM gateways: its model list routes a model name
starting with `via-finish-fix/` to finish_fix and every other name straight to the tunnel. LiteLLM
takes ~15 s to start on a small machine, so starting it once matters.

Books: finish_fix appends a ledger line per flow (`--set finish_fix_ledger=...`); LiteLLM's
success/failure callbacks (labs.gateways.litellm_books) append theirs. Both record the request's
model name, which carries the cell id (`labs.scenario.Scenario.model_name`), so a cell finds its
entry by id.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from labs.clients import LAB_API_KEY
from labs.gateways import EXTERNAL, LITELLM_BOOKS_ENV
from labs.outcome import BOOKS_ERROR, BOOKS_OK
from labs.processes import ServiceError, bind_failed, free_port, open_service

__all__ = ["Gateway", "books_entry", "open_gateways"]

ROOT = Path(__file__).resolve().parents[2]
FINISH_FIX_SCRIPT = ROOT / "addons" / "finish_fix.py"
STREAM_CAPTURE_SCRIPT = Path(__file__).resolve().parent / "stream_capture.py"
BIN = Path(sys.executable).parent
#: What mitmdump and mitmweb print once their proxy listens (asked for port 0).
MITM_LISTENING = re.compile(r"listening at 127\.0\.0\.1:(\d+)")
#: Tries for a program that cannot listen on port 0 (LiteLLM): the free port may be taken between
#: `free_port` and the program's bind; a bind failure is then retried on another port.
BIND_ATTEMPTS = 3
#: LiteLLM routes model names with this prefix through finish_fix.
VIA_FINISH_FIX = "via-finish-fix/"

# finish_fix's verdicts, as the books column words (README of issue 2: clean and repaired are
# successes; interrupted, upstream_error and http_error failures; skipped says nothing).
_FINISH_FIX_BOOKS = {
    "clean": BOOKS_OK,
    "repaired": BOOKS_OK,
    "interrupted": BOOKS_ERROR,
    "upstream_error": BOOKS_ERROR,
    "http_error": BOOKS_ERROR,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Gateway:
    name: str
    base_url: str
    #: The JSON-lines file this gateway's books go to, or None (no books).
    books_path: Path | None = None
    #: Prefix the gateway needs on the model name (LiteLLM's route through finish_fix).
    model_prefix: str = ""
    #: Whose books: `finish_fix` or `litellm`.
    books_kind: str | None = None
    #: The API key the gateway wants (LiteLLM's master key of this run); None: any.
    api_key: str | None = None
    #: JSON lines of the streams finish_fix sent on (labs/gateways/stream_capture.py), or None.
    capture_path: Path | None = None


def _litellm_config(path: Path, tunnel_url: str, finish_fix_url: str, master_key: str) -> None:
    # JSON is valid YAML, and needs no YAML writer here.
    config = {
        "model_list": [
            {
                "model_name": f"{VIA_FINISH_FIX}*",
                "litellm_params": {"model": "openai/*", "api_base": finish_fix_url, "api_key": LAB_API_KEY},
            },
            {
                "model_name": "*",
                "litellm_params": {"model": "openai/*", "api_base": tunnel_url, "api_key": LAB_API_KEY},
            },
        ],
        "litellm_settings": {"callbacks": ["labs.gateways.litellm_books.books"], "telemetry": False},
        "general_settings": {"master_key": master_key},
    }
    path.write_text(json.dumps(config, indent=2))


@asynccontextmanager
async def _open_finish_fix(upstream_url: str, run_dir: Path) -> AsyncIterator[tuple[str, Path, Path]]:
    ledger = run_dir / "finish_fix-ledger.jsonl"
    capture = run_dir / "finish_fix-streams.jsonl"
    confdir = run_dir / "mitmproxy-conf"
    confdir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(BIN / "mitmdump"),
        "--mode", f"reverse:{upstream_url}",
        "--listen-host", "127.0.0.1",
        "--listen-port", "0",
        "-s", str(FINISH_FIX_SCRIPT),
        "--set", f"confdir={confdir}",
        "--set", f"finish_fix_ledger={ledger}",
        "-s", str(STREAM_CAPTURE_SCRIPT),
        "--set", f"finishline_capture={capture}",
        # `info`: the "listening at" line the port is read from is an info message.
        "--set", "termlog_verbosity=info",
        "--set", "flow_detail=0",
    ]
    async with open_service(
        "mitmdump (finish_fix)", argv, port=0, port_in_log=MITM_LISTENING, log_path=run_dir / "mitmdump.log", start_timeout=30
    ) as (_, port):
        yield f"http://127.0.0.1:{port}/v1", ledger, capture


@asynccontextmanager
async def _open_litellm(upstream_url: str, finish_fix_url: str | None, run_dir: Path) -> AsyncIterator[tuple[str, Path, str]]:
    books = run_dir / "litellm-books.jsonl"
    books.touch()
    config = run_dir / "litellm-config.yaml"
    master_key = "sk-lab-" + secrets.token_hex(16)
    tunnel_url = f"{upstream_url}/v1"
    _litellm_config(config, tunnel_url, finish_fix_url or tunnel_url, master_key)
    env = {LITELLM_BOOKS_ENV: str(books), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    async with AsyncExitStack() as stack:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            port = free_port()
            argv = [str(BIN / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
            try:
                await stack.enter_async_context(open_service(
                    "litellm proxy", argv, port=port, log_path=run_dir / "litellm.log", env=env,
                    health_path="/health/liveliness", start_timeout=120,
                ))
            except ServiceError as error:
                if attempt < BIND_ATTEMPTS and bind_failed(error):
                    continue
                raise
            break
        yield f"http://127.0.0.1:{port}/v1", books, master_key


@asynccontextmanager
async def open_gateways(
    names: tuple[str, ...],
    *,
    primary_url: str | None,
    spare_url: str | None = None,
    run_dir: Path,
    external_url: str | None = None,
    external_api_key: str | None = None,
) -> AsyncIterator[dict[str, Gateway]]:
    """Start what `names` need and yield {name: Gateway}.

    `primary_url`: the gateways' first upstream, `http://127.0.0.1:PORT` without `/v1` (the
    worker's tunnel, or the hub in front of it; not needed when only `external` runs).
    `spare_url`: a second, healthy worker for the gateways that can have more than one upstream
    (None: a pool of one).
    """
    gateways: dict[str, Gateway] = {}
    async with AsyncExitStack() as stack:
        if "direct" in names:
            gateways["direct"] = Gateway(name="direct", base_url=f"{primary_url}/v1")
        finish_fix_url = ledger = capture = None
        if "finish_fix" in names or "litellm+finish_fix" in names:
            finish_fix_url, ledger, capture = await stack.enter_async_context(_open_finish_fix(primary_url, run_dir))
            if "finish_fix" in names:
                gateways["finish_fix"] = Gateway(
                    name="finish_fix", base_url=finish_fix_url, books_path=ledger, books_kind="finish_fix", capture_path=capture
                )
        if "litellm" in names or "litellm+finish_fix" in names:
            url, books, key = await stack.enter_async_context(_open_litellm(primary_url, finish_fix_url, run_dir))
            if "litellm" in names:
                gateways["litellm"] = Gateway(name="litellm", base_url=url, books_path=books, books_kind="litellm", api_key=key)
            if "litellm+finish_fix" in names:
                gateways["litellm+finish_fix"] = Gateway(
                    name="litellm+finish_fix", base_url=url, books_path=books, books_kind="litellm", model_prefix=VIA_FINISH_FIX,
                    api_key=key, capture_path=capture,
                )
        if EXTERNAL in names:
            if not external_url:
                raise ValueError("the external gateway needs --gateway-url")
            gateways[EXTERNAL] = Gateway(name=EXTERNAL, base_url=external_url.rstrip("/"), api_key=external_api_key)
        yield gateways


def read_books(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def books_entry(gateway: Gateway, entries: list[dict[str, Any]], cell_id: str) -> tuple[str | None, dict[str, Any] | None]:
    """The books' word (`ok`/`error`, None when there is no entry) and the entry for one cell.

    The cell id is the first item of the model name; LiteLLM may record it with its route prefix.
    With `litellm+finish_fix` two books see the request; the gateway's own (LiteLLM's) count.
    """
    mine = [e for e in entries if _cell_of(e.get("model")) == cell_id]
    if not mine:
        return None, None
    entry = mine[-1]
    if gateway.books_kind == "finish_fix":
        return _FINISH_FIX_BOOKS.get(entry.get("verdict")), entry
    return (BOOKS_OK if entry.get("status") == "success" else BOOKS_ERROR), entry


def captured_stream(entries: list[dict[str, Any]], cell_id: str) -> str | None:
    """The stream finish_fix sent on for one cell (to the client, or to LiteLLM), if captured."""
    mine = [e for e in entries if _cell_of(e.get("model")) == cell_id]
    return mine[-1].get("stream") if mine else None


def _cell_of(model: object) -> str | None:
    if not isinstance(model, str):
        return None
    name = model.split(";", 1)[0]
    return name.rsplit("/", 1)[-1]
