// zeptograd VIZ page: reads /trace.json (zeptograd/viz/trace.py describes it) and shows kernels, schedules and a
// timeline. The graph layout is layered (ranks by longest path from the leaves, rows ordered by a few barycenter
// sweeps): linear in the graph's size, so a graph of thousands of nodes lays out in well under a second.
"use strict";

const FAMILY = {  // op -> family color
  memory: ["BUFFER", "DEFINE_GLOBAL", "DEFINE_LOCAL", "DEFINE_REG", "LOAD", "STORE", "INDEX", "COPY", "ASSIGN",
    "AFTER", "DEVICE", "CONTIGUOUS"],
  movement: ["RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "VECTORIZE", "GEP", "CAT"],
  loop: ["RANGE", "END", "REDUCE", "REDUCE_AXIS", "SPECIAL", "BARRIER", "IF", "ENDIF"],
  leaf: ["CONST", "VCONST", "DEFINE_VAR", "BIND", "IOTA"],
  sink: ["SINK", "NOOP", "DETACH"],
};
const COLOR = { memory: "#ffd8b5", movement: "#d8f5d0", loop: "#ffe7a3", leaf: "#e6e6e6", sink: "#c8d1ff",
  alu: "#cfe8ff" };
const familyOf = {};
for (const [fam, ops] of Object.entries(FAMILY)) for (const op of ops) familyOf[op] = fam;

const S = { trace: null, view: null, step: 0, hideConsts: false, sort: { key: "time", desc: true } };
S.collapsed = new Set();  // nodes shown without what only they read (double-click one); kept while stepping
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const fmtNum = (n) => (n >= 1e9 ? (n / 1e9).toFixed(2) + "G" : n >= 1e6 ? (n / 1e6).toFixed(2) + "M" :
  n >= 1e4 ? (n / 1e3).toFixed(1) + "k" : String(n));
const fmtBytes = (n) => (n >= 1e6 ? (n / 1e6).toFixed(2) + " MB" : n >= 1e3 ? (n / 1e3).toFixed(1) + " kB" : n + " B");
const fmtTime = (s) => (s >= 1 ? s.toFixed(2) + " s" : s >= 1e-3 ? (s * 1e3).toFixed(2) + " ms" : (s * 1e6).toFixed(1) + " us");
const fmtMs = (ms) => (ms >= 100 ? ms.toFixed(0) : ms.toFixed(1)) + " ms";  // a step's compile time

// ***** graph: reachable nodes, layout, drawing *****

function reachable(nodes, sink) {  // ids reachable from sink, ascending (the table lists sources first)
  const seen = new Set([sink]);
  const stack = [sink];
  while (stack.length) for (const s of nodes[stack.pop()][3]) if (!seen.has(s)) { seen.add(s); stack.push(s); }
  return Array.from(seen).sort((a, b) => a - b);
}

function labelOf(n, hidden) {
  const lines = [hidden ? `${n[0]} +${hidden}` : n[0]];  // +N: the nodes collapsed into it
  const second = [n[1] === "void" ? "" : n[1], n[2]].filter((x) => x).join(" ");
  if (second) lines.push(second.length > 44 ? second.slice(0, 43) + "\u2026" : second);
  if (n[4]) lines.push(n[4].length > 44 ? n[4].slice(0, 43) + "\u2026" : n[4]);
  return lines;
}

function layout(nodes, ids, hidden) {
  const rank = new Map();
  const users = new Map(ids.map((i) => [i, []]));
  let maxRank = 0;
  for (const i of ids) {  // sources have smaller ids: one pass gives the longest path from the leaves
    let r = 0;
    for (const s of nodes[i][3]) if (rank.has(s)) { r = Math.max(r, rank.get(s) + 1); users.get(s).push(i); }
    rank.set(i, r);
    maxRank = Math.max(maxRank, r);
  }
  const rows = Array.from({ length: maxRank + 1 }, () => []);
  for (const i of ids) rows[rank.get(i)].push(i);
  const box = new Map();
  for (const i of ids) {
    const lines = labelOf(nodes[i], hidden.get(i));
    box.set(i, { w: 14 + 6.1 * Math.max(...lines.map((l) => l.length)), h: 8 + 12 * lines.length, lines });
  }
  const pos = new Map();
  const place = () => {  // x of every node from the order of its row, rows centered on 0
    for (const row of rows) {
      let x = 0;
      for (const i of row) { const w = box.get(i).w; pos.set(i, x + w / 2); x += w + 14; }
      const shift = x / 2;
      for (const i of row) pos.set(i, pos.get(i) - shift);
    }
  };
  place();
  const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  for (let sweep = 0; sweep < 4; sweep++) {  // barycenter ordering: users' mean x going up, sources' going down
    const down = sweep % 2 === 1;
    for (let k = 0; k < rows.length; k++) {
      const row = rows[down ? k : rows.length - 1 - k];
      const key = new Map();
      for (const i of row) {
        const nb = (down ? nodes[i][3].filter((s) => pos.has(s)) : users.get(i)).map((j) => pos.get(j));
        key.set(i, nb.length ? mean(nb) : pos.get(i));
      }
      row.sort((a, b) => key.get(a) - key.get(b));
      let x = 0;
      for (const i of row) { const w = box.get(i).w; pos.set(i, x + w / 2); x += w + 14; }
      for (const i of row) pos.set(i, pos.get(i) - x / 2);
    }
  }
  const rowH = 64;
  return { ids, box, x: pos, y: new Map(ids.map((i) => [i, rank.get(i) * rowH])), rank };
}

let zoom = null;
const FAR = 0.35;  // below this zoom the labels are not drawn (unreadable anyway; painting them is most of the cost)
function drawGraph(nodes, sink, opts) {
  const t0 = performance.now();
  const svgEl = $("#graph");
  const size = [svgEl.clientWidth || 800, svgEl.clientHeight || 600];  // read before the graph is in the page
  let ids = reachable(nodes, sink);
  if (S.hideConsts) ids = ids.filter((i) => nodes[i][0] !== "CONST" && nodes[i][0] !== "VCONST");
  const hidden = new Map();  // collapsed node -> how many nodes only it reads
  if (S.collapsed.size) ids = collapse(nodes, sink, ids, hidden);
  const L = layout(nodes, ids, hidden);
  const idset = new Set(ids);
  const parts = [];
  if (opts.groups) {  // a schedule's kernels: a box around each fused group
    for (const [k, members] of opts.groups) {
      const ms = members.filter((i) => idset.has(i));
      if (!ms.length) continue;
      const x0 = Math.min(...ms.map((i) => L.x.get(i) - L.box.get(i).w / 2)) - 8;
      const x1 = Math.max(...ms.map((i) => L.x.get(i) + L.box.get(i).w / 2)) + 8;
      const y0 = Math.min(...ms.map((i) => L.y.get(i))) - 18;
      const y1 = Math.max(...ms.map((i) => L.y.get(i) + L.box.get(i).h)) + 8;
      parts.push(`<rect class="group" x="${x0}" y="${y0}" width="${x1 - x0}" height="${y1 - y0}"></rect>` +
        `<text class="group-label" x="${x0 + 4}" y="${y0 + 12}">${esc(k)}</text>`);
    }
  }
  const edges = [];  // every edge in one path: one element to paint, not thousands
  for (const i of ids) {
    const tx = Math.round(L.x.get(i)), ty = L.y.get(i);
    for (const s of nodes[i][3]) {
      if (!idset.has(s)) continue;
      const sx = Math.round(L.x.get(s)), sy = L.y.get(s) + L.box.get(s).h, my = (sy + ty) / 2;
      edges.push(`M${sx},${sy}C${sx},${my} ${tx},${my} ${tx},${ty}`);
    }
  }
  parts.push(`<path class="edge" d="${edges.join("")}"></path>`);
  for (const i of ids) {
    const n = nodes[i], b = L.box.get(i);
    let cls = "node";
    if (opts.changed && opts.changed.has(i)) cls += " changed";
    if (opts.realized && opts.realized.has(i)) cls += " realized";
    if (hidden.has(i)) cls += " collapsed";
    const x = Math.round(L.x.get(i) - b.w / 2), y = L.y.get(i);
    let g = `<g class="${cls}" data-id="${i}" data-op="${n[0]}" transform="translate(${x},${y})">` +
      `<rect width="${Math.round(b.w)}" height="${b.h}" fill="${COLOR[familyOf[n[0]] || "alu"]}"></rect>`;
    b.lines.forEach((l, k) => { g += `<text${k === 0 ? ' class="op"' : ""} x="7" y="${16 + 12 * k}">${esc(l)}</text>`; });
    parts.push(g + "</g>");
  }
  S.drawn = { nodes, opts };
  const fit = fitTransform(L, size);
  svgEl.classList.toggle("far", fit.k < FAR);  // before the nodes go in: hidden labels cost no text layout
  const svg = d3.select(svgEl);
  svgEl.replaceChildren();  // at once: d3's selectAll("*").remove() takes each of thousands of nodes out one by one
  const root = svg.append("g").attr("id", "graph-root").attr("transform", fit);
  root.node().innerHTML = parts.join("");
  zoom = d3.zoom().extent([[0, 0], size]).scaleExtent([0.005, 4]).on("zoom", (e) => {
    root.attr("transform", e.transform);
    svgEl.classList.toggle("far", e.transform.k < FAR);
  });
  svg.call(zoom).on("dblclick.zoom", null);  // a double-click collapses a node (below), it does not zoom
  svg.property("__zoom", fit);  // d3-zoom's state: the next gesture starts from the fitted view
  const ms = performance.now() - t0;
  svg.attr("data-nodes", ids.length).attr("data-render-ms", ms.toFixed(1));
  applySearch();
  return ms;
}

function collapse(nodes, sink, ids, hidden) {
  // the nodes still shown: reachable from the sink without going below a collapsed node. What a collapsed node
  // reads that something else shown also reads stays (a shared RANGE or buffer); the rest is counted into it.
  const shown = new Set(ids);
  const seen = new Set([sink]), stack = [sink];
  while (stack.length) {
    const i = stack.pop();
    if (S.collapsed.has(i)) continue;
    for (const s of nodes[i][3]) if (shown.has(s) && !seen.has(s)) { seen.add(s); stack.push(s); }
  }
  for (const c of S.collapsed) {
    if (!seen.has(c)) continue;
    const n = reachable(nodes, c).filter((i) => shown.has(i) && !seen.has(i)).length;
    if (n) hidden.set(c, n);
  }
  return ids.filter((i) => seen.has(i));
}

function toggleCollapse(e) {  // double-click a node: what only it reads folds into it; again: unfolds
  const g = e.target.closest && e.target.closest("g.node");
  if (!g || !S.drawn) return;
  const i = +g.dataset.id;
  if (S.collapsed.has(i)) S.collapsed.delete(i);
  else S.collapsed.add(i);
  selectStep(S.step);
}

function fitTransform(L, [w, h]) {
  let x0 = Infinity, x1 = -Infinity, y1 = 0;
  for (const i of L.ids) {
    x0 = Math.min(x0, L.x.get(i) - L.box.get(i).w / 2); x1 = Math.max(x1, L.x.get(i) + L.box.get(i).w / 2);
    y1 = Math.max(y1, L.y.get(i) + L.box.get(i).h);
  }
  if (!L.ids.length) return d3.zoomIdentity;
  // the whole width at most 1:1; the whole height too where that keeps labels readable (else pan down)
  const kw = Math.min(1, (w - 40) / (x1 - x0 + 1));
  const k = Math.max(Math.min(kw, (h - 40) / (y1 + 21)), Math.min(kw, 0.5));
  return d3.zoomIdentity.translate(w / 2 - (k * (x0 + x1)) / 2, 30).scale(k);  // centered, top first
}

function nodeText(n) {  // what search and the tooltip read: op, dtype, arg, shape
  return [n[0], n[1], n[2], n[4] || ""].filter((x) => x).join(" ");
}

function applySearch() {
  const q = $("#search").value.trim().toLowerCase();
  let found = 0;
  for (const g of document.querySelectorAll("#graph g.node")) {
    const hit = q !== "" && nodeText(S.drawn.nodes[+g.dataset.id]).toLowerCase().includes(q);
    g.classList.toggle("found", hit);
    found += hit;
  }
  $("#found").textContent = q ? `${found} found` : "";
}

function showTip(e) {  // one tooltip for every node (a <title> per node doubles what the page holds)
  const g = e.target.closest && e.target.closest("g.node");
  const tip = $("#tip");
  if (!g || !S.drawn) { tip.style.display = "none"; return; }
  const i = +g.dataset.id, o = S.drawn.opts;
  const lines = [`#${i} ${nodeText(S.drawn.nodes[i])}`];
  if (o.made && o.made[i]) lines.push("made by " + o.made[i] + (S.trace.rules[o.made[i]] ? ": " + S.trace.rules[o.made[i]] : ""));
  else if (o.changed && o.changed.has(i)) lines.push("new in this step (rebuilt over a changed source)");
  if (o.realized && o.realized.has(i)) lines.push("stored: " + o.realized.get(i));
  if (o.decisions && o.decisions.has(i)) {
    for (const d of o.decisions.get(i)) lines.push(`${d.keep ? "keep" : "inline"} (${d.stage}): ${d.rule}`);
  }
  const folded = S.collapsed.has(i);
  lines.push(folded ? "double-click: unfold what it reads" : "double-click: collapse what only it reads into it");
  tip.textContent = lines.join("\n");
  tip.style.display = "block";
  tip.style.left = e.clientX + 12 + "px";
  tip.style.top = e.clientY + 12 + "px";
}

// ***** views *****

function showKernel(k, step) {
  S.view = { kind: "kernel", k };
  S.collapsed.clear();
  document.body.classList.remove("timeline");
  const steps = k.steps;
  $("#title").textContent = k.name || "(not compiled)";
  const gflops = k.time_s ? (k.n_ops * k.runs / k.time_s * 1e-9).toFixed(2) : "-";
  const gbs = k.time_s ? (k.bytes / k.time_s * 1e-9).toFixed(2) : "-";
  $("#facts").textContent = `${k.device} \u00b7 ${k.kind} \u00b7 ${k.runs} runs \u00b7 ${fmtTime(k.time_s)} \u00b7 ` +
    `${gflops} GFLOPS \u00b7 ${gbs} GB/s \u00b7 opts: ${k.opts.length ? k.opts.join(", ") : "none"}`;
  const code = $("#source code");
  code.textContent = k.src || "(no source: a copy, or compiled before VIZ was on)";
  if (k.kind === "jit") {  // its kernels' runs are counted with them: its own time is what the replay adds
    code.textContent = "a TinyJit replay runs these captured kernels, in order (their runs and times are counted" +
      " with each kernel; the replay's time is its own, and that of kernels compiled before recording):\n" + k.src;
  }
  code.className = k.src.startsWith("; ") || k.src.includes("define ") ? "language-llvm" : "language-c";
  delete code.dataset.highlighted;
  // highlighted after the graph is drawn: highlight.js takes a second over a large kernel's 25 KB of LLVM IR
  if (k.src) setTimeout(() => { if (code.textContent === k.src) hljs.highlightElement(code); }, 0);
  $("#details").innerHTML = k.beam ? beamTable(k.beam) : "";
  setSteps(steps, step === undefined ? steps.length - 1 : step);
  markSelected();
}

function beamTable(b) {  // BEAM's candidates: actions, time, against the unoptimized kernel; the winner marked
  const head = `BEAM=${b.width}: `;
  if (b.cached) {
    return `<div class="summary beam-summary">${head}the choice came from the disk cache (no candidate timed this run):` +
      ` ${esc(b.chosen.join(", ") || "no actions")}</div>`;
  }
  const rounds = Math.max(0, ...b.candidates.map((c) => c[0]));
  const vs = (t) => (t && b.baseline_s ? (b.baseline_s / t).toFixed(2) + "x" : "-");
  const t = (s) => (s === null ? "-" : fmtTime(s));
  const summary = `${head}${b.candidates.length} candidates in ${rounds + 1} rounds · unoptimized ${t(b.baseline_s)}` +
    ` · heuristic ${t(b.heuristic_s)} · chosen ${t(b.best_s)} (${vs(b.best_s)} the unoptimized):` +
    ` ${esc(b.chosen.join(", ") || "no actions")}`;
  const order = b.candidates.map((c, i) => i).sort((i, j) => {
    const a = b.candidates[i], c = b.candidates[j];
    return a[0] - c[0] || (a[2] === null) - (c[2] === null) || (a[2] || 0) - (c[2] || 0);
  });
  const heur = JSON.stringify(b.heuristic);
  const rows = order.map((i) => {
    const [round, opts, secs, why] = b.candidates[i];
    const base = round === 0 ? (opts.length === 0 ? "unoptimized" : JSON.stringify(opts) === heur ? "heuristic" : "") : "";
    const note = [i === b.won ? "chosen" : "", base, why].filter((x) => x).join(", ");
    const cls = i === b.won ? "beam-row won" : secs === null || why ? "beam-row dropped" : "beam-row";
    return `<tr class="${cls}" data-i="${i}"><td class="num">${round}</td><td>${esc(opts.join(", ") || "(none)")}</td>` +
      `<td class="num">${t(secs)}</td><td class="num">${why ? "-" : vs(secs)}</td><td>${esc(note)}</td></tr>`;
  }).join("");
  return `<div class="summary beam-summary">${summary}</div><table class="beam"><tr><th>round</th><th>actions</th>` +
    `<th>time</th><th>speedup</th><th></th></tr>${rows}</table>`;
}

function decisionTable(s) {  // the scheduler's keep-or-inline decisions, with the cost model's estimates
  if (!s.decisions || !s.decisions.length) return "";
  const rows = s.decisions.map((d, i) => {
    const n = s.nodes[d.node], c = d.cost || {};
    const num = (v, f) => `<td class="num">${v === undefined ? "" : f(v)}</td>`;
    return `<tr class="decision-row ${d.keep ? "keep" : "inline"}" data-node="${d.node}" data-i="${i}">` +
      `<td>#${d.node} ${esc(n[0])} ${esc(n[4] || "")}</td><td class="decision">${d.keep ? "keep" : "inline"}</td>` +
      `<td class="stage">${esc(d.stage)}</td><td>${esc(d.rule)}</td>${num(c.inline, fmtNum)}${num(c.keep, fmtNum)}` +
      `${num(c.inline_bytes, fmtBytes)}${num(c.keep_bytes, fmtBytes)}</tr>`;
  }).join("");
  const kept = s.decisions.filter((d) => d.keep).length;
  return `<div class="summary">${s.decisions.length} decisions of the scheduler (${kept} keep a buffer); the cost` +
    ` model's estimates in its units (rough cycles) and bytes of memory traffic, inlined against kept.` +
    ` <label><input type="checkbox" id="only-keeps"> only the keeps</label></div>` +
    `<table class="decisions"><tr><th>node</th><th>decision</th><th>stage</th><th>rule</th><th>inline cost</th>` +
    `<th>keep cost</th><th>inline bytes</th><th>keep bytes</th></tr>${rows}</table>`;
}

function pickNode(id) {  // a decision's node: marked in the graph and brought to the middle of the view
  let g = document.querySelector(`#graph g.node[data-id="${id}"]`);
  const steps = S.view && S.view.kind === "schedule" ? S.view.s.steps : null;
  if (!g && steps) {  // decided on the tensor graph after the scheduler's own rewrites: the last step that has it
    const at = steps.findLastIndex((st) => reachable(S.view.s.nodes, st.after).includes(id));
    if (at >= 0 && at !== S.step) {
      selectStep(at);
      g = document.querySelector(`#graph g.node[data-id="${id}"]`);
    }
  }
  for (const p of document.querySelectorAll("#graph g.node.picked")) p.classList.remove("picked");
  if (!g) return false;
  g.classList.add("picked");
  const m = /translate\(([-\d.]+),([-\d.]+)\)/.exec(g.getAttribute("transform"));
  const box = g.querySelector("rect");
  if (m && zoom) d3.select("#graph").call(zoom.translateTo, +m[1] + box.width.baseVal.value / 2, +m[2] + 15);
  return true;
}

function showSchedule(s, step) {
  S.view = { kind: "schedule", s };
  S.collapsed.clear();
  document.body.classList.remove("timeline");
  const kernels = S.trace.kernels;
  $("#title").textContent = `schedule ${s.id}`;
  $("#facts").textContent = `${s.nodes.length} tensor-graph nodes \u00b7 ${s.realized.length} realized`;
  $("#source code").textContent = s.realized.map((r) => {
    const n = s.nodes[r.node];
    return `${n[0]} ${n[4] || ""} -> ${r.kernel === null ? "(no kernel)" : kernels[r.kernel].name}: ${r.why}`;
  }).join("\n");
  $("#source code").className = "";
  $("#details").innerHTML = decisionTable(s);
  for (const tr of document.querySelectorAll("#details tr.decision-row")) tr.onclick = () => pickNode(+tr.dataset.node);
  const only = $("#only-keeps");  // most inlines are index arithmetic or cheap elementwise ops: the keeps stand out
  if (only) only.onchange = () => $("#details table.decisions").classList.toggle("only-keeps", only.checked);
  setSteps(s.steps, step === undefined ? 0 : step);
  markSelected();
}

function groupsOf(s) {  // kernel label -> the nodes below each realized node down to the next realized ones
  const realized = new Map(s.realized.map((r) => [r.node, r]));
  const groups = new Map();
  for (const r of s.realized) {
    const name = r.kernel === null ? "(no kernel)" : `${S.trace.kernels[r.kernel].name} #${r.kernel}`;
    const members = groups.get(name) || [];
    const stack = [r.node], seen = new Set(members);
    while (stack.length) {
      const i = stack.pop();
      if (seen.has(i)) continue;
      seen.add(i); members.push(i);
      for (const src of s.nodes[i][3]) if (!realized.has(src) && s.nodes[src][0] !== "BUFFER") stack.push(src);
    }
    groups.set(name, members);
  }
  return groups;
}

function setSteps(steps, current) {
  if (!steps.length) {  // a copy or a TinyJit replay: no graph, nothing was compiled
    $("#steps").innerHTML = "";
    $("#step-slider").max = 0;
    $("#step-label").textContent = "no graph: nothing was compiled";
    $("#rules").innerHTML = "";
    $("#graph").replaceChildren();
    S.drawn = null;
    return;
  }
  const ol = $("#steps");
  ol.innerHTML = steps.map((st, i) => {  // a named pass's own rewrites (optimize's) indented under it
    const same = st.before !== null && st.before === st.after;
    const cls = `step${same ? " same" : ""}${st.kind ? " " + st.kind : ""}`;
    const title = [st.about, st.where].filter((x) => x).join(" \u00b7 ");
    // the time first: floated right, it stays on the name's first line
    const ms = st.ms !== undefined && st.kind !== "code" ? `<span class="ms">${fmtMs(st.ms)}</span>` : "";
    return `<li class="${cls}" data-i="${i}" style="margin-left:${14 * (st.depth || 0)}px" title="${esc(title)}">` +
      `${ms}${esc(st.name)}${st.rules.length ? " (" + st.rules.reduce((a, r) => a + r[1], 0) + ")" : ""}</li>`;
  }).join("");
  for (const li of ol.children) li.onclick = () => selectStep(+li.dataset.i);
  const slider = $("#step-slider");
  slider.max = steps.length - 1;
  selectStep(current);
}

function selectStep(i) {
  const v = S.view;
  const rec = v.kind === "kernel" ? v.k : v.s;
  const st = rec.steps[i];
  S.step = i;
  $("#step-slider").value = i;
  $("#step-label").textContent = `step ${i} / ${rec.steps.length - 1}: ${st.name}`;
  for (const li of $("#steps").children) li.classList.toggle("current", +li.dataset.i === i);
  const changed = new Set();
  if (st.before !== null) {
    const before = new Set(reachable(rec.nodes, st.before));
    for (const id of reachable(rec.nodes, st.after)) if (!before.has(id)) changed.add(id);
  }
  const opts = { changed, made: st.made || {} };
  if (v.kind === "schedule") {
    opts.realized = new Map(rec.realized.map((r) => [r.node, r.why]));
    opts.groups = groupsOf(rec);
    opts.decisions = new Map();
    for (const d of rec.decisions || []) opts.decisions.set(d.node, [...(opts.decisions.get(d.node) || []), d]);
  }
  drawGraph(rec.nodes, st.after, opts);
  const rules = st.rules.map((r) => `<div title="${esc(S.trace.rules[r[0]] || "")}">${esc(r[0])} \u00d7${r[1]}` +
    ` <span style="color:#57606a">${r[2]} ms</span></div>`);
  const about = st.kind === "pass" || st.kind === "code"  // a pass that is not one graph_rewrite: what it does
    ? `<div class="about"><b>${esc(st.name)}</b>: ${esc(st.about || "not a graph_rewrite: " + st.where)}` +
      `${st.kind === "pass" ? ` <span style="color:#57606a">${fmtMs(st.ms)} \u00b7 ${esc(st.where)}</span>` : ""}` +
      ` \u00b7 ${changed.size} nodes new</div>`
    : "";
  $("#rules").innerHTML = about + (rules.length ? `<b>rules that fired</b>${rules.join("")}` : "");
  // a link to this view (no history entry per step)
  history.replaceState(null, "", "#" + (v.kind === "kernel" ? `kernel=${v.k.id}&step=${i}` : `schedule=${v.s.id}&step=${i}`));
}

function markSelected() {
  const v = S.view;
  for (const tr of document.querySelectorAll("#list tr.row")) {
    tr.classList.toggle("selected", v !== null && ((v.kind === "kernel" && tr.dataset.kernel === String(v.k.id)) ||
      (v.kind === "schedule" && tr.dataset.schedule === String(v.s.id))));
  }
}

function listKernels() {
  const ks = S.trace.kernels.slice();
  const total = ks.reduce((a, k) => a + k.time_s, 0) || 1;
  const keyOf = { name: (k) => k.name, runs: (k) => k.runs, time: (k) => k.time_s, id: (k) => k.id };
  const key = keyOf[S.sort.key];
  ks.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (S.sort.desc ? -1 : 1));
  const head = [["id", "#"], ["name", "kernel"], ["runs", "runs"], ["time", "time"]].map(([k, t]) =>
    `<th data-sort="${k}">${t}${S.sort.key === k ? (S.sort.desc ? " \u25be" : " \u25b4") : ""}</th>`).join("");
  $("#list").innerHTML = `<table><tr>${head}<th>share</th></tr>` + ks.map((k) => {
    const share = k.time_s / total;
    return `<tr class="row kernel-row" data-kernel="${k.id}" data-name="${esc(k.name)}"><td class="num">${k.id}</td>` +
      `<td>${esc(k.name || "?")}${k.kind === "copy" ? " (copy)" : ""}</td><td class="num">${k.runs}</td>` +
      `<td class="num">${fmtTime(k.time_s)}</td><td><span class="share" style="width:${Math.round(share * 60)}px">` +
      `</span>${(share * 100).toFixed(1)}%</td></tr>`;
  }).join("") + "</table>";
  for (const th of document.querySelectorAll("#list th[data-sort]")) {
    th.onclick = () => {
      S.sort = { key: th.dataset.sort, desc: S.sort.key === th.dataset.sort ? !S.sort.desc : th.dataset.sort !== "name" };
      listKernels();
    };
  }
  for (const tr of document.querySelectorAll("#list tr.row")) tr.onclick = () => showKernel(S.trace.kernels[+tr.dataset.kernel]);
  markSelected();
}

