// The StitchML debugger's page: network (dagre layout, kernels as regions), tensors, timeline, bisection.
"use strict";

const $ = (id) => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
const state = { files: [], file: null, net: null, collapsed: new Set(), selected: null, tensor: null, page: 0, pages: 1,
  tensorSeq: 0 };

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}
function text(s) { return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]); }
function fmt(v) { return v === null || v === undefined ? "—" : (typeof v === "number" ? Number(v.toPrecision(6)) : v); }

async function api(path, params) {
  const q = new URLSearchParams({ file: state.file, ...(params || {}) });
  const r = await fetch(`${path}?${q}`);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function showError(msg) { const e = $("error"); e.hidden = !msg; e.textContent = msg || ""; }
function showNote(msg) { const e = $("note"); e.hidden = !msg; e.textContent = msg || ""; }
function current() { return state.files.find((f) => f.path === state.file); }

// -- views ---------------------------------------------------------------------------------
function show(view) {
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("on", b.dataset.view === view));
  document.querySelectorAll(".view").forEach((s) => { s.hidden = s.id !== view; });
  if (view === "tensor") loadTensor();
  if (view === "timeline") loadTimeline();
  if (view === "bisect") showBisect();
}

// -- network -------------------------------------------------------------------------------
function kernelOf(op) { return op.kernel && state.kernels.has(op.kernel) ? op.kernel : null; }
function visible(op) { return $("show-constants").checked || op.op !== "constant"; }

