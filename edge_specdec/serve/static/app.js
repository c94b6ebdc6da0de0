// The page of `edge-specdec serve`: streams a completion (a model without a chat template) or a chat reply
// from this server and colours each streamed run of text by where it came from: drafted tokens the target
// accepted, or the token the target wrote itself in that round (the chunk's edge_specdec.source).
"use strict";

const KEY_STORAGE = "edge-specdec-api-key";
const $ = (id) => document.getElementById(id);

const state = {
  model: null,        // the model's id from /v1/models
  chat: false,        // the model has a chat template: chat mode, else completion mode
  history: [],        // chat mode: the conversation so far, as {role, content}
  controller: null,   // the AbortController of the request in flight
};

// --- small helpers ----------------------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// The status line; data-state is for scripts and tests: loading, ready, busy, done, stopped, error, auth.
function setStatus(text, stateName) {
  const status = $("status");
  status.textContent = text;
  status.dataset.state = stateName;
}

function showError(message) {
  const error = $("error");
  error.textContent = message || "";
  error.hidden = !message;
}

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;  // textContent: model output is never parsed as HTML
  return el;
}

// An error's message: the server's {"error": {"message"}} body when it sent one, else the HTTP status.
async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON */ }
  return `HTTP ${response.status} ${response.statusText}`.trim();
}

function askForKey(message) {
  $("auth").hidden = false;
  setStatus(message, "auth");
  $("api-key").focus();
}

function setBusy(busy) {
  $("send").disabled = busy || !state.model;
  $("stop").disabled = !busy;
  $("clear").disabled = busy;  // Stop first: a reply still streaming would land in the cleared conversation
}

// --- the model card ---------------------------------------------------------------------------------------------

// Read /v1/models: the mode (chat or completion) and the algorithms this bundle serves. While the model loads
// the server answers 503; the page asks again every 2 s.
async function loadModel() {
  let response;
  try {
    response = await fetch("v1/models", { headers: headers() });
  } catch (e) {
    setStatus("cannot reach the server; retrying…", "loading");
    setTimeout(loadModel, 2000);
    return;
  }
  if (response.status === 401) {
    askForKey(await errorMessage(response));
    return;
  }
  if (response.status === 503) {
    setStatus(await errorMessage(response), "loading");
    setTimeout(loadModel, 2000);
    return;
  }
  if (!response.ok) {
    setStatus("the server did not describe its model", "error");
    showError(await errorMessage(response));
    return;
  }
  const card = (await response.json()).data[0];
  const info = card.edge_specdec || {};
  state.model = card.id;
  state.chat = Boolean(info.chat_template);
  $("auth").hidden = true;
  $("model").textContent = `${card.id} · ${info.vocabulary_relation || "?"} vocabularies · context ` +
    `${info.max_context ?? "?"} tokens`;
  $("mode").textContent = state.chat ? "chat" : "completion mode: the model continues your text";
  $("mode").dataset.mode = state.chat ? "chat" : "completion";
  $("prompt-label").textContent = state.chat ? "Message" : "Text to continue";
  $("system").hidden = $("system-label").hidden = !state.chat;  // a system message is a chat's
  const select = $("algorithm");
  select.replaceChildren(...(info.algorithms || ["auto"]).map((name) => element("option", null, name)));
  select.value = "auto";
  setStatus("ready", "ready");
  setBusy(false);
  $("prompt").focus();
}

// --- streaming --------------------------------------------------------------------------------------------------

// Yield the JSON objects of a server-sent-events body ("data: {...}" events), up to "data: [DONE]".
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();  // stream: true keeps a character split between reads whole
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

// The counts shown while streaming: tokens so far, tokens/s since the request left, share of drafted tokens.
class Tally {
  constructor() { this.start = performance.now(); this.tokens = 0; this.drafted = 0; }
  add(source, tokens) {
    this.tokens += tokens;
    if (source === "draft") this.drafted += tokens;
  }
  text() {
    const seconds = (performance.now() - this.start) / 1000;
    const rate = seconds > 0 ? this.tokens / seconds : 0;
    const share = this.tokens ? Math.round(100 * this.drafted / this.tokens) : 0;
    return `${this.tokens} tokens · ${rate.toFixed(1)} tokens/s · ${share}% drafted`;
  }
}