function listSchedules() {
  $("#list").innerHTML = "<table><tr><th>#</th><th>schedule</th><th>kernels</th></tr>" + S.trace.schedules.map((s) => {
    const names = [...new Set(s.realized.filter((r) => r.kernel !== null).map((r) => S.trace.kernels[r.kernel].name))];
    return `<tr class="row schedule-row" data-schedule="${s.id}"><td class="num">${s.id}</td><td>${s.nodes.length} nodes</td>` +
      `<td>${esc(names.join(" ").slice(0, 60))}</td></tr>`;
  }).join("") + "</table>";
  for (const tr of document.querySelectorAll("#list tr.row")) tr.onclick = () => showSchedule(S.trace.schedules[+tr.dataset.schedule]);
  markSelected();
}

function showTimeline() {
  document.body.classList.add("timeline");
  const runs = S.trace.runs, kernels = S.trace.kernels;
  const el = $("#timeline");
  if (!runs.length) { el.textContent = "no kernel ran"; return; }
  const end = Math.max(...runs.map((r) => r[1] + r[2]));
  const lanes = [...new Set(runs.map((r) => r[0]))];
  const laneOf = new Map(lanes.map((k, i) => [k, i]));
  const W = Math.max(800, el.clientWidth - 20), laneH = 16, left = 180;
  const x = d3.scaleLinear().domain([0, end]).range([left, W - 10]);
  const color = d3.scaleOrdinal(d3.schemeTableau10);
  const svg = d3.create("svg").attr("width", W).attr("height", lanes.length * laneH + 40);
  svg.append("g").attr("transform", `translate(0,${lanes.length * laneH + 4})`).call(d3.axisBottom(x).ticks(8).tickFormat((s) => fmtTime(s)));
  svg.append("g").selectAll("text").data(lanes).join("text").attr("x", 4).attr("y", (k, i) => i * laneH + 12)
    .style("font", "11px ui-monospace, monospace").text((k) => `${kernels[k].name} #${k}`);
  svg.append("g").selectAll("rect").data(runs).join("rect").attr("class", "run")
    .attr("x", (r) => x(r[1])).attr("width", (r) => Math.max(1, x(r[1] + r[2]) - x(r[1])))
    .attr("y", (r) => laneOf.get(r[0]) * laneH + 2).attr("height", laneH - 4).attr("fill", (r) => color(r[0] % 10))
    .append("title").text((r) => `${kernels[r[0]].name}: ${fmtTime(r[2])}, ${r[3]} bytes, ` +
      `${r[2] ? (r[3] / r[2] * 1e-9).toFixed(2) : "-"} GB/s`);
  el.innerHTML = `<div>${runs.length} runs in ${fmtTime(end)} (kernels ${kernels.filter((k) => k.kind === "kernel").length},` +
    ` copies ${kernels.filter((k) => k.kind === "copy").length}; a TinyJit replay: a bar over its kernels' runs)</div>`;
  el.appendChild(svg.node());
}

