"""Readable output for the terminal (rich tables)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from perfmodel.output import json_text
from perfmodel.predict import Prediction


def _console() -> Console:
    import sys

    # piped output is not cut to 80 columns: tables stay whole in files and logs
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def fmt_seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: float) -> str:
    """A parameter count: 8.03B, 596.0M, 124.4M, 65,536."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n:,.0f}"


def model_line(name: str, source: str, parameters: float, seq_len: int, seq_len_from: str) -> str:
    """The header line naming the model: where it was read, its parameters, its sequence length
    and where that length came from."""
    return (f"model {name} from {source or 'Python'}: {fmt_count(parameters)} parameters, "
            f"sequence length {seq_len} (from {seq_len_from or 'the model'})")


def print_prediction(r: Prediction) -> None:
    con = _console()
    p = r.plan
    m = r.model
    con.print(model_line(m.name, m.origin, r.parameters, m.seq_len, m.seq_len_from), markup=False)
    con.print(f"[bold]{r.model.name}[/] on [bold]{p.gpus} x {r.hardware.gpu_name}[/] "
              f"({r.hardware.name}): dp={p.dp} tp={p.tp} pp={p.pp}, micro-batch {p.micro_batch}, "
              f"global batch {p.global_batch} ({r.micro_batches} micro-batches), {p.schedule}"
              + (f" v={p.virtual_stages}" if p.virtual_stages > 1 else "")
              + f", recompute {p.recompute}" + (", sequence parallel" if p.sequence_parallel else "")
              + (f", ZeRO-{p.zero}" if p.zero else "") + f", {p.dtype}")
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_row("step time", fmt_seconds(r.step_time_s))
    summary.add_row("throughput", f"{r.samples_per_s:,.2f} samples/s, {r.tokens_per_s:,.0f} tokens/s")
    summary.add_row("model FLOPs / step", f"{r.model_flops_per_step:.3e}")
    summary.add_row("per GPU", f"{r.tflops_per_gpu:.1f} TFLOP/s, MFU {r.mfu * 100:.1f}%")
    fits = "fits" if r.fits_in_memory else "[red]does NOT fit[/]"
    summary.add_row("memory per GPU", f"{fmt_bytes(r.memory_per_gpu_bytes)} of "
                    f"{fmt_bytes(r.memory_capacity_bytes)}: {fits}")
    con.print(summary)
    table = Table(title=f"step time breakdown (slowest stage: {r.bottleneck_stage})")
    table.add_column("term")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for name, t in r.breakdown_s.items():
        if t > 0:
            table.add_row(name, fmt_seconds(t), f"{t / r.step_time_s * 100:.1f}%")
    table.add_row("[bold]total[/]", f"[bold]{fmt_seconds(r.step_time_s)}[/]", "100.0%")
    con.print(table)
    mem = Table(title="memory per GPU")
    mem.add_column("term")
    mem.add_column("bytes", justify="right")
    for name, nbytes in r.memory_breakdown_bytes.items():
        if nbytes > 0:
            mem.add_row(name, fmt_bytes(nbytes))
    mem.add_row("[bold]total[/]", f"[bold]{fmt_bytes(r.memory_per_gpu_bytes)}[/]")
    con.print(mem)


def print_collective(res: dict[str, Any]) -> None:
    con = _console()
    con.print(f"{res['op']} of {fmt_bytes(res['bytes'])} over {res['ranks']} ranks "
              f"({res['ranks_per_node']} per node, {res['scope']}) on {res['hardware']}")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("time", fmt_seconds(res["time_s"]))
    protocol = f" ({res['protocol']} protocol)" if res.get("protocol") else ""
    table.add_row("algorithm", res["algorithm"] + protocol)
    if res["algbw_bytes_per_s"] is None:  # one rank: nothing moves
        table.add_row("algbw", "n/a (one rank moves nothing)")
        table.add_row("busbw", "n/a")
    else:
        table.add_row("algbw", f"{res['algbw_bytes_per_s'] / 1e9:.2f} GB/s")
        table.add_row("busbw", f"{res['busbw_bytes_per_s'] / 1e9:.2f} GB/s "
                      f"(factor {res['bus_factor']:.3f})")
    con.print(table)
    options = res.get("by_option_s") or res["by_algorithm_s"]
    if len(options) > 1:
        other = Table(title="by algorithm / protocol")
        other.add_column("algorithm / protocol")
        other.add_column("time", justify="right")
        for alg, t in sorted(options.items(), key=lambda kv: kv[1]):
            other.add_row(alg, fmt_seconds(t))
        con.print(other)