// The last chunk's statistics, as a line: acceptance, tokens per target pass, algorithm, the server's speed, and
// once the usage chunk came, how many prompt tokens the server reused from its cache (a conversation's earlier
// turns: usage.prompt_tokens_details.cached_tokens) instead of prefilling them.
function summaryText(s, usage) {
  const percent = s.draft_tokens_proposed ? ` (${(100 * s.acceptance).toFixed(1)}%)` : "";
  let line = `acceptance ${s.draft_tokens_accepted}/${s.draft_tokens_proposed}${percent} · ` +
    `${Number(s.mean_tokens_per_target_pass).toFixed(2)} tokens per target pass · ` +
    `${s.target_passes} target passes · algorithm ${s.algorithm} · ` +
    `${Number(s.tokens_per_s).toFixed(1)} tokens/s on the server`;
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    line += ` · ${cached} of ${usage.prompt_tokens} prompt tokens reused`;
  }
  // copies of earlier text (free drafts) are drafted tokens too, proposed without the draft model
  const copied = (s.suffix_tokens_accepted || 0) + (s.pool_tokens_accepted || 0);
  if (copied) line += ` · ${copied} tokens copied from earlier text`;
  if (s.drafting_note) line += ` · ${s.drafting_note}`;  // why it drafted less: the CLI's own sentence
  return line;
}

// Build the request for the current mode and the controls' values. Throws where a control's value is not valid
// (a schema that is not JSON), before anything is sent.
function requestFor(text) {
  const body = {
    model: state.model,
    stream: true,
    stream_options: { include_usage: true },  // the last chunk: usage, with the prompt tokens reused
    return_progress: true,  // chunks that say how far a long prompt's prefill got, before the text
    max_tokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    edge_specdec: { algorithm: $("algorithm").value },
  };
  const topP = Number($("top-p").value);
  if ($("top-p").value !== "" && topP !== 1) body.top_p = topP;
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const schemaText = $("schema").value.trim();
  let schema = null;
  if (schemaText) {
    try {
      schema = JSON.parse(schemaText);
    } catch (e) {
      throw new Error(`the JSON schema is not JSON: ${e.message}`);
    }
  }
  if (state.chat) {
    const system = $("system").value.trim();
    body.messages = [...(system ? [{ role: "system", content: system }] : []), ...state.history,
                     { role: "user", content: text }];
    // OpenAI's structured output for chat
    if (schema) body.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
    return ["v1/chat/completions", body];
  }
  body.prompt = text;
  if (schema) body.json_schema = schema;  // llama-server's field for completions
  return ["v1/completions", body];
}

// Add the turn the reply streams into: the prompt then its continuation, or the user's and the model's messages.
function addTurn(text) {
  const transcript = $("transcript");
  if (state.chat) {
    const user = element("div", "msg user");
    user.append(element("span", "who", "you"), element("span", "body", text));
    const reply = element("div", "msg assistant");
    const body = element("span", "body output");
    reply.append(element("span", "who", "model"), body);
    transcript.append(user, reply);
    return { turn: [user, reply], output: body };
  }
  const turn = element("div", "turn");
  const output = element("span", "output");
  turn.append(element("span", "prompt", text), output);
  transcript.append(turn);
  return { turn: [turn], output };
}

