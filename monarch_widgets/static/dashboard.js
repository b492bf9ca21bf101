// Front-end of the monarch dashboard (anywidget ESM). Renders the compact state built by
// monarch_widgets/state.py: one CSS grid per mesh, a proc table, and a detail pane.
const STATES = ["starting", "idle", "busy", "failed", "stopped", "paused"];

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  let x = n;
  for (const u of ["B", "K", "M", "G", "T"]) {
    if (Math.abs(x) < 1024 || u === "T") return u === "B" ? `${x}${u}` : `${x.toFixed(1)}${u}`;
    x /= 1024;
  }
}

function fmtDur(s) {
  s = Math.max(0, s);
  if (s < 60) return `${s.toFixed(1)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}

function gridCols(dims, n) {
  const sizes = dims.length ? dims.map((d) => d[1]) : [n];
  let cols = Math.max(1, sizes[sizes.length - 1]);
  if (sizes.length === 1 && cols > 32) cols = Math.min(32, Math.ceil(Math.sqrt(cols)) * 2);
  return cols;
}

function coords(dims, rank) {
  const out = [];
  let r = rank;
  for (let i = dims.length - 1; i >= 0; i--) {
    out.unshift(`${dims[i][0]}=${r % dims[i][1]}`);
    r = Math.floor(r / dims[i][1]);
  }
  return out.join(", ");
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render({ model, el: root }) {
  const top = el("div", "mw-root");
  const header = el("div", "mw-header");
  const meshesBox = el("div", "mw-meshes");
  const detail = el("div", "mw-detail");
  const procsBox = el("details", "mw-procs");
  procsBox.open = true;
  const notice = el("div", "mw-notice");
  // the timeline tab: a drawing of every live proc mesh's calls and spans, on request
  const timelineBox = el("details", "mw-timeline-tab");
  const timelineSummary = el("summary", "", "timeline");
  const timelineBody = el("div", "mw-timeline-body");
  const timelineBtn = el("button", "mw-btn mw-timeline-refresh", "draw the last 5 minutes");
  timelineBtn.onclick = () => model.send({ action: "timeline" });
  timelineBox.append(timelineSummary, timelineBtn, timelineBody);
  timelineBox.ontoggle = () => { if (timelineBox.open) model.send({ action: "timeline" }); };
  const showTimeline = () => { timelineBody.innerHTML = model.get("timeline") || ""; };
  top.append(header, notice, meshesBox, detail, timelineBox, procsBox);
  root.append(top);

  const meshViews = new Map(); // name -> {box, head, grid, cells, key}
  let selected = null; // {mesh, rank} chosen by click
  let hovered = null;
  const decoder = new TextDecoder();
  const load = () => {
    const v = model.get("payload");
    try { return v ? JSON.parse(typeof v === "string" ? v : decoder.decode(v)) : {}; } catch (e) { return {}; }
  };
  let state = load();
  // the kernel's clock may differ from the browser's: durations count from the kernel's
  // time `t` of the last state, plus the browser time elapsed since it arrived
  let receivedAt = Date.now() / 1000;
  const kernelNow = () => (state.t || receivedAt) + (Date.now() / 1000 - receivedAt);

  function actorRecord(meshName, rank) {
    const m = (state.meshes || []).find((x) => x.name === meshName);
    if (!m) return null;
    const a = m.actors.find((x) => x[0] === rank);
    return a ? { m, a } : null;
  }

  function showDetail() {
    const target = hovered || selected;
    detail.replaceChildren();
    if (!target) {
      detail.append(el("div", "mw-hint", "hover or click an actor for details"));
      return;
    }
    const rec = actorRecord(target.mesh, target.rank);
    if (!rec) return;
    const { m, a } = rec;
    const [rank, code, pi, endpoint, age, handled, errors, ei, ti, queued, wi] = a;
    const since = state.t - age;
    const proc = pi >= 0 ? state.procs[pi] : null;
    const st = STATES[code];
    const now = kernelNow();
    const title = el("div", "mw-detail-title");
    title.append(el("b", "", `${m.name}[${rank}]`), el("span", `mw-badge s-${st}`, st));
    title.append(el("span", "", ` for ${fmtDur(now - since)}`));
    detail.append(title);
    const rows = [
      ["coords", coords(m.dims, rank)],
      ["endpoint", endpoint || "-"],
      ["messages", `${handled} handled, ${errors} errors`],
    ];
    if (st === "busy" || st === "paused") {
      // from the last heartbeat, as runtime.diagnose (%mesh why) reads it
      rows.push(["waits on", wi >= 0 ? state.texts[wi] : "- (runs code)"]);
      rows.push(["queued", `${queued || 0} message(s) behind it`]);
    }
    if (proc) rows.push(["proc", `${proc[0]} on ${proc[1]} pid ${proc[2]}`]);
    const dl = el("div", "mw-kv");
    for (const [k, v] of rows) dl.append(el("span", "mw-k", k), el("span", "mw-v", v));
    detail.append(dl);
    if (ei >= 0) detail.append(el("div", "mw-error", state.texts[ei]));
    if (ti >= 0) detail.append(el("pre", "mw-tb", state.texts[ti]));
    const stacksBtn = el("button", "mw-btn mw-stacks-btn", "stacks (py-spy)");
    stacksBtn.onclick = () => model.send({ action: "stacks", mesh: m.name, rank });
    const nativeBtn = el("button", "mw-btn mw-stacks-native", "with native frames");
    nativeBtn.onclick = () => model.send({ action: "stacks", mesh: m.name, rank, native: true });
    detail.append(stacksBtn, nativeBtn);
    let taken = {};
    try { taken = JSON.parse(model.get("stacks") || "{}"); } catch (e) { taken = {}; }
    if (taken.mesh === m.name && taken.rank === rank) detail.append(el("pre", "mw-tb mw-stacks", taken.text));
    if (st === "paused") {
      const b = el("button", "mw-btn mw-attach", "attach debugger");
      b.onclick = () => model.send({ action: "attach", mesh: m.name, rank });
      detail.append(b);
    }
  }

  function meshView(m) {
    const key = `${m.actors.length}|${JSON.stringify(m.dims)}`;
    let v = meshViews.get(m.name);
    if (v && v.key === key) return v;
    if (v) v.box.remove();
    const box = el("div", "mw-mesh");
    box.dataset.mesh = m.name;
    const head = el("div", "mw-mesh-head");
    const grid = el("div", "mw-grid");
    grid.style.gridTemplateColumns = `repeat(${gridCols(m.dims, m.actors.length)}, var(--mw-cell))`;
    const cells = m.actors.map((a) => {
      const c = el("div", "mw-cell");
      c.dataset.rank = a[0];
      c.dataset.mesh = m.name;
      c.onmouseenter = () => { hovered = { mesh: m.name, rank: a[0] }; showDetail(); };
      c.onmouseleave = () => { hovered = null; showDetail(); };
      c.onclick = () => {
        selected = { mesh: m.name, rank: a[0] };
        for (const x of grid.querySelectorAll(".mw-selected")) x.classList.remove("mw-selected");
        c.classList.add("mw-selected");
        showDetail();
      };
      grid.append(c);
      return c;
    });
    box.append(head, grid);
    v = { box, head, grid, cells, key };
    meshViews.set(m.name, v);
    return v;
  }

  function update() {
    state = load();
    receivedAt = Date.now() / 1000;
    const meshes = state.meshes || [];
    let total = 0;
    const counts = {};
    const seen = new Set();
    for (const m of meshes) {
      seen.add(m.name);
      const v = meshView(m);
      meshesBox.append(v.box); // keeps order; a no-op move when already in place
      v.box.dataset.state = m.state;
      total += m.actors.length;
      for (const [k, n] of Object.entries(m.counts)) counts[k] = (counts[k] || 0) + n;
      v.head.replaceChildren(
        el("b", "", m.name),
        el("span", "mw-dims", ` [${m.dims.map((d) => `${d[0]}=${d[1]}`).join(" \u00d7 ")}] on ${m.proc_mesh} `),
        el("span", `mw-badge s-${m.state}`, m.state),
        el("span", "mw-counts", " " + Object.entries(m.counts).map(([k, n]) => `${n} ${k}`).join(", ")),
      );
      v.box.dataset.keep = m.keep ? String(m.keep) : "";
      if (m.lease) v.head.append(el("span", "mw-lease", " " + m.lease));
      if (m.state !== "stopped") {
        const stop = el("button", "mw-btn mw-stop", "stop mesh");
        stop.onclick = () => {
          if (window.confirm(`Stop mesh ${m.name}?`)) model.send({ action: "stop_mesh", mesh: m.name });
        };
        v.head.append(stop);
      }
      m.actors.forEach((a, i) => {
        const c = v.cells[i];
        const st = STATES[a[1]];
        if (c.dataset.state !== st) {
          c.dataset.state = st;
          c.className = `mw-cell s-${st}` + (selected && selected.mesh === m.name && selected.rank === a[0] ? " mw-selected" : "");
        }
        const waits = a[10] >= 0 ? state.texts[a[10]] : "";
        c.classList.toggle("mw-waiting", Boolean(waits) || a[9] > 0 && st === "busy");
        c.title = `${m.name}[${a[0]}] ${st}` + (a[3] ? `: ${a[3]}` : "") +
          (waits ? `, waits on ${waits}` : "") + (a[9] > 0 ? `, ${a[9]} queued` : "");
      });
    }
    for (const [name, v] of meshViews) {
      if (!seen.has(name)) { v.box.remove(); meshViews.delete(name); }
    }
    header.replaceChildren(el("b", "", "monarch"), el("span", "", ` ${meshes.length} meshes, ${total} actors `));
    if ((state.active || []).length) header.append(el("span", "mw-badge mw-active", `active: ${state.active.join(", ")}`));
    for (const s of STATES) {
      if (counts[s]) header.append(el("span", `mw-badge s-${s}`, `${counts[s]} ${s}`));
    }
    notice.textContent = state.notice || "";
    // proc table (capped so 1,000 procs stay cheap)
    const procs = state.procs || [];
    // a proc's state: the worst of its actors' (failed > paused > busy > starting > idle > stopped)
    const rankOrder = { failed: 5, paused: 4, busy: 3, starting: 2, idle: 1, stopped: 0 };
    const procState = new Map();
    for (const m of meshes) {
      for (const a of m.actors) {
        const st = STATES[a[1]];
        const cur = procState.get(a[2]);
        if (cur === undefined || rankOrder[st] > rankOrder[cur]) procState.set(a[2], st);
      }
    }
    procsBox.replaceChildren(el("summary", "", `${procs.length} procs`));
    const table = el("table", "mw-proc-table");
    const hr = el("tr");
    const engine = procs.some((p) => p.length > 6);  // the tensor engine runs in some proc
    for (const h of ["", "proc", "host", "pid", "CPU", "RSS", "GPU mem", ...(engine ? ["tensors"] : [])]) hr.append(el("th", "", h));
    table.append(hr);
    procs.slice(0, 64).forEach((p, i) => {
      const tr = el("tr");
      tr.dataset.proc = p[0];
      const st = procState.get(i) || "starting";
      tr.dataset.state = st;
      const dot = el("td");
      dot.append(el("span", `mw-dot s-${st}`));
      dot.title = st;
      tr.append(dot);
      const cells = [p[0], p[1], p[2], p[3] === null ? "-" : `${Math.round(p[3])}%`, fmtBytes(p[4]), fmtBytes(p[5])];
      if (engine) cells.push(p.length > 6 ? fmtBytes(p[6]) : "-");
      for (const v of cells) {
        tr.append(el("td", "", String(v)));
      }
      table.append(tr);
    });
    procsBox.append(table);
    if (procs.length > 64) procsBox.append(el("div", "mw-hint", `... and ${procs.length - 64} more`));
    showDetail();
  }

  model.on("change:payload", update);
  model.on("change:timeline", showTimeline);
  model.on("change:stacks", showDetail);
  update();
  showTimeline();
  const timer = setInterval(() => { if (hovered || selected) showDetail(); }, 1000);
  return () => {
    clearInterval(timer);
    model.off("change:payload", update);
    model.off("change:timeline", showTimeline);
    model.off("change:stacks", showDetail);
  };
}

export default { render };
