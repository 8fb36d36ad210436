"""``agentgym view RUN_DIR``: one self-contained HTML page of what the agent did and how it learned.

    html = build_page(run_dir, limit=2000)     # the page as a string
    path = write_page(run_dir)                 # RUN_DIR/view.html

Reads ``episodes.jsonl`` (learner/episode_log.py), ``metrics.jsonl``, ``eval.jsonl`` and
``config.toml`` of a run (finished or still running) and writes a page with no outside
resources: success and reward over the steps (training and held-out evaluation), then the
logged episodes — newest first, filterable by kind, environment, outcome, step range and text —
each one opening into its conversation exactly as the learner trained on it: prompt, agent turns
(with their reward, weight versions and mean behaviour logprob) and environment messages.
Filters can also be set from the URL: ``view.html?kind=eval&env=maze&outcome=failure&q=north``
(``&open=all`` opens every conversation).

All text is inserted as text (``textContent``), never as HTML, so whatever an agent or an
environment wrote shows as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRIC_KEYS = ("step", "success_rate", "reward_mean", "turn_limit", "staleness_mean", "trajectories_per_s",
               "loss", "entropy", "kl_ref", "kl_penalty", "is_weight_mean", "is_weight_max", "is_truncated_frac",
               "is_rejected_frac", "learner_utilisation", "learner_export_s")  # the page's curves (MORE below)
EVAL_KEYS = ("step", "version", "success_rate", "reward_mean", "split", "episodes", "pinned")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file; a torn last line (a run still writing) is skipped."""
    if not path.exists():
        return []
    out = []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n == len(lines):
                continue
            raise ValueError(f"{path}:{n}: not a JSON line ({exc})") from None
    return out


