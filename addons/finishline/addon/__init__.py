"""finish_fix, the mitmproxy addon: the adapter between mitmproxy and the sans-IO core.

The core (`finishline`) never imports this package: it stays standard library only, and this is
where mitmproxy (and, when their options ask, prometheus-client and OpenTelemetry) come in.

- `hooks`: `FinishFix`, mitmproxy's hooks and each flow's books; `options`: its options, declared
  and read; `finish_fix`: the script `mitmdump -s` loads (`finish-fix --addon-path`).
- `stream`: `ClientStream`, each flow's stream callable; `cut_hook`: the one private mitmproxy
  method finish_fix relies on, isolated; `books`: the ledger and the body copy; `view`: mitmweb's
  "SSE chat" view; `telemetry`, `metrics`, `traces`: the books as Prometheus metrics and spans.
"""
