"""finish_fix in mitmweb, read through mitmweb's own HTTP API (what its UI shows): repaired and
interrupted flows are marked and commented, their streamed bodies are not "content missing" but the
bytes the client was sent, and the "SSE chat" content view reassembles the answer."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests import mitmdump_process
from tests.chat_streams import chat_stream
from tests.e2e_support import ANSWER, CUTS, chat_url, raw_post
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump, MitmdumpError
from tests.upstream_server import Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@dataclass
class Mitmweb:
    process: Mitmdump
    web_url: str
    token: str

    def get(self, path: str) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=10) as client:
            response = client.get(f"{self.web_url}{path}", headers={"Authorization": f"Bearer {self.token}"})
        response.raise_for_status()
        return response


def _free_port() -> int:
    # mitmweb prints ":0" for --web-port 0 rather than the bound port, so pick one; the short race
    # with another process taking it is retried below.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def mitmweb(mitmproxy_confdir: Path, upstream: UpstreamServer) -> Iterator[Mitmweb]:
    for attempt in range(3):
        web_port = _free_port()
        process = mitmdump_process.start(
            program="mitmweb",
            confdir=mitmproxy_confdir,
            mode=f"reverse:{upstream.origin}",
            scripts=[FINISH_FIX_SCRIPT],
            options={"web_open_browser": "false"},
            extra_args=["--web-host", "127.0.0.1", "--web-port", str(web_port)],
        )
        try:
            match = process.wait_for_output(r"Web server listening at (http://\S+?)/\?token=(\w+)", timeout=20)
            break
        except MitmdumpError:
            process.stop()
            if attempt == 2:
                raise
    try:
        yield Mitmweb(process, match.group(1), match.group(2))
    finally:
        process.stop()
        print(f"--- mitmweb (pid {process.pid}) ---\n{process.output}")


def test_mitmweb_shows_marked_commented_flows_with_the_bytes_sent_and_the_answer(
    mitmweb: Mitmweb, upstream: UpstreamServer
) -> None:
    prefixes = {
        "repaired": upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None))),
        "interrupted": upstream.route(CUTS["fin-mid-chunk"]),
    }
    sent = {verdict: raw_post(chat_url(mitmweb.process.url, prefix)).body for verdict, prefix in prefixes.items()}

    flows = {flow["request"]["path"].split("/")[1]: flow for flow in mitmweb.get("/flows").json()}
    for verdict, prefix in prefixes.items():
        flow = flows[prefix.strip("/")]
        assert flow["marked"], f"{verdict} flow not marked in mitmweb: {flow}"
        assert flow["comment"].startswith("finish_fix:"), flow["comment"]
        content = mitmweb.get(f"/flows/{flow['id']}/response/content.data").content
        assert content == sent[verdict], f"mitmweb's {verdict} body differs from what was sent"
        view = mitmweb.get(f"/flows/{flow['id']}/response/content/auto.json").json()
        assert view["view_name"] == "SSE chat", view
        assert re.search(re.escape("".join(ANSWER if verdict == "repaired" else ANSWER[:2])), view["text"]), view["text"]