async function send(text) {
  if (!text || state.controller) return;
  showError("");
  $("live-stats").textContent = "";
  $("final-stats").textContent = "";
  delete $("stats").dataset.summary;
  delete $("stats").dataset.usage;
  let url, body;
  try {
    [url, body] = requestFor(text);
  } catch (e) {
    showError(e.message);  // nothing was sent: the prompt stays in its box
    return;
  }
  const { turn, output } = addTurn(text);
  const transcript = $("transcript");
  transcript.scrollTop = transcript.scrollHeight;
  $("prompt").value = "";  // sent: the box is free for the next prompt (a failed one comes back below)

  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  setStatus("generating…", "busy");
  const tally = new Tally();
  let reply = "";
  let summary = null;  // the finishing chunk's statistics
  let outcome = "error";
  try {
    const response = await fetch(url, { method: "POST", headers: headers(), body: JSON.stringify(body),
                                        signal: controller.signal });
    if (!response.ok) {
      const message = await errorMessage(response);
      if (response.status === 401) askForKey(message);
      throw new Error(message);
    }
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);  // a failure after the stream started
      if (chunk.usage) {  // the usage chunk, after the finishing one
        $("stats").dataset.usage = JSON.stringify(chunk.usage);
        if (summary) $("final-stats").textContent = summaryText(summary, chunk.usage);
      }
      if (chunk.prompt_progress) {  // how far the prompt's prefill got: shown between its calls (a long prompt)
        const p = chunk.prompt_progress;
        if (p.cache < p.processed && p.processed < p.total) {
          setStatus(`reading the prompt: ${p.processed} of ${p.total} tokens`, "busy");
        } else if (p.processed >= p.total) {
          setStatus("generating…", "busy");
        }
        continue;
      }
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      const piece = state.chat ? (choice.delta || {}).content : choice.text;
      const info = chunk.edge_specdec || {};
      if (piece) {
        const source = ["draft", "grammar"].includes(info.source) ? info.source : "target";
        const tokens = info.tokens || 0;
        const span = element("span", "tok " + source, piece);
        span.dataset.tokens = tokens;
        span.title = {draft: "drafted, accepted by the target", grammar: "forced by the request's grammar",
                      target: "written by the target"}[source] + ` (${tokens} tokens)`;
        // Follow the text as it grows, unless the reader scrolled up.
        const atBottom = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 30;
        output.append(span);
        if (atBottom) transcript.scrollTop = transcript.scrollHeight;
        reply += piece;
        tally.add(source, tokens);
        $("live-stats").textContent = tally.text();
      }
      if (choice.finish_reason) {
        $("stats").dataset.summary = JSON.stringify(info);  // the last chunk's statistics, as the server sent them
        summary = info;
        $("final-stats").textContent = summaryText(info);
        outcome = "done";
        setStatus(`done: ${info.stop_reason || choice.finish_reason}`, "done");
      }
    }
    if (outcome !== "done") throw new Error("the stream ended before its last chunk");
  } catch (e) {
    if (controller.signal.aborted) {
      outcome = "stopped";  // the server sees the connection close and cancels the generation
      setStatus("stopped", "stopped");
    } else {
      showError(e.message);
      if ($("status").dataset.state !== "auth") setStatus("failed", "error");
    }
  } finally {
    state.controller = null;
    setBusy(false);
  }
  // a request that failed, or was stopped before its reply began (while the server read its prompt), leaves the
  // conversation as it was
  if (outcome === "error" || (outcome === "stopped" && !reply)) {
    turn.forEach((el) => el.classList.add("failed"));
    if (!$("prompt").value) $("prompt").value = text;  // the prompt is not lost: edit, resend
  } else if (state.chat) {  // a stopped reply stays in the conversation as far as it got
    state.history.push({ role: "user", content: text }, { role: "assistant", content: reply });
  }
  $("prompt").focus();
}

// --- wiring -----------------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send($("prompt").value);
  });
  // Enter sends; Shift+Enter (and Enter while an input method composes) types a new line.
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (!$("send").disabled) $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => {
    state.history = [];
    $("transcript").replaceChildren();
    $("live-stats").textContent = "";
    $("final-stats").textContent = "";
    showError("");
  });
  $("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
    $("api-key").value = "";
    showError("");
    setStatus("checking the key…", "loading");
    loadModel();
  });
  loadModel();
});
