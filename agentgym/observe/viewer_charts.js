// The charts of `agentgym view` (agentgym/observe/viewer.py inlines this file into the page; no outside
// resources). Each chart: axes with "nice" ticks (1, 2 or 5 times a power of ten) and a grid, a
// y range fitted to the data, training curves smoothed like TensorBoard's slider (an exponential
// moving average, debiased; the raw curve stays drawn faintly), evaluations as points, and a
// crosshair with the values at the nearest step on hover (or at ?hover=STEP for every chart).
// After drawing, the box of every label of every chart goes to #layout as JSON, so that a
// headless browser can check that labels sit inside their chart and overlap nothing.
"use strict";
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#3466c2", "#d9822b", "#2a9d4b", "#b3261e", "#7b4fb8", "#8c6d31", "#d1439a", "#4aa3b5"];
const W = 440, H = 210, TOP = 10, RIGHT = 16, BOTTOM = 38, FONT = 11;

function svgEl(parent, tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}

// d3-array's tick increment: about `count` ticks between lo and hi.
function tickStep(lo, hi, count) {
  const raw = Math.abs(hi - lo) / Math.max(count, 1);
  let step = Math.pow(10, Math.floor(Math.log10(raw)));
  const err = raw / step;
  if (err >= Math.sqrt(50)) step *= 10; else if (err >= Math.sqrt(10)) step *= 5; else if (err >= Math.sqrt(2)) step *= 2;
  return step;
}

// The data's range, padded by 5% and widened to whole ticks; a constant gets a band around it.
function niceRange(lo, hi, count) {
  if (hi - lo <= Math.abs(hi) * 1e-9) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  else { const pad = (hi - lo) * 0.05; lo -= pad; hi += pad; }
  const s = tickStep(lo, hi, count);
  return [Math.floor(lo / s) * s, Math.ceil(hi / s) * s, s];
}

function tickValues(lo, hi, s) {
  const out = [];
  for (let i = Math.ceil(lo / s - 1e-9); i * s <= hi + s * 1e-9; i++) out.push(Math.abs(i * s) < s * 1e-9 ? 0 : i * s);
  return out;
}

// Fixed decimals for ordinary steps; a shared mantissa width in e-notation for very small or large ones.
function tickFormat(s, maxAbs) {
  const es = Math.floor(Math.log10(s) + 1e-9);
  if (s >= 1e-3 && maxAbs < 1e6) return v => v.toFixed(Math.max(0, -es));
  const em = Math.floor(Math.log10(maxAbs || s) + 1e-9);
  return v => (v === 0 ? "0" : v.toExponential(Math.max(0, em - es)));
}

function valueFormat(v) {
  if (typeof v !== "number" || !isFinite(v)) return "–";
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : v.toFixed(a >= 100 ? 1 : 4);
}

// TensorBoard's smoothing: EMA with weight w, debiased so the first points are not pulled to 0.
function smooth(points, w) {
  if (!(w > 0)) return points;
  let acc = 0, n = 0;
  return points.map(([x, y]) => { acc = acc * w + (1 - w) * y; n++; return [x, acc / (1 - Math.pow(w, n))]; });
}

