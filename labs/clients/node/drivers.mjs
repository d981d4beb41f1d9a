// One driver per real Node client and dialect. Each runs one streaming request the way an application
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
//
// `DRIVERS[dialect][client]` is the registry (dialect = the request's "dialect", "chat" when absent):
// a client name means that library in that dialect. The request is Chat-shaped in every dialect
// (`messages`, `max_tokens`, OpenAI-format `tools`, `base_url` = the API root ending in /v1); the
// Messages, Responses and Gemini drivers adapt it the way labs/clients/python_messages.py and
// python_responses.py do, and surface the reason as those do: Messages `stop_reason`, Responses the
// terminal response's `status` (`incomplete_details.reason` when incomplete), Gemini candidate 0's
// `finishReason`, the AI SDK's unified reason, pi-ai's stopReason.

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { streamText, jsonSchema, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { createGoogleGenerativeAI } from "@ai-sdk/google";
import { GoogleGenAI } from "@google/genai";
import { stream as piOpenAICompletionsStream } from "@earendil-works/pi-ai/api/openai-completions";
import { stream as piAnthropicMessagesStream } from "@earendil-works/pi-ai/api/anthropic-messages";
import { stream as piOpenAIResponsesStream } from "@earendil-works/pi-ai/api/openai-responses";
import { stream as piGoogleGenerativeAIStream } from "@earendil-works/pi-ai/api/google-generative-ai";

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
    sink.response(chunk.model, chunk.usage);
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
async function aiSdk(model, { request, signal, sink }, { maxOutputTokens = request.max_tokens } = {}) {
  const result = streamText({
    model,
    messages: request.messages,
    abortSignal: signal,
    // The default onError logs every stream error to stderr; the driver reports it instead.
    onError: () => {},
    ...(maxOutputTokens ? { maxOutputTokens } : {}),
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

// Pi's LLM library, one of its APIs, called the way a custom provider does: a model definition
// (`api`, `baseUrl`, the lab's model name as `id`, unchanged) and a context. Pi never throws: the
// stream ends with a `done` event (with a stop reason) or an `error` event (with a message).
async function piAi(api, streamFunction, { request, signal, fetch, sink }, { baseUrl = request.base_url, maxTokens = request.max_tokens } = {}) {
  const model = {
    id: request.model,
    name: request.model,
    api,
    provider: "finishline-lab",
    baseUrl,
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
  const events = streamFunction(model, context, {
    apiKey: request.api_key,
    signal,
    fetch,
    ...(maxTokens ? { maxTokens } : {}),
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

// The `openai-completions` API: the one with the "Stream ended without finish_reason" check.
const piAiChat = (context) => piAi("openai-completions", piOpenAICompletionsStream, context);

// ---- Anthropic Messages (`POST <base>/messages`) ----

// `max_tokens` when the lab's request gives none: the Messages API requires one (the same value as
// DEFAULT_MAX_TOKENS in labs/clients/__init__.py; the worker's knobs decide where it stops).
const DEFAULT_MAX_TOKENS = 4096;

// The lab's API root (`.../v1`) as the Anthropic SDK wants it: it appends `/v1/messages` itself
// (resources/messages/messages.mjs `post('/v1/messages')`; pi-ai's Anthropic client too).
function anthropicRoot(baseUrl) {
  const root = baseUrl.replace(/\/+$/, "");
  if (!root.endsWith("/v1")) throw new Error(`the Anthropic SDKs append /v1/messages to their base URL; ${baseUrl} does not end in /v1`);
  return root.slice(0, -"/v1".length);
}

function messagesBody(request) {
  const system = request.messages.filter((m) => m.role === "system").map((m) => m.content);
  return {
    model: request.model,
    messages: request.messages.filter((m) => m.role !== "system"),
    max_tokens: request.max_tokens || DEFAULT_MAX_TOKENS,
    ...(system.length ? { system: system.join("\n") } : {}),
    ...(request.tools
      ? { tools: request.tools.map((t) => ({ name: t.function.name, description: t.function.description ?? "", input_schema: t.function.parameters ?? { type: "object" } })) }
      : {}),
  };
}

function anthropicClient({ request, fetch }) {
  return new Anthropic({ baseURL: anthropicRoot(request.base_url), apiKey: request.api_key, fetch });
}

// One Messages wire event's output into the sink: text and thinking deltas; a `tool_use` block's
// opening names the call at its block index, its `input_json_delta` pieces are the arguments.
function readMessagesEvent(event, sink, { toolCalls }) {
  if (event.type === "content_block_start") {
    const block = event.content_block;
    if (block.type === "text") sink.text(block.text);
    else if (block.type === "thinking") sink.reasoning(block.thinking);
    else if (block.type === "tool_use" && toolCalls) sink.toolCall(event.index, block.name, null);
  } else if (event.type === "content_block_delta") {
    const delta = event.delta;
    if (delta.type === "text_delta") sink.text(delta.text);
    else if (delta.type === "thinking_delta") sink.reasoning(delta.thinking);
    else if (delta.type === "input_json_delta" && toolCalls) sink.toolCall(event.index, null, delta.partial_json);
  }
}

// @anthropic-ai/sdk raw: `messages.create({stream: true})` and `for await` over the wire events
// (core/streaming.mjs: frames without `event:` are skipped, `event: error` throws `APIError`, the
// end of the body ends the iteration). The reason is the last non-null `message_delta` stop_reason.
async function anthropicNode(context) {
  const { request, signal, sink } = context;
  const stream = await anthropicClient(context).messages.create({ ...messagesBody(request), stream: true }, { signal });
  let finishReason = null;
  for await (const event of stream) {
    readMessagesEvent(event, sink, { toolCalls: true });
    if (event.type === "message_start") sink.response(event.message?.model, event.message?.usage);
    if (event.type === "message_delta") sink.response(null, event.usage);
    if (event.type === "message_delta" && event.delta?.stop_reason != null) finishReason = event.delta.stop_reason;
  }
  return { finish_reason: finishReason };
}

// @anthropic-ai/sdk's `messages.stream()` helper (`MessageStream`): `for await` over its events,
// then `finalMessage()`, the way an application that wants the assembled message uses it
// (lib/MessageStream.mjs: a message is recorded only at `message_stop`; without one
// `finalMessage()` rejects "stream ended without producing a Message with role=assistant").
// Tool calls come from the final message's `tool_use` blocks.
async function anthropicNodeHelper(context) {
  const { request, signal, sink } = context;
  const stream = anthropicClient(context).messages.stream(messagesBody(request), { signal });
  // Asked for before iterating, its rejection handled: see openaiNodeHelper.
  const final = stream.finalMessage();
  final.catch(() => {});
  for await (const event of stream) readMessagesEvent(event, sink, { toolCalls: false });
  const message = await final;
  message.content.forEach((block, index) => {
    if (block.type === "tool_use") sink.toolCall(index, block.name, JSON.stringify(block.input ?? null));
  });
  return { finish_reason: message.stop_reason ?? null };
}

function aiSdkAnthropic(context) {
  // @ai-sdk/anthropic's base URL is the root with /v1 (it posts to `${baseURL}/messages`).
  const provider = createAnthropic({ baseURL: context.request.base_url, apiKey: context.request.api_key, fetch: context.fetch });
  return aiSdk(provider.messages(context.request.model), context, { maxOutputTokens: context.request.max_tokens || DEFAULT_MAX_TOKENS });
}

// Pi's `anthropic-messages` API: its Anthropic client appends /v1/messages (it posts the beta
// path, `/v1/messages?beta=true`).
const piAiMessages = (context) =>
  piAi("anthropic-messages", piAnthropicMessagesStream, context, {
    baseUrl: anthropicRoot(context.request.base_url),
    maxTokens: context.request.max_tokens || DEFAULT_MAX_TOKENS,
  });

// ---- OpenAI Responses (`POST <base>/responses`) ----

function responsesBody(request) {
  return {
    model: request.model,
    input: request.messages,
    ...(request.max_tokens ? { max_output_tokens: request.max_tokens } : {}),
    ...(request.tools
      ? { tools: request.tools.map((t) => ({ type: "function", name: t.function.name, description: t.function.description ?? "", parameters: t.function.parameters ?? { type: "object" } })) }
      : {}),
  };
}

// A response's reason word: its `status`, or `incomplete_details.reason` when incomplete.
function responsesReason(response) {
  if (!response) return null;
  if (response.status === "incomplete" && response.incomplete_details?.reason) return response.incomplete_details.reason;
  return response.status ?? null;
}

const TERMINAL_RESPONSE_EVENTS = new Set(["response.completed", "response.incomplete", "response.failed"]);
const REASONING_DELTAS = new Set(["response.reasoning_summary_text.delta", "response.reasoning_text.delta"]);

function readResponsesEvent(event, sink, { toolCalls }) {
  if (event.type === "response.output_text.delta") sink.text(event.delta);
  else if (REASONING_DELTAS.has(event.type)) sink.reasoning(event.delta);
  else if (!toolCalls) return;
  else if (event.type === "response.output_item.added" && event.item?.type === "function_call") sink.toolCall(event.output_index, event.item.name, event.item.arguments);
  else if (event.type === "response.function_call_arguments.delta") sink.toolCall(event.output_index, null, event.delta);
}

// openai-node raw: `responses.create({stream: true})` and `for await` over the events
// (core/streaming.mjs: `event: error` or a top-level `error` key throws `APIError`; the end of the
// body ends the iteration). The reason comes from a terminal event only (null without one).
async function openaiNodeResponses({ request, signal, fetch, sink }) {
  const client = new OpenAI({ baseURL: request.base_url, apiKey: request.api_key, fetch });
  const stream = await client.responses.create({ ...responsesBody(request), stream: true }, { signal });
  let finishReason = null;
  for await (const event of stream) {
    readResponsesEvent(event, sink, { toolCalls: true });
    if (TERMINAL_RESPONSE_EVENTS.has(event.type)) {
      finishReason = responsesReason(event.response);
      sink.response(event.response?.model, event.response?.usage);
    }
  }
  return { finish_reason: finishReason };
}

// openai-node's `responses.stream()` helper (`ResponseStream`): its events, then `finalResponse()`
// (lib/responses/ResponseStream.mjs: a clean end after at least one response event resolves with
// the snapshot so far, whatever its status). Tool calls come from the final response's items.
async function openaiNodeResponsesHelper({ request, signal, fetch, sink }) {
  const client = new OpenAI({ baseURL: request.base_url, apiKey: request.api_key, fetch });
  const stream = client.responses.stream(responsesBody(request), { signal });
  const final = stream.finalResponse();
  final.catch(() => {});
  for await (const event of stream) readResponsesEvent(event, sink, { toolCalls: false });
  const response = await final;
  (response.output ?? []).forEach((item, index) => {
    if (item.type === "function_call") sink.toolCall(index, item.name, item.arguments);
  });
  return { finish_reason: responsesReason(response) };
}

function aiSdkOpenAIResponses(context) {
  const provider = createOpenAI({ baseURL: context.request.base_url, apiKey: context.request.api_key, fetch: context.fetch });
  return aiSdk(provider.responses(context.request.model), context);
}

const piAiResponses = (context) => piAi("openai-responses", piOpenAIResponsesStream, context);

// ---- Gemini (`POST <base>/models/<model>:streamGenerateContent?alt=sse`) ----
//
// The lab gives each dialect's clients a base URL that ends in the API version its gateway serves
// (`/v1` at the worker and finish_fix, `/v1beta` at LiteLLM, whose Gemini routes have no `/v1`),
// and every client must reach `<base>/models/...` under it, as labs/clients/python_gemini.py's
// google-genai does. The AI SDK and pi-ai take such a URL as is (their default is Google's
// `.../v1beta`); @google/genai puts its `apiVersion` after its `baseUrl` itself, so it gets the two
// apart (`geminiRootAndVersion`).
function geminiRootAndVersion(baseUrl) {
  const url = baseUrl.replace(/\/+$/, "");
  const cut = url.lastIndexOf("/");
  const root = url.slice(0, cut);
  const version = url.slice(cut + 1);
  if (!/^v1/.test(version) || !root.includes("://") || root.endsWith("/")) {
    throw new Error(`@google/genai appends /<version>/models/... to its base URL; ${baseUrl} does not end in a version`);
  }
  return { root, version };
}

const geminiBase = (baseUrl) => baseUrl.replace(/\/+$/, "");

// The Chat-shaped request as Gemini contents: user and assistant turns (`model`), system messages
// as the system instruction, OpenAI tools as function declarations (their JSON schema as is).
function geminiRequest(request) {
  const system = request.messages.filter((m) => m.role === "system").map((m) => m.content);
  const contents = request.messages
    .filter((m) => m.role !== "system")
    .map((m) => ({ role: m.role === "assistant" ? "model" : "user", parts: [{ text: m.content }] }));
  const config = {
    ...(request.max_tokens ? { maxOutputTokens: request.max_tokens } : {}),
    ...(system.length ? { systemInstruction: system.join("\n") } : {}),
    ...(request.tools
      ? {
          tools: [
            {
              functionDeclarations: request.tools.map((t) => ({
                name: t.function.name,
                description: t.function.description ?? "",
                parametersJsonSchema: t.function.parameters ?? { type: "object" },
              })),
            },
          ],
        }
      : {}),
  };
  return { model: request.model, contents, config };
}

// @google/genai: `models.generateContentStream` and `for await` over the chunks, as its README
// shows. Candidate 0's parts go to the sink (a `thought` part is reasoning, a `functionCall` part a
// whole call); the reason is the last `finishReason` a chunk carried, as sent (null if none did:
// the SDK ends a stream without one silently, and raises `ApiError` only on an `{"error": ...}`
// frame whose `code` is a number in 400-599, `throwIfStreamErrorChunk` in dist/node/index.mjs).
// No retry options: the SDK's default is none.
async function googleGenAINode({ request, signal, fetch, sink }) {
  const { root, version } = geminiRootAndVersion(request.base_url);
  const client = new GoogleGenAI({ apiKey: request.api_key, httpOptions: { baseUrl: root, apiVersion: version, fetch } });
  const params = geminiRequest(request);
  const stream = await client.models.generateContentStream({ ...params, config: { ...params.config, abortSignal: signal } });
  let finishReason = null;
  let calls = 0;
  for await (const chunk of stream) {
    sink.response(chunk.modelVersion, chunk.usageMetadata);
    const candidate = (chunk.candidates ?? []).find((c) => (c.index ?? 0) === 0);
    if (!candidate) continue;
    for (const part of candidate.content?.parts ?? []) {
      if (typeof part.text === "string" && part.thought) sink.reasoning(part.text);
      else if (typeof part.text === "string") sink.text(part.text);
      if (part.functionCall) sink.toolCall(calls++, part.functionCall.name, JSON.stringify(part.functionCall.args ?? {}));
    }
    if (candidate.finishReason != null) finishReason = candidate.finishReason;
  }
  return { finish_reason: finishReason };
}

// @ai-sdk/google: `streamText` with the Gemini provider, whose base URL includes the version
// (google-provider.ts: default `https://generativelanguage.googleapis.com/v1beta`). Its unified
// reason starts as `interrupted` and only a `finishReason` (or a blocked prompt) replaces it; an
// `{"error": ...}` frame becomes an error part and the reason `error` (google-language-model.ts
// `doStream`). A model id with a `/` is taken as a whole resource path (get-model-path.ts: no
// `models/` put before it), so a gateway's `gemini/...` deployment name is given as
// `models/gemini/...`, as an application of LiteLLM's Gemini routes must (the other SDKs put
// `models/` before any name that lacks it).
function aiSdkGoogle(context) {
  const provider = createGoogleGenerativeAI({
    baseURL: geminiBase(context.request.base_url),
    apiKey: context.request.api_key,
    fetch: context.fetch,
  });
  const model = context.request.model;
  return aiSdk(provider(model.includes("/") && !model.startsWith("models/") ? `models/${model}` : model), context);
}

// Pi's `google-generative-ai` API: @google/genai (its own copy, 2.32.0) pointed at the model's
// `baseUrl` with the version left to the URL (`apiVersion: ""`, dist/api/google-generative-ai.js
// `createClient`): the base URL carries the version, as pi's built-in Gemini models' `.../v1beta`
// does. It throws "Google stream ended without a finish reason" when no chunk carried one
// (L206-208).
const piAiGemini = (context) => piAi("google-generative-ai", piGoogleGenerativeAIStream, context, { baseUrl: geminiBase(context.request.base_url) });

// The registry, by dialect then client name (the same names as labs.clients.NODE_CLIENTS_BY_DIALECT).
export const DRIVERS = {
  chat: {
    "openai-node": openaiNode,
    "openai-node-helper": openaiNodeHelper,
    "ai-sdk-openai": aiSdkOpenAI,
    "ai-sdk-compatible": aiSdkCompatible,
    "pi-ai": piAiChat,
  },
  messages: {
    "anthropic-node": anthropicNode,
    "anthropic-node-helper": anthropicNodeHelper,
    "ai-sdk-anthropic": aiSdkAnthropic,
    "pi-ai": piAiMessages,
  },
  responses: {
    "openai-node": openaiNodeResponses,
    "openai-node-helper": openaiNodeResponsesHelper,
    "ai-sdk-openai": aiSdkOpenAIResponses,
    "pi-ai": piAiResponses,
  },
  gemini: {
    "google-genai-node": googleGenAINode,
    "ai-sdk-google": aiSdkGoogle,
    "pi-ai": piAiGemini,
  },
};
