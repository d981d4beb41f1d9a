// The lab's Node driver host: one long-lived process that runs many streaming requests, in any dialect.
//
// Starting node (and importing these SDKs) costs about a second per process, so the lab starts this
// once and sends it one JSON line per request on stdin; it answers one JSON line per outcome on
// stdout, in completion order, matched by "id". The first line it writes is a hello with the versions
// that decide behaviour (Node, its bundled undici, each SDK): see ../../../shared notes on the
// `Connection: close` trap, which depends on the undici version.
//
// Request:  {"id", "client", "dialect"? ("chat" when absent), "base_url", "model", "messages",
//            "max_tokens"?, "tools"?, "deadline_s", "api_key"?}; the driver is DRIVERS[dialect][client]
// Outcome:  {"id", "client", "completed", "text", "reasoning", "finish_reason", "tool_calls",
//            "error_class", "error_message", "ttft_s", "duration_s", "timed_out", "http_status",
//            "connection"}

import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";
import { DRIVERS } from "./drivers.mjs";

function packageVersion(name) {
  const url = new URL(`./node_modules/${name}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, "utf8")).version;
}

const versions = {
  node: process.versions.node,
  undici: process.versions.undici,
  openai: packageVersion("openai"),
  "@anthropic-ai/sdk": packageVersion("@anthropic-ai/sdk"),
  ai: packageVersion("ai"),
  "@ai-sdk/openai": packageVersion("@ai-sdk/openai"),
  "@ai-sdk/anthropic": packageVersion("@ai-sdk/anthropic"),
  "@ai-sdk/openai-compatible": packageVersion("@ai-sdk/openai-compatible"),
  "@ai-sdk/google": packageVersion("@ai-sdk/google"),
  "@google/genai": packageVersion("@google/genai"),
  "@earendil-works/pi-ai": packageVersion("@earendil-works/pi-ai"),
  // pi-ai's Gemini API runs its own copy of @google/genai, not the one above.
  "@earendil-works/pi-ai > @google/genai": packageVersion("@earendil-works/pi-ai/node_modules/@google/genai"),
};

function write(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function describeError(err) {
  if (err == null) return { error_class: null, error_message: null };
  if (err instanceof Error) {
    // undici reports a cut body as `TypeError: terminated` with the socket error as its cause:
    // keep the causes, the socket error is what tells a FIN from a reset. The chain is walked
    // because a helper may wrap it once more (openai-node's ChatCompletionStream re-raises the
    // TypeError as an OpenAIError with the same message).
    let message = err.message;
    let cause = err.cause;
    for (let depth = 0; depth < 4 && cause instanceof Error; depth += 1, cause = cause.cause) {
      if (cause.message && !message.includes(cause.message)) message += ` (cause: ${cause.name}: ${cause.message})`;
    }
    return { error_class: err.constructor?.name || err.name || "Error", error_message: message };
  }
  if (typeof err === "object") {
    return { error_class: "Object", error_message: JSON.stringify(err) };
  }
  return { error_class: typeof err, error_message: String(err) };
}

// A fetch wrapper every driver passes to its SDK, so the lab sees what the server side of the
// client's connection sent: the status and the `Connection` header (undici 6.24 treats EOF on a
// `Connection: close` response as a complete body).
function recordingFetch(record) {
  return async (input, init) => {
    const response = await fetch(input, init);
    record.http_status = response.status;
    record.connection = response.headers.get("connection");
    return response;
  };
}

async function run(request) {
  const dialect = request.dialect ?? "chat";
  const driver = Object.hasOwn(DRIVERS, dialect) && Object.hasOwn(DRIVERS[dialect], request.client) ? DRIVERS[dialect][request.client] : undefined;
  const started = performance.now();
  const record = {
    id: request.id,
    client: request.client,
    completed: false,
    text: "",
    reasoning: "",
    finish_reason: null,
    tool_calls: [],
    error_class: null,
    error_message: null,
    ttft_s: null,
    duration_s: null,
    timed_out: false,
    http_status: null,
    connection: null,
    // The model the response named and its usage, where the driver reads them (the raw SDK drivers).
    model: null,
    usage: null,
  };
  if (!driver) {
    Object.assign(record, { error_class: "UnknownClient", error_message: `no Node driver named ${request.client} in the ${dialect} dialect` });
    record.duration_s = 0;
    return record;
  }
  const controller = new AbortController();
  const timer = setTimeout(() => {
    record.timed_out = true;
    controller.abort(new Error(`lab deadline of ${request.deadline_s}s passed`));
  }, request.deadline_s * 1000);
  const callsByIndex = new Map();
  const sink = {
    // A chunk's or event's `model` and `usage`: the last model named wins, usage fields merge
    // (Messages: input tokens in `message_start`, output tokens in `message_delta`).
    response(model, usage) {
      if (typeof model === "string" && model) record.model = model;
      if (usage && typeof usage === "object") {
        const numbers = Object.fromEntries(Object.entries(usage).filter(([, v]) => typeof v === "number"));
        if (Object.keys(numbers).length) record.usage = { ...(record.usage ?? {}), ...numbers };
      }
    },
    text(delta) {
      if (!delta) return;
      if (record.ttft_s === null) record.ttft_s = (performance.now() - started) / 1000;
      record.text += delta;
    },
    reasoning(delta) {
      if (!delta) return;
      if (record.ttft_s === null) record.ttft_s = (performance.now() - started) / 1000;
      record.reasoning += delta;
    },
    toolCall(index, name, args) {
      if (!name && !args) return;
      if (record.ttft_s === null) record.ttft_s = (performance.now() - started) / 1000;
      let call = callsByIndex.get(index);
      if (!call) {
        call = { name: "", arguments: "" };
        callsByIndex.set(index, call);
        record.tool_calls.push(call);
      }
      if (name) call.name = name;
      if (args) call.arguments += args;
    },
  };
  try {
    const result = await driver({
      request,
      signal: controller.signal,
      fetch: recordingFetch(record),
      sink,
    });
    record.completed = true;
    record.finish_reason = result.finish_reason ?? null;
  } catch (err) {
    Object.assign(record, describeError(err));
  } finally {
    clearTimeout(timer);
    record.duration_s = (performance.now() - started) / 1000;
  }
  return record;
}

const clients = Object.fromEntries(Object.entries(DRIVERS).map(([dialect, drivers]) => [dialect, Object.keys(drivers)]));
write({ hello: { runtime: "node", versions, clients } });

const lines = createInterface({ input: process.stdin });
const pending = new Set();
lines.on("line", (line) => {
  if (!line.trim()) return;
  let request;
  try {
    request = JSON.parse(line);
  } catch (err) {
    write({ id: null, error_class: "BadRequestLine", error_message: String(err) });
    return;
  }
  const job = run(request).then(write, (err) => write({ id: request.id, ...describeError(err) }));
  pending.add(job);
  job.finally(() => pending.delete(job));
});
lines.on("close", async () => {
  await Promise.allSettled([...pending]);
  process.exit(0);
});