// One chart. spec: {id, title, tags, unit, steps, series: [{name, color, points: [[step, y]], sparse}]};
// sparse series (evaluations) are drawn with a marker per point and never smoothed; `unit`: a rate
// (the y range stops at 1); `steps`: a step function, never smoothed.
function drawChart(host, spec, smoothing) {
  const box = document.createElement("div"); box.className = "chart"; box.id = "chart-" + spec.id;
  box.showStep = () => {};  // a chart with no data has no crosshair
  const head = document.createElement("div"); head.className = "chart-title";
  head.append(spec.title, " ");
  const tags = document.createElement("span"); tags.className = "muted tag"; tags.textContent = spec.tags; head.appendChild(tags);
  box.appendChild(head);
  if (spec.series.length > 1) {
    const legend = document.createElement("div"); legend.className = "legend";
    for (const s of spec.series) {
      const item = document.createElement("span"); item.className = "legend-item";
      const sw = document.createElement("span"); sw.className = "swatch"; sw.style.background = s.color;
      item.append(sw, s.name); legend.appendChild(item);
    }
    box.appendChild(legend);
  }
  const svg = svgEl(box, "svg", {width: W, height: H, id: "c-" + spec.id, viewBox: `0 0 ${W} ${H}`});
  const tip = document.createElement("div"); tip.className = "tip"; tip.hidden = true; box.appendChild(tip);
  host.appendChild(box);

  const w = spec.steps ? 0 : smoothing;  // a step function (turn limit, schedule) is drawn as it is
  const series = spec.series.filter(s => s.points.length).map(s => ({...s, shown: s.sparse ? s.points : smooth(s.points, w)}));
  if (!series.length) { svgEl(svg, "text", {x: 12, y: 24, "font-size": FONT, class: "label"}, "no data yet"); return; }
  const pts = series.flatMap(s => s.sparse ? s.points : s.points.concat(s.shown));
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  // Fitted to the data, but never past a bound the quantity cannot cross (0 for counts, 1 for rates).
  const lo = Math.min(...ys), hi = Math.max(...ys);
  let [y0, y1, ys_] = niceRange(lo, hi, 5);
  if (lo >= 0 && y0 < 0) y0 = 0;
  if (spec.unit && hi <= 1 && y1 > 1) y1 = 1;
  const yfmt = tickFormat(ys_, Math.max(Math.abs(y0), Math.abs(y1)));
  const yTicks = tickValues(y0, y1, ys_);
  // The left margin fits the widest y tick label, measured as rendered.
  const labels = yTicks.map(v => svgEl(svg, "text", {"font-size": FONT, "text-anchor": "end", class: "label tick-y"}, yfmt(v)));
  const LEFT = Math.ceil(Math.max(...labels.map(t => t.getComputedTextLength()))) + 12;
  const xmin = Math.min(...xs), xmax = Math.max(...xs);
  const [x0, x1, xs_] = xmax > xmin ? [xmin, xmax, Math.max(1, tickStep(xmin, xmax, Math.floor((W - LEFT - RIGHT) / 70)))] : [xmin - 1, xmax + 1, 1];
  const X = x => LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT), Y = y => TOP + (y1 - y) / (y1 - y0) * (H - TOP - BOTTOM);
  const grid = svgEl(svg, "g", {class: "grid"});
  yTicks.forEach((v, i) => {
    labels[i].setAttribute("x", LEFT - 6); labels[i].setAttribute("y", (Y(v) + FONT * 0.35).toFixed(1));
    svgEl(grid, "line", {x1: LEFT, x2: W - RIGHT, y1: Y(v).toFixed(1), y2: Y(v).toFixed(1)});
  });
  for (const v of tickValues(Math.ceil(x0 / xs_) * xs_, x1, xs_)) {
    if (v < x0) continue;
    svgEl(grid, "line", {x1: X(v).toFixed(1), x2: X(v).toFixed(1), y1: TOP, y2: H - BOTTOM});
    svgEl(svg, "text", {x: X(v).toFixed(1), y: H - BOTTOM + 15, "font-size": FONT, "text-anchor": "middle", class: "label tick-x"}, String(v));
  }
  svgEl(svg, "path", {d: `M${LEFT},${TOP}V${H - BOTTOM}H${W - RIGHT}`, stroke: "#888", fill: "none"});
  svgEl(svg, "text", {x: LEFT + (W - LEFT - RIGHT) / 2, y: H - 6, "font-size": FONT, "text-anchor": "middle", class: "label axis-label"}, "step");

  const line = (s, pts, cls, extra) => svgEl(svg, "polyline", {points: pts.map(p => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "),
    fill: "none", stroke: s.color, class: cls, "data-name": s.name, ...extra});
  for (const s of series) {
    if (s.sparse || s.points.length === 1) {
      for (const p of s.points) svgEl(svg, "circle", {cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 3, fill: s.color, class: "point", "data-name": s.name});
    }
    if (!s.sparse && w > 0) line(s, s.points, "raw", {"stroke-width": 1, "stroke-opacity": 0.3});
    line(s, s.shown, "series", {"stroke-width": 1.6, ...(s.sparse ? {"stroke-dasharray": "4 3"} : {})});
  }

  // Hover: the nearest step of any series, a vertical line, and each series' value there.
  const steps = [...new Set(xs)].sort((a, b) => a - b);
  const cross = svgEl(svg, "line", {y1: TOP, y2: H - BOTTOM, stroke: "#555", "stroke-dasharray": "2 2", visibility: "hidden", class: "cross"});
  const show = step => {
    cross.setAttribute("x1", X(step)); cross.setAttribute("x2", X(step)); cross.setAttribute("visibility", "visible");
    tip.replaceChildren(); tip.hidden = false;
    const h = document.createElement("div"); h.className = "tip-step"; h.textContent = `step ${step}`; tip.appendChild(h);
    for (const s of series) {
      const i = s.points.findIndex(p => p[0] === step);
      if (i < 0) continue;
      const row = document.createElement("div"); row.className = "tip-row";
      const sw = document.createElement("span"); sw.className = "swatch"; sw.style.background = s.color;
      const raw = s.points[i][1], shown = s.shown[i][1];
      row.append(sw, `${s.name} ${valueFormat(shown)}` + (shown !== raw ? ` (raw ${valueFormat(raw)})` : ""));
      tip.appendChild(row);
    }
    // Beside the crosshair, on the side with more room.
    if (X(step) < W / 2) { tip.style.left = `${X(step) + 14}px`; tip.style.right = ""; }
    else { tip.style.right = `${W - X(step) + 14}px`; tip.style.left = ""; }
  };
  const hide = () => { cross.setAttribute("visibility", "hidden"); tip.hidden = true; };
  const hit = svgEl(svg, "rect", {x: LEFT, y: TOP, width: W - LEFT - RIGHT, height: H - TOP - BOTTOM, fill: "transparent"});
  hit.addEventListener("mousemove", ev => {
    const r = svg.getBoundingClientRect(), x = x0 + (ev.clientX - r.left - LEFT) / (W - LEFT - RIGHT) * (x1 - x0);
    show(steps.reduce((a, b) => Math.abs(b - x) < Math.abs(a - x) ? b : a));
  });
  hit.addEventListener("mouseleave", hide);
  box.showStep = step => { if (steps.includes(step)) show(step); };
}