function setTab(tab) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
  if (tab === "kernels") listKernels();
  else if (tab === "schedules") listSchedules();
  else { listKernels(); showTimeline(); }
}

async function main() {
  const resp = await fetch("/trace.json");
  S.trace = await resp.json();
  $("#program").textContent = S.trace.program.join(" ");
  for (const b of document.querySelectorAll("#tabs button")) b.onclick = () => setTab(b.dataset.tab);
  $("#step-slider").oninput = (e) => selectStep(+e.target.value);
  $("#hide-consts").onchange = (e) => { S.hideConsts = e.target.checked; if (S.view && S.drawn) selectStep(S.step); };
  $("#search").oninput = applySearch;
  $("#graph").addEventListener("mousemove", showTip);
  $("#graph").addEventListener("dblclick", toggleCollapse);
  $("#graph").addEventListener("mouseleave", () => { $("#tip").style.display = "none"; });
  document.addEventListener("keydown", (e) => {  // arrow keys step through the rewrites
    if (!S.view || e.target.tagName === "INPUT" || !S.drawn) return;
    const n = (S.view.kind === "kernel" ? S.view.k : S.view.s).steps.length;
    if (e.key === "ArrowRight" || e.key === "ArrowDown") selectStep(Math.min(n - 1, S.step + 1));
    if (e.key === "ArrowLeft" || e.key === "ArrowUp") selectStep(Math.max(0, S.step - 1));
  });
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.has("schedule")) { setTab("schedules"); showSchedule(S.trace.schedules[+hash.get("schedule")], +hash.get("step")); }
  else {
    setTab("kernels");
    if (hash.has("kernel")) showKernel(S.trace.kernels[+hash.get("kernel")], +hash.get("step"));
  }
  document.body.dataset.ready = "1";
}

main();
