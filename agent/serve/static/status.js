// Rooflight status page: polls api/v1/status and roofline.svg about once a second while visible.
// Builds the DOM with textContent only (no HTML from data); the roofline SVG is the server's, parsed as XML.
// Every number that /metrics also exports carries data-metric, data-labels and data-value (the raw value).
"use strict";
(function () {
  const POLL_MS = 1000;
  const MAX_BACKOFF_MS = 15000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const live = { paused: false, timer: null, inFlight: false, failures: 0, lastOk: null, names: {} };

  // -- small helpers -------------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function isNum(v) { return typeof v === "number" && Number.isFinite(v); }

  function sig(v) {
    if (!isNum(v)) return "–";
    if (v === 0) return "0";
    const a = Math.abs(v);
    for (const [f, p] of [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
      if (a >= f) return (v / f).toPrecision(3) + " " + p;
    }
    return a >= 0.001 ? String(Number(v.toPrecision(3))) : v.toExponential(2);
  }
  function pct(v) { return isNum(v) ? (v * 100).toFixed(v < 0.01 ? 2 : 1) + "%" : "–"; }
  function secs(v) { return !isNum(v) ? "–" : v < 1 ? sig(v * 1000) + " ms" : sig(v) + " s"; }
  function count(v) { return isNum(v) ? (Number.isInteger(v) ? String(v) : v.toFixed(1)) : "–"; }
  function clock(t) { return isNum(t) ? new Date(t * 1000).toLocaleTimeString() : "never"; }

  // A number /metrics exports too: the shown text plus the raw value and the series it comes from.
  function metric(text, value, name, labels) {
    const attrs = { class: "num", text: text };
    if (name) {
      attrs["data-metric"] = name;
      attrs["data-labels"] = JSON.stringify(labels);
      if (isNum(value)) attrs["data-value"] = String(value);
    }
    return el("span", attrs);
  }

  function seriesLabels(t, s, extra) {
    return Object.assign({ target: t.name, engine: t.engine || "unknown", model: s.model, rank: s.rank }, extra || {});
  }

  // -- the roofline --------------------------------------------------------------------------------
  function parseSvg(text) {
    const doc = new DOMParser().parseFromString(text, "image/svg+xml");
    const root = doc.documentElement;
    if (!root || root.namespaceURI !== SVG_NS || doc.getElementsByTagName("parsererror").length) return null;
    return document.importNode(root, true);
  }

  function rooflineCaption(t) {
    const roof = t.roofline;
    if (!roof) return "No GPU profile yet.";
    const parts = [];
    for (const s of t.series) {
      const d = s.operating && s.operating.decode;
      if (!d) continue;
      const side = d.intensity < roof.ridge ? "left of the ridge: memory-bound" : "right of the ridge: compute-bound";
      parts.push(`Decode${t.series.length > 1 ? " (" + s.model + " rank " + s.rank + ")" : ""} at ` +
        `${sig(d.intensity)} FLOP/byte, ${side}.`);
    }
    return `Ridge at ${sig(roof.ridge)} FLOP/byte (${sig(roof.peak_flops)}FLOP/s over ${sig(roof.peak_bandwidth)}B/s). ` +
      (parts.join(" ") || "No decode point yet.");
  }

  // -- one series ------------------------------------------------------------------------------------
  function kpi(cls, label, valueNode, sub) {
    return el("div", { class: "kpi " + (cls || "") }, el("div", { class: "label", text: label }),
      el("div", { class: "value" }, valueNode), sub ? el("div", { class: "sub" }, sub) : null);
  }

  function kpis(t, s) {
    const n = live.names;
    const w = s.windows[0];
    const box = el("div", { class: "kpis" });
    if (!w) {
      box.append(el("p", { class: "muted", text: "The shortest window is still filling." }));
      return box;
    }
    const L = (extra) => seriesLabels(t, s, Object.assign({ window: w.window }, extra));
    const win = `${w.window} window`;
    box.append(
      kpi("decode", "decode MBU", metric(pct(w.mbu), w.mbu, n.mbu, L()), win),
      kpi("prefill", "prefill MFU", metric(pct(w.mfu.prefill), w.mfu.prefill, n.mfu, L({ phase: "prefill" })), win),
      kpi("decode", "decode tokens/s", metric(sig(w.tokens_per_second.decode), w.tokens_per_second.decode,
        n.tokens_per_second, L({ phase: "decode" })), win),
      kpi("prefill", "prefill tokens/s", metric(sig(w.tokens_per_second.prefill), w.tokens_per_second.prefill,
        n.tokens_per_second, L({ phase: "prefill" })), win),
      kpi("decode", "decode MFU", metric(pct(w.mfu.decode), w.mfu.decode, n.mfu, L({ phase: "decode" })), win));
    const ridge = t.roofline ? t.roofline.ridge : null;
    const side = isNum(w.decode_intensity) && isNum(ridge)
      ? (w.decode_intensity < ridge ? "below the ridge " : "above the ridge ") + sig(ridge) : "";
    box.append(kpi("decode", "decode FLOP/byte", metric(sig(w.decode_intensity), w.decode_intensity,
      n.decode_intensity, L()), side));
    const ceiling = (s.ceilings || []).find((c) => c.kind === "batch");
    if (ceiling) {
      const got = w.tokens_per_second.decode;
      const share = isNum(got) && ceiling.tokens_per_second > 0 ? `attained ${pct(got / ceiling.tokens_per_second)}` : "";
      box.append(kpi("", `plan ceiling, batch ${ceiling.batch}`, el("span", { text: sig(ceiling.tokens_per_second) + " tok/s" }),
        `${share} at ${ceiling.context_tokens} tokens of context`));
    }
    const cap = (s.ceilings || []).find((c) => c.kind === "cap");
    if (cap) {
      box.append(kpi("", `plan ceiling, batch cap ${cap.batch}`, el("span", { text: sig(cap.tokens_per_second) + " tok/s" }),
        "if the batch filled its cap at this context"));
    }
    return box;
  }

  function bar(parts) {
    const b = el("div", { class: "bar", role: "presentation" });
    for (const [cls, frac] of parts) {
      if (isNum(frac) && frac > 0) {
        const span = el("span", { class: cls });
        span.style.width = Math.min(100, frac * 100).toFixed(1) + "%";
        b.append(span);
      }
    }
    return b;
  }

  function bars(t, s) {
    const n = live.names;
    const kv = el("div", { class: "bar-row" },
      el("div", { class: "label" }, el("span", { text: "KV cache occupancy" }),
        metric(pct(s.kv_usage_ratio), s.kv_usage_ratio, n.kv_usage_ratio, seriesLabels(t, s))),
      bar([["fill", s.kv_usage_ratio]]));
    const capText = isNum(s.batch_max) ? " / cap " : " / cap unknown";
    const cap = isNum(s.batch_max) ? s.batch_max : null;
    const batch = el("div", { class: "bar-row" },
      el("div", { class: "label" },
        el("span", {}, "running ", metric(count(s.running), s.running, n.running, seriesLabels(t, s)), capText,
          cap !== null ? metric(count(cap), cap, n.batch_max, seriesLabels(t, s)) : null),
        el("span", {}, "waiting ", metric(count(s.waiting), s.waiting, n.waiting, seriesLabels(t, s)))),
      bar(cap ? [["fill", s.running / cap], ["over", (s.waiting || 0) / cap]] : []));
    return el("div", { class: "bars" }, kv, batch);
  }

  function windowsTable(t, s) {
    const n = live.names;
    const pcts = [...new Set(s.windows.flatMap((w) => Object.keys(w.ttft).concat(Object.keys(w.itl))))]
      .sort((a, b) => Number(a) - Number(b));
    const head = el("tr", {}, el("th", { text: "window" }), el("th", { text: "MBU" }), el("th", { text: "MFU prefill" }),
      el("th", { text: "MFU decode" }), el("th", { text: "tok/s prefill" }), el("th", { text: "tok/s decode" }),
      ...pcts.map((p) => el("th", { text: "TTFT p" + p })), ...pcts.map((p) => el("th", { text: "ITL p" + p })),
      el("th", { text: "preempt/s" }));
    const rows = s.windows.map((w) => {
      const L = (extra) => seriesLabels(t, s, Object.assign({ window: w.window }, extra));
      const td = (node) => el("td", {}, node);
      return el("tr", {}, el("td", { text: w.window }),
        td(metric(pct(w.mbu), w.mbu, n.mbu, L())),
        td(metric(pct(w.mfu.prefill), w.mfu.prefill, n.mfu, L({ phase: "prefill" }))),
        td(metric(pct(w.mfu.decode), w.mfu.decode, n.mfu, L({ phase: "decode" }))),
        td(metric(sig(w.tokens_per_second.prefill), w.tokens_per_second.prefill, n.tokens_per_second, L({ phase: "prefill" }))),
        td(metric(sig(w.tokens_per_second.decode), w.tokens_per_second.decode, n.tokens_per_second, L({ phase: "decode" }))),
        ...pcts.map((p) => td(metric(secs(w.ttft[p]), w.ttft[p], n.ttft, L({ percentile: p })))),
        ...pcts.map((p) => td(metric(secs(w.itl[p]), w.itl[p], n.itl, L({ percentile: p })))),
        td(metric(sig(w.preemptions_per_second), w.preemptions_per_second, n.preemptions_per_second, L())));
    });
    return el("div", { class: "scroll" }, el("table", { class: "data windows" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  const SPARKS = [
    ["mbu", "decode MBU", pct, ""], ["tokens_decode", "decode tok/s", sig, ""],
    ["mfu_prefill", "prefill MFU", pct, "prefill"], ["tokens_prefill", "prefill tok/s", sig, "prefill"],
    ["itl_p99", "ITL p99", secs, ""], ["ttft_p99", "TTFT p99", secs, "prefill"],
    ["kv_usage", "KV occupancy", pct, ""], ["running", "running", count, ""],
    ["waiting", "waiting", count, "prefill"], ["preemptions_per_second", "preemptions/s", sig, "prefill"],
  ];

  function sparkline(times, values) {
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("viewBox", "0 0 100 32");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    const pts = times.map((t, i) => [t, values[i]]);
    const known = pts.filter(([, v]) => isNum(v));
    if (known.length < 2) return svg;
    const t0 = pts[0][0], t1 = pts[pts.length - 1][0];
    const max = Math.max(...known.map(([, v]) => v)) || 1;
    let run = [];
    const flush = () => {
      if (run.length > 1) {
        const line = document.createElementNS(SVG_NS, "polyline");
        line.setAttribute("points", run.join(" "));
        svg.append(line);
      }
      run = [];
    };
    for (const [t, v] of pts) {
      if (!isNum(v)) { flush(); continue; }
      const x = t1 > t0 ? ((t - t0) / (t1 - t0)) * 100 : 0;
      run.push(x.toFixed(2) + "," + (30 - (v / max) * 28).toFixed(2));
    }
    flush();
    return svg;
  }

  function sparklines(s) {
    const h = s.history;
    if (!h || !h.t) return null;
    const grid = el("div", { class: "sparks" });
    for (const [key, label, fmt, cls] of SPARKS) {
      const values = h[key] || [];
      const last = values.length ? values[values.length - 1] : null;
      grid.append(el("div", { class: "spark " + cls, "data-spark": key, "data-points": String(h.t.length) },
        el("div", { class: "label" }, el("span", { text: label }), el("b", { text: fmt(last) })),
        sparkline(h.t, values)));
    }
    return grid;
  }

  function detectors(t, s) {
    const list = el("ul", { class: "detectors" });
    for (const d of s.detectors) {
      const word = { active: "ACTIVE", clear: "clear", unknown: "cannot tell" }[d.state];
      const badge = el("span", { class: "state " + d.state, "data-metric": d.metric,
        "data-labels": JSON.stringify(seriesLabels(t, s)) }, word);
      if (d.state !== "unknown") badge.setAttribute("data-value", d.state === "active" ? "1" : "0");
      const extra = d.key === "head_of_line" && isNum(d.itl_inflation)
        ? el("span", { class: "muted" }, "Worst ITL now ",
          metric(sig(d.itl_inflation) + "x", d.itl_inflation, live.names.itl_inflation, seriesLabels(t, s)),
          " its recent median",
          d.itl_source === "proxy" ? " (the exact gaps between tokens the proxy relayed). " : " (the engine's ITL buckets). ")
        : null;
      list.append(el("li", { class: "detector", "data-detector": d.key, "data-state": d.state }, badge,
        el("p", {}, el("strong", { text: d.title + ". " }), d.sentence + " ", extra,
          el("a", { href: d.runbook, rel: "noopener" }, "Runbook"))));
    }
    return list;
  }

  function seriesSection(t, s) {
    const sec = el("section", { class: "series", "data-model": s.model, "data-rank": s.rank });
    if (t.series.length > 1) sec.append(el("h3", { text: `${s.model} · rank ${s.rank}` }));
    sec.append(el("h3", { text: "Windows" }), windowsTable(t, s));
    const sparks = sparklines(s);
    if (sparks) sec.append(el("h3", { text: "Recent history" }), sparks);
    return sec;
  }

  // -- one target ----------------------------------------------------------------------------------
  function targetCard(t, chart) {
    const card = el("section", { class: "card target", "data-target": t.name,
      "data-last-sample": isNum(t.last_sample) ? String(t.last_sample) : null });
    const roof = t.roofline;
    const gpu = roof ? `${roof.tensor_parallel_size} x ${roof.gpu_name} (${t.gpu_profile_source || "?"})` : "GPU unknown";
    card.append(el("h2", { text: t.name }),
      el("p", { class: "meta muted", text: `${t.engine || "engine not recognised yet"} · ${t.model || "model unknown"} · ${gpu}` }));
    for (const s of t.series) {  // what binds the batch first: the detectors, then the numbers behind them
      const title = "Detectors" + (t.series.length > 1 ? ` · ${s.model} · rank ${s.rank}` : "");
      card.append(el("h3", { text: title }), detectors(t, s));
    }
    const figure = el("figure", { class: "roofline", "data-snapshot": chart ? chart.snapshot : null });
    if (chart && chart.svg) figure.append(chart.svg);
    figure.append(el("figcaption", { class: "muted", text: rooflineCaption(t) }));
    const side = el("div", { class: "side" });
    for (const s of t.series) {
      if (t.series.length > 1) side.append(el("h3", { text: `${s.model} · rank ${s.rank}` }));
      side.append(kpis(t, s), bars(t, s));
    }
    if (!t.series.length) side.append(el("p", { class: "muted", text: "No engine series yet: see Sources below." }));
    card.append(el("div", { class: "overview" }, figure, side));
    for (const s of t.series) card.append(seriesSection(t, s));
    return card;
  }

  // -- sources -------------------------------------------------------------------------------------
  // Up, starting (no good sample yet since the agent started: an engine loading its model), or DOWN.
  function sourceState(h, labels) {
    const n = live.names;
    if (h.starting) {
      return el("span", { class: "state starting", "data-metric": n.source_starting,
        "data-labels": JSON.stringify(labels), "data-value": "1" }, "starting");
    }
    return el("span", { class: "state " + (h.up ? "up" : "down"), "data-metric": n.source_up,
      "data-labels": JSON.stringify(labels), "data-value": h.up ? "1" : "0" }, h.up ? "up" : "DOWN");
  }

  function sourceRow(h) {
    const n = live.names;
    const labels = { source: h.source, target: h.target };
    const errors = Object.entries(h.errors).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
    const last = h.last_error ? h.last_error.reason + (isNum(h.last_error.at) ? ` at ${clock(h.last_error.at)}` : "") : "";
    return el("tr", { "data-source": h.source, "data-target": h.target },
      el("td", { text: h.source }), el("td", { text: h.target }),
      el("td", {}, sourceState(h, labels)),
      el("td", {}, metric(clock(h.last_success), h.last_success, n.source_last_success, labels)),
      el("td", { text: isNum(h.duration) ? secs(h.duration) : "–" }),
      el("td", { text: errors }),
      el("td", { class: "error", text: last || "–" }));
  }

  // -- the whole page ------------------------------------------------------------------------------
  function render(status, charts) {
    live.names = status.metric_names || {};
    document.getElementById("version").textContent = "v" + status.version;
    document.body.setAttribute("data-created", String(status.created));
    const cards = status.targets.map((t, i) => targetCard(t, charts[i]));
    if (!cards.length) cards.push(el("section", { class: "card" }, el("p", { text: "No targets configured." })));
    document.getElementById("targets").replaceChildren(...cards);
    document.querySelector("#sources tbody").replaceChildren(...status.health.map(sourceRow));
    const active = status.targets.flatMap((t) => t.series.flatMap((s) => s.detectors.filter((d) => d.state === "active")));
    document.title = active.length ? `(${active.length}) Rooflight: ${active.map((d) => d.title).join(", ")}` : "Rooflight";
    const age = status.created ? Math.max(0, Date.now() / 1000 - status.created) : null;
    document.getElementById("updated").textContent = status.created
      ? `snapshot ${clock(status.created)} (${age.toFixed(1)} s old)` : "waiting for the agent's first snapshot";
  }

  function banner(text) {
    const b = document.getElementById("banner");
    b.hidden = !text;
    b.textContent = text || "";
    document.body.classList.toggle("stale", Boolean(text));
  }

  async function fetchOk(url) {
    const r = await fetch(url, { cache: "no-store" });
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r;
  }

  async function fetchChart(name) {
    const r = await fetchOk("roofline.svg?target=" + encodeURIComponent(name));
    return { snapshot: r.headers.get("X-Rooflight-Snapshot"), svg: parseSvg(await r.text()) };
  }

  // The status and its charts from one snapshot: a sample landing between the fetches would draw a chart
  // beside the numbers (and caption) of the sample before. Each response names its snapshot (the same
  // header text for the same snapshot); on a mismatch the page asks again, up to 3 times, then draws what it
  // has. A response without the header (a proxy that drops it) is taken as it is.
  async function fetchSnapshot() {
    for (let attempt = 1; ; attempt++) {
      const r = await fetchOk("api/v1/status");
      const snapshot = r.headers.get("X-Rooflight-Snapshot");
      const status = JSON.parse(await r.text());
      const charts = await Promise.all(status.targets.map((t) => fetchChart(t.name)));
      const same = (c) => snapshot === null || c.snapshot === null || c.snapshot === snapshot;
      if (attempt >= 3 || charts.every(same)) return [status, charts];
    }
  }

  async function poll() {
    live.timer = null;
    if (live.paused || document.hidden || live.inFlight) return;
    live.inFlight = true;
    try {
      const [status, charts] = await fetchSnapshot();
      render(status, charts);
      live.failures = 0;
      live.lastOk = Date.now();
      banner("");
    } catch (err) {
      live.failures += 1;
      const since = live.lastOk ? ` since ${new Date(live.lastOk).toLocaleTimeString()}` : "";
      banner(`The agent did not answer${since} (${err.message}); retrying. The numbers below are stale.`);
    } finally {
      live.inFlight = false;
    }
    schedule();
  }

  function schedule() {
    if (live.timer !== null || live.inFlight || live.paused || document.hidden) return;
    const delay = Math.min(MAX_BACKOFF_MS, POLL_MS * Math.pow(2, Math.min(live.failures, 4)));
    live.timer = setTimeout(poll, delay);
  }

  function setPaused(paused) {
    live.paused = paused;
    const button = document.getElementById("pause");
    button.setAttribute("aria-pressed", String(paused));
    button.textContent = paused ? "Resume" : "Pause";
    if (paused && live.timer !== null) { clearTimeout(live.timer); live.timer = null; }
    if (!paused) poll();
  }

  document.getElementById("pause").addEventListener("click", () => setPaused(!live.paused));
  document.addEventListener("visibilitychange", () => { if (!document.hidden && live.timer === null) poll(); });
  poll();
})();