// The chart list: which keys of metrics.jsonl (training) and eval.jsonl (held-out) each draws.
function chartSpecs(D) {
  const num = (recs, k) => recs.flatMap(r => typeof r[k] === "number" ? [[r.step, r[k]]] : []);
  const envs = prefix => [...new Set(D.metrics.concat(D.evals).flatMap(r => Object.keys(r)).filter(k => k.startsWith("env/") && k.endsWith("/" + prefix)).map(k => k.split("/")[1]))].sort();
  const one = (id, title, key, opts) => ({id, title, tags: `train/${key}`, ...opts, series: [{name: "train", color: COLORS[0], points: num(D.metrics, key)}]});
  const unit = {unit: true}, steps = {steps: true};  // rates in [0, 1]; step functions (not smoothed)
  const specs = [
    {id: "success", title: "success rate", tags: "train/success_rate, eval/success_rate", always: true, unit: true, series: [
      {name: "train", color: COLORS[0], points: num(D.metrics, "success_rate")},
      {name: "eval", color: COLORS[1], points: num(D.evals, "success_rate"), sparse: true}]},
    {id: "reward", title: "mean reward", tags: "train/reward_mean, eval/reward_mean", always: true, series: [
      {name: "train", color: COLORS[0], points: num(D.metrics, "reward_mean")},
      {name: "eval", color: COLORS[1], points: num(D.evals, "reward_mean"), sparse: true}]},
  ];
  const byEnv = envs("success_rate");
  if (byEnv.length > 1) {
    specs.push({id: "success_by_env", title: "success rate by env", tags: "train/env/NAME/success_rate, eval/…", unit: true,
      series: byEnv.flatMap((e, i) => [
        {name: e, color: COLORS[i % COLORS.length], points: num(D.metrics, `env/${e}/success_rate`)},
        {name: `${e} (eval)`, color: COLORS[i % COLORS.length], points: num(D.evals, `env/${e}/success_rate`), sparse: true}])});
  }
  const ks = [...new Set(D.evals.flatMap(r => Object.keys(r)).filter(k => /^(avg|pass)@\d+$/.test(k)))].sort();
  specs.push({id: "eval_k", title: "held-out avg@k and pass@k", tags: ks.map(k => "eval/" + k).join(", "), unit: true,
    series: ks.map((k, i) => ({name: k, color: COLORS[(i + 1) % COLORS.length], points: num(D.evals, k), sparse: true}))});
  specs.push(one("throughput", "trajectories per second", "trajectories_per_s"), one("tokens", "agent tokens per second", "tokens_per_s"));
  const limits = envs("turn_limit");
  specs.push(limits.length > 1
    ? {id: "turn_limit", title: "turn limit", tags: "train/env/NAME/turn_limit", steps: true,
       series: limits.map((e, i) => ({name: e, color: COLORS[i % COLORS.length], points: num(D.metrics, `env/${e}/turn_limit`)}))}
    : one("turn_limit", "turn limit", "turn_limit", steps));
  for (const [key, title, opts] of [["loss", "loss"], ["grad_norm", "gradient norm (before clipping)"], ["lr", "learning rate", steps],
    ["clip_frac", "clip fraction", unit], ["approx_kl", "approx KL (to the proximal policy)"], ["entropy", "entropy"],
    ["kl_ref", "KL to reference"], ["kl_penalty", "KL penalty"], ["is_weight_mean", "importance weight (mean)"],
    ["is_weight_max", "importance weight (max)"], ["is_truncated_frac", "importance weights truncated", unit],
    ["is_rejected_frac", "importance weights rejected", unit], ["staleness_mean", "staleness (versions)"],
    ["learner_utilisation", "learner utilisation", unit], ["learner_export_s", "weight export (s)"],
    // flight recorder and stragglers (docs/operations.md): flat at 0 in a healthy run
    ["weights_digest_mismatch", "weight digest mismatches (flight recorder)", steps],
    ["logprob_mismatch_kl_max", "behaviour vs learner logprobs, worst actor (KL)"], ["logprob_outliers", "logprob outliers flagged", steps],
    ["tickets_deadline_reissued", "tickets re-issued past their deadline", steps], ["late_answers", "late answers (duplicates)", steps]]) specs.push(one(key, title, key, opts));
  // A chart is drawn when its run has data for it (success and reward always).
  return specs.filter(s => s.always || s.series.some(x => x.points.length));
}

// Every label's box, per chart, for a legibility check from outside (see the comment at the top).
function exportLayout() {
  const out = [];
  for (const svg of document.querySelectorAll(".chart svg")) {
    const texts = [...svg.querySelectorAll("text")].map(t => { const b = t.getBBox(); return {text: t.textContent, x: b.x, y: b.y, w: b.width, h: b.height}; });
    out.push({id: svg.id, width: +svg.getAttribute("width"), height: +svg.getAttribute("height"), texts});
  }
  document.getElementById("layout").textContent = JSON.stringify(out);
}

function drawCharts(D, host, smoothing, hoverStep) {
  host.replaceChildren();
  for (const spec of chartSpecs(D)) drawChart(host, spec, smoothing);
  if (hoverStep !== null) for (const box of host.querySelectorAll(".chart")) box.showStep(hoverStep);
  exportLayout();
}