def print_presets(as_json: bool) -> None:
    from perfmodel.specs import list_presets, load_hardware, load_model

    names = list_presets()
    if as_json:
        print(json_text(names))
        return
    con = _console()
    hw = Table(title="hardware presets")
    for col in ("name", "GPU", "GPUs/node", "memory", "bf16 peak", "intra-node", "inter-node/node"):
        hw.add_column(col)
    for name in names["hardware"]:
        h = load_hardware(name)
        peak = h.peak_flops_per_s.get("bf16") or h.peak_flops_per_s.get("fp16", 0)
        hw.add_row(name, h.gpu_name, str(h.gpus_per_node), fmt_bytes(h.memory_bytes),
                   f"{peak / 1e12:.0f} TFLOP/s", f"{h.intra_node.bandwidth_bytes_per_s / 1e9:.0f} GB/s",
                   f"{h.inter_node.bandwidth_bytes_per_s / 1e9:.0f} GB/s")
    con.print(hw)
    md = Table(title="model presets")
    for col in ("name", "layers", "hidden", "heads", "kv", "ffn", "seq", "vocab", "source"):
        md.add_column(col)
    graphs = Table(title="layer-graph presets (Pr x Pc grid)")
    for col in ("name", "layers", "parameters", "GFLOPs / sample", "input", "source"):
        graphs.add_column(col)
    for name in names["models"]:
        m = load_model(name)
        if getattr(m, "kind", "") == "layers":
            graphs.add_row(name, str(len(m.layers)), f"{m.parameters / 1e6:.1f}M",
                           f"{m.flops_per_sample / 1e9:.2f}", "x".join(map(str, m.input_shape)),
                           m.source)
            continue
        md.add_row(name, str(m.layers), str(m.hidden), str(m.heads), str(m.kv_heads),
                   str(m.ffn_hidden), str(m.seq_len), str(m.vocab), m.source)
    con.print(md)
    con.print(graphs)


def print_recommendation(rec: Any, data: dict[str, Any]) -> None:
    con = _console()
    r = rec.result
    from perfmodel.recommend import memory_limit_line

    if "parameters" in data:
        con.print(model_line(data["model"], data["model_source"], data["parameters"],
                             data["seq_len"], data["seq_len_from"]), markup=False)
    con.print(f"searched {r.enumerated:,} plans ({r.evaluated:,} evaluated after the memory bound, "
              f"{r.feasible:,} fit) in {r.search_time_s:.2f} s; objective "
              f"{r.request.objective.value}")
    con.print(memory_limit_line(r))
    if not rec.top:
        info = rec.explanation["infeasible"]
        con.print(f"[red]no plan[/]: {info['reason']}")
        for near in info["nearest"]:
            when = (f", {fmt_seconds(near['step_time_s'])} per step" if near["step_time_s"] is not None
                    else " (model states alone)")
            con.print(f"  nearest: {near['plan']}: {fmt_bytes(near['memory_per_gpu_bytes'])} per GPU{when}")
        return
    table = Table(title="best plans")
    for col in ("#", "dp", "tp", "layout", "pp", "mb", "schedule", "recompute", "sp", "zero",
                "placement", "step time", "tokens/s", "MFU", "memory/GPU"):
        left = col in ("layout", "schedule", "recompute", "placement")
        table.add_column(col, justify="left" if left else "right")
    for rank, p in enumerate(rec.top, start=1):
        pl = p.plan
        sched = pl.schedule.value + (f" v={pl.virtual_stages}" if pl.virtual_stages > 1 else "")
        layout = pl.tp_layout.value + (f" d={pl.tp_depth}" if pl.tp_depth > 1 else "")
        table.add_row(str(rank), str(pl.dp), str(pl.tp), layout, str(pl.pp), str(pl.micro_batch), sched,
                      pl.recompute.value, "yes" if pl.sequence_parallel else "", str(pl.zero),
                      ",".join(pl.placement), fmt_seconds(p.step_time_s), f"{p.tokens_per_s:,.0f}",
                      f"{p.mfu:.1%}", fmt_bytes(p.memory_per_gpu_bytes))
    con.print(table)
    best = rec.top[0]
    breakdown = Table(title=f"best plan: {rec.explanation['best']}")
    breakdown.add_column("term")
    breakdown.add_column("time", justify="right")
    breakdown.add_column("share", justify="right")
    for name, t in best.breakdown_s.items():
        if t > 0:
            breakdown.add_row(name, fmt_seconds(t), f"{t / best.step_time_s:.1%}")
    con.print(breakdown)
    con.print("[bold]what binds it[/]")
    for line in rec.explanation["binding"]:
        con.print(f"  - {line}")
    if "runner_up" in rec.explanation:
        ru = rec.explanation["runner_up"]
        con.print(f"[bold]runner-up[/] {ru['plan']}: slower by {fmt_seconds(ru['slower_by_s'])}, "
                  f"memory {ru['memory_delta_bytes'] / 2**30:+.1f} GiB; trades "
                  + ", ".join(ru["trades"]))
    curve = Table(title="throughput against micro-batch size (same layout)")
    for col in ("micro-batch", "step time", "tokens/s", "memory/GPU", "fits"):
        curve.add_column(col, justify="right")
    for row in rec.explanation["micro_batch_curve"]:
        curve.add_row(str(row["micro_batch"]), fmt_seconds(row["step_time_s"]),
                      f"{row['tokens_per_s']:,.0f}", fmt_bytes(row["memory_per_gpu_bytes"]),
                      "yes" if row["fits"] else "[red]no (memory limit)[/]")
    con.print(curve)
    if "sensitivities" in data:
        sens = Table(title="sensitivity of the step time (elasticity: % change per +1%)")
        sens.add_column("hardware parameter")
        sens.add_column("elasticity", justify="right")
        for name, value in sorted(data["sensitivities"].items(), key=lambda kv: kv[1]):
            sens.add_row(name, f"{value:+.3f}")
        con.print(sens)
    if "what_if" in data and data["what_if"]["best"]:
        w = data["what_if"]
        plan = w["best"]["plan"]
        con.print(f"[bold]what if[/] {', '.join(w['changes'])}: best becomes dp={plan['dp']} "
                  f"tp={plan['tp']} pp={plan['pp']} mb={plan['micro_batch']} {plan['schedule']}, "
                  f"{fmt_seconds(w['best']['step_time_s'])} per step ({w['speedup']:.3f}x)")
    if "validation" in data:
        v = data["validation"]
        for caveat in v.get("caveats") or []:  # first: why the numbers below do not compare
            con.print(f"[bold]validation[/] cannot be compared: {caveat}")
        if v.get("measured_step_time_s") is None:
            con.print(f"[bold]validation[/] of the scaled-down plan: {v.get('status')}")
        else:
            con.print(f"[bold]validation[/] of the best plan scaled down to {v['ranks']} {v['backend']} "
                      f"ranks: predicted {fmt_seconds(v['predicted_step_time_s'])}, measured "
                      f"{fmt_seconds(v['measured_step_time_s'])} ({v['relative_error']:+.1%})")