function drawNetwork() {
  const net = state.net, root = $("graph");
  root.innerHTML = "";
  const g = new dagre.graphlib.Graph({ compound: true, multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 28, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  const producer = new Map(), nodeOf = new Map();
  for (const op of net.ops) for (const t of op.outputs) producer.set(t, op);
  for (const op of net.ops) {
    if (!visible(op)) continue;
    const k = kernelOf(op);
    if (k && state.collapsed.has(k)) {
      const n = state.kernels.get(k).ops.length;
      g.setNode(k, { width: Math.max(150, k.length * 7 + 20), height: 36, kind: "kernel", label: `${k} (${n} ops)` });
      nodeOf.set(op.name, k);
      continue;
    }
    const label = `${op.name}: ${op.op}`;
    g.setNode(op.name, { width: Math.max(80, label.length * 6.3 + 14), height: 30, kind: "op", op });
    if (k && k !== op.name) {  // a vendor call or view step is named after its one op: no region around it
      if (!g.hasNode(k)) g.setNode(k, { kind: "cluster", label: k });
      g.setParent(op.name, k);
    }
    nodeOf.set(op.name, op.name);
  }
  const refused = new Map();  // "kernel->op name" -> reason: the fusion report's refusals
  for (const k of state.kernels.values())
    for (const [who, why] of k.not_fused) {
      const m = /\(([^()]*)\)$/.exec(who);
      if (m) refused.set(`${k.name}->${m[1]}`, why);
    }
  const edges = [];
  for (const op of net.ops) {
    const dst = nodeOf.get(op.name);
    if (!dst) continue;
    for (const t of op.inputs) {
      const p = producer.get(t), src = p && nodeOf.get(p.name);
      if (!src || src === dst || g.hasEdge(src, dst)) continue;
      const why = p.kernel && kernelOf(op) !== p.kernel ? refused.get(`${p.kernel}->${op.name}`) : undefined;
      g.setEdge(src, dst, { why });
      edges.push([src, dst]);
    }
  }
  dagre.layout(g);
  const info = g.graph();
  root.setAttribute("width", info.width + 20);
  root.setAttribute("height", info.height + 20);
  const layers = { clusters: svg("g", {}, root), edges: svg("g", {}, root), nodes: svg("g", {}, root) };
  for (const id of g.nodes()) {
    const n = g.node(id);
    if (n.kind !== "cluster") continue;
    const grp = svg("g", { class: "kernel", "data-kernel": id }, layers.clusters);
    svg("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2 - 14, width: n.width, height: n.height + 14 }, grp);
    const t = svg("text", { x: n.x - n.width / 2 + 6, y: n.y - n.height / 2 - 2, class: "title" }, grp);
    t.textContent = `${id} ▾`;
    grp.addEventListener("click", (ev) => { ev.stopPropagation(); toggle(id); });
  }
  for (const [a, b] of edges) {
    const e = g.edge(a, b);
    const path = svg("polyline", { class: "edge" + (e.why ? " refused" : ""),
      points: e.points.map((p) => `${p.x},${p.y}`).join(" ") }, layers.edges);
    if (e.why) svg("title", {}, path).textContent = `not fused: ${e.why}`;
  }
  for (const id of g.nodes()) {
    const n = g.node(id);
    if (n.kind === "cluster") continue;
    const isK = n.kind === "kernel";
    const grp = svg("g", { class: isK ? "kernel collapsed" : "op" + (["placeholder", "constant", "variable"].includes(n.op.op) ? " src" : ""),
      [isK ? "data-kernel" : "data-op"]: id }, layers.nodes);
    svg("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height }, grp);
    const t = svg("text", { x: n.x - n.width / 2 + 7, y: n.y + 4, class: isK ? "title" : "" }, grp);
    t.textContent = isK ? `${n.label} ▸` : `${n.op.name}: ${n.op.op}`;
    if (!isK && state.selected === id) grp.classList.add("sel");
    grp.addEventListener("click", () => (isK ? toggle(id) : selectOp(n.op)));
  }
  $("net-info").textContent = `${net.ops.length} ops, ${state.kernels.size} compiled steps`;
}

function toggle(kernel) {
  if (state.collapsed.has(kernel)) state.collapsed.delete(kernel); else state.collapsed.add(kernel);
  drawNetwork();
  showKernel(kernel);
}

function showKernel(name) {
  const k = state.kernels.get(name);
  const refusals = k.not_fused.map(([who, why]) => `<li><b>${text(who)}</b>: ${text(why)}</li>`).join("");
  $("details").innerHTML = `<h3>kernel ${text(name)}</h3><p>template: ${text(k.template)}; ops: ${k.ops.map(text).join(", ")}</p>
    <h4>not fused with its neighbours</h4><ul>${refusals || "<li>(no refusals)</li>"}</ul>
    <h4>generated source</h4>${k.source ? `<pre id="kernel-source">${text(k.source)}</pre>` :
      "<p class='hint'>none: this step ran through the reference backend (CPU without TRITON_INTERPRET=1), a vendor call or a view</p>"}`;
}

function selectOp(op) {
  state.selected = op.name;
  document.querySelectorAll(".op.sel").forEach((e) => e.classList.remove("sel"));
  const el = document.querySelector(`.op[data-op="${CSS.escape(op.name)}"]`);
  if (el) { el.classList.add("sel"); el.scrollIntoView({ block: "center", inline: "center" }); }
  const outs = op.outputs.map((t, i) => `<li>${text(t)}: ${text(op.dtypes[i])}[${op.shapes[i].join(",")}]</li>`).join("");
  const attrs = Object.entries(op.attrs).map(([k, v]) => `<li>${text(k)} = ${text(v)}</li>`).join("");
  const k = op.kernel && state.kernels.get(op.kernel);
  const captured = (current().tensors || []).filter((t) => op.outputs.includes(t));
  const origins = op.outputs.flatMap((t) => (state.net.origins || {})[t] || []);
  const from = origins.map((o) => `${text(o.value)} (${text(o.op)}${o.location ? `, ${text(o.location)}` : ""})`).join("; ");
  $("details").innerHTML = `<h3 id="op-name">${text(op.name)}</h3>
    <table><tr><td>op</td><td>${text(op.op)}</td></tr><tr><td>source</td><td id="op-location">${text(op.location)}</td></tr>
    <tr><td>scope</td><td>${text(op.scope || "—")}</td></tr><tr><td>kernel</td><td>${text(op.kernel || "not in a kernel")}</td></tr>
    <tr><td>inputs</td><td>${op.inputs.map(text).join(", ") || "—"}</td></tr>
    ${from ? `<tr><td>model value</td><td id="op-origin">${from}</td></tr>` : ""}</table>
    <h4>outputs</h4><ul>${outs}</ul>${attrs ? `<h4>attributes</h4><ul>${attrs}</ul>` : ""}
    ${captured.map((t) => `<button class="open-tensor" data-name="${text(t)}">view tensor ${text(t)}</button>`).join(" ")}
    ${k ? `<h4>kernel ${text(k.name)} source</h4>${k.source ? `<pre>${text(k.source)}</pre>` : "<p class='hint'>no generated source (reference backend, vendor call or view)</p>"}` : ""}`;
  document.querySelectorAll(".open-tensor").forEach((b) => b.addEventListener("click", () => openTensor(b.dataset.name)));
}

async function loadNetwork() {
  showError(""); showNote("");
  const f = current();
  if (f.error) { showError(`Cannot open ${f.path}: ${f.error}`); $("graph").innerHTML = ""; return; }
  if (f.kind === "trace") { showNote("a trace file: see the Timeline view"); $("graph").innerHTML = ""; return; }
  const file = state.file;
  const net = await api("/api/network");
  if (file !== state.file) return;  // another file was chosen meanwhile
  state.net = net;
  state.kernels = new Map(state.net.kernels.filter((k) => k.template !== "view" || k.ops.length > 1).map((k) => [k.name, k]));
  state.collapsed = new Set([...state.kernels.values()].filter((k) => k.ops.length > 1).map((k) => k.name));
  showNote(state.net.note);
  drawNetwork();
  $("graph").dataset.file = state.file;  // which file the drawing shows (tests wait on it)
}

// -- tensors --------------------------------------------------------------------------------
function openTensor(name, diff) {
  state.tensor = name; state.page = 0;
  $("tensor-name").value = name;
  $("diff").checked = !!diff;
  show("tensor");
}

const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
function colour(t, stops) {
  t = Math.min(Math.max(t, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(t), stops.length - 2), f = t - i;
  return stops[i].map((c, j) => Math.round(c + (stops[i + 1][j] - c) * f));
}

async function loadTensor() {
  const f = current();
  const sel = $("tensor-name");
  if (!f.tensors.length) { $("stats").textContent = "This file holds no tensors: open a capture (stitchml.debug.capture(...).save)."; return; }
  if (sel.options.length !== f.tensors.length) sel.innerHTML = f.tensors.map((t) => `<option>${text(t)}</option>`).join("");
  const name = state.tensor || f.tensors[0];
  sel.value = name; state.tensor = name;
  $("diff").disabled = !f.references.includes(name);
  if ($("diff").disabled) $("diff").checked = false;
  const seq = ++state.tensorSeq;  // a later request supersedes this one: drop its answers
  const fresh = () => seq === state.tensorSeq;
  try {
    const t = await api("/api/tensor", { name, page: state.page, size: 64 });
    if (!fresh()) return;
    const bad = (k) => (t[k] ? ` class="bad"` : "");
    $("stats").innerHTML = `<span><b>${text(name)}</b> ${text(t.dtype)}[${t.shape.join(",")}]</span>
      <span>min ${fmt(t.min)}</span><span>max ${fmt(t.max)}</span><span>mean ${fmt(t.mean)}</span><span>std ${fmt(t.std)}</span>
      <span${bad("nan")} id="nan-count">NaN ${t.nan}${t.first_nan ? ` (first at [${t.first_nan}])` : ""}</span>
      <span${bad("inf")}>Inf ${t.inf}${t.first_inf ? ` (first at [${t.first_inf}])` : ""}</span>`;
    state.pages = t.pages;
    $("page").textContent = `page ${t.page + 1} of ${t.pages}`;
    const cells = t.raw.map((v, i) => `<td title="flat index ${t.page * 64 + i}">${v}</td>`);
    let rows = "";
    for (let i = 0; i < cells.length; i += 8) rows += `<tr><th>${t.page * 64 + i}</th>${cells.slice(i, i + 8).join("")}</tr>`;
    $("numbers").innerHTML = rows;
    const diff = $("diff").checked;
    const rgb = $("colour").value === "rgb";
    const img = await api("/api/tensor/plane", { name, layout: $("layout").value, n: $("img-n").value, c: $("img-c").value,
      diff: diff ? 1 : 0, rgb: rgb ? 1 : 0 });
    if (!fresh()) return;
    drawImage(img, diff);
    const hist = await api("/api/tensor/histogram", { name, bins: 40 });
    if (!fresh()) return;
    drawHistogram(hist);
    showError("");
  } catch (e) { showError(e.message); }
}

function drawImage(img, diff) {
  const cv = $("image"), ctx = cv.getContext("2d");
  const scale = Math.max(1, Math.floor(320 / Math.max(img.rows, img.cols)));
  cv.width = img.cols * scale; cv.height = img.rows * scale;
  const lo = diff ? -Math.max(Math.abs(img.min), Math.abs(img.max)) : img.min;
  const hi = diff ? -lo : img.max;
  const stops = diff ? DIVERGING : VIRIDIS;
  const level = (v) => Math.round(255 * (hi > lo ? (v - lo) / (hi - lo) : 0.5));
  for (let r = 0; r < img.rows; r++)
    for (let c = 0; c < img.cols; c++) {
      let rgb;
      if (img.rgb) {  // the three channels, scaled together to 0..255
        const vs = img.values.map((p) => p[r][c]);
        rgb = vs.includes(null) ? [255, 0, 255] : vs.map(level);
      } else {
        const v = img.values[r][c];
        rgb = v === null ? [255, 0, 255] : colour(hi > lo ? (v - lo) / (hi - lo) : 0.5, stops);
      }
      ctx.fillStyle = `rgb(${rgb})`;
      ctx.fillRect(c * scale, r * scale, scale, scale);
    }
  const sc = $("scale"), sctx = sc.getContext("2d");
  for (let x = 0; x < sc.width; x++) { sctx.fillStyle = `rgb(${colour(x / (sc.width - 1), stops)})`; sctx.fillRect(x, 0, 1, sc.height); }
  $("scale-text").textContent = `${diff ? "ours − reference: " : ""}${fmt(lo)} … ${fmt(hi)} (NaN/Inf magenta); ${img.rows}×${img.cols} shown`;
  cv.dataset.rendered = `${img.rgb ? "rgb " : ""}${img.rows}x${img.cols}`;
}

function drawHistogram(h) {
  const cv = $("histogram"), ctx = cv.getContext("2d");
  ctx.clearRect(0, 0, cv.width, cv.height);
  const top = Math.max(1, ...h.counts), w = cv.width / h.counts.length;
  ctx.fillStyle = "#4a6fa5";
  h.counts.forEach((c, i) => { const bh = (c / top) * (cv.height - 20); ctx.fillRect(i * w, cv.height - 14 - bh, w - 1, bh); });
  ctx.fillStyle = "#222"; ctx.font = "10px sans-serif";
  ctx.fillText(fmt(h.edges[0]), 0, cv.height - 2);
  const last = fmt(h.edges[h.edges.length - 1]);
  ctx.fillText(last, cv.width - ctx.measureText(String(last)).width, cv.height - 2);
}

// -- timeline --------------------------------------------------------------------------------
async function loadTimeline() {
  const root = $("tl");
  root.innerHTML = "";
  $("export").href = `/api/timeline/export?${new URLSearchParams({ file: state.file })}`;
  let events;
  try { events = (await api("/api/timeline")).traceEvents; } catch (e) { showError(e.message); return; }
  const spans = events.filter((e) => e.ph === "X" || e.ph === "i");
  if (!spans.length) { $("tl-info").textContent = "no timeline: capture a run with a compiled executable, or open a trace file"; return; }
  const names = new Map();
  for (const e of events) if (e.ph === "M" && e.name === "thread_name") names.set(`${e.pid}/${e.tid}`, e.args.name);
  const tracks = [...new Set(spans.map((e) => `${e.pid}/${e.tid}`))];
  const t0 = Math.min(...spans.map((e) => e.ts)), t1 = Math.max(...spans.map((e) => e.ts + (e.dur || 0)));
  const W = 1100, left = 150, H = 34, x = (t) => left + ((t - t0) / Math.max(t1 - t0, 1e-9)) * (W - left - 10);
  root.setAttribute("width", W); root.setAttribute("height", tracks.length * H + 40);
  const defs = svg("defs", {}, root);
  const m = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" }, defs);
  svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#e8590c" }, m);
  tracks.forEach((k, i) => { svg("text", { x: 4, y: 20 + i * H + 14 }, root).textContent = names.get(k) || k; });
  const palette = ["#74c0fc", "#b2f2bb", "#ffd8a8", "#d0bfff", "#ffc9c9", "#99e9f2"];
  const cats = [...new Set(spans.map((e) => e.cat))];
  for (const e of spans) {
    const y = 20 + tracks.indexOf(`${e.pid}/${e.tid}`) * H;
    if (e.ph === "X") {
      const r = svg("rect", { class: "slice", x: x(e.ts), y, width: Math.max(x(e.ts + e.dur) - x(e.ts), 1.5), height: H - 8,
        fill: palette[cats.indexOf(e.cat) % palette.length] }, root);
      svg("title", {}, r).textContent = `${e.name} (${e.cat}): ${fmt(e.dur)} µs at ${fmt(e.ts - t0)} µs`;
      const room = x(e.ts + e.dur) - x(e.ts);
      if (room > 40) svg("text", { x: x(e.ts) + 3, y: y + 16 }, root).textContent = e.name.slice(0, Math.floor(room / 6.5));
    } else {
      const l = svg("line", { class: "instant", x1: x(e.ts), x2: x(e.ts), y1: y - 2, y2: y + H - 6, stroke: "#c92a2a", "stroke-width": 2 }, root);
      svg("title", {}, l).textContent = `${e.name} (${e.cat})`;
    }
  }
  const starts = new Map();
  for (const e of events) if (e.ph === "s") starts.set(e.id, e);
  let flows = 0;
  for (const e of events) {
    if (e.ph !== "f" || !starts.has(e.id)) continue;
    const s = starts.get(e.id);
    const ys = 20 + tracks.indexOf(`${s.pid}/${s.tid}`) * H + (H - 8) / 2, yf = 20 + tracks.indexOf(`${e.pid}/${e.tid}`) * H + (H - 8) / 2;
    svg("path", { class: "flow", d: `M${x(s.ts)},${ys} C${x(s.ts) + 20},${ys - 14} ${x(e.ts) - 20},${yf - 14} ${x(e.ts)},${yf}` }, root);
    flows++;
  }
  svg("text", { x: left, y: tracks.length * H + 34 }, root).textContent = `0 … ${fmt(t1 - t0)} µs`;
  $("tl-info").textContent = `${spans.length} events on ${tracks.length} track(s), ${flows} dependencies`;
}

// -- bisection -------------------------------------------------------------------------------
function showBisect() {
  const b = current().bisect, body = $("bisect-body");
  if (!b) { body.innerHTML = "<p>No bisection in this file. Run <code>stitchml debug bisect GRAPH --feed NAME=FILE.npy -o out.capture</code> and open out.capture.</p>"; return; }
  if (!b.op) { body.innerHTML = `<p id="bisect-op">No divergence: ${b.compared} ops compared in ${b.probes} probe(s).</p>`; return; }
  const trail = b.trail.map(([op, bad]) => `<li>${text(op)}: ${bad ? "<span class='bad'>diverges</span>" : "agrees"}</li>`).join("");
  body.innerHTML = `<h3>First divergence: <span id="bisect-op">${text(b.op.name)}</span> (${text(b.op.op)})</h3>
    <table><tr><td>built at</td><td>${text(b.op.location)}</td></tr><tr><td>scope</td><td>${text(b.op.scope || "—")}</td></tr>
    <tr><td>tensor</td><td>${text(b.tensor)}</td></tr><tr><td>max |ours − reference|</td><td>${fmt(b.max_abs_error)}</td></tr>
    <tr><td>probes</td><td id="bisect-probes">${b.probes} (over ${b.compared} compared ops)</td></tr></table>
    <p><button id="bisect-diff">difference map</button> <button id="bisect-locate">show in network</button></p>
    <h4>probes, in order (prefix ending at the op)</h4><ol>${trail}</ol>`;
  $("bisect-diff").addEventListener("click", () => openTensor(b.tensor, true));
  $("bisect-locate").addEventListener("click", () => {
    show("network");
    const op = state.net && state.net.ops.find((o) => o.name === b.op.name);
    if (op) { if (op.kernel) state.collapsed.delete(op.kernel); drawNetwork(); selectOp(op); }
  });
}

// -- start -----------------------------------------------------------------------------------
async function start() {
  const r = await fetch("/api/files");
  state.files = await r.json();
  state.file = state.files[0].path;
  $("file").innerHTML = state.files.map((f) => `<option value="${text(f.path)}">${text(f.path.split("/").pop())} (${f.kind})</option>`).join("");
  $("file").addEventListener("change", async () => { state.file = $("file").value; state.tensor = null; await loadNetwork(); show("network"); });
  document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => show(b.dataset.view)));
  $("expand-all").addEventListener("click", () => { state.collapsed.clear(); drawNetwork(); });
  $("collapse-all").addEventListener("click", () => {
    state.collapsed = new Set([...state.kernels.values()].filter((k) => k.ops.length > 1).map((k) => k.name)); drawNetwork();
  });
  $("show-constants").addEventListener("change", drawNetwork);
  $("tensor-name").addEventListener("change", () => { state.tensor = $("tensor-name").value; state.page = 0; loadTensor(); });
  for (const id of ["layout", "img-n", "img-c", "diff", "colour"]) $(id).addEventListener("change", loadTensor);
  $("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); loadTensor(); });
  $("next").addEventListener("click", () => { state.page = Math.min(state.page + 1, state.pages - 1); loadTensor(); });
  await loadNetwork();
  const view = new URLSearchParams(location.search).get("view");
  if (view) show(view);
  document.body.dataset.ready = "1";
}
start().catch((e) => showError(e.message));
