"""A scenario's finish_fix options, set in a running mitmdump (labs/gateways/finish_fix_options.py,
`FinishFixOptions` in labs/gateways/finish_fix_proxy.py): what the runner does as each scenario
starts. A real mitmdump with finish_fix and the lab's options script in front of an upstream that
never answers: the first-token deadline the scenario sets is the one its requests get, the lab's own
comes back after it, and a value finish_fix refuses is one line and changes nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from labs.gateways.finish_fix_proxy import OPTIONS_PATH, OPTIONS_SCRIPT, FinishFixOptions, FinishFixOptionsError
from tests.chat_streams import chat_stream
from tests.e2e_support import ANSWER, raw_post
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump, running_mitmdump
from tests.upstream_server import Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lab_finish_fix(upstream: UpstreamServer, mitmproxy_confdir: Path) -> Iterator[Mitmdump]:
    """finish_fix as the lab starts it: its own first-token deadline (the default, 600 s), the options script."""
    with running_mitmdump(
        confdir=mitmproxy_confdir, mode=f"reverse:{upstream.origin}", scripts=[FINISH_FIX_SCRIPT, OPTIONS_SCRIPT]
    ) as mitmdump:
        yield mitmdump


def put(mitmdump: Mitmdump, body: object) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=30) as client:
        return client.put(mitmdump.url + OPTIONS_PATH, content=json.dumps(body))


def test_a_scenarios_deadline_governs_its_requests_and_the_labs_comes_back(lab_finish_fix, upstream: UpstreamServer):
    options = FinishFixOptions(lab_finish_fix.url)
    trio.run(options.apply, {"finish_fix_first_token_timeout": "1"})
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER), head_gate=threading.Event()))
    response = raw_post(f"{lab_finish_fix.url}{prefix}/v1/chat/completions")
    assert response.status == 504 and b"no response head within 1 s of the request" in response.body

    # The next scenario has none: the lab's own value is back (what a PUT answers is read back from
    # mitmproxy, so this is the deadline in force, not the request echoed).
    assert trio.run(options.apply, {}) == {"finish_fix_first_token_timeout": "600"}
    assert trio.run(options.apply, {}) == {}  # nothing to send: the options in force are these
    assert put(lab_finish_fix, {}).json() == {"options": {}}
    again = put(lab_finish_fix, {"finish_fix_idle_timeout": "3"}).json()
    assert again == {"options": {"finish_fix_idle_timeout": "3"}}
    assert put(lab_finish_fix, {}).json() == {"options": {"finish_fix_idle_timeout": "120"}}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"finish_fix_first_token_timeout": "soon"},
            "finish_fix_first_token_timeout: 'soon' is not a number of seconds >= 0 (0 = no limit), e.g. 120 or 2.5",
        ),
        ({"listen_port": "1"}, "not a finish_fix option: listen_port"),
        (
            {"finish_fix_first_token_timeout": 1},
            'the body must be a JSON object of strings, e.g. {"finish_fix_first_token_timeout": "1"}',
        ),
    ],
)
def test_a_refused_value_is_one_line_and_changes_nothing(lab_finish_fix, body, error):
    refused = put(lab_finish_fix, body)
    assert refused.status_code == 400 and refused.json() == {"error": error}
    assert put(lab_finish_fix, {}).json() == {"options": {}}


def test_the_runner_is_told_what_finish_fix_refused(lab_finish_fix):
    with pytest.raises(FinishFixOptionsError, match=r"refused .*: finish_fix_idle_timeout: '-1' is not a number of seconds"):
        trio.run(FinishFixOptions(lab_finish_fix.url).apply, {"finish_fix_idle_timeout": "-1"})
