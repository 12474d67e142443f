"""A report to share: `predict --html FILE` and `recommend --html FILE`.

One self-contained HTML file: inline CSS, charts as base64 PNG (perfmodel.plot), no script or
font from anywhere; a Content-Security-Policy forbids every fetch at view time, so that a page
that needs the network shows it at once (the browser refuses and says so). Sections: the plan,
the summary, the step-time breakdown, the memory, the timeline of the step (perfmodel.timeline),
and for recommend the best plans, what binds the best, the runner-up comparison, the Pareto front
and the micro-batch curve. A few lines of inline script mark the page for tests: data-rendered
on <html> once loaded, data-images with the images drawn of all, data-errors with any script
error or refused fetch (tests/unit/test_html_report.py opens it in headless Chromium).
"""

from __future__ import annotations

import base64
import datetime
import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from perfmodel.output import fmt_fixed

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
       "script-src 'unsafe-inline'")

STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto;
       max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f6f8; }
td.l, th.l { text-align: left; }
tr.best td { background: #eef7ee; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.note { color: #8a5a00; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 0.9em; min-width: 10em; }
.card b { display: block; font-size: 1.2em; }
footer { color: #888; font-size: 0.8em; margin-top: 3em; }
"""

# marks the page for tests (see the module doc); nothing is fetched or sent
SCRIPT = """
(function () {
  var root = document.documentElement;
  function error(text) {
    root.setAttribute('data-errors', (root.getAttribute('data-errors') || '') + text + ';');
  }
  window.addEventListener('error', function (e) { error(e.message || 'error'); }, true);
  document.addEventListener('securitypolicyviolation', function (e) {
    error('refused ' + e.blockedURI);
  });
  window.addEventListener('load', function () {
    var images = document.images, drawn = 0;
    for (var i = 0; i < images.length; i++) {
      if (images[i].complete && images[i].naturalWidth > 0) { drawn++; }
    }
    root.setAttribute('data-images', drawn + '/' + images.length);
    root.setAttribute('data-rendered', 'yes');
  });
})();
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, left: int = 1,
          css_id: str | None = None, classes: Sequence[str] = ()) -> str:
    """An HTML table: the first `left` columns left-aligned, the rest right-aligned."""
    def cell(tag: str, i: int, value: Any) -> str:
        align = ' class="l"' if i < left else ""
        return f"<{tag}{align}>{esc(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        cls = f' class="{classes[n]}"' if n < len(classes) and classes[n] else ""
        body.append(f"<tr{cls}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    ident = f' id="{esc(css_id)}"' if css_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def image(fig: Any, alt: str, css_id: str) -> str:
    """A matplotlib figure as an inline PNG."""
    from perfmodel.plot import figure_bytes

    data = base64.b64encode(figure_bytes(fig, "png")).decode("ascii")
    return f'<img id="{esc(css_id)}" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """The whole document: sections are (id, heading, inner HTML)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        made_by = f"perfmodel {version('perfmodel')}"
    except PackageNotFoundError:
        made_by = "perfmodel"
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "".join(f'<section id="{esc(i)}"><h2>{esc(h)}</h2>{inner}</section>'
                   for i, h, inner in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style><script>{SCRIPT}</script>"
            f'</head><body><h1 id="title">{esc(title)}</h1><p class="sub">{esc(subtitle)}</p>'
            f"{body}<footer>made by {esc(made_by)} on {stamp}; every number is the model's "
            "prediction for the plan shown (perfmodel explain prints its formulas)</footer>"
            "</body></html>\n")


# --- the parts of a prediction -------------------------------------------------------------------


def _plan_rows(plan: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in plan.to_dict().items()]


def _summary(p: Any) -> str:
    from perfmodel.output import fmt_bytes
    from perfmodel.render import fmt_seconds

    cards = [("step time", fmt_seconds(p.step_time_s)),
             ("tokens/s", fmt_fixed(p.tokens_per_s, ',.0f')),
             ("MFU", fmt_fixed(p.mfu, ".1%")),
             ("TFLOP/s per GPU", fmt_fixed(p.tflops_per_gpu, '.1f')),
             ("memory per GPU", f"{fmt_bytes(p.memory_per_gpu_bytes)} of "
                                f"{fmt_bytes(p.memory_capacity_bytes)}"),
             ("fits in memory", {"fits": "yes", "tight": "tight: only without the "
                                 "allocator's fragmentation margin"}.get(p.memory_verdict, "NO")),
             ("micro-batches", str(p.micro_batches)),
             ("slowest stage", p.bottleneck_stage)]
    return '<div class="cards" id="summary-cards">' + "".join(
        f'<div class="card">{esc(k)}<b>{esc(v)}</b></div>' for k, v in cards) + "</div>"


def _breakdown(p: Any, css_id: str = "breakdown-table") -> str:
    from perfmodel.plot import breakdown_axes
    from perfmodel.render import fmt_seconds, fmt_share

    rows = [(k, fmt_seconds(v), fmt_share(v, p.step_time_s))
            for k, v in p.breakdown_s.items() if v > 0]
    rows.append(("total", fmt_seconds(p.step_time_s), "100.0%"))
    return (table(("term", "time", "share"), rows, css_id=css_id)
            + image(breakdown_axes(p).get_figure(), "step-time breakdown", "breakdown-chart"))


def _memory(p: Any) -> str:
    from perfmodel.output import fmt_bytes
    from perfmodel.plot import memory_axes

    rows = [(k, fmt_bytes(v)) for k, v in p.memory_breakdown_bytes.items() if v > 0]
    rows.append(("total", fmt_bytes(p.memory_per_gpu_bytes)))
    return (table(("term", "per GPU"), rows, css_id="memory-table")
            + image(memory_axes(p).get_figure(), "memory per GPU", "memory-chart"))


def _timeline(p: Any) -> str:
    """The Gantt chart of the plan's step, or why there is none (a PlanError's one line)."""
    from perfmodel.errors import PlanError
    from perfmodel.plot import timeline_figure
    from perfmodel.timeline import predicted_timeline

    try:
        tl = predicted_timeline(p.model, p.hardware, p.plan)
    except PlanError as exc:
        return f'<p class="note" id="timeline-missing">no timeline: {esc(exc)}</p>'
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in tl.notes)
    return (f"<p>Each pipeline stage's passes in the order the {esc(p.plan.schedule.value)} "
            "schedule runs them (F forward, R recompute, B backward, W weight gradient), the "
            "bubbles in grey, then the gradient sync and the optimizer step. "
            "<code>perfmodel predict ... --trace step.json</code> writes the same for "
            "Perfetto (ui.perfetto.dev).</p>" + notes
            + image(timeline_figure([tl]), "timeline of the step", "timeline-chart"))


def _header(p: Any) -> tuple[str, str]:
    pl = p.plan
    title = f"{p.model.name} on {pl.gpus} x {p.hardware.gpu_name} ({p.hardware.name})"
    sub = (f"dp={pl.dp} tp={pl.tp} pp={pl.pp}"
           + (f" cp={pl.cp} ({pl.cp_comm.value})" if pl.cp > 1 else "")
           + (f" ep={pl.ep}" if pl.ep > 1 else "")
           + (f" etp={pl.etp}" if pl.etp > 1 else "")
           + f", micro-batch {pl.micro_batch}, global batch "
           f"{pl.global_batch}, sequence length {p.model.seq_len}, {pl.schedule.value}"
           + (f" v={pl.virtual_stages}" if pl.virtual_stages > 1 else "")
           + f", recompute {pl.recompute.value}, {pl.dtype.value}")
    return title, sub


def prediction_html(p: Any, notes: Sequence[str] = ()) -> str:
    """The report of one prediction (perfmodel.predict.Prediction)."""
    title, sub = _header(p)
    sections = [
        ("plan", "The plan", table(("field", "value"), _plan_rows(p.plan), left=2,
                                   css_id="plan-table")),
        ("summary", "Summary", _summary(p)),
        ("breakdown", "Step time breakdown", _breakdown(p)),
        ("memory", "Memory per GPU", _memory(p)),
        ("timeline", "Timeline of one step", _timeline(p)),
    ]
    if notes:
        sections.append(("notes", "Notes", "".join(f'<p class="note">{esc(n)}</p>'
                                                   for n in notes)))
    return page(f"perfmodel prediction: {title}", sub, sections)


# --- a recommendation -----------------------------------------------------------------------------


def _plans_table(rec: Any, data: Mapping[str, Any]) -> str:
    """The best plans; with --tokens / --gpu-hour-price their time to train, GPU-hours and cost
    (the command's JSON entries, perfmodel.recommend.training_budget)."""
    from perfmodel.output import fmt_bytes
    from perfmodel.render import fmt_duration, fmt_price, fmt_seconds, overlaps

    entries = list(data.get("plans") or [{} for _ in rec.top])
    budget = [(key, label, fmt) for key, label, fmt in (
        ("time_to_train_s", "time to train", fmt_duration), ("gpu_hours", "GPU-hours",
                                                             lambda x: fmt_fixed(x, ',.0f')),
        ("cost", "cost", fmt_price), ("cost_per_step", "cost/step", fmt_price))
        if entries and key in entries[0]]
    rows = []
    for rank, (p, entry) in enumerate(zip(rec.top, entries, strict=False), start=1):
        pl = p.plan
        sched = pl.schedule.value + (f" v={pl.virtual_stages}" if pl.virtual_stages > 1 else "")
        cp = f"{pl.cp} {pl.cp_comm.value}" if pl.cp > 1 else str(pl.cp)
        rows.append((rank, pl.gpus, pl.dp, pl.tp, pl.tp_layout.value, pl.pp, cp, pl.ep, pl.etp,
                     pl.micro_batch, sched, pl.recompute.value,
                     "yes" if pl.sequence_parallel else "", pl.zero, overlaps(pl, p.model),
                     ",".join(pl.placement), fmt_seconds(p.step_time_s),
                     fmt_fixed(p.tokens_per_s, ",.0f"), fmt_fixed(p.mfu, ".1%"),
                     fmt_bytes(p.memory_per_gpu_bytes),
                     *(fmt(entry[key]) for key, _, fmt in budget)))
    headers = ("#", "GPUs", "dp", "tp", "layout", "pp", "cp", "ep", "etp", "mb", "schedule",
               "recompute", "sp", "zero", "overlap", "placement", "step time", "tokens/s", "MFU",
               "memory/GPU",
               *(label for _, label, _ in budget))
    return table(headers, rows, left=0, css_id="plans-table", classes=["best"])


def _runner_up(rec: Any) -> str:
    from perfmodel.output import fmt_bytes
    from perfmodel.render import fmt_seconds

    if len(rec.top) < 2:
        return '<p id="runner-up-none">only one plan was found: there is no runner-up.</p>'
    info = rec.explanation.get("runner_up", {})
    best, second = rec.top[0], rec.top[info.get("rank", 2) - 1]
    names = list(dict.fromkeys([*best.breakdown_s, *second.breakdown_s]))
    rows = []
    for name in names:
        a, b = best.breakdown_s.get(name, 0.0), second.breakdown_s.get(name, 0.0)
        if a or b:
            rows.append((name, fmt_seconds(a), fmt_seconds(b),
                         f"{fmt_fixed((b - a) * 1e3, '+.3f')} ms"))
    rows.append(("step time", fmt_seconds(best.step_time_s), fmt_seconds(second.step_time_s),
                 f"{fmt_fixed((second.step_time_s - best.step_time_s) * 1e3, '+.3f')} ms"))
    rows.append(("memory per GPU", fmt_bytes(best.memory_per_gpu_bytes),
                 fmt_bytes(second.memory_per_gpu_bytes),
                 fmt_bytes(second.memory_per_gpu_bytes - best.memory_per_gpu_bytes, signed=True)))
    trades = ", ".join(info.get("trades", []))
    return (f"<p>best: {esc(rec.explanation.get('best', ''))}<br>runner-up: "
            f"{esc(info.get('plan', ''))}" + (f"<br>it trades {esc(trades)}" if trades else "")
            + "</p>" + table(("term", "best", "runner-up", "runner-up - best"), rows,
                             css_id="runner-up-table"))


def _curve(rec: Any) -> str:
    from perfmodel.output import fmt_bytes
    from perfmodel.render import fmt_seconds

    rows = [(r["micro_batch"], fmt_seconds(r["step_time_s"]), fmt_fixed(r['tokens_per_s'], ',.0f'),
             fmt_bytes(r["memory_per_gpu_bytes"]), "yes" if r["fits"] else "no (memory limit)")
            for r in rec.explanation.get("micro_batch_curve", [])]
    return table(("micro-batch", "step time", "tokens/s", "memory/GPU", "fits"), rows, left=0,
                 css_id="curve-table")


def recommendation_html(rec: Any, data: Mapping[str, Any]) -> str:
    """The report of a recommendation (perfmodel.recommend.Recommendation and the command's
    data: model, search figures)."""
    from perfmodel.errors import DataError
    from perfmodel.plot import pareto_axes
    from perfmodel.recommend import memory_limit_line

    r = rec.result
    search = (f"searched {r.enumerated:,} plans ({r.evaluated:,} evaluated after the memory "
              f"bound, {r.feasible:,} fit) in {r.search_time_s:.2f} s; objective "
              f"{r.request.objective.value}; {memory_limit_line(r)}")
    model = data.get("model", "")
    if not rec.top:
        info = rec.explanation.get("infeasible", {})
        return page(f"perfmodel recommendation: {model}", search,
                    [("no-plan", "No plan fits", f"<p>{esc(info.get('reason', ''))}</p>")])
    best = rec.top[0]
    title, sub = _header(best)
    binding = "".join(f"<li>{esc(line)}</li>" for line in rec.explanation.get("binding", []))
    try:
        pareto = image(pareto_axes(r).get_figure(), "Pareto front", "pareto-chart")
    except DataError as exc:  # nothing evaluated: the section says so
        pareto = f'<p class="note">no Pareto front: {esc(exc)}</p>'
    sections = [
        ("search", "The search", f"<p>{esc(search)}</p>"),
        ("plans", "Best plans", _plans_table(rec, data)),
        ("plan", "The best plan", table(("field", "value"), _plan_rows(best.plan), left=2,
                                        css_id="plan-table")),
        ("summary", "Summary", _summary(best)),
        ("binding", "What binds it", f"<ul>{binding}</ul>"),
        *_wins(rec),
        ("breakdown", "Step time breakdown", _breakdown(best)),
        ("memory", "Memory per GPU", _memory(best)),
        ("timeline", "Timeline of one step", _timeline(best)),
        ("runner-up", "Runner-up comparison", _runner_up(rec)),
        ("pareto", "Pareto front: step time against memory", pareto),
        ("curve", "Throughput against micro-batch size", _curve(rec)),
    ]
    return page(f"perfmodel recommendation: {title}", sub, sections)


def _wins(rec: Any) -> list[tuple[str, str, str]]:
    """The section saying what FP8, context and expert parallelism do for the best plan (the
    terminal's "FP8:" line and "what context / expert parallelism does"), where the explanation
    has them."""
    lines = [rec.explanation["fp8"]["says"]] if "fp8" in rec.explanation else []
    lines += [w["note"] for w in rec.explanation.get("parallelism", [])]
    if not lines:
        return []
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return [("wins", "What FP8 and context / expert parallelism do", f"<ul>{items}</ul>")]


def write_html(path: Any, text: str) -> None:
    from perfmodel.files import write_atomic

    write_atomic(path, text, what="HTML report")
