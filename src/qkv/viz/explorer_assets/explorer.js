// The qkv attention explorer. Reads the JSON block #qkv-data; writes user strings with
// textContent only (never innerHTML). A view is (L, H, rows, cols) float32, C order: rows are the
// queries (attend from), columns the keys (attend to). A GPT or Encoder page has one square view
// (flat fields in its data); an encoder-decoder page has three: encoder, decoder, cross (target × source).
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
  // hover: null or {q, k} (a query row and/or a key column; in a square view of one token list, q === k)
  const st = { data: null, views: [], v: null, layer: 0, head: 0, hover: null, cell: 1, mx: 0, my: 0 };

  // ---- data ------------------------------------------------------------------------------
  function f32(b64) {  // base64 of little-endian float32 -> Float32Array
    const bin = atob(b64);
    const view = new DataView(new ArrayBuffer(bin.length));
    for (let i = 0; i < bin.length; i++) view.setUint8(i, bin.charCodeAt(i));
    const out = new Float32Array(bin.length / 4);
    for (let k = 0; k < out.length; k++) out[k] = view.getFloat32(4 * k, true);
    return out;
  }
  function viewsOf(d) {  // a GPT / Encoder page: its flat fields as the one view
    if (d.views) return d.views;
    return [{ name: "self", title: "self-attention", caption: "", same: true, queries: d.tokens, keys: d.tokens,
      query_ids: d.ids, key_ids: d.ids, num_layers: d.num_layers, num_heads: d.num_heads, rows: d.T, cols: d.T,
      attention: d.attention, entropy: d.entropy, entropy_max: d.entropy_max, causal: d.model.causal }];
  }
  const w = (l, h, i, j) => { const v = st.v; return v.A[((l * v.num_heads + h) * v.rows + i) * v.cols + j]; };
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
    const d = st.data, m = d.model, v0 = st.views[0];
    document.title = d.title;
    $("title").textContent = d.title;
    const seq2seq = st.views.length > 1;
    const parts = [m.kind, seq2seq ? `encoder ${m.layers[0]} + decoder ${m.layers[1]} layers × ${v0.num_heads} heads`
      : `${d.num_layers} layers × ${d.num_heads} heads`];
    if (m.d_model) parts.push(`d_model ${m.d_model}`);
    if (m.positional) parts.push(`positional: ${m.positional}`);
    if (seq2seq) parts.push(`${v0.rows} source tokens → ${st.views[1].rows} target tokens (START first)`);
    else parts.push(`${d.T} tokens`, m.causal ? "causal (a query sees only earlier keys)" : "bidirectional");
    $("summary").textContent = parts.join(" · ");
    const box = $("translation"); box.replaceChildren();
    for (const [what, text] of [["source", d.text], ["translation", d.translation]]) {
      if (text) box.append(el("span", "what", what), el("span", "text", text));
    }
    box.hidden = box.children.length === 0;
  }
  function chips(box, labels, ids) {
    box.replaceChildren();
    labels.forEach((s, i) => {
      const t = el("span", "tok", show(s));
      t.title = `#${i}  id ${ids[i]}  ${JSON.stringify(s)}`;
      t.dataset.index = i;
      box.appendChild(t);
    });
  }
  function tokens() {
    const v = st.v, named = Boolean(v.query_side);
    chips($("tokens"), v.queries, v.query_ids);
    $("tokens-label").hidden = !named;
    $("tokens-label").textContent = named ? `${v.query_side} tokens${v.same ? "" : " — queries, the rows"}` : "";
    $("keys-block").hidden = v.same;
    if (!v.same) {
      chips($("key-tokens"), v.keys, v.key_ids);
      $("key-tokens-label").textContent = `${v.key_side} tokens — keys, the columns`;
    }
    $("tokens-hint").textContent = v.same ? "hover one: what it attends to (blue) and what attends to it (orange)"
      : `hover a ${v.query_side} token: the ${v.key_side} tokens it attends to (blue); ` +
        `hover a ${v.key_side} token: the ${v.query_side} tokens attending to it (orange)`;
  }
  function options(select, n, word) {
    select.replaceChildren();
    for (let k = 0; k < n; k++) { const o = el("option", null, `${word} ${k}`); o.value = k; select.appendChild(o); }
  }
  function viewOptions() {
    const select = $("view"); select.replaceChildren();
    st.views.forEach((v, k) => {
      const o = el("option", null, `${v.title} (${v.rows} × ${v.cols})`); o.value = k; select.appendChild(o);
    });
    $("view-pick").hidden = st.views.length < 2;
  }

  // ---- the heatmap ---------------------------------------------------------------------------
  function labelMargin(ctx, labels, show) {
    let margin = 24;
    if (show) for (const s of labels) margin = Math.max(margin, ctx.measureText(short(s, 10)).width + 8);
    return margin;
  }
  function heatmap() {
    const v = st.v, R = v.rows, C = v.cols, canvas = $("heatmap");
    const cs = Math.max(2, Math.min(28, Math.floor(520 / Math.max(R, C))));
    const labels = cs >= 9;
    const probe = canvas.getContext("2d");
    probe.font = "11px ui-monospace, monospace";
    const mx = labelMargin(probe, v.queries, labels), my = labelMargin(probe, v.keys, labels);
    const W = mx + C * cs + 2, H = my + R * cs + 2, ctx = sized(canvas, W, H);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.drawImage(bitmap(R, C, cur, seq), mx, my, C * cs, R * cs);
    ctx.strokeStyle = "#d0d5dd"; ctx.strokeRect(mx - 0.5, my - 0.5, C * cs + 1, R * cs + 1);
    ctx.fillStyle = "#344054"; ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle";
    const text = (list, i) => labels ? short(list[i], 10) : String(i);
    ctx.textAlign = "right";
    for (let i = 0; i < R; i += labels ? 1 : Math.ceil(R / 8)) ctx.fillText(text(v.queries, i), mx - 4, my + i * cs + cs / 2);
    for (let j = 0; j < C; j += labels ? 1 : Math.ceil(C / 8)) {
      ctx.save(); ctx.translate(mx + j * cs + cs / 2, my - 4); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
      ctx.fillText(text(v.keys, j), 0, 0); ctx.restore();
    }
    Object.assign(st, { cell: cs, mx, my });
    Object.assign(canvas.dataset, { layer: st.layer, head: st.head, view: v.name, rows: R, cols: C });
    legend();
  }
  function legend() {
    const box = $("legend"); box.replaceChildren();
    const c = el("canvas"), ctx = sized(c, 120, 10);
    ctx.drawImage(bitmap(1, 120, (i, j) => j / 119, seq), 0, 0, 120, 10);
    box.append(el("span", null, "0"), c, el("span", null, "1 (weight)"));
  }
  function place(box, i, horizontal) {  // outline row i (horizontal) or column i of the heatmap
    const v = st.v, cs = st.cell;
    Object.assign(box.style, horizontal
      ? { left: st.mx - 2 + "px", top: st.my + i * cs - 2 + "px", width: v.cols * cs + 4 + "px", height: cs + 4 + "px" }
      : { left: st.mx + i * cs - 2 + "px", top: st.my - 2 + "px", width: cs + 4 + "px", height: v.rows * cs + 4 + "px" });
    box.hidden = false;
  }
  function onHeatmapMove(ev) {
    const r = $("heatmap").getBoundingClientRect(), v = st.v;
    const j = Math.floor((ev.clientX - r.left - st.mx) / st.cell), i = Math.floor((ev.clientY - r.top - st.my) / st.cell);
    const tip = $("tip");
    if (i < 0 || j < 0 || i >= v.rows || j >= v.cols) { tip.hidden = true; setHover(null); return; }
    place($("hm-row"), i, true); place($("hm-col"), j, false);
    $("hm-row").dataset.row = i; $("hm-col").dataset.col = j;
    tip.textContent = `query #${i} ${short(v.queries[i], 16)}\n → key #${j} ${short(v.keys[j], 16)}\nweight ${cur(i, j).toFixed(4)}`;
    tip.style.left = ev.clientX - r.left + 14 + "px"; tip.style.top = ev.clientY - r.top + 14 + "px";
    tip.hidden = false;
  }

  // ---- the lines view ------------------------------------------------------------------------
  const ROW = 18, LINES_W = 170;
  function linesColumns() {
    for (const [side, labels] of [["left", st.v.queries], ["right", st.v.keys]]) {
      const col = $("lines-" + side); col.replaceChildren();
      labels.forEach((s, i) => {
        const t = el("div", "ltok", short(s, 12));
        t.dataset.index = i; t.title = `#${i} ${JSON.stringify(s)}`;
        col.appendChild(t);
      });
    }
  }
  function lines() {  // one path per colour and alpha step: R·C strokes in ~40 draw calls
    const v = st.v, R = v.rows, C = v.cols, hv = st.hover;
    const ctx = sized($("lines-canvas"), LINES_W, Math.max(R, C) * ROW);
    const STEPS = 20, paths = new Map();
    const add = (i, j, colour, alpha) => {
      const k = Math.round(Math.min(1, alpha) * STEPS);
      if (k === 0) return;
      const key = colour + k;
      if (!paths.has(key)) paths.set(key, { colour, alpha: k / STEPS, path: new Path2D() });
      const p = paths.get(key).path;
      p.moveTo(2, i * ROW + ROW / 2); p.lineTo(LINES_W - 2, j * ROW + ROW / 2);
    };
    for (let i = 0; i < R; i++) for (let j = 0; j < C; j++) add(i, j, "#1f5fbf", cur(i, j) * (hv === null ? 0.9 : 0.08));
    if (hv !== null && hv.q !== null) for (let j = 0; j < C; j++) add(hv.q, j, "#1f5fbf", cur(hv.q, j));
    if (hv !== null && hv.k !== null) for (let i = 0; i < R; i++) add(i, hv.k, "#d9730d", cur(i, hv.k));
    ctx.lineWidth = 2;
    for (const { colour, alpha, path } of paths.values()) { ctx.strokeStyle = colour; ctx.globalAlpha = alpha; ctx.stroke(path); }
    ctx.globalAlpha = 1;
  }

  // ---- hover: a query's row (what it attends to) and a key's column (what attends to it) ------
  function setHover(h) {
    st.hover = h;
    const v = st.v, q = h ? h.q : null, k = h ? h.k : null;
    const qs = $("tokens").children, ks = v.same ? qs : $("key-tokens").children;
    for (let i = 0; i < qs.length; i++) {  // a query's underline: how much it attends to the hovered key
      qs[i].classList.toggle("active", i === q);
      qs[i].style.borderBottom = k === null ? "" : `3px solid rgba(217,115,13,${Math.min(1, cur(i, k)).toFixed(3)})`;
    }
    for (let j = 0; j < ks.length; j++) {  // a key's background: how much the hovered query attends to it
      if (!v.same) ks[j].classList.toggle("active", j === k);
      ks[j].style.backgroundColor = q === null ? "" : `rgba(31,95,191,${(0.75 * cur(q, j)).toFixed(3)})`;
    }
    for (const [side, n] of [["left", q], ["right", k]]) {
      const col = $("lines-" + side).children;
      for (let j = 0; j < col.length; j++) col[j].classList.toggle("active", j === n);
    }
    const row = $("hm-row"), column = $("hm-col");
    if (q === null) { row.hidden = true; delete row.dataset.row; } else { place(row, q, true); row.dataset.row = q; }
    if (k === null) { column.hidden = true; delete column.dataset.col; } else { place(column, k, false); column.dataset.col = k; }
    lines();
  }
  const sameHover = (a, b) => a === b || (a !== null && b !== null && a.q === b.q && a.k === b.k);
  let pending = null, queued = false, follow = false;  // hover updates wait for the next frame: a fast mouse crosses many tokens
  function hoverSoon(h, scroll) {
    if (!queued) requestAnimationFrame(() => {
      queued = false;
      const n = pending;
      if (sameHover(n, st.hover)) return;
      setHover(n);
      if (n !== null && follow) {  // bring the token's line into the lines view
        const box = $("lines"), y = (n.q !== null ? n.q : n.k) * ROW;
        if (y < box.scrollTop || y + ROW > box.scrollTop + box.clientHeight) box.scrollTop = y - box.clientHeight / 2;
      }
    });
    queued = true; pending = h; follow = scroll;
  }
  function hoverable(box, side, scroll) {  // side: the box holds queries ("q") or keys ("k")
    box.addEventListener("mouseover", (ev) => {
      const t = ev.target.closest("[data-index]");
      if (!t || !box.contains(t)) return;
      const i = Number(t.dataset.index);
      hoverSoon(st.v.same ? { q: i, k: i } : side === "q" ? { q: i, k: null } : { q: null, k: i }, scroll);
    });
    box.addEventListener("mouseleave", () => hoverSoon(null, false));
  }

  // ---- thumbnails and entropy ------------------------------------------------------------------
  function thumbs() {
    const v = st.v, box = $("thumbs"); box.replaceChildren();
    $("thumbs-layer").textContent = st.layer;
    const px = 96 / Math.max(v.rows, v.cols);
    for (let h = 0; h < v.num_heads; h++) {
      const b = el("button", "thumb" + (h === st.head ? " selected" : ""));
      b.type = "button"; b.dataset.head = h;
      const c = el("canvas"); c.width = v.cols; c.height = v.rows;
      c.style.width = v.cols * px + "px"; c.style.height = v.rows * px + "px";
      c.getContext("2d").drawImage(bitmap(v.rows, v.cols, (i, j) => w(st.layer, h, i, j), seq), 0, 0);
      b.append(c, el("div", null, `head ${h} · H=${v.entropy[st.layer][h].toFixed(2)}`));
      b.addEventListener("click", () => select(st.layer, h));
      box.appendChild(b);
    }
  }
  function entropy() {
    const v = st.v, table = $("entropy"); table.replaceChildren();
    const all = v.entropy.flat(), lo = Math.min(...all), hi = Math.max(...all);
    const head = el("tr"); head.appendChild(el("th"));
    for (let h = 0; h < v.num_heads; h++) head.appendChild(el("th", null, `h${h}`));
    table.appendChild(head);
    for (let l = 0; l < v.num_layers; l++) {
      const tr = el("tr"); tr.appendChild(el("th", null, `layer ${l}`));
      for (let h = 0; h < v.num_heads; h++) {
        const e = v.entropy[l][h], x = hi > lo ? (e - lo) / (hi - lo) : 0.5;
        const td = el("td", l === st.layer && h === st.head ? "selected" : "", e.toFixed(2));
        td.style.backgroundColor = rgb(seq(0.1 + 0.75 * x)); td.style.color = x > 0.55 ? "#fff" : "#1d2330";
        td.title = `layer ${l} head ${h}: ${e.toFixed(3)} bits; uniform over the allowed keys: ${v.entropy_max[l][h].toFixed(3)} bits`;
        td.dataset.layer = l; td.dataset.head = h;
        td.addEventListener("click", () => select(l, h));
        tr.appendChild(td);
      }
      table.appendChild(tr);
    }
    const top = v.entropy_max[0][0];
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

  // ---- expert load (a mixture-of-experts run): MaxVio over training, tokens per expert --------
  const LAYER_COLOURS = ["#1f5fbf", "#d9730d", "#2e9e44", "#b42318", "#7a4cc2", "#0e8f8f", "#a15c00", "#c2418d"];
  function axes(ctx, box, xs, ys, names) {  // frame, 5 ticks a side, axis names; returns value -> pixel maps
    const [x0, x1] = xs, [y0, y1] = ys, { l, t, w, h } = box;
    const px = (v) => l + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * w, py = (v) => t + h - (v - y0) / (y1 - y0) * h;
    ctx.strokeStyle = "#d0d5dd"; ctx.fillStyle = "#344054"; ctx.font = "11px system-ui, sans-serif";
    ctx.strokeRect(l - 0.5, t - 0.5, w + 1, h + 1);
    for (let k = 0; k <= 4; k++) {
      const vy = y0 + (k / 4) * (y1 - y0);
      ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillText(vy.toFixed(2), l - 4, py(vy));
      ctx.beginPath(); ctx.moveTo(l, py(vy) + 0.5); ctx.lineTo(l + w, py(vy) + 0.5); ctx.stroke();
    }
    const raw = Math.max(1, (x1 - x0) / 4), p10 = 10 ** Math.floor(Math.log10(raw));
    const dx = p10 * [1, 2, 5, 10].find((m) => m * p10 >= raw);  // whole, round steps: 1, 2, 5 × 10^n
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (let vx = Math.ceil(x0 / dx) * dx; vx <= x1; vx += dx) ctx.fillText(String(vx), px(vx), t + h + 4);
    ctx.fillText(names[0], l + w / 2, t + h + 20);
    ctx.save(); ctx.translate(12, t + h / 2); ctx.rotate(-Math.PI / 2); ctx.fillText(names[1], 0, 0); ctx.restore();
    return [px, py];
  }
  function maxvioChart(x) {
    const canvas = $("xl-maxvio"), W = 560, H = 260, box = { l: 52, t: 10, w: W - 80, h: H - 50 };
    const ctx = sized(canvas, W, H), top = Math.max(0.1, ...x.maxvio.flat()) * 1.05;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const [px, py] = axes(ctx, box, [x.steps[0], x.steps[x.steps.length - 1]], [0, top], ["step", "MaxVio"]);
    const keys = $("xl-keys"); keys.replaceChildren();
    x.layers.forEach((name, l) => {
      const colour = LAYER_COLOURS[l % LAYER_COLOURS.length];
      ctx.strokeStyle = ctx.fillStyle = colour; ctx.lineWidth = 1.5; ctx.beginPath();
      x.steps.forEach((s, n) => { ctx[n ? "lineTo" : "moveTo"](px(s), py(x.maxvio[n][l])); });
      ctx.stroke();
      if (x.steps.length <= 40) x.steps.forEach((s, n) => ctx.fillRect(px(s) - 2, py(x.maxvio[n][l]) - 2, 4, 4));
      const key = el("span", null, name); key.style.borderLeftColor = colour; keys.appendChild(key);
    });
    Object.assign(canvas.dataset, { lines: x.layers.length, points: x.steps.length });
  }
  function loadMap(x, k) {  // snapshot k: L × E tokens, each coloured by log2(tokens / the layer's mean)
    const snap = x.snapshots[k], L = x.layers.length, E = x.experts, canvas = $("xl-map");
    const means = snap.tokens.map((row) => row.reduce((a, b) => a + b, 0) / E);
    const ratio = (i, j) => means[i] > 0 ? snap.tokens[i][j] / means[i] : 1;
    const cs = Math.max(3, Math.min(28, Math.floor(520 / E), Math.floor(360 / L)));
    const probe = canvas.getContext("2d"); probe.font = "11px ui-monospace, monospace";
    const mx = 8 + Math.max(24, ...x.layers.map((s) => probe.measureText(s).width)), my = 30;
    const W = mx + E * cs + 90, H = my + L * cs + 24;
    const ctx = sized(canvas, W, H);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.drawImage(bitmap(L, E, (i, j) => Math.log2(Math.max(ratio(i, j), 0.5)), div), mx, my, E * cs, L * cs);
    ctx.fillStyle = "#344054"; ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle";
    const every = Math.ceil(12 / cs);  // a label on every row that has room for one
    x.layers.forEach((name, i) => {
      if (i % every) return;
      const y = my + i * cs + cs / 2, vio = means[i] > 0 ? Math.max(...snap.tokens[i]) / means[i] - 1 : 0;
      ctx.textAlign = "right"; ctx.fillText(name, mx - 4, y);
      ctx.textAlign = "left"; ctx.fillText(`MaxVio ${vio.toFixed(2)}`, mx + E * cs + 6, y);
    });
    ctx.textAlign = "center";
    for (let j = 0; j < E; j += Math.ceil(E / 16)) ctx.fillText(String(j), mx + j * cs + cs / 2, my - 8);
    ctx.fillText("expert", mx + E * cs / 2, my + L * cs + 12);
    Object.assign(st, { xl: { x, k, cs, mx, my, ratio } });
    Object.assign(canvas.dataset, { step: snap.step, rows: L, cols: E });
    const legend = $("xl-legend"), c = el("canvas"); legend.replaceChildren();
    sized(c, 120, 10).drawImage(bitmap(1, 120, (i, j) => j / 59.5 - 1, div), 0, 0, 120, 10);
    legend.append(el("span", null, "½× mean or less"), c, el("span", null, "2× mean or more"));
  }
  function onLoadMapMove(ev) {
    const g = st.xl, r = $("xl-map").getBoundingClientRect(), tip = $("xl-tip"), snap = g.x.snapshots[g.k];
    const j = Math.floor((ev.clientX - r.left - g.mx) / g.cs), i = Math.floor((ev.clientY - r.top - g.my) / g.cs);
    if (i < 0 || j < 0 || i >= g.x.layers.length || j >= g.x.experts) { tip.hidden = true; return; }
    tip.textContent = `${g.x.layers[i]}, expert ${j}\n${snap.tokens[i][j]} tokens (${g.ratio(i, j).toFixed(2)}× the mean)`;
    tip.style.left = ev.clientX - r.left + 14 + "px"; tip.style.top = ev.clientY - r.top + 14 + "px";
    tip.hidden = false;
  }
  function experts(x) {
    const last = x.snapshots.length - 1, pick = $("xl-step");
    $("xl-summary").textContent = `${x.layers.length} MoE layers × ${x.experts} experts, ${x.steps.length} evaluations`;
    x.snapshots.forEach((s, k) => { const o = el("option", null, `step ${s.step}`); o.value = k; pick.appendChild(o); });
    pick.value = last;
    pick.addEventListener("change", () => loadMap(x, Number(pick.value)));
    $("xl-map").addEventListener("mousemove", onLoadMapMove);
    $("xl-map").addEventListener("mouseleave", () => { $("xl-tip").hidden = true; });
    $("experts").hidden = false;
    maxvioChart(x); loadMap(x, last);
  }

  // ---- selection and the whole page ------------------------------------------------------------
  function select(l, h) {
    st.layer = l; st.head = h;
    $("layer").value = l; $("head").value = h;
    const v = st.v;
    $("headinfo").textContent = `entropy ${v.entropy[l][h].toFixed(3)} bits (uniform: ${v.entropy_max[l][h].toFixed(3)})`;
    heatmap(); thumbs(); entropy();
    setHover(st.hover);
  }
  function setView(k) {
    const v = st.views[k];
    if (!v.A) v.A = f32(v.attention);  // decoded once, when first shown
    st.v = v; st.hover = null;
    $("view").value = k;
    $("view-note").textContent = v.caption || ""; $("view-note").hidden = !v.caption;
    tokens(); linesColumns();
    options($("layer"), v.num_layers, "layer"); options($("head"), v.num_heads, "head");
    select(Math.min(st.layer, v.num_layers - 1), Math.min(st.head, v.num_heads - 1));
  }
  function render(data) {
    st.data = data; st.views = viewsOf(data);
    $("main").hidden = false; $("empty").hidden = true;
    header(); viewOptions(); positional();
    const start = st.views.findIndex((v) => v.name === data.view);
    setView(Math.max(0, start));
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

  $("view").addEventListener("change", (e) => setView(Number(e.target.value)));
  $("layer").addEventListener("change", (e) => select(Number(e.target.value), st.head));
  $("head").addEventListener("change", (e) => select(st.layer, Number(e.target.value)));
  const hm = $("heatmap");
  hm.addEventListener("mousemove", onHeatmapMove);
  hm.addEventListener("mouseleave", () => { $("tip").hidden = true; setHover(null); });
  hoverable($("tokens"), "q", true); hoverable($("key-tokens"), "k", true);
  hoverable($("lines-left"), "q", false); hoverable($("lines-right"), "k", false);
  if (server) {
    $("input").hidden = false;
    $("text").value = server.text || "";
    $("text").addEventListener("input", count);
    $("text").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); });
    $("run").addEventListener("click", run);
    count();
  }
  if (boot.experts) experts(boot.experts);
  if (boot.data) render(boot.data);
  else {
    const t = (server && server.title) || "qkv explorer";
    document.title = t; $("title").textContent = t;
    $("empty").hidden = false;
  }
})();
