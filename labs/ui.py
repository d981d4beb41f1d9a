"""`make ui` (`python -m labs.ui`): the worker, its toxiproxy tunnel and mitmweb with finish_fix in
reverse mode, all on 127.0.0.1, until Ctrl-C; prints how to send a stream through and how to break
the tunnel live with `python -m faults`, so an engineer can watch repaired and interrupted flows
in mitmweb's UI.
"""

from __future__ import annotations

import secrets
import shlex
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from faults.toxiproxy_server import open_toxiproxy_server
from labs.entry import run_command
from labs.gateways.services import BIN, FINISH_FIX_SCRIPT, MITM_LISTENING
from labs.processes import open_service
from labs.scenario_run import TUNNEL
from labs.worker.server import open_worker

#: Where `make ui` keeps its logs and finish_fix's ledger (one folder per start, kept after exit).
RESULTS_DIR = Path("lab-results")
EXAMPLE_MODEL = "finishline-worker;tokens=40;token_delay=0.15;finish=omitted"


def _instructions(proxy_port: int, web_port: int, password: str, toxiproxy_url: str, ledger: Path) -> str:
    body = f'{{"model": "{EXAMPLE_MODEL}", "stream": true, "messages": [{{"role": "user", "content": "hi"}}]}}'
    python = shlex.quote(sys.executable)
    return f"""
finishline ui is running (Ctrl-C stops everything)

  mitmweb UI:      http://127.0.0.1:{web_port}/   (password: {password})
  finish_fix:      http://127.0.0.1:{proxy_port}/v1   <- your client's base URL (any API key)
  books (ledger):  {ledger}

A stream through finish_fix (the worker omits finish_reason; finish_fix adds it):

  curl -N http://127.0.0.1:{proxy_port}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{body}'

The worker's knobs ride in the model name (or the x-finishline-worker header); see
`{python} -m labs.worker --help`. For a client: OPENAI_BASE_URL=http://127.0.0.1:{proxy_port}/v1
OPENAI_API_KEY=sk-any, model "{EXAMPLE_MODEL}".

Break the tunnel live, in another shell (the fault stays while the command runs, Ctrl-C removes it):

  export TOXIPROXY_URL={toxiproxy_url}
  {python} -m faults cut_after_tokens 5 --request '{body}'
  {python} -m faults stall_after_tokens 5 --request '{body}'
  {python} -m faults cut_during_prefill --request '{body}'
  {python} -m faults down

then send the curl above again and watch the flow in mitmweb: marked, with a comment saying what
finish_fix did (repaired, interrupted after N events, ...).
"""


async def main(results_dir: Path = RESULTS_DIR) -> None:
    run_dir = (results_dir / time.strftime("ui-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    async with AsyncExitStack() as stack:
        worker = await stack.enter_async_context(open_worker())
        toxiproxy = await stack.enter_async_context(open_toxiproxy_server(log_path=str(run_dir / "toxiproxy.log")))
        tunnel = await trio.to_thread.run_sync(lambda: toxiproxy.client.create_proxy(TUNNEL, upstream=f"127.0.0.1:{worker.port}"))
        password = secrets.token_urlsafe(9)
        ledger = run_dir / "finish_fix-ledger.jsonl"
        log_path = run_dir / "mitmweb.log"
        # Both of mitmweb's servers listen on port 0; the launcher reads their ports from its own
        # sockets. Its log names the proxy's ("listening at"); the web UI's, bound before it
        # (mitmproxy's WebMaster.running), is the other one.
        argv = [
            str(BIN / "mitmweb"),
            "--mode",
            f"reverse:http://127.0.0.1:{tunnel.listen_port}",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            "--web-host",
            "127.0.0.1",
            "--web-port",
            "0",
            "-s",
            str(FINISH_FIX_SCRIPT),
            "--set",
            f"confdir={run_dir / 'mitmproxy-conf'}",
            "--set",
            f"finish_fix_ledger={ledger}",
            "--set",
            "web_open_browser=false",
            "--set",
            f"web_password={password}",
        ]
        mitmweb, proxy_port = await stack.enter_async_context(
            open_service("mitmweb (finish_fix)", argv, port=0, port_in_log=MITM_LISTENING, log_path=log_path)
        )
        ports = mitmweb.listening_ports()
        if ports is None:
            raise RuntimeError("the web UI's port is read from Linux's /proc, which this system does not have")
        (web_port,) = ports - {proxy_port}
        print(_instructions(proxy_port, web_port, password, toxiproxy.client.url, ledger), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    status, _ = run_command(main)
    # Ctrl-C is how `make ui` is meant to end: not a failure.
    sys.exit(0 if status >= 128 else status)
