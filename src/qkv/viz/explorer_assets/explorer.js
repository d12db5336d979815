// The qkv attention explorer. Reads the JSON block #qkv-data; writes user strings with
// textContent only (never innerHTML). Attention is (L, H, T, T) float32, C order.
(function () {
  "use strict";
  const boot = JSON.parse(document.getElementById("qkv-data").textContent);
  const server = boot.server;
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const st = { data: null, A: null, layer: 0, head: 0, hover: null, cell: 1, mx: 0, my: 0 };

  // ---- data ------------------------------------------------------------------------------
  function f32(b64) {  // base64 of little-endian float32 -> Float32Array
    const bin = atob(b64);
    const view = new DataView(new ArrayBuffer(bin.length));
    for (let i = 0; i < bin.length; i++) view.setUint8(i, bin.charCodeAt(i));
    const out = new Float32Array(bin.length / 4);
    for (let k = 0; k < out.length; k++) out[k] = view.getFloat32(4 * k, true);
    return out;
  }
  const w = (l, h, i, j) => { const T = st.data.T; return st.A[((l * st.data.num_heads + h) * T + i) * T + j]; };
  const cur = (i, j) => w(st.layer, st.head, i, j);
  function show(s) {  // make whitespace visible; still plain text
    if (s === "") return "∅";
    return s.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/[\x00-\x08\x0b-\x1f\x7f]/g, "·");
  }
  const short = (s, n) => { const t = show(s); return t.length > n ? t.slice(0, n - 1) + "…" : t; };

  // ---- colour ----------------------------------------------------------------------------
  const BLUES = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  function ramp(stops, x) {
    x = Math.min(1, Math.max(0, x)) * (stops.length - 1);
    const k = Math.min(stops.length - 2, Math.floor(x)), f = x - k, a = stops[k], b = stops[k + 1];
    return [a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])];
  }
  const seq = (x) => ramp(BLUES, x);
  const div = (x) => ramp([[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]], (x + 1) / 2);
  const rgb = (c) => `rgb(${c[0] | 0},${c[1] | 0},${c[2] | 0})`;

  // rows × cols values -> an offscreen canvas of rows × cols pixels
  function bitmap(rows, cols, value, colour) {
    const c = document.createElement("canvas");
    c.width = cols; c.height = rows;
    const ctx = c.getContext("2d"), img = ctx.createImageData(cols, rows);
    for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
      const p = 4 * (i * cols + j), v = colour(value(i, j));
      img.data[p] = v[0]; img.data[p + 1] = v[1]; img.data[p + 2] = v[2]; img.data[p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    return c;
  }
  function sized(canvas, cssW, cssH) {  // crisp on high-DPI screens
    const r = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * r); canvas.height = Math.round(cssH * r);
    canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    ctx.imageSmoothingEnabled = false;
    return ctx;
  }

  // ---- header, tokens, selectors ----------------------------------------------------------
  function header() {
    const d = st.data, m = d.model;
    document.title = d.title;
    $("title").textContent = d.title;
    const parts = [m.kind, `${d.num_layers} layers × ${d.num_heads} heads`];
    if (m.d_model) parts.push(`d_model ${m.d_model}`);
    if (m.positional) parts.push(`positional: ${m.positional}`);
    parts.push(`${d.T} tokens`, m.causal ? "causal (a query sees only earlier keys)" : "bidirectional");
    $("summary").textContent = parts.join(" · ");
  }
  function tokens() {
    const box = $("tokens"); box.replaceChildren();
    st.data.tokens.forEach((s, i) => {
      const t = el("span", "tok", show(s));
      t.title = `#${i}  id ${st.data.ids[i]}  ${JSON.stringify(s)}`;
      t.dataset.index = i;
      box.appendChild(t);
    });
  }
  function options(select, n, word) {
    select.replaceChildren();
    for (let k = 0; k < n; k++) { const o = el("option", null, `${word} ${k}`); o.value = k; select.appendChild(o); }
  }

  // ---- the heatmap ---------------------------------------------------------------------------
  function heatmap() {
    const d = st.data, T = d.T, canvas = $("heatmap");
    const cs = Math.max(2, Math.min(28, Math.floor(520 / T)));
    const labels = cs >= 9;
    let margin = 24;
    const probe = canvas.getContext("2d");
    probe.font = "11px ui-monospace, monospace";
    if (labels) for (const s of d.tokens) margin = Math.max(margin, probe.measureText(short(s, 10)).width + 8);
    const side = T * cs, ctx = sized(canvas, margin + side + 2, margin + side + 2);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, margin + side + 2, margin + side + 2);
    ctx.drawImage(bitmap(T, T, cur, seq), margin, margin, side, side);
    ctx.strokeStyle = "#d0d5dd"; ctx.strokeRect(margin - 0.5, margin - 0.5, side + 1, side + 1);
    ctx.fillStyle = "#344054"; ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle";
    const every = labels ? 1 : Math.ceil(T / 8);
    for (let i = 0; i < T; i += every) {
      const text = labels ? short(d.tokens[i], 10) : String(i), c = margin + i * cs + cs / 2;
      ctx.textAlign = "right"; ctx.fillText(text, margin - 4, c);
      ctx.save(); ctx.translate(c, margin - 4); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
      ctx.fillText(text, 0, 0); ctx.restore();
    }
    Object.assign(st, { cell: cs, mx: margin, my: margin });
    canvas.dataset.layer = st.layer; canvas.dataset.head = st.head;
    legend();
  }
  function legend() {
    const box = $("legend"); box.replaceChildren();
    const c = el("canvas"), ctx = sized(c, 120, 10);
    ctx.drawImage(bitmap(1, 120, (i, j) => j / 119, seq), 0, 0, 120, 10);
    box.append(el("span", null, "0"), c, el("span", null, "1 (weight)"));
  }
  function place(box, i, horizontal) {
    const T = st.data.T, cs = st.cell;
    Object.assign(box.style, horizontal
      ? { left: st.mx - 2 + "px", top: st.my + i * cs - 2 + "px", width: T * cs + 4 + "px", height: cs + 4 + "px" }
      : { left: st.mx + i * cs - 2 + "px", top: st.my - 2 + "px", width: cs + 4 + "px", height: T * cs + 4 + "px" });
    box.hidden = false;
  }
  function onHeatmapMove(ev) {
    const r = $("heatmap").getBoundingClientRect(), T = st.data.T;
    const j = Math.floor((ev.clientX - r.left - st.mx) / st.cell), i = Math.floor((ev.clientY - r.top - st.my) / st.cell);
    const tip = $("tip");
    if (i < 0 || j < 0 || i >= T || j >= T) { tip.hidden = true; setHover(null); return; }
    place($("hm-row"), i, true); place($("hm-col"), j, false);
    $("hm-row").dataset.row = i; $("hm-col").dataset.col = j;
    const d = st.data;
    tip.textContent = `query #${i} ${short(d.tokens[i], 16)}\n → key #${j} ${short(d.tokens[j], 16)}\nweight ${cur(i, j).toFixed(4)}`;
    tip.style.left = ev.clientX - r.left + 14 + "px"; tip.style.top = ev.clientY - r.top + 14 + "px";
    tip.hidden = false;
  }

  // ---- the lines view ------------------------------------------------------------------------
  const ROW = 18, LINES_W = 170;
  function linesColumns() {
    for (const side of ["left", "right"]) {
      const col = $("lines-" + side); col.replaceChildren();
      st.data.tokens.forEach((s, i) => {
        const t = el("div", "ltok", short(s, 12));
        t.dataset.index = i; t.title = `#${i} ${JSON.stringify(s)}`;
        col.appendChild(t);
      });
    }
  }
  function lines() {  // one path per colour and alpha step: T² strokes in ~40 draw calls
    const T = st.data.T, hv = st.hover, ctx = sized($("lines-canvas"), LINES_W, T * ROW);
    const STEPS = 20, paths = new Map();
    const add = (i, j, colour, alpha) => {
      const k = Math.round(Math.min(1, alpha) * STEPS);
      if (k === 0) return;
      const key = colour + k;
      if (!paths.has(key)) paths.set(key, { colour, alpha: k / STEPS, path: new Path2D() });
      const p = paths.get(key).path;
      p.moveTo(2, i * ROW + ROW / 2); p.lineTo(LINES_W - 2, j * ROW + ROW / 2);
    };
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) add(i, j, "#1f5fbf", cur(i, j) * (hv === null ? 0.9 : 0.08));
    if (hv !== null) for (let k = 0; k < T; k++) { add(hv, k, "#1f5fbf", cur(hv, k)); add(k, hv, "#d9730d", cur(k, hv)); }
    ctx.lineWidth = 2;
    for (const { colour, alpha, path } of paths.values()) { ctx.strokeStyle = colour; ctx.globalAlpha = alpha; ctx.stroke(path); }
    ctx.globalAlpha = 1;
  }

  // ---- hover: a token's row (what it attends to) and column (what attends to it) --------------
  function setHover(i) {
    st.hover = i;
    const chips = $("tokens").children;
    for (let j = 0; j < chips.length; j++) {
      const c = chips[j];
      c.classList.toggle("active", j === i);
      c.style.backgroundColor = i === null ? "" : `rgba(31,95,191,${(0.75 * cur(i, j)).toFixed(3)})`;
      c.style.borderBottom = i === null ? "" : `3px solid rgba(217,115,13,${Math.min(1, cur(j, i)).toFixed(3)})`;
    }
    for (const side of ["left", "right"]) {
      const col = $("lines-" + side).children;
      for (let j = 0; j < col.length; j++) col[j].classList.toggle("active", j === i);
    }
    if (i === null) { $("hm-row").hidden = true; $("hm-col").hidden = true; delete $("hm-row").dataset.row; }
    else { place($("hm-row"), i, true); place($("hm-col"), i, false); $("hm-row").dataset.row = i; $("hm-col").dataset.col = i; }
    lines();
  }
  let pending, follow = false;  // hover updates wait for the next frame: a fast mouse crosses many tokens
  function hoverSoon(i, scroll) {
    if (pending === undefined) requestAnimationFrame(() => {
      const k = pending; pending = undefined;
      if (k === st.hover) return;
      setHover(k);
      if (k !== null && follow) {  // bring the token's line into the lines view
        const box = $("lines"), y = k * ROW;
        if (y < box.scrollTop || y + ROW > box.scrollTop + box.clientHeight) box.scrollTop = y - box.clientHeight / 2;
      }
    });
    pending = i; follow = scroll;
  }
  function hoverable(box, scroll) {
    box.addEventListener("mouseover", (ev) => {
      const t = ev.target.closest("[data-index]");
      if (t && box.contains(t)) hoverSoon(Number(t.dataset.index), scroll);
    });
    box.addEventListener("mouseleave", () => hoverSoon(null, false));
  }

  // ---- thumbnails and entropy ------------------------------------------------------------------
  function thumbs() {
    const d = st.data, box = $("thumbs"); box.replaceChildren();
    $("thumbs-layer").textContent = st.layer;
    for (let h = 0; h < d.num_heads; h++) {
      const b = el("button", "thumb" + (h === st.head ? " selected" : ""));
      b.type = "button"; b.dataset.head = h;
      const c = el("canvas"); c.width = d.T; c.height = d.T;
      c.getContext("2d").drawImage(bitmap(d.T, d.T, (i, j) => w(st.layer, h, i, j), seq), 0, 0);
      b.append(c, el("div", null, `head ${h} · H=${d.entropy[st.layer][h].toFixed(2)}`));
      b.addEventListener("click", () => select(st.layer, h));
      box.appendChild(b);
    }
  }
  function entropy() {
    const d = st.data, table = $("entropy"); table.replaceChildren();
    const all = d.entropy.flat(), lo = Math.min(...all), hi = Math.max(...all);
    const head = el("tr"); head.appendChild(el("th"));
    for (let h = 0; h < d.num_heads; h++) head.appendChild(el("th", null, `h${h}`));
    table.appendChild(head);
    for (let l = 0; l < d.num_layers; l++) {
      const tr = el("tr"); tr.appendChild(el("th", null, `layer ${l}`));
      for (let h = 0; h < d.num_heads; h++) {
        const v = d.entropy[l][h], x = hi > lo ? (v - lo) / (hi - lo) : 0.5;
        const td = el("td", l === st.layer && h === st.head ? "selected" : "", v.toFixed(2));
        td.style.backgroundColor = rgb(seq(0.1 + 0.75 * x)); td.style.color = x > 0.55 ? "#fff" : "#1d2330";
        td.title = `layer ${l} head ${h}: ${v.toFixed(3)} bits; uniform over the allowed keys: ${d.entropy_max[l][h].toFixed(3)} bits`;
        td.dataset.layer = l; td.dataset.head = h;
        td.addEventListener("click", () => select(l, h));
        tr.appendChild(td);
      }
      table.appendChild(tr);
    }
    const top = d.entropy_max[0][0];
    $("entropy-note").textContent = `For comparison: attending uniformly to every allowed key would give ${top.toFixed(2)} bits ` +
      `(mean over queries); a head that always picks one key gives 0.`;
  }

  // ---- positional encoding --------------------------------------------------------------------
  function positional() {
    const p = st.data.positional;
    $("pe-kind").textContent = p.kind ? `(${p.kind})` : "";
    if (!p.matrix) { $("pe-note").textContent = p.note || ""; $("pe-views").hidden = true; return; }
    $("pe-note").textContent = p.kind === "sinusoidal"
      ? `Fixed: PE(pos, 2i) = sin(pos / ${p.base}^(2i/d)), PE(pos, 2i+1) = cos(…), added to the token embeddings.`
      : "Learned: one trained vector per position, added to the token embeddings.";
    const M = f32(p.matrix), S = f32(p.similarity), T = p.T, C = p.C;
    let amax = 1e-12; for (const v of M) amax = Math.max(amax, Math.abs(v));
    const px = Math.max(1, Math.min(8, Math.floor(640 / C))), py = Math.max(1, Math.min(8, Math.floor(320 / T)));
    sized($("pe-matrix"), C * px, T * py).drawImage(bitmap(T, C, (i, j) => M[i * C + j] / amax, div), 0, 0, C * px, T * py);
    const ps = Math.max(1, Math.min(8, Math.floor(320 / T)));
    sized($("pe-sim"), T * ps, T * ps).drawImage(bitmap(T, T, (i, j) => S[i * T + j], div), 0, 0, T * ps, T * ps);
    $("pe-views").hidden = false;
  }

  // ---- selection and the whole page ------------------------------------------------------------
  function select(l, h) {
    st.layer = l; st.head = h;
    $("layer").value = l; $("head").value = h;
    const d = st.data;
    $("headinfo").textContent = `entropy ${d.entropy[l][h].toFixed(3)} bits (uniform: ${d.entropy_max[l][h].toFixed(3)})`;
    heatmap(); thumbs(); entropy();
    setHover(st.hover);
  }
  function render(data) {
    st.data = data; st.A = f32(data.attention); st.hover = null;
    $("main").hidden = false; $("empty").hidden = true;
    header(); tokens(); linesColumns();
    options($("layer"), data.num_layers, "layer"); options($("head"), data.num_heads, "head");
    positional();
    select(Math.min(st.layer, data.num_layers - 1), Math.min(st.head, data.num_heads - 1));
  }

  // ---- the text box (served page only) --------------------------------------------------------
  function count() {
    const n = [...$("text").value].length, c = $("count");
    c.textContent = `${n} / ${server.max_chars} characters`;
    c.classList.toggle("over", n > server.max_chars);
  }
  function fail(message) { const e = $("error"); e.textContent = message; e.hidden = false; }
  async function run() {
    $("error").hidden = true; $("busy").hidden = false; $("run").disabled = true;
    try {
      const r = await fetch("api/attention", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ text: $("text").value }),
      });
      let body = null;
      try { body = await r.json(); } catch (e) { body = null; }
      if (!r.ok) fail(`The server refused (HTTP ${r.status}): ${body && body.error ? body.error : r.statusText}`);
      else render(body);
    } catch (e) {
      fail(`Could not reach the server: ${e.message}`);
    } finally {
      $("busy").hidden = true; $("run").disabled = false;
    }
  }

  $("layer").addEventListener("change", (e) => select(Number(e.target.value), st.head));
  $("head").addEventListener("change", (e) => select(st.layer, Number(e.target.value)));
  const hm = $("heatmap");
  hm.addEventListener("mousemove", onHeatmapMove);
  hm.addEventListener("mouseleave", () => { $("tip").hidden = true; setHover(null); });
  hoverable($("tokens"), true); hoverable($("lines-left"), false); hoverable($("lines-right"), false);
  if (server) {
    $("input").hidden = false;
    $("text").value = server.text || "";
    $("text").addEventListener("input", count);
    $("text").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); });
    $("run").addEventListener("click", run);
    count();
  }
  if (boot.data) render(boot.data);
  else {
    const t = (server && server.title) || "qkv explorer";
    document.title = t; $("title").textContent = t;
    $("empty").hidden = false;
  }
})();