def print_grid_prediction(r: Any) -> None:
    con = _console()
    p = r.plan
    con.print(f"[bold]{r.model.name}[/] on [bold]{p.gpus} x {r.hardware.gpu_name}[/]: Pr={p.pr} "
              f"(model) x Pc={p.pc} (data), batch {p.global_batch}, norm {p.norm.value}, "
              f"collectives {p.variant.value}, {p.dtype}")
    con.print(f"step time {fmt_seconds(r.step_time_s)}, {r.samples_per_s:,.1f} samples/s, "
              f"MFU {r.mfu:.1%}, memory per GPU {fmt_bytes(r.memory_per_gpu_bytes)} "
              + ("(fits)" if r.fits_in_memory else "[red](does NOT fit)[/]"))
    narrow = {name: c for name, c in getattr(r, "layer_degrees", {}).items() if c < p.pr}
    if narrow:
        con.print(f"layers with fewer units than Pr, split over c = min(Pr, units) ranks "
                  f"(collectives with c contributors, Pr receivers: {p.contributors.value}): "
                  + ", ".join(f"{name} c={c}" for name, c in narrow.items()))
    table = Table(title="step time breakdown")
    table.add_column("term")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for name, t in r.breakdown_s.items():
        table.add_row(name, fmt_seconds(t), f"{t / r.step_time_s:.1%}")
    con.print(table)


def print_frame(frame: Any, title: str) -> None:
    con = _console()
    table = Table(title=title)
    columns = [c for c in frame.columns if not c.startswith("time:")]
    for col in columns:
        table.add_column(col, justify="right")
    for _, row in frame.iterrows():
        cells = []
        for col in columns:
            value = row[col]
            if col == "step_time_s":
                cells.append(fmt_seconds(value))
            elif col in ("mfu", "communication_share"):
                cells.append(f"{value:.1%}")
            elif isinstance(value, float):
                cells.append(f"{value:.4g}")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    con.print(table)


def print_grid_recommendation(plans: list[Any], evaluated: int, seconds: float) -> None:
    con = _console()
    con.print(f"evaluated {evaluated} Pr x Pc plans in {seconds:.2f} s")
    if not plans:
        con.print("[red]no plan fits in memory[/]")
        return
    table = Table(title="best plans (layer graph on a Pr x Pc grid)")
    for col in ("#", "Pr", "Pc", "norm", "collectives", "step time", "samples/s", "MFU",
                "communication", "memory/GPU"):
        table.add_column(col, justify="right")
    for rank, r in enumerate(plans, start=1):
        comm = sum(v for k, v in r.breakdown_s.items() if k.startswith("comm/"))
        table.add_row(str(rank), str(r.plan.pr), str(r.plan.pc), r.plan.norm.value,
                      r.plan.variant.value, fmt_seconds(r.step_time_s), f"{r.samples_per_s:,.0f}",
                      f"{r.mfu:.1%}", f"{comm / r.step_time_s:.1%}", fmt_bytes(r.memory_per_gpu_bytes))
    con.print(table)
