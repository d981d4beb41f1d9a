"""A mitmproxy script the lab loads next to finish_fix (`-s addons/finish_fix.py -s this`), so that a
scenario can run with finish_fix options of its own (a scenario's `[finish_fix]` table,
labs.scenario) in the one finish_fix mitmdump every scenario of its topology shares. The runner
sets them as the scenario starts, the way it sets the hub's policy (labs.runner), and puts the
lab's own back for the next scenario that has none.

`PUT /.finishline-lab/options` with a JSON object `{"finish_fix_...": "value", ...}`: every option it
names is set (as `--set` would), every option an earlier PUT set and this one does not name goes
back to its value before the first PUT, and the answer is 200 with the value now in force of every
option it set or put back (read back from mitmproxy, not echoed), or 400 with
finish_fix's own one line when it refuses a value (mitmproxy then keeps the old ones). Nothing else
is served, and the request never goes upstream. Only `finish_fix_*` options: the lab's cells must
not be able to change what mitmproxy does with them. Lab-only: a production finish_fix has no such
door.
"""

from __future__ import annotations

import json
from typing import Any

from mitmproxy import ctx, exceptions, http

#: The one path this script answers (no API has it: it is never a cell's request).
OPTIONS_PATH = "/.finishline-lab/options"
_PREFIX = "finish_fix_"


class FinishFixOptions:
    def __init__(self) -> None:
        # Each option a PUT set, with its value before the first PUT that set it.
        self._before: dict[str, Any] = {}

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.path != OPTIONS_PATH:
            return
        if flow.request.method != "PUT":
            flow.response = _answer(405, {"error": f"{OPTIONS_PATH} takes PUT"})
            return
        try:
            wanted = json.loads(flow.request.raw_content or b"")
        except ValueError:
            wanted = None
        if not isinstance(wanted, dict) or not all(isinstance(v, str) for v in wanted.values()):
            flow.response = _answer(
                400, {"error": 'the body must be a JSON object of strings, e.g. {"finish_fix_first_token_timeout": "1"}'}
            )
            return
        unknown = sorted(name for name in wanted if not name.startswith(_PREFIX) or name not in ctx.options)
        if unknown:
            flow.response = _answer(400, {"error": f"not a finish_fix option: {', '.join(unknown)}"})
            return
        before = {**{name: getattr(ctx.options, name) for name in wanted}, **self._before}
        values = {**self._before, **wanted}
        try:
            ctx.options.update(**values)
        except exceptions.OptionsError as refused:  # mitmproxy kept every old value
            flow.response = _answer(400, {"error": str(refused)})
            return
        self._before = {name: before[name] for name in wanted}
        flow.response = _answer(200, {"options": {name: getattr(ctx.options, name) for name in values}})


def _answer(status: int, body: dict[str, Any]) -> http.Response:
    return http.Response.make(status, json.dumps(body).encode(), {"content-type": "application/json"})


addons = [FinishFixOptions()]
