// thinkstruct playground: one page, no build step, no dependencies.
//
// Talks only to its own server, by URLs relative to where the page was loaded (so it works
// behind a reverse-proxy prefix): v1/models, v1/chat/completions (streamed),
// playground/config, playground/lint and playground/validate. Text from the model is only
// ever put in the page with textContent.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  // "/" -> "/", "/prefix/" -> "/prefix/", "/prefix" (no slash, behind a proxy) -> "/prefix/".
  const BASE = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
  const KEY_STORAGE = "thinkstruct.apiKey";
  const SVG = "http://www.w3.org/2000/svg";

  const PERSON = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 40 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      favourite_colour: { enum: ["red", "green", "blue", "yellow", "purple"] },
    },
    required: ["name", "age", "favourite_colour"],
    additionalProperties: false,
  };

  const EXAMPLES = {
    json_schema: [
      { name: "Person", prompt: "Invent a character for a short story: their name, age and favourite colour.", value: PERSON },
      {
        name: "Sum",
        prompt: "What is 12 + 30?",
        value: { type: "object", properties: { answer: { type: "integer" } }, required: ["answer"], additionalProperties: false },
      },
      {
        name: "Review sentiment",
        prompt: "Review: \"The soup was cold and the waiter was rude.\" What is its sentiment, and which words show it?",
        value: {
          type: "object",
          properties: {
            sentiment: { enum: ["positive", "negative", "neutral"] },
            keywords: { type: "array", items: { type: "string", maxLength: 20 }, minItems: 1, maxItems: 3 },
          },
          required: ["sentiment", "keywords"],
          additionalProperties: false,
        },
      },
      {
        name: "Lenient: uniqueItems",
        prompt: "Give up to four tags for a blog post about baking bread.",
        value: {
          type: "object",
          properties: { tags: { type: "array", items: { type: "string", maxLength: 12 }, maxItems: 4, uniqueItems: true } },
          required: ["tags"],
          additionalProperties: false,
        },
      },
      {
        name: "Broken: unknown type",
        prompt: "Invent a person.",
        text: '{\n  "type": "object",\n  "properties": {\n    "name": {"type": "string"},\n    "age": {"type": "integr"}\n  },\n  "required": ["name", "age"]\n}\n',
      },
      {
        name: "Broken: malformed JSON",
        prompt: "Invent a person.",
        text: '{\n  "type": "object",\n  "properties": {\n    "name": {"type": "string"},\n  }\n}\n',
      },
    ],
    regex: [
      { name: "ISO date", prompt: "On what date did Apollo 11 land on the Moon?", value: "\\d{4}-\\d{2}-\\d{2}" },
      { name: "Time of day", prompt: "At what time does a typical office day start?", value: "([01][0-9]|2[0-3]):[0-5][0-9]" },
      { name: "Broken: unclosed group", prompt: "Say something.", value: "(ab" },
    ],
    choice: [
      { name: "Capital", prompt: "What is the capital of France?", value: ["Paris", "London", "Berlin", "Madrid"] },
      { name: "Sentiment", prompt: "\"I loved every minute of it.\" Is this positive, negative or neutral?", value: ["positive", "negative", "neutral"] },
    ],
    ebnf: [
      {
        name: "Arithmetic",
        prompt: "Write an arithmetic expression whose value is 10.",
        value: 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"\n',
      },
      {
        name: "Yes or no, with a reason",
        prompt: "Is the sea salty? Answer and give a short reason.",
        value: 'root ::= answer ", because " reason "."\nanswer ::= "yes" | "no"\nreason ::= [a-z ]+\n',
      },
    ],
    none: [{ name: "Free text", prompt: "Tell me a one-sentence fact about owls." }],
  };

  const HINTS = {
    json_schema: "A JSON Schema (draft 2020-12 unless $schema says otherwise).",
    regex: "A regular expression the whole answer must match.",
    choice: "One option per line; the answer is exactly one of them.",
    ebnf: "An EBNF grammar (GBNF style) whose root rule is root.",
    none: "No constraint: the answer is free text.",
  };

  // ---- state ---------------------------------------------------------------------------

  let apiKey = sessionStorage.getItem(KEY_STORAGE) || "";
  let keyRequired = false;
  let modelId = null;
  let running = null; // {controller} while a request streams
  let lintTimer = null;
  let lintSeq = 0;

  // ---- HTTP ----------------------------------------------------------------------------

  class AuthError extends Error {}

  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    if (apiKey) h["Authorization"] = "Bearer " + apiKey;
    return h;
  }

  /** GET or POST a JSON endpoint; resolves to {status, data}. A 401 opens the key dialog. */
  async function api(path, body, signal) {
    const init = body === undefined ? { headers: headers(false) } : { method: "POST", headers: headers(true), body: JSON.stringify(body) };
    if (signal) init.signal = signal;
    const res = await fetch(BASE + path, init);
    let data = null;
    try {
      data = await res.json();
    } catch (_) {
      data = null;
    }
    if (res.status === 401) {
      askKey(apiKey ? "The server refused this key." : "");
      throw new AuthError("the API key is missing or wrong");
    }
    return { status: res.status, data };
  }

  function errorMessage(data, status) {
    const err = data && data.error;
    if (err && err.message) return err.message;
    return "HTTP " + status;
  }

  // ---- API key -------------------------------------------------------------------------

  function askKey(message) {
    const dialog = $("key-dialog");
    $("key-error").textContent = message || "";
    $("key-error").hidden = !message;
    $("key-input").value = "";
    if (!dialog.open) dialog.showModal();
    $("key-input").focus();
  }

  function showKeyStatus() {
    $("key-status").hidden = !keyRequired;
    $("key-status").textContent = apiKey ? "API key set" : "no API key";
    $("key-change").hidden = !keyRequired;
    $("key-forget").hidden = !(keyRequired && apiKey);
  }

  async function useKey(key) {
    apiKey = key;
    sessionStorage.setItem(KEY_STORAGE, key);
    showKeyStatus();
    $("key-dialog").close();
    await loadModel();
  }

  // ---- start-up ------------------------------------------------------------------------

  async function start() {
    setupMessages();
    setupConstraintEditor();
    $("send").addEventListener("click", send);
    $("stop").addEventListener("click", () => running && running.controller.abort());
    document.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        send();
      }
    });
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const key = $("key-input").value.trim();
      if (key) useKey(key);
    });
    $("key-change").addEventListener("click", () => askKey(""));
    $("key-forget").addEventListener("click", () => {
      apiKey = "";
      sessionStorage.removeItem(KEY_STORAGE);
      showKeyStatus();
      askKey("");
    });
    drawPlot(null);
    const config = await fetch(BASE + "playground/config").then((r) => r.json());
    keyRequired = Boolean(config.api_key_required);
    // An empty budget leaves the thought the server's share of max tokens.
    if (typeof config.reasoning_share === "number") {
      $("budget").placeholder = `default: ${Math.round(config.reasoning_share * 100)}% of max tokens`;
    }
    showKeyStatus();
    if (keyRequired && !apiKey) {
      askKey("");
      return;
    }
    await loadModel();
  }

  async function loadModel() {
    try {
      const { status, data } = await api("v1/models");
      if (status !== 200) {
        $("model").textContent = errorMessage(data, status);
        if (status === 503) setTimeout(loadModel, 3000);
        return;
      }
      modelId = data.data[0].id;
      $("model").textContent = modelId;
      $("model").dataset.ready = "true";
      lintNow();
    } catch (e) {
      if (!(e instanceof AuthError)) $("model").textContent = String(e.message || e);
    }
  }

  // ---- messages ------------------------------------------------------------------------

  function addMessage(role, content) {
    const node = $("message-template").content.firstElementChild.cloneNode(true);
    node.querySelector(".role").value = role;
    node.querySelector(".content").value = content || "";
    node.querySelector(".remove").addEventListener("click", () => {
      if ($("messages").children.length > 1) node.remove();
    });
    $("messages").appendChild(node);
    return node;
  }

  function setupMessages() {
    addMessage("user", "");
    $("add-message").addEventListener("click", () => {
      const last = readMessages().pop();
      addMessage(last && last.role === "user" ? "assistant" : "user", "").querySelector(".content").focus();
    });
  }

  function readMessages() {
    return Array.from($("messages").children).map((node) => ({
      role: node.querySelector(".role").value,
      content: node.querySelector(".content").value,
    }));
  }

  function setPrompt(prompt) {
    const nodes = Array.from($("messages").children).filter((n) => n.querySelector(".role").value === "user");
    const node = nodes.length ? nodes[nodes.length - 1] : addMessage("user", "");
    node.querySelector(".content").value = prompt;
  }

  // ---- constraint editor and lint ------------------------------------------------------

  function setupConstraintEditor() {
    $("kind").addEventListener("change", () => {
      fillExamples();
      pickExample(0);
    });
    $("example").addEventListener("change", () => pickExample(Number($("example").value)));
    for (const id of ["constraint", "backend", "strict"]) {
      $(id).addEventListener(id === "constraint" ? "input" : "change", scheduleLint);
    }
    $("constraint").addEventListener("keydown", (e) => {
      if (e.key === "Tab" && !e.shiftKey) {
        // Indent instead of leaving the editor.
        e.preventDefault();
        const t = e.target;
        const at = t.selectionStart;
        t.setRangeText("  ", at, t.selectionEnd, "end");
        scheduleLint();
      }
    });
    fillExamples();
    pickExample(0);
  }

  function fillExamples() {
    const select = $("example");
    select.replaceChildren();
    EXAMPLES[$("kind").value].forEach((ex, i) => {
      const opt = document.createElement("option");
      opt.value = String(i);
      opt.textContent = ex.name;
      select.appendChild(opt);
    });
    const kind = $("kind").value;
    $("constraint-hint").textContent = HINTS[kind];
    $("constraint").disabled = kind === "none";
  }

  function exampleText(kind, ex) {
    if (ex.text !== undefined) return ex.text;
    if (kind === "json_schema") return JSON.stringify(ex.value, null, 2) + "\n";
    if (kind === "choice") return ex.value.join("\n") + "\n";
    return ex.value || "";
  }

  function pickExample(index) {
    const kind = $("kind").value;
    const ex = EXAMPLES[kind][index];
    $("example").value = String(index);
    $("constraint").value = exampleText(kind, ex);
    if (ex.prompt) setPrompt(ex.prompt);
    lintNow();
  }

  function choiceOptions() {
    const lines = $("constraint").value.split("\n");
    while (lines.length && lines[lines.length - 1] === "") lines.pop();
    return lines;
  }

  /** The constraint as the lint and validate endpoints take it, or null for none. */
  function constraintSpec() {
    const kind = $("kind").value;
    if (kind === "none") return null;
    return {
      kind,
      value: kind === "choice" ? choiceOptions() : $("constraint").value,
      backend: $("backend").value,
      strict: $("strict").checked,
    };
  }

  function scheduleLint() {
    clearTimeout(lintTimer);
    setLint("checking", [text("checking…")]);
    lintTimer = setTimeout(runLint, 300);
  }

  function lintNow() {
    clearTimeout(lintTimer);
    runLint();
  }

  async function runLint() {
    const spec = constraintSpec();
    const seq = ++lintSeq;
    if (spec === null) {
      setLint("idle", [text("Free text: nothing to compile.")]);
      return;
    }
    if (!modelId) return; // not ready (or no key yet): linted once the model is known
    setLint("checking", [text("checking…")]);
    let result;
    try {
      result = await api("playground/lint", spec);
    } catch (e) {
      if (seq === lintSeq) setLint("error", [text(String(e.message || e))]);
      return;
    }
    if (seq !== lintSeq) return; // a newer edit is being checked
    if (result.status !== 200) {
      setLint("error", [text(errorMessage(result.data, result.status))]);
      return;
    }
    renderLint(result.data, spec);
  }

  function setLint(state, nodes) {
    const box = $("lint");
    box.dataset.state = state;
    box.replaceChildren(...nodes);
  }

  function renderLint(r, spec) {
    if (r.ok) {
      const parts = [el("span", "ok", "✓ compiles"), text(" with "), el("b", "lint-backend", r.backend)];
      if (r.compile_ms !== null) parts.push(text(` in ${fmtMs(r.compile_ms)}`));
      if (r.compile_ms !== null && r.waited_ms < r.compile_ms / 2) parts.push(text(" (cached)"));
      if (r.ignored_keywords.length) {
        parts.push(el("div", "warn-text", "Not enforced by this backend (lenient mode; strict mode checks them):"));
        const ul = el("ul", "ignored");
        for (const p of r.ignored_keywords) ul.appendChild(li([el("code", "pointer", p)]));
        parts.push(ul);
      }
      const checked = (r.enforcement || []).filter((e) => e.enforcement === "checked");
      if (checked.length) {
        parts.push(el("div", "note-text", "Checked as each value closes (no grammar enforces them; a value that fails is sampled again):"));
        const ul = el("ul", "checked");
        for (const e of checked) {
          ul.appendChild(li([el("code", "keyword", e.keyword), text(" at "), el("code", "pointer", e.pointer), text(" on "), el("code", "location", e.location || "/")]));
        }
        parts.push(ul);
      }
      setLint("ok", parts);
      return;
    }
    const e = r.error;
    const parts = [el("span", "bad", "✗ " + (e.code === "unsupported_constraint" ? "cannot be enforced" : "does not compile"))];
    if (e.backend) parts.push(text(` (${e.backend})`));
    const where = el("div", "where");
    if (e.pointer !== null) where.append(text("at "), el("code", "pointer", e.pointer || "/"), text(" "));
    if (e.line !== null) where.append(el("span", "linecol", `line ${e.line}, column ${e.column}`), text(" "));
    where.append(el("span", "reason", e.reason));
    parts.push(where);
    if (e.position !== null && typeof spec.value === "string") parts.push(excerpt(spec.value, e.position));
    setLint("error", parts);
  }

  /** The line of ``source`` holding ``position``, with a caret under it. */
  function excerpt(source, position) {
    const start = source.lastIndexOf("\n", position - 1) + 1;
    let end = source.indexOf("\n", position);
    if (end < 0) end = source.length;
    const line = source.slice(start, end);
    const caret = " ".repeat(Math.max(0, position - start)) + "^";
    return el("pre", "excerpt", line + "\n" + caret);
  }

  // ---- sending -------------------------------------------------------------------------

  function buildRequest() {
    const messages = readMessages().filter((m) => m.role !== "system" || m.content.trim());
    if (!messages.length) throw new Error("add a message first");
    const body = {
      model: modelId,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      return_allowed_tokens: true,
      backend: $("backend").value,
      chat_template_kwargs: { enable_thinking: $("thinking").checked },
    };
    const temperature = Number($("temperature").value);
    if ($("temperature").value !== "" && Number.isFinite(temperature)) body.temperature = temperature;
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (Number.isFinite(maxTokens)) body.max_tokens = maxTokens;
    const seed = parseInt($("seed").value, 10);
    if (Number.isFinite(seed)) body.seed = seed;
    const budget = parseInt($("budget").value, 10);
    if ($("thinking").checked && Number.isFinite(budget)) body.max_reasoning_tokens = budget;
    const spec = constraintSpec();
    if (spec !== null) {
      if (spec.kind === "json_schema") {
        let schema;
        try {
          schema = JSON.parse(spec.value);
        } catch (e) {
          throw new Error("the schema is not valid JSON: " + e.message);
        }
        body.response_format = { type: "json_schema", json_schema: { name: "playground", schema, strict: spec.strict } };
      } else {
        body[spec.kind] = spec.value;
      }
    }
    return { body, spec };
  }

  function resetOutput() {
    $("thought").textContent = "";
    $("thought-count").textContent = "";
    $("answer").textContent = "";
    $("errors").replaceChildren();
    setVerdict("none", "");
    for (const id of ["s-finish", "s-rate", "s-ttft", "s-tokens", "s-reasoning", "s-backend", "s-forced", "s-compile"]) $(id).textContent = "–";
    drawPlot(null);
  }

  function setStatus(state, message) {
    $("status").dataset.state = state;
    $("status").textContent = message;
  }

  function setVerdict(state, message) {
    $("verdict").dataset.state = state;
    $("verdict").textContent = message;
  }

  async function send() {
    if (running) return;
    if (!modelId) {
      setStatus("error", keyRequired && !apiKey ? "Enter the API key first." : "The model is not ready yet.");
      return;
    }
    let request;
    try {
      request = buildRequest();
    } catch (e) {
      setStatus("error", e.message);
      return;
    }
    resetOutput();
    const controller = new AbortController();
    running = { controller };
    $("send").disabled = true;
    $("stop").disabled = false;
    setStatus("running", "Waiting for the first token…");
    const run = { spec: request.spec, started: performance.now(), firstAt: null, endAt: null, thought: "", answer: "", finish: null, lengthPart: null, error: null, usage: null, info: null };
    try {
      const res = await fetch(BASE + "v1/chat/completions", {
        method: "POST",
        headers: headers(true),
        body: JSON.stringify(request.body),
        signal: controller.signal,
      });
      if (res.status === 401) {
        askKey(apiKey ? "The server refused this key." : "");
        throw new Error("the API key is missing or wrong");
      }
      if (!res.ok) {
        const data = await res.json().catch(() => null);
        showRequestError(data, res.status);
        return;
      }
      await readStream(res.body, run);
      run.endAt = performance.now();
      await finish(run);
    } catch (e) {
      if (e.name === "AbortError") {
        setStatus("error", "Stopped.");
        if (run.answer) $("answer").textContent = run.answer;
      } else {
        setStatus("error", String(e.message || e));
      }
    } finally {
      running = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
  }

  function showRequestError(data, status) {
    setStatus("error", "The server refused the request: " + errorMessage(data, status));
    const err = data && data.error;
    if (err && (err.pointer !== undefined || err.param)) {
      const items = [];
      if (err.param) items.push(li([text("field "), el("code", "pointer", err.param)]));
      if (err.pointer !== undefined && err.pointer !== null) items.push(li([text("at "), el("code", "pointer", err.pointer || "/")]));
      $("errors").replaceChildren(...items);
    }
  }

  async function readStream(stream, run) {
    const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of block.split("\n")) {
          if (line.startsWith("data: ")) onEvent(line.slice(6), run);
        }
      }
    }
  }

  function onEvent(data, run) {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) {
      run.error = chunk.error.message;
      return;
    }
    if (chunk.usage) run.usage = chunk.usage;
    if (chunk.thinkstruct) run.info = chunk.thinkstruct;
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      if (delta.reasoning_content || delta.content) {
        if (run.firstAt === null) {
          run.firstAt = performance.now();
          setStatus("running", "Generating…");
        }
      }
      if (delta.reasoning_content) {
        run.thought += delta.reasoning_content;
        $("thought").textContent = run.thought;
        $("thought").scrollTop = $("thought").scrollHeight;
      }
      if (delta.content) {
        run.answer += delta.content;
        $("answer").textContent = run.answer;
      }
      if (choice.finish_reason) run.finish = choice.finish_reason;
      if (choice.length_part) run.lengthPart = choice.length_part; // which part max tokens cut
      if (choice.error) run.error = choice.error.message;
    }
  }

  async function finish(run) {
    const usage = run.usage || {};
    const info = run.info || {};
    const tokens = usage.completion_tokens;
    const reasoning = usage.completion_tokens_details ? usage.completion_tokens_details.reasoning_tokens : 0;
    $("s-finish").textContent = run.finish ? run.finish + (run.lengthPart ? ` (${run.lengthPart})` : "") : "–";
    $("s-tokens").textContent = tokens ?? "–";
    $("s-reasoning").textContent = reasoning ?? "–";
    $("s-backend").textContent = info.backend || "none";
    $("s-forced").textContent = info.jump_forward_tokens ?? "–";
    $("s-ttft").textContent = info.time_to_first_token_s != null ? fmtMs(info.time_to_first_token_s * 1000) : "–";
    $("s-compile").textContent = info.compile_seconds != null ? fmtMs(info.compile_seconds * 1000) : "–";
    const decodeS = run.firstAt !== null ? (run.endAt - run.firstAt) / 1000 : 0;
    $("s-rate").textContent = tokens > 1 && decodeS > 0 ? ((tokens - 1) / decodeS).toFixed(1) : "–";
    $("thought-count").textContent = run.thought ? `(${reasoning} tokens)` : "(none)";
    const counts = info.allowed_tokens ? info.allowed_tokens[0] : null;
    drawPlot(counts, reasoning);
    if (run.error) {
      setStatus("error", `Finished with an error: ${run.error}`);
    } else {
      const seconds = ((run.endAt - run.started) / 1000).toFixed(2);
      setStatus("done", `Done in ${seconds} s (finish reason: ${run.finish}).`);
    }
    await showVerdict(run);
  }

  async function showVerdict(run) {
    if (run.spec === null) {
      setVerdict("unchecked", "free text");
      return;
    }
    let pretty = run.answer;
    if (run.spec.kind === "json_schema") {
      try {
        pretty = JSON.stringify(JSON.parse(run.answer), null, 2);
      } catch (_) {
        pretty = run.answer;
      }
    }
    $("answer").textContent = pretty;
    let result;
    try {
      const r = await api("playground/validate", { ...run.spec, answer: run.answer });
      if (r.status !== 200) throw new Error(errorMessage(r.data, r.status));
      result = r.data;
    } catch (e) {
      setVerdict("unchecked", "not checked: " + String(e.message || e));
      return;
    }
    const items = [];
    if (result.parse_error) items.push(li([text(result.parse_error)]));
    if (result.schema_error) items.push(li([text(result.schema_error)]));
    for (const issue of result.errors) items.push(li([el("code", "pointer", issue.pointer || "/"), text(" " + issue.message)]));
    if (result.grammar_accepts === false) {
      const at = result.rejected_at >= run.answer.length ? "it ends before it is complete" : `rejected at character ${result.rejected_at}`;
      items.push(li([text(`the grammar does not accept the whole answer: ${at}`)]));
    }
    $("errors").replaceChildren(...items);
    if (result.valid) {
      setVerdict("valid", run.spec.kind === "json_schema" ? "✓ valid against the schema" : "✓ matches the constraint");
    } else {
      const cut = run.finish === "length" ? " (cut off at max tokens)" : "";
      setVerdict("invalid", "✗ " + (run.spec.kind === "json_schema" ? "does not validate" : "does not match") + cut);
    }
  }

  // ---- the plot ------------------------------------------------------------------------

  /**
   * Per output token, how many tokens the grammar allowed (log scale); the first
   * ``thoughtTokens`` (the thought, end tag included) shaded. One circle per token.
   */
  function drawPlot(counts, thoughtTokens) {
    const svg = $("plot");
    svg.replaceChildren();
    const W = 640;
    const H = 180;
    const left = 44;
    const right = 10;
    const top = 10;
    const bottom = 24;
    const iw = W - left - right;
    const ih = H - top - bottom;
    svg.dataset.points = counts ? String(counts.length) : "0";
    if (!counts || !counts.length) {
      const t = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" });
      t.textContent = counts ? "no tokens" : "the next answer is plotted here";
      svg.appendChild(t);
      return;
    }
    const n = counts.length;
    const maxCount = Math.max(...counts, 10);
    const decades = Math.max(1, Math.ceil(Math.log10(maxCount)));
    const x = (i) => left + (n === 1 ? iw / 2 : (i * iw) / (n - 1));
    const y = (c) => top + ih - (Math.log10(Math.max(c, 1)) / decades) * ih;
    const thought = Math.min(thoughtTokens || 0, n);
    if (thought > 0) {
      const x1 = thought >= n ? left + iw : (x(thought - 1) + x(thought)) / 2;
      svg.appendChild(svgEl("rect", { x: left, y: top, width: Math.max(1, x1 - left), height: ih, class: "band" }));
      const label = svgEl("text", { x: (left + x1) / 2, y: top + ih / 2, "text-anchor": "middle", class: "band-label" });
      label.textContent = "thought";
      svg.appendChild(label);
    }
    for (let d = 0; d <= decades; d++) {
      const yy = y(10 ** d);
      svg.appendChild(svgEl("line", { x1: left, x2: left + iw, y1: yy, y2: yy, class: d === 0 ? "axis" : "grid-line" }));
      const t = svgEl("text", { x: left - 6, y: yy + 3, "text-anchor": "end", class: "tick" });
      t.textContent = d < 3 ? String(10 ** d) : d < 6 ? 10 ** (d - 3) + "k" : 10 ** (d - 6) + "M";
      svg.appendChild(t);
    }
    svg.appendChild(svgEl("line", { x1: left, x2: left, y1: top, y2: top + ih, class: "axis" }));
    for (const i of [0, n - 1]) {
      const t = svgEl("text", { x: x(i), y: H - 8, "text-anchor": i === 0 ? "start" : "end", class: "tick" });
      t.textContent = i === 0 ? "token 1" : `token ${n}`;
      svg.appendChild(t);
    }
    const path = counts.map((c, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(c).toFixed(1)}`).join("");
    svg.appendChild(svgEl("path", { d: path, class: "trace" }));
    const radius = n > 300 ? 1.4 : 2.2;
    counts.forEach((c, i) => {
      const kind = i < thought ? "pt thought" : c === 1 ? "pt forced" : "pt";
      const dot = svgEl("circle", { cx: x(i).toFixed(1), cy: y(c).toFixed(1), r: radius, class: kind });
      const title = svgEl("title", {});
      title.textContent = `token ${i + 1}${i < thought ? " (thought)" : ""}: ${c.toLocaleString()} allowed${c === 1 ? " (forced)" : ""}`;
      dot.appendChild(title);
      svg.appendChild(dot);
    });
  }

  // ---- small DOM helpers ---------------------------------------------------------------

  function el(tag, cls, content) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (content !== undefined) node.textContent = content;
    return node;
  }

  function li(children) {
    const node = document.createElement("li");
    node.append(...children);
    return node;
  }

  function text(s) {
    return document.createTextNode(s);
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function fmtMs(ms) {
    if (ms < 1) return `${(ms * 1000).toFixed(0)} µs`;
    if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
    return `${(ms / 1000).toFixed(2)} s`;
  }

  start().catch((e) => setStatus("error", String(e.message || e)));
})();
