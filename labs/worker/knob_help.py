"""What each knob of the simulated worker does, in every dialect: one sentence or a few per knob.

`python -m labs.worker --help` prints these; `WorkerSettings` (labs.worker.settings) declares the knobs
and their defaults, in the same order. Chat first, then "Messages:", "Responses:" and "Gemini:" where they differ.
"""

__all__ = ["KNOB_HELP"]

#: Every `WorkerSettings` field by name: what it does (tests/test_worker_settings.py checks both agree).
KNOB_HELP: dict[str, str] = {
    "tokens": (
        "Content pieces per choice (before `max_tokens` truncation). Messages: `text_delta`s of one text "
        "block; Responses: `response.output_text.delta`s of one message item."
        " Gemini: one `text` part per chunk."
    ),
    "reasoning_tokens": (
        "`reasoning_content` pieces per choice, streamed before any content. Messages: `thinking_delta`s "
        "of a thinking block (closed by one `signature_delta`); Responses: "
        "`response.reasoning_summary_text.delta`s of a reasoning item."
        ' Gemini: `{"text", "thought": true}` parts (usage `thoughtsTokenCount`).'
    ),
    "tool_calls": (
        "Tool calls per choice, streamed after content; the finish reason becomes `tool_calls`. Messages:"
        " `tool_use` blocks (arguments as `input_json_delta`s), stop_reason `tool_use`; Responses: "
        "`function_call` items (arguments as `response.function_call_arguments.delta`s), status "
        "`completed`."
        " Gemini: one whole `functionCall` part per call (one token event; a call cut short is not sent), finishReason `STOP`."
    ),
    "n": (
        "Choices per response; `None`: the request's `n` (default 1). Messages and Responses have no "
        "choices: always 1 (choice 0 only), whatever this says."
        " Gemini: always 1 (candidate 0)."
    ),
    "max_tokens": (
        "Truncate every choice to this many token events and finish with `length`; `None`: the request's "
        "`max_completion_tokens` or `max_tokens` (default: no limit). Messages: the request's "
        "`max_tokens`, stop_reason `max_tokens`; Responses: the request's `max_output_tokens`, terminal "
        "`response.incomplete` (reason `max_output_tokens`)."
        " Gemini: the request's `generationConfig.maxOutputTokens`, finishReason `MAX_TOKENS`."
    ),
    "include_usage": (
        'Send usage (`"usage": null` on every chunk, a final usage-only chunk); `None`: the request\'s '
        "`stream_options.include_usage` (default off). Messages and Responses: no effect (usage is always"
        " in `message_start`/`message_delta`, in the terminal response)."
    ),
    "prefill_delay": ('Seconds between the response head and the first event (the model is "in prefill"); every dialect.'),
    "token_delay": "Seconds between two token events (every dialect).",
    "framing": "Body framing on the wire (every dialect).",
    "connection_close": (
        "Send `Connection: close` and close after the response. Node's undici before 6.26 takes EOF on "
        "such a response as a complete body, so a lab records this (see shared/notes/clients.md)."
    ),
    "finish": (
        "How a natural end is reported: sent (correct), omitted, or empty (the two defects). Messages, "
        'the `message_delta`: omitted = none at all, empty = stop_reason `""`. Responses: omitted = no '
        "terminal event, and with `done` a `data: [DONE]` instead (a gateway ending it the Chat way); "
        'empty = the terminal response\'s `status` is `""`.'
        ' Gemini: omitted = no `finishReason` anywhere (no last chunk); empty = `"finishReason": ""`.'
    ),
    "done": (
        'End a stream with `data: [DONE]`; 0 is the "no [DONE]" defect. Also sent after an error event. '
        "Messages: `message_stop` (never after an error event). Responses: the terminal event, "
        "`response.completed` or `response.incomplete` (`response.failed` after an error event). 0 in "
        "either: the terminator is lost."
        " Gemini: refused (its streams have no terminator; use finish=omitted)."
    ),
    "error_after": (
        "After this many token events (all choices together), send an error event instead of the rest. "
        "Messages: `event: error` with the Anthropic error type for `error_status`; Responses: `event: "
        "error` with a nested `error` object (what openai-python raises on), then `response.failed` when "
        "`done`."
        ' Gemini: a `data: {"error": {code, message, status}}` frame (`error` first), then the close.'
    ),
    "error_status": (
        "HTTP status whose OpenAI error (type and code) the error event carries, e.g. 429. Messages: its "
        "Anthropic type (429 `rate_limit_error`, 529 `overloaded_error`, other 5xx `api_error`, 4xx "
        "`invalid_request_error` and kin)."
    ),
    "http_error": (
        "Answer with this HTTP status and a JSON error body instead of any completion (e.g. 429, 500). "
        'Messages: Anthropic\'s body `{"type":"error","error":{...}}`.'
        ' Gemini: Google\'s body `{"error":{"code","message","status"}}` with the status word.'
    ),
    "model": (
        "Model name echoed in every chunk (Messages `message.model`, Responses `response.model`); `None`:"
        " the request's `model` as sent."
    ),
    "prompt_tokens": (
        "`usage.prompt_tokens` reported (fixed, so the bytes do not depend on the prompt); Messages and "
        "Responses: `usage.input_tokens`."
    ),
    "null_reason": (
        "Report the natural end with a null reason, whatever `finish` says: Chat a final chunk with "
        '`"finish_reason": null`; Messages a `message_delta` with `stop_reason: null`, then '
        "`message_stop` (vLLM's `/v1/messages` on an abort); Responses the terminal event with `status: "
        "null`."
        ' Gemini: the last chunk with `"finishReason": null` (what translating gateways write).'
    ),
    "bare_error": (
        'The `error_after` error is a bare `data: {"error":{...}}` frame (OpenAI\'s error object): no '
        "`event:` line and nothing after it, as vLLM's `/v1/responses` sends. Messages: the same frame "
        "instead of `event: error` (both Anthropic SDKs skip it). Chat: no effect (its error event is "
        "that frame already)."
    ),
    "hide_limit": (
        "Report a truncation at `max_tokens` as a natural end (the expected answer keeps the true "
        "`length`): Chat `stop`; Messages `end_turn`; Responses `response.completed` with status "
        "`completed` and no `incomplete_details` (llama.cpp's and Ollama's Responses, ik_llama.cpp's Chat"
        " and Messages before its fix). Streams and whole bodies."
        " Gemini: `STOP`."
    ),
    "responses_indexes": (
        "Responses: 0 sends no `sequence_number`, `output_index` or `content_index` on any event, as "
        "llama.cpp does (openai-python's `responses.stream()` helper then fails). Chat and Messages: no "
        "effect."
        " Gemini: refused."
    ),
    "close_after_reasoning": (
        "Close the stream cleanly right after the last reasoning token event (after the opening events "
        "when there is no reasoning): no content, tool calls, closing events, finish or terminator, as "
        "Ollama's `/v1/responses` sometimes does. Every dialect; an earlier `error_after` still comes "
        "first."
    ),
    "http_429_retry_after": (
        "Once: answer 429 with `Retry-After: <this many seconds>` and the dialect's rate-limit body, then"
        " healthy (failoverbench S01). Every dialect."
    ),
    "http_500_once": "Once: answer 500 with the dialect's server-error body, then healthy (S03). Every dialect.",
    "reset_before_head": (
        "Once: read the request, then reset the connection (SO_LINGER 0) before any response byte; then "
        "healthy (S05). Every dialect."
    ),
    "no_response": (
        "Every attempt: read the request and never answer; the connection stays open until the client "
        "goes (S06). Every dialect. (Head at once and the first token late is `prefill_delay`.)"
    ),
    "malformed_chunk": (
        "Every attempt: one SSE event whose data is invalid JSON after half the token events, then the "
        "rest of the stream as usual (S10): the dialect's own token event cut in half. Chat: a bare "
        "`data:` line; Messages and Responses: with the `event:` line of a token event "
        "(`content_block_delta`, `response.output_text.delta`). Streams only."
        " Gemini: a bare `data:` frame with half a chunk (in the JSON-array form, half an element)."
    ),
    "http_400_context_length": (
        "Every attempt: 400 with code `context_length_exceeded` (S12), which a client or gateway must not"
        " retry; implies `http_error=400`. Chat and Responses: OpenAI's error object with that code; "
        "Messages: Anthropic's `invalid_request_error` (it has no codes) saying the prompt is too long."
    ),
    "primary_429_persistent": (
        "Every attempt at the primary: 429 with the dialect's rate-limit body and no `Retry-After` "
        "(failoverbench S02); the spare answers normally. Every dialect."
    ),
    "primary_503_persistent": (
        "Every attempt at the primary: 503 with the dialect's server-error body (S04, S16); the spare "
        "answers normally. Every dialect."
    ),
    "primary_503_first": (
        "A flapping primary (S15): 503 for a cell's first this many attempts at the primary, then "
        "healthy; the spare answers normally. Every dialect."
    ),
    "http_400_content_policy": (
        "Every attempt, at every worker: 400 for a content-policy refusal (S13), which a client or "
        "gateway must not retry; implies `http_error=400`. Chat and Responses: OpenAI's error object with"
        " code `content_policy_violation`; Messages: Anthropic's `invalid_request_error` saying the "
        "content was blocked by its policy."
    ),
    "reject_prefill": (
        "At every worker: a request whose last message is the assistant's (a partial answer to continue, "
        '"prefill") gets 400 "assistant message prefill is not supported" (`http_400_prefill`); any other'
        " request is answered as usual (S14). Chat and Messages: the last of `messages`; Responses: the "
        "last item of `input`."
    ),
    "http_400_prefill": (
        'Every attempt: 400 "assistant message prefill is not supported" (what `reject_prefill` answers a'
        " prefill with); implies `http_error=400`. Chat and Responses: OpenAI's error object (type "
        "`invalid_request_error`, param `messages`); Messages: Anthropic's `invalid_request_error`."
    ),
    "spare_model": (
        "At the spare: the model name it answers with, whatever the request named (S16: the caller should"
        " see the fallback's model). Every dialect."
    ),
    "spare_prompt_tokens": (
        "At the spare: its `prompt_tokens` (Messages and Responses `input_tokens`), so its usage is its own (S16). Every dialect."
    ),
}
