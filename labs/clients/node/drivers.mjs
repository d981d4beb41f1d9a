// One driver per real Node client. Each runs one streaming chat completion the way an application
// using that library would, feeds what the application would see into `sink`, and returns the
// finish reason the library surfaced, or throws what the library threw. No driver second-guesses its
// library: if the library calls a stream complete, so does the driver.
//
// Every driver gets: request (see host.mjs), signal (the lab's deadline), fetch (records status and
// the Connection header) and sink ({text, reasoning, toolCall(index, name, argumentsPiece)}: tool
// calls accumulate per index, the first delta of a call names it, later ones add argument pieces).
// Only choice 0 is read: a chunk's choices with another `index` are skipped (with n=2 the worker
// interleaves both choices). The API key comes in the request (labs.clients.LAB_API_KEY unless the
// gateway wants its own).

import OpenAI from "openai";
import { streamText, jsonSchema, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { stream as piOpenAICompletionsStream } from "@earendil-works/pi-ai/api/openai-completions";

function firstChoice(choices) {
  return (choices ?? []).find((choice) => (choice.index ?? 0) === 0);
}

// openai-node: `chat.completions.create({stream: true})` and `for await` over the chunks, the
// library's plain Stream. The finish reason is whatever the chunks carried (null if none did).
async function openaiNode({ request, signal, fetch, sink }) {
  const client = new OpenAI({ baseURL: request.base_url, apiKey: request.api_key, fetch });
  const body = {
    model: request.model,
    messages: request.messages,
    stream: true,
    ...(request.max_tokens ? { max_tokens: request.max_tokens } : {}),
    ...(request.tools ? { tools: request.tools } : {}),
  };
  const stream = await client.chat.completions.create(body, { signal });
  return { finish_reason: await readChunks(stream, sink) };
}

// Both openai-node drivers read the same chunks the same way: choice 0's deltas go to the sink;
// returns the last finish reason a chunk carried (null if none did).
async function readChunks(stream, sink) {
  let finishReason = null;
  for await (const chunk of stream) {
    const choice = firstChoice(chunk.choices);
    if (!choice) continue;
    sink.reasoning(choice.delta?.reasoning_content);
    sink.text(choice.delta?.content);
    for (const call of choice.delta?.tool_calls ?? []) {
      sink.toolCall(call.index ?? 0, call.function?.name, call.function?.arguments);
    }
    if (choice.finish_reason != null) finishReason = choice.finish_reason;
  }
  return finishReason;
}

// openai-node's `chat.completions.stream()` helper (`ChatCompletionStream`): `for await` over the
// same chunks, then `finalChatCompletion()`, the way an application that wants the assembled message
// uses it. The helper validates the end (lib/ChatCompletionStream.js `finalizeChatCompletion`): a
// choice without a finish_reason rejects with `OpenAIError: missing finish_reason for choice 0`; a
// transport error is re-raised as an `OpenAIError` with the same message and the original as its
// cause (lib/EventStream.js `#handleError`). The finish reason returned is the final completion's.
async function openaiNodeHelper({ request, signal, fetch, sink }) {
  const client = new OpenAI({ baseURL: request.base_url, apiKey: request.api_key, fetch });
  const body = {
    model: request.model,
    messages: request.messages,
    ...(request.max_tokens ? { max_tokens: request.max_tokens } : {}),
    ...(request.tools ? { tools: request.tools } : {}),
  };
  const stream = client.chat.completions.stream(body, { signal });
  // Asked for before iterating: a helper whose error nobody awaits surfaces it as an unhandled
  // rejection (lib/EventStream.js), which would end the host process, not the cell.
  const final = stream.finalChatCompletion();
  final.catch(() => {});
  await readChunks(stream, sink);
  const completion = await final;
  return { finish_reason: firstChoice(completion.choices)?.finish_reason ?? null };
}

// The AI SDK turns a request's OpenAI tools into its own tool set (no execute: the lab only
// looks at what the model asked for).
function aiSdkTools(tools) {
  if (!tools) return undefined;
  const out = {};
  for (const t of tools) {
    out[t.function.name] = tool({ description: t.function.description ?? "", inputSchema: jsonSchema(t.function.parameters ?? { type: "object" }) });
  }
  return out;
}

// Vercel AI SDK `streamText`, with either provider. Errors do not throw from `fullStream`: they
// arrive as `error` parts (the SDK's own retries, default 2, happen before any output), so the
// driver throws the last one, the way an application reading `result.text` would see a rejection.
async function aiSdk(model, { request, signal, sink }) {
  const result = streamText({
    model,
    messages: request.messages,
    abortSignal: signal,
    // The default onError logs every stream error to stderr; the driver reports it instead.
    onError: () => {},
    ...(request.max_tokens ? { maxOutputTokens: request.max_tokens } : {}),
    ...(request.tools ? { tools: aiSdkTools(request.tools) } : {}),
  });
  let finishReason = null;
  let error = null;
  let calls = 0;
  for await (const part of result.fullStream) {
    if (part.type === "text-delta") sink.text(part.text);
    else if (part.type === "reasoning-delta") sink.reasoning(part.text);
    else if (part.type === "tool-call") sink.toolCall(calls++, part.toolName, JSON.stringify(part.input ?? null));
    else if (part.type === "error") error = part.error;
    else if (part.type === "abort") error = signal.reason ?? new Error("aborted");
    else if (part.type === "finish") finishReason = part.finishReason;
  }
  if (error) throw error;
  return { finish_reason: finishReason };
}

function aiSdkOpenAI(context) {
  const provider = createOpenAI({ baseURL: context.request.base_url, apiKey: context.request.api_key, fetch: context.fetch });
  // `.chat()`: the Chat Completions API (the default model is the Responses API).
  return aiSdk(provider.chat(context.request.model), context);
}

function aiSdkCompatible(context) {
  const provider = createOpenAICompatible({
    name: "lab",
    baseURL: context.request.base_url,
    apiKey: context.request.api_key,
    fetch: context.fetch,
  });
  return aiSdk(provider.chatModel(context.request.model), context);
}

// Pi's LLM library, its `openai-completions` API (the one with the "Stream ended without
// finish_reason" check), called the way a custom provider does. Pi never throws: the stream ends
// with a `done` event (with a stop reason) or an `error` event (with a message).
async function piAi({ request, signal, fetch, sink }) {
  const model = {
    id: request.model,
    name: request.model,
    api: "openai-completions",
    provider: "finishline-lab",
    baseUrl: request.base_url,
    reasoning: false,
    input: ["text"],
    cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
    contextWindow: 128000,
    maxTokens: 32000,
  };
  const context = {
    messages: request.messages
      .filter((m) => m.role === "user")
      .map((m) => ({ role: "user", content: m.content, timestamp: Date.now() })),
    ...(request.tools
      ? { tools: request.tools.map((t) => ({ name: t.function.name, description: t.function.description ?? "", parameters: t.function.parameters ?? { type: "object" } })) }
      : {}),
  };
  const system = request.messages.find((m) => m.role === "system");
  if (system) context.systemPrompt = system.content;
  const events = piOpenAICompletionsStream(model, context, {
    apiKey: request.api_key,
    signal,
    fetch,
    ...(request.max_tokens ? { maxTokens: request.max_tokens } : {}),
  });
  let calls = 0;
  for await (const event of events) {
    if (event.type === "text_delta") sink.text(event.delta);
    else if (event.type === "thinking_delta") sink.reasoning(event.delta);
    else if (event.type === "toolcall_end") sink.toolCall(calls++, event.toolCall?.name, JSON.stringify(event.toolCall?.arguments ?? null));
    else if (event.type === "done") return { finish_reason: event.reason };
    else if (event.type === "error") {
      const err = new Error(event.error?.errorMessage ?? "pi-ai error event");
      err.name = `PiStreamError(${event.reason})`;
      throw Object.defineProperty(err, "constructor", { value: { name: err.name } });
    }
  }
  throw new Error("pi-ai stream ended without a done or error event");
}

export const DRIVERS = {
  "openai-node": openaiNode,
  "openai-node-helper": openaiNodeHelper,
  "ai-sdk-openai": aiSdkOpenAI,
  "ai-sdk-compatible": aiSdkCompatible,
  "pi-ai": piAi,
};
