"""``agentgym view RUN_DIR``: one self-contained HTML page of what the agent did and how it learned.

    html = build_page(run_dir, limit=2000)     # the page as a string
    path = write_page(run_dir)                 # RUN_DIR/view.html

Reads ``episodes.jsonl`` (learner/records/episode_log.py), ``metrics.jsonl``, ``eval.jsonl`` and
``config.toml`` of a run (finished or still running) and writes a page with no outside
resources: charts of the training and held-out curves (success, reward, per-env success,
avg@k/pass@k, throughput, turn limit, loss, gradient norm, learning rate, clip fraction, approx KL,
importance weights, staleness; viewer_charts.js draws them, with ticks, grid, smoothing and
hover, each titled with its TensorBoard/W&B tag), then the logged episodes — newest first,
filterable by kind, environment, outcome, step range and text — each one opening into its conversation exactly as the learner trained on it: prompt, agent turns
(with their reward, weight versions and mean behaviour logprob) and environment messages.
Filters can also be set from the URL: ``view.html?kind=eval&env=maze&outcome=failure&q=north``
(``&open=all`` opens every conversation; ``&smooth=0`` turns smoothing off, ``&hover=50`` shows every
chart's values at step 50).

All text is inserted as text (``textContent``), never as HTML, so whatever an agent or an
environment wrote shows as written.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

# The keys the page's charts draw (viewer_charts.js, chartSpecs); the rest of a record stays out of the page.
METRIC_KEYS = (
    "step",
    "success_rate",
    "reward_mean",
    "turn_limit",
    "staleness_mean",
    "trajectories_per_s",
    "tokens_per_s",
    "loss",
    "grad_norm",
    "lr",
    "clip_frac",
    "approx_kl",
    "entropy",
    "kl_ref",
    "kl_penalty",
    "is_weight_mean",
    "is_weight_max",
    "is_truncated_frac",
    "is_rejected_frac",
    "learner_utilisation",
    "learner_export_s",
    "weights_digest_mismatch",
    "logprob_mismatch_kl_max",
    "logprob_outliers",
    "tickets_deadline_reissued",
    "late_answers",
)
EVAL_KEYS = ("step", "version", "success_rate", "reward_mean", "split", "episodes", "pinned")
METRIC_PATTERN = re.compile(r"env/[^/]+/(success_rate|turn_limit)")  # per-env curves
EVAL_PATTERN = re.compile(r"(avg|pass)@\d+|env/[^/]+/success_rate")  # avg@k, pass@k (k = group size), per env
CHARTS_JS = Path(__file__).with_name("viewer_charts.js")


def _pick(rec: dict[str, Any], keys: tuple[str, ...], pattern: re.Pattern[str]) -> dict[str, Any]:
    """The keys the page draws; NaN and infinities become null (JSON.parse takes no NaN)."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in rec.items()
        if k in keys or pattern.fullmatch(k)
    }


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
        raise FileNotFoundError(
            f"agentgym view: {run_dir} has none of episodes.jsonl, metrics.jsonl, eval.jsonl "
            "(not a run directory, or the run has not trained a step yet)"
        )
    episodes = _jsonl(files[0])
    total = len(episodes)
    episodes = episodes[-limit:] if limit > 0 else []
    metrics = [_pick(r, METRIC_KEYS, METRIC_PATTERN) for r in _jsonl(files[1])]
    evals = [_pick(r, EVAL_KEYS, EVAL_PATTERN) for r in _jsonl(files[2])]
    config = (run_dir / "config.toml").read_text() if (run_dir / "config.toml").exists() else ""
    return {
        "run": run_dir.resolve().name,
        "episodes": episodes,
        "episodes_total": total,
        "metrics": metrics,
        "evals": evals,
        "config": config,
    }


def build_page(run_dir: Path, limit: int = 2000) -> str:
    data = json.dumps(run_data(run_dir, limit), separators=(",", ":"), default=float)
    # Inside <script> only "</" could end the element early; as JSON, "<" may be written \u003c.
    data = data.replace("<", "\\u003c")
    return _PAGE.replace("__CHARTS__", CHARTS_JS.read_text()).replace("__DATA__", data)


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
.muted{color:#777} .charts{display:flex;gap:1em;flex-wrap:wrap}
.chart{background:#fff;border:1px solid #ddd;padding:.4em;position:relative;width:440px} .chart svg{display:block}
.chart-title{font-weight:600;white-space:nowrap;overflow:hidden;text-overflow:ellipsis} .tag{font-weight:400;font-size:.85em} .legend{font-size:12px;display:flex;gap:.8em;flex-wrap:wrap}
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:-.05em;border-radius:2px}
.chart text{fill:#444} .grid line{stroke:#eee} svg .point{stroke:#fff;stroke-width:.8}
.tip{position:absolute;top:3.2em;background:rgba(255,255,255,.95);border:1px solid #bbb;border-radius:3px;padding:.2em .45em;
font-size:12px;pointer-events:none;white-space:nowrap} .tip-step{font-weight:600}
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
<div class="filters"><label title="exponential moving average of the training curves, as TensorBoard's slider">smoothing
  <input id="smooth" type="range" min="0" max="0.99" step="0.01" value="0.6"> <span id="smooth-v"></span></label>
  <span class="muted">hover a chart for the values at a step; faint lines are the raw values, points are evaluations</span></div>
<div class="charts" id="charts"></div>
<pre id="layout" hidden></pre>
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
<script>__CHARTS__</script>
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

for (const env of [...new Set(D.episodes.map(e => e.env))].sort()) $("f-env").appendChild(el("option", "", env));
const params = new URLSearchParams(location.search);
// Charts (viewer_charts.js): smoothing from the slider or ?smooth=W, a crosshair at ?hover=STEP.
if (params.has("smooth")) $("smooth").value = params.get("smooth");
const redraw = () => { $("smooth-v").textContent = (+$("smooth").value).toFixed(2);
  drawCharts(D, $("charts"), +$("smooth").value, params.has("hover") ? +params.get("hover") : null); };
$("smooth").addEventListener("input", redraw);
redraw();
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
