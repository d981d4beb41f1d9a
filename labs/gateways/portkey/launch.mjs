// Start the open-source Portkey gateway (@portkey-ai/gateway, this folder's lock file) for the lab:
// on 127.0.0.1, on a port the kernel picks, with one gateway config for every request, and its
// request logs appended to a file.
//
// Why a launcher: the gateway's own entry point (build/start-server.js) has only `--port=N` and
// listens on every interface (it calls @hono/node-server's `serve({fetch, port})`, no hostname).
// Node's `http.Server.prototype.listen` is the one place every server passes through, so this
// wraps it before importing the entry point: the gateway's server listens on 127.0.0.1, port 0.
//
// Environment:
//   FINISHLINE_PORTKEY_CONFIG  a Portkey config (JSON), sent on as `x-portkey-config` on every request
//                              that has neither that header nor `x-portkey-provider`: the lab's
//                              clients are stock SDKs that send no Portkey headers, where Portkey's
//                              docs have the application send its config (the Portkey SDK's
//                              `createHeaders({config})`). The gateway validates it as usual.
//   FINISHLINE_PORTKEY_LOG     a JSON-lines file: one line per entry of the gateway's request log
//                              (what its UI's Logs page shows, streamed from its own
//                              `GET /log/stream`), keeping what says how the request went (see
//                              `booksEntry`).
//
// Prints `portkey listening on http://127.0.0.1:PORT` once the port is bound and the log stream is
// subscribed (so no request's log entry is missed).

import http from "node:http";
import { appendFileSync } from "node:fs";

const CONFIG_HEADER = "x-portkey-config";
const PROVIDER_HEADER = "x-portkey-provider";
const config = process.env.FINISHLINE_PORTKEY_CONFIG || "";
const logPath = process.env.FINISHLINE_PORTKEY_LOG || "";

const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function listenOnLoopback(...args) {
  // Restore at once: only the gateway's one server is meant (the log subscription below is a client).
  http.Server.prototype.listen = listen;
  if (config) {
    // Runs before the gateway's own request listener; @hono/node-server builds the request's
    // headers from `rawHeaders` when the app first reads them, which is after this.
    this.prependListener("request", (request) => {
      if (!(CONFIG_HEADER in request.headers) && !(PROVIDER_HEADER in request.headers)) {
        request.rawHeaders.push(CONFIG_HEADER, config);
        request.headers[CONFIG_HEADER] = config;
      }
    });
  }
  this.once("listening", () => announce(this.address().port));
  const callback = typeof args.at(-1) === "function" ? [args.at(-1)] : [];
  return listen.call(this, 0, "127.0.0.1", ...callback);
};

async function announce(port) {
  if (logPath) await subscribeToLogs(port);
  console.log(`portkey listening on http://127.0.0.1:${port}`);
}

// The gateway's request log (src/middlewares/log/index.ts in 1.15.2): after a /v1/ request's
// handler returned its Response, one SSE `event: log` whose data is a JSON object (time, status,
// duration, requestOptions: one entry per attempt) goes to every subscriber of /log/stream. It is
// served only without `--headless`. The stream also sends `connected` and `heartbeat` events.
async function subscribeToLogs(port) {
  const response = await fetch(`http://127.0.0.1:${port}/log/stream`);
  if (!response.ok || !response.body) throw new Error(`portkey /log/stream answered ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let connected;
  const subscribed = new Promise((resolve) => (connected = resolve));
  (async () => {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buffer += value.replaceAll("\r\n", "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (event.name === "connected") connected();
        else if (event.name === "log") appendFileSync(logPath, JSON.stringify(booksEntry(JSON.parse(event.data))) + "\n");
      }
    }
  })().catch((error) => console.error("portkey log stream failed:", error));
  await subscribed;
}

// What the books keep of a log entry: never keys, headers or message content (the entry has the
// provider's API key and the whole request), only what says how the request went and where it went.
function booksEntry(log) {
  const attempts = (log.requestOptions || []).map((option) => ({
    url: option.providerOptions?.requestURL ?? null,
    option_index: option.lastUsedOptionIndex ?? null,
    execution_ms: option.executionTime ?? null,
  }));
  return {
    time: log.time,
    model: log.requestOptions?.[0]?.requestParams?.model ?? null,
    stream: Boolean(log.requestOptions?.[0]?.requestParams?.stream),
    status: log.status,
    duration_ms: log.duration,
    attempts,
  };
}

function parseEvent(block) {
  const event = { name: "message", data: "" };
  const data = [];
  for (const line of block.split("\n")) {
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event.name = value;
    else if (field === "data") data.push(value);
  }
  event.data = data.join("\n");
  return event;
}

await import("@portkey-ai/gateway/build/start-server.js");
