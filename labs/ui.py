"""`make ui` (`python -m labs.ui`): the worker, its toxiproxy tunnel and mitmweb with finish_fix in
reverse mode, all on 127.0.0.1, until Ctrl-C; prints how to send a stream through and how to break
the tunnel live with `python -m faults`, so an engineer can watch repaired and interrupted flows
in mitmweb's UI.
"""

from __future__ import annotations

import secrets
import shlex
import sys
import tempfile
from pathlib import Path

import trio

from faults.toxiproxy_server import open_toxiproxy_server
from labs.gateways.services import BIN, FINISH_FIX_SCRIPT
from labs.processes import free_port, open_service
from labs.worker.server import open_worker

TUNNEL = "worker"
EXAMPLE_MODEL = "finishline-worker;tokens=40;token_delay=0.15;finish=omitted"


def _instructions(proxy_port: int, web_port: int, password: str, toxiproxy_url: str, ledger: Path) -> str:
    body = '{"model": "%s", "stream": true, "messages": [{"role": "user", "content": "hi"}]}' % EXAMPLE_MODEL
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


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="finishline-ui-") as scratch:
        run_dir = Path(scratch)
        async with open_worker() as worker, open_toxiproxy_server(log_path=str(run_dir / "toxiproxy.log")) as toxiproxy:
            tunnel = await trio.to_thread.run_sync(
                lambda: toxiproxy.client.create_proxy(TUNNEL, upstream=f"127.0.0.1:{worker.port}")
            )
            proxy_port, web_port = free_port(), free_port()
            password = secrets.token_urlsafe(9)
            ledger = run_dir / "finish_fix-ledger.jsonl"
            argv = [
                str(BIN / "mitmweb"),
                "--mode", f"reverse:http://127.0.0.1:{tunnel.listen_port}",
                "--listen-host", "127.0.0.1", "--listen-port", str(proxy_port),
                "--web-host", "127.0.0.1", "--web-port", str(web_port),
                "-s", str(FINISH_FIX_SCRIPT),
                "--set", f"confdir={run_dir / 'mitmproxy-conf'}",
                "--set", f"finish_fix_ledger={ledger}",
                "--set", "web_open_browser=false",
                "--set", f"web_password={password}",
            ]
            async with open_service("mitmweb (finish_fix)", argv, port=web_port, log_path=run_dir / "mitmweb.log", start_timeout=30):
                print(_instructions(proxy_port, web_port, password, toxiproxy.client.url, ledger), flush=True)
                await trio.sleep_forever()


if __name__ == "__main__":
    try:
        trio.run(main)
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
