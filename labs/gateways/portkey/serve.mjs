// "@hono/node-server" as the Portkey gateway's bundle sees it (hooks.mjs): the real package, except
// that `serve` binds 127.0.0.1 on a port the kernel picks and gives every request the lab's config.
// Only public APIs: @hono/node-server's `serve({fetch, hostname, port}, listening)` and the Fetch
// API's `new Request(request, {headers})`.
//
// Environment:
//   FINISHLINE_PORTKEY_CONFIG  a Portkey config (JSON), sent on as `x-portkey-config` on every request
//                              that has neither that header nor `x-portkey-provider`: the lab's
//                              clients are stock SDKs that send no Portkey headers, where Portkey's
//                              docs have the application send its config (the Portkey SDK's
//                              `createHeaders({config})`). The gateway validates it as usual.
//   FINISHLINE_PORTKEY_MESSAGES_CONFIG  the config a `/v1/messages` request gets instead (an
//                              Anthropic SDK's application configures the `anthropic` provider:
//                              Portkey's `openai` provider has no Messages route).
//   FINISHLINE_PORTKEY_GEMINI_CONFIG  the config a Gemini request (a path ending
//                              `:streamGenerateContent` or `:generateContent`) gets instead (a
//                              Google SDK's application configures the `google` provider: Portkey's
//                              `/v1/*` proxy route then relays the path to its custom host).
//   FINISHLINE_PORTKEY_LOG     a JSON-lines file: one line per entry of the gateway's request log
//                              (what its UI's Logs page shows, streamed from its own
//                              `GET /log/stream`), keeping what says how the request went (see
//                              `booksEntry`).

import { appendFileSync } from "node:fs";
import { serve as honoServe } from "@hono/node-server";

export * from "@hono/node-server";

const CONFIG_HEADER = "x-portkey-config";
const PROVIDER_HEADER = "x-portkey-provider";
const config = process.env.FINISHLINE_PORTKEY_CONFIG || "";
const messagesConfig = process.env.FINISHLINE_PORTKEY_MESSAGES_CONFIG || config;
const MESSAGES_PATH = /\/messages\/?$/;
const geminiConfig = process.env.FINISHLINE_PORTKEY_GEMINI_CONFIG || config;
const GEMINI_PATH = /:(stream)?[gG]enerateContent$/;
const logPath = process.env.FINISHLINE_PORTKEY_LOG || "";

let served = false;

/** Whether the gateway's bundle called `serve` (launch.mjs checks it after importing the bundle). */
export function gatewayServed() {
  return served;
}

export function serve(options, listening) {
  served = true;
  const fetch = config ? withConfig(options.fetch) : options.fetch;
  return honoServe({ ...options, fetch, hostname: "127.0.0.1", port: 0 }, (info) => {
    listening?.(info);
    announce(info.port).catch((error) => {
      console.error("portkey log stream failed:", error);
      process.exit(1);
    });
  });
}

function configFor(pathname) {
  if (MESSAGES_PATH.test(pathname)) return messagesConfig;
  return GEMINI_PATH.test(pathname) ? geminiConfig : config;
}

function withConfig(fetch) {
  return (request, ...rest) => {
    if (request.headers.has(CONFIG_HEADER) || request.headers.has(PROVIDER_HEADER)) return fetch(request, ...rest);
    const headers = new Headers(request.headers);
    headers.set(CONFIG_HEADER, configFor(new URL(request.url).pathname));
    // The same request (method, URL, body stream, abort signal) with one more header.
    return fetch(new Request(request, { headers }), ...rest);
  };
}

async function announce(port) {
  if (logPath) await subscribeToLogs(port);
  console.log(`portkey listening on http://127.0.0.1:${port}`);
}

// The gateway's request log (src/middlewares/log/index.ts in 1.15.2): after a /v1/ request's
// handler returned its Response, one SSE `event: log` whose data is a JSON object (time, status,
// duration, requestOptions: one entry per attempt) goes to every subscriber of /log/stream. It is
// served only without `--headless`. The stream also sends `connected` and `heartbeat` events.
// Node 20 has no EventSource and the package brings no SSE parser, hence the small one below: the
// gateway writes these events itself (Hono's `writeSSE`: `event:` and `data:` lines, a blank line).
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