def run_data(run_dir: Path, limit: int = 2000) -> dict[str, Any]:
    """What the page shows, as plain data: the newest ``limit`` episodes, the metric curves."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"agentgym view: {run_dir} is not a directory")
    files = [run_dir / n for n in ("episodes.jsonl", "metrics.jsonl", "eval.jsonl")]
    if not any(f.exists() for f in files):
        raise FileNotFoundError(f"agentgym view: {run_dir} has none of episodes.jsonl, metrics.jsonl, eval.jsonl "
                                "(not a run directory, or the run has not trained a step yet)")  # fmt: skip
    episodes = _jsonl(files[0])
    total = len(episodes)
    episodes = episodes[-limit:] if limit > 0 else []
    metrics = [{k: r[k] for k in METRIC_KEYS if k in r} for r in _jsonl(files[1])]
    evals = [{k: r[k] for k in EVAL_KEYS if k in r} for r in _jsonl(files[2])]
    config = (run_dir / "config.toml").read_text() if (run_dir / "config.toml").exists() else ""
    return {"run": run_dir.resolve().name, "episodes": episodes, "episodes_total": total, "metrics": metrics,
            "evals": evals, "config": config}  # fmt: skip


def build_page(run_dir: Path, limit: int = 2000) -> str:
    data = json.dumps(run_data(run_dir, limit), separators=(",", ":"), default=float)
    # Inside <script> only "</" could end the element early; as JSON, "<" may be written \u003c.
    data = data.replace("<", "\\u003c")
    return _PAGE.replace("__DATA__", data)


def write_page(run_dir: Path, out: Path | None = None, limit: int = 2000) -> Path:
    out = Path(out) if out is not None else Path(run_dir) / "view.html"
    html = build_page(run_dir, limit)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out


_PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentgym run</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .4em} h2{font-size:1.05em;margin:1.2em 0 .4em}
.muted{color:#777} .charts{display:flex;gap:1.5em;flex-wrap:wrap}
.chart{background:#fff;border:1px solid #ddd;padding:.4em} .chart svg{display:block}
.filters{display:flex;gap:.6em;flex-wrap:wrap;align-items:center;margin:.5em 0}
.ep{background:#fff;border:1px solid #ddd;margin:.3em 0;border-radius:4px}
.ep>summary{cursor:pointer;padding:.35em .6em;display:flex;gap:1em;flex-wrap:wrap}
.ok{color:#17823b;font-weight:600} .bad{color:#b3261e;font-weight:600}
.badge{background:#eee;border-radius:3px;padding:0 .4em;font-size:.9em}
.conv{padding:.3em .6em .6em}
.seg{white-space:pre-wrap;font:12.5px/1.35 ui-monospace,monospace;padding:.35em .5em;margin:.25em 0;border-radius:3px}
.seg.critique{background:#fff3d6;border-left:3px solid #d08a00}
.seg .who{font:600 11px system-ui,sans-serif;display:block;color:#555;margin-bottom:.15em}
.prompt{background:#f0f0f0} .env{background:#e8f4ea} .agent{background:#e6eefb;border-left:3px solid #3466c2}
pre.config{background:#fff;border:1px solid #ddd;padding:.5em;max-height:20em;overflow:auto}
</style></head>
<body>
<h1>agentgym run <span id="run"></span></h1>
<div class="muted" id="counts"></div>
<div class="charts">
  <div class="chart"><div>success rate (training <span style="color:#3466c2">&#9632;</span>, held-out <span style="color:#d9822b">&#9632;</span>)</div><svg id="c-success" width="420" height="160"></svg></div>
  <div class="chart"><div>mean reward (training)</div><svg id="c-reward" width="420" height="160"></svg></div>
</div>
<div class="charts" id="more"></div>
<h2>Episodes</h2>
<div class="filters">
  <label>kind <select id="f-kind"><option value="">all</option><option>train</option><option>eval</option></select></label>
  <label>env <select id="f-env"><option value="">all</option></select></label>
  <label>outcome <select id="f-outcome"><option value="">all</option><option>success</option><option>failure</option></select></label>
  <label>steps <input id="f-min" type="number" style="width:5em"> to <input id="f-max" type="number" style="width:5em"></label>
  <label>text <input id="f-q" type="search" placeholder="in any message"></label>
  <span class="muted" id="shown"></span>
</div>
<div id="episodes"></div>
<h2>Config</h2><pre class="config" id="config"></pre>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const $ = id => document.getElementById(id);
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; }
const fmt = x => (x === null || x === undefined) ? "–" : (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(3)) : String(x));

$("run").textContent = D.run;
$("config").textContent = D.config || "(no config.toml)";
$("counts").textContent = `${D.metrics.length} optimizer steps, ${D.evals.length} evaluations, ` +
  `${D.episodes_total} logged episodes` + (D.episodes_total > D.episodes.length ? ` (newest ${D.episodes.length} shown)` : "");

function chart(svg, series, ylabel) {
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), P = 28, NS = "http://www.w3.org/2000/svg";
  const pts = series.flatMap(s => s.points);
  if (!pts.length) { const t = document.createElementNS(NS, "text"); t.setAttribute("x", 10); t.setAttribute("y", 20); t.textContent = "no data yet"; svg.appendChild(t); return; }
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = x => P + (x - x0) / (x1 - x0) * (W - 2 * P), Y = y => H - P - (y - y0) / (y1 - y0) * (H - 2 * P);
  const axis = document.createElementNS(NS, "path");
  axis.setAttribute("d", `M${P},${P / 2}V${H - P}H${W - P / 2}`); axis.setAttribute("stroke", "#999"); axis.setAttribute("fill", "none"); svg.appendChild(axis);
  for (const [v, x, y, anchor] of [[fmt(y1), 2, P / 2 + 4, "start"], [fmt(y0), 2, H - P, "start"], [x0, P, H - 8, "start"], [x1, W - P, H - 8, "end"]]) {
    const t = document.createElementNS(NS, "text"); t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "10"); t.setAttribute("text-anchor", anchor); t.textContent = v; svg.appendChild(t);
  }
  // Axis titles: x is always the optimizer step; y names the quantity.
  for (const [v, x, y, rot] of [["step", W / 2, H - 2, ""], [ylabel || "", 10, H / 2, `rotate(-90 10 ${H / 2})`]]) {
    const t = document.createElementNS(NS, "text"); t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "10");
    t.setAttribute("text-anchor", "middle"); t.setAttribute("class", "axis-label"); if (rot) t.setAttribute("transform", rot); t.textContent = v; svg.appendChild(t);
  }
  for (const s of series) {
    if (!s.points.length) continue;
    // A marker per point, so that a single evaluation is visible (a one-point line draws nothing).
    for (const p of s.points) {
      const c = document.createElementNS(NS, "circle"); c.setAttribute("cx", X(p[0]).toFixed(1)); c.setAttribute("cy", Y(p[1]).toFixed(1));
      c.setAttribute("r", "2.5"); c.setAttribute("fill", s.color); c.setAttribute("class", "point"); c.dataset.name = s.name; svg.appendChild(c);
    }
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", s.points.map(p => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", s.color); line.setAttribute("stroke-width", "1.5");
    line.setAttribute("class", "series"); line.dataset.name = s.name; svg.appendChild(line);
  }
}
const num = (r, k) => typeof r[k] === "number" ? [[r.step, r[k]]] : [];
chart($("c-success"), [
  {name: "train", color: "#3466c2", points: D.metrics.flatMap(r => num(r, "success_rate"))},
  {name: "eval", color: "#d9822b", points: D.evals.flatMap(r => num(r, "success_rate"))}], "success rate");
chart($("c-reward"), [{name: "train", color: "#3466c2", points: D.metrics.flatMap(r => num(r, "reward_mean"))}], "reward");
// Training-health curves, each drawn only when the run's metrics carry the key.
const MORE = [["loss", "loss"], ["entropy", "entropy"], ["kl_ref", "KL to reference"], ["kl_penalty", "KL penalty"],
  ["is_weight_mean", "importance weight (mean)"], ["is_weight_max", "importance weight (max)"],
  ["is_truncated_frac", "importance weights truncated"], ["is_rejected_frac", "importance weights rejected"],
  ["staleness_mean", "staleness (versions)"], ["learner_utilisation", "learner utilisation"],
  ["learner_export_s", "weight export (s)"]];
for (const [key, label] of MORE) {
  const points = D.metrics.flatMap(r => num(r, key));
  if (!points.length) continue;
  const box = el("div", "chart"); box.appendChild(el("div", "", label));
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg"); svg.setAttribute("width", "420"); svg.setAttribute("height", "160"); svg.id = "c-" + key;
  box.appendChild(svg); $("more").appendChild(box);
  chart(svg, [{name: key, color: "#3466c2", points}], label);
}

for (const env of [...new Set(D.episodes.map(e => e.env))].sort()) $("f-env").appendChild(el("option", "", env));
const params = new URLSearchParams(location.search);
for (const [k, id] of [["kind", "f-kind"], ["env", "f-env"], ["outcome", "f-outcome"], ["min", "f-min"], ["max", "f-max"], ["q", "f-q"]])
  if (params.has(k)) $(id).value = params.get(k);

function episodeNode(e, n) {
  const d = el("details", "ep"); d.dataset.index = n; d.open = params.get("open") === "all";
  const s = el("summary");
  s.append(el("span", "badge", e.kind), el("span", "", `step ${e.step}`), el("span", "", `${e.env} #${e.task_id}`),
           el("span", e.success ? "ok" : "bad", e.success ? "success" : "failure"), el("span", "", `reward ${fmt(e.reward)}`),
           el("span", "", `${e.turns}/${e.turn_limit} turns`), el("span", "badge", e.finish),
           ...(e.critiques ? [el("span", "badge", `${e.critiques} critique${e.critiques > 1 ? "s" : ""}`)] : []),
           el("span", "muted", `${e.tokens} tokens · episode ${e.episode + 1}/${e.group_size} of ${e.group_id} (group mean ${fmt(e.group_reward_mean)}) · ${e.actor_id}`));
  d.appendChild(s);
  const c = el("div", "conv");
  if (e.failure) c.appendChild(el("div", "bad", `failure: ${e.failure}`));
  for (const seg of e.segments) {
    const b = el("div", "seg " + seg.role);
    let who = seg.role === "agent" ? `agent, turn ${seg.turn === null ? "?" : seg.turn + 1}` : seg.role;
    if (seg.role === "agent") who += ` · reward ${fmt(seg.reward)} · version ${seg.versions[0]}${seg.versions[1] !== seg.versions[0] ? "–" + seg.versions[1] : ""} · mean logprob ${fmt(seg.logprob_mean)}`;
    b.appendChild(el("span", "who", `${who} · ${seg.tokens} tokens`));
    b.appendChild(document.createTextNode(seg.text));
    c.appendChild(b);
  }
  d.appendChild(c);
  return d;
}
function render() {
  const kind = $("f-kind").value, env = $("f-env").value, outcome = $("f-outcome").value, q = $("f-q").value.toLowerCase();
  const lo = $("f-min").value === "" ? -Infinity : +$("f-min").value, hi = $("f-max").value === "" ? Infinity : +$("f-max").value;
  const box = $("episodes"); box.replaceChildren();
  let shown = 0;
  for (let n = D.episodes.length - 1; n >= 0; n--) {
    const e = D.episodes[n];
    if ((kind && e.kind !== kind) || (env && e.env !== env) || (outcome === "success" && !e.success) ||
        (outcome === "failure" && e.success) || e.step < lo || e.step > hi) continue;
    if (q && !e.segments.some(s => s.text.toLowerCase().includes(q))) continue;
    box.appendChild(episodeNode(e, n)); shown++;
  }
  $("shown").textContent = `${shown} of ${D.episodes.length} episodes`;
  if (!shown) box.appendChild(el("div", "muted", "no episode matches"));
}
for (const id of ["f-kind", "f-env", "f-outcome", "f-min", "f-max", "f-q"]) $(id).addEventListener("input", render);
render();
</script></body></html>
"""
