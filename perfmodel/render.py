"""Readable output for the terminal (rich tables).

Width: a terminal's own (rich reads COLUMNS, then asks the terminal); in a pipe or a file,
COLUMNS when it is set, else 100 columns. Tables wider than that are laid out again (recommend's
plans: one table, then two, then two without vertical rules) rather than cut; text wraps between
words.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from perfmodel.encode import compute_dtype
from perfmodel.output import degrees_text, document, fmt_bytes, fmt_fixed, json_text
from perfmodel.predict import Prediction

PIPE_WIDTH = 100  # columns of output that goes to a pipe or a file, when COLUMNS is not set
MIN_WIDTH = 40  # narrower than this, rich cuts words: lay out for 40 columns



def _recompute_method(p: Any, model: Any = None) -> str:
    """Full recompute's Megatron method where it is not uniform 1 ('' otherwise), with what a
    count beyond a chunk's layers does (Megatron-Core stops each group and the block at the
    chunk's end: one group of the chunk, every layer of it)."""
    method, k = _value(getattr(p, "recompute_method", "uniform")), \
        getattr(p, "recompute_num_layers", 1)
    chunk = getattr(model, "layers", 0) // max(1, p.pp * p.virtual_stages)
    beyond = method in ("block", "uniform") and k > 1 and 0 < chunk < k
    if method == "block":
        return f" (block: the first {k} layers of each chunk" \
            + (f"; a chunk holds {chunk}: every one)" if beyond else ")")
    if k <= 1:
        return ""
    return f" (uniform: groups of {k} layers" \
        + (f"; a chunk holds {chunk}: one group of {chunk})" if beyond else ")")

def console_width() -> int | None:
    """The width to lay output out for: None in a terminal (rich takes COLUMNS, else the
    terminal's size); in a pipe or a file, COLUMNS when it is a whole number, else PIPE_WIDTH."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    return max(MIN_WIDTH, int(columns)) if columns.isdigit() else PIPE_WIDTH


def console() -> Console:
    """The console every command prints its tables with (console_width's width)."""
    return Console(highlight=False, soft_wrap=False, width=console_width())


# A time below a nanosecond is printed as 0: it is what a smooth max leaves of a host time the
# device hides whole (overhead/kernels of 4e-14 s beside a 1.4 s step), not time a step spends,
# and no clock resolves it (fmt_fixed otherwise prints a nonzero value with its digits)
NEGLIGIBLE_S = 1e-9


def fmt_seconds(t: float) -> str:
    if abs(t) < NEGLIGIBLE_S:
        t = 0.0
    if abs(t) >= 1:  # the unit by the size, whatever the sign (a difference)
        return f"{fmt_fixed(t, '.3f')} s"
    if abs(t) >= 1e-3:
        return f"{fmt_fixed(t * 1e3, '.2f')} ms"
    return f"{fmt_fixed(t * 1e6, '.1f')} us"


def fmt_share(t: float, total: float) -> str:
    """A term's share of the step, t / total, as a percentage (0 for a negligible t, as
    fmt_seconds prints it)."""
    return fmt_fixed(t / total if abs(t) >= NEGLIGIBLE_S else 0.0, ".1%")


def fmt_duration(t: float) -> str:
    """A time to train: seconds below 2 minutes, then minutes, hours, days."""
    if t < 120:
        return fmt_seconds(t)
    if t < 2 * 3600:
        return f"{fmt_fixed(t / 60, '.1f')} min"
    if t < 2 * 86400:
        return f"{fmt_fixed(t / 3600, '.1f')} h"
    return f"{fmt_fixed(t / 86400, ',.1f')} days"


def fmt_price(x: float) -> str:
    """A price in the units of --gpu-hour-price: whole units from 100 on, else cents."""
    return fmt_fixed(x, ',.0f') if abs(x) >= 100 else fmt_fixed(x, ',.2f')


def fmt_count(n: float) -> str:
    """A parameter count: 8.03B, 596.0M, 124.4M, 65,536."""
    if n >= 1e9:
        return f"{fmt_fixed(n / 1e9, '.2f')}B"
    if n >= 1e6:
        return f"{fmt_fixed(n / 1e6, '.1f')}M"
    return fmt_fixed(n, ',.0f')


def model_line(name: str, source: str, parameters: float, seq_len: int, seq_len_from: str,
               mtp: float = 0.0) -> str:
    """The header line naming the model: where it was read, its parameters (and its
    multi-token-prediction modules', apart), its sequence length and where that length came from
    (when not from the same place as the model)."""
    source = source or "Python"
    origin = "" if seq_len_from in ("", source) else f" (from {seq_len_from})"
    modules = f" (+ {fmt_count(mtp)} in multi-token prediction)" if mtp else ""
    return (f"model {name} from {source}: {fmt_count(parameters)} parameters{modules}, "
            f"sequence length {seq_len}{origin}")


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _value(option: Any) -> str:
    """An enum option's name as the command line spells it."""
    return str(getattr(option, "value", option))


def layout_text(plan: Any) -> str:
    """The tensor layout of a plan: 1d (Megatron), 2d, 2.5d with its depth, 3d."""
    layout = _value(plan.tp_layout)
    return f"{layout} d={plan.tp_depth}" if plan.tp_depth > 1 else layout


def plan_lines(p: Any, hardware: Any, micro_batches: int, model: Any) -> list[str]:
    """The header of a prediction under the model line (which names the sequence length): the
    hardware and precision, the layout (degrees, tensor layout, placement, sequence parallelism,
    ZeRO) and the schedule (micro-batch, global batch, recompute, options)."""
    layout = [degrees_text(p), f"tensor layout {layout_text(p)}",
              f"placement {','.join(p.placement)}"]
    if p.sequence_parallel:
        layout.append("sequence parallel")
    if p.zero:
        layout.append(f"ZeRO-{p.zero}")
    schedule = [_value(p.schedule) + (f" v={p.virtual_stages}" if p.virtual_stages > 1 else ""),
                f"micro-batch {p.micro_batch}",
                f"global batch {p.global_batch} "
                f"({_plural(micro_batches, 'micro-batch', 'micro-batches')})",
                f"recompute {_value(p.recompute)}"
                + (f" (one layer in {p.recompute_every})" if p.recompute_every > 1 else "")
                + _recompute_method(p, model)]
    offloaded = getattr(p, "cpu_offload_layers", 0)
    if offloaded:
        schedule.append("the first layer's activations offloaded to the host" if offloaded == 1
                        else f"the first {offloaded:,} layers' activations offloaded to the host")
    kernel = getattr(p, "attention_kernel", None)
    if not kernel and p.flash_attention and hasattr(hardware, "flash_kernel"):
        default = hardware.flash_kernel(compute_dtype(p.dtype))  # what the plan is costed with
        kernel = default.name if default is not None else None
    schedule.append(("flash attention" + (f" ({kernel})" if kernel else ""))
                    if p.flash_attention else "unfused attention")
    if p.grad_dtype or p.optimizer_dtype or p.master_weights:
        schedule.append(f"gradients {p.grad_dtype or 'fp32'}, optimizer states "
                        f"{p.optimizer_dtype or 'fp32'}"
                        + (f", master weights {p.master_weights}" if p.master_weights else ""))
    overlapped = overlaps(p, model)
    if overlapped:
        schedule.append(f"overlapped: {overlapped}")
    if getattr(p, "overlap_grad_sync", False) and (
            getattr(p, "dp_bucket_size", None) is not None
            or _value(getattr(p, "dp_bucketing", "megatron")) != "megatron"):
        size = p.dp_bucket_size
        schedule.append("gradient sync in buckets of "
                        + (f"{size:,} parameters" if size else "Megatron-Core's default size")
                        + (" (every parameter bucketed)" if _value(p.dp_bucketing) == "all"
                           else ""))
    if _value(p.stack) != "eager":
        schedule.append(f"{_value(p.stack)} stack")
    if _value(getattr(p, "kernels", "fused")) != "fused":
        schedule.append(f"{_value(p.kernels)} element-wise kernels")
    loss = {"te": "Transformer Engine's fused cross entropy",
            "no-upcast": "cross entropy without an fp32 copy of the logits",
            "torch": "PyTorch's cross entropy on fp32 logits",
            "flash-attn": "flash-attn's fused cross entropy"}
    if _value(getattr(p, "cross_entropy", "unfused")) in loss:
        schedule.append(loss[_value(p.cross_entropy)])
    if _value(getattr(p, "optimizer_kernels", "fused")) == "foreach":
        schedule.append("AdamW by torch's foreach passes")
    if _value(getattr(p, "expert_weighting", "activation")) == "output" \
            and getattr(model, "experts", 0) > 0:  # torchtitan's, of its MoE models only
        schedule.append("routing weights on the experts' outputs")
    if getattr(p, "expandable_segments", False):
        schedule.append("allocator with expandable segments (no fragmentation margin)")
    if p.first_stage_layers or p.last_stage_layers:
        # the stages not given split the rest evenly (Megatron's uneven split)
        given = [n for n in (p.first_stage_layers, p.last_stage_layers) if n]
        others = p.pp - len(given)
        layers = getattr(model, "layers", 0)
        rest = f"{(layers - sum(given)) // max(1, others)}" if layers and others else "-"
        first = p.first_stage_layers or rest
        last = p.last_stage_layers or rest
        middle = f", {rest} on each other stage" if p.pp > 2 else ""
        schedule.append(f"stages' layers {first} first, {last} last{middle}")
    if getattr(p, "pipeline_layout", ""):
        ranks = p.layout.decoder_layers
        between = ("-" if len(ranks) < 3 else f"{ranks[1]} each" if p.layout.middle_layers is None
                   else f"{'/'.join(map(str, ranks[1:-1]))} (each costed as "
                        f"{p.layout.middle_layers}, the slowest)")
        schedule.append(f"pipeline layout {p.pipeline_layout} (layers per rank: {ranks[0]} "
                        f"first, {between} between, {ranks[-1]} last)")
    dtype = _value(p.dtype)
    if p.fp8_recipe is not None:  # an fp8 plan: its recipe, and where the output layer runs
        dtype += (f" ({_value(p.fp8_recipe)} scaling; output layer "
                  f"{'fp8' if p.fp8_output_layer else 'bf16'}"
                  f"{'; FP8 weights' if p.fp8_params else ''})")
    algorithm = getattr(hardware, "collective_algorithm", "auto")  # --collective-algorithm's
    pinned = f", collective algorithm {algorithm}" if algorithm != "auto" else ""
    return [f"hardware: [bold]{p.gpus} x {hardware.gpu_name}[/] ({hardware.name}), {dtype}"
            + pinned,
            "layout: " + ", ".join(layout), "schedule: " + ", ".join(schedule)]


def overlaps(plan: Any, model: Any) -> str:
    """A plan's overlaps in short: tp (TP communication with the GEMMs), grad (gradient sync with
    backward), param (parameter gather with forward), ep (the all-to-alls with another
    micro-batch); grad and param only where the plan syncs over more than one rank (a plan read
    from a config may say so with dp 1: nothing is overlapped)."""
    from perfmodel.strategy import sync_ranks

    synced = sync_ranks(plan, model) > 1
    return "+".join(name for name, on in (("tp", plan.tp_comm_overlap),
                                          ("grad", plan.overlap_grad_sync and synced),
                                          ("param", plan.overlap_param_gather and synced),
                                          ("ep", getattr(plan, "ep_comm_overlap", False))) if on)


def print_prediction(r: Prediction) -> None:
    con = console()
    p = r.plan
    m = r.model
    con.print(model_line(m.name, m.origin, r.parameters, m.seq_len, m.seq_len_from,
                         r.mtp_parameters), markup=False)
    for line in plan_lines(p, r.hardware, r.micro_batches, r.model):
        con.print(line)
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_row("step time", fmt_seconds(r.step_time_s))
    summary.add_row("throughput",
                    f"{fmt_fixed(r.samples_per_s, ',.2f')} samples/s, "
                    f"{fmt_fixed(r.tokens_per_s, ',.0f')} tokens/s")
    summary.add_row("model FLOPs / step", f"{r.model_flops_per_step:.3e}")
    # MFU in Megatron-LM's convention (the causal attention core counted as half; docs/model.md),
    # the full-attention (torchtitan) count beside it
    # a windowed model's whole count holds the s^2 scores its windowed layers skip: past the
    # window it can exceed the peak, which the line says rather than leave it unexplained
    window = getattr(m, "sliding_window", None)
    skipped = ", the windows' skipped scores counted" \
        if r.mfu_full_attention > 1 and window is not None and window < m.seq_len else ""
    summary.add_row("per GPU", f"{fmt_fixed(r.tflops_per_gpu, '.1f')} TFLOP/s, "
                    f"MFU {fmt_fixed(r.mfu * 100, '.1f')}% (Megatron's count; "
                    f"{fmt_fixed(r.mfu_full_attention * 100, '.1f')}% with attention whole"
                    f"{skipped})"
                    + (f"; {fmt_fixed(r.mfu_fp8_peak * 100, '.1f')}% of the FP8 peak"
                       if r.mfu_fp8_peak is not None else ""))
    summary.add_row("memory per GPU", f"{fmt_bytes(r.memory_per_gpu_bytes)} of "
                    f"{fmt_bytes(r.memory_capacity_bytes)}: {memory_verdict_text(r)}")
    con.print(summary)
    table = Table(title=f"step time breakdown (slowest stage: {r.bottleneck_stage})")
    table.add_column("term")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for name, t in r.breakdown_s.items():
        if t > 0:
            table.add_row(name, fmt_seconds(t), fmt_share(t, r.step_time_s))
    table.add_row("[bold]total[/]", f"[bold]{fmt_seconds(r.step_time_s)}[/]", "100.0%")
    con.print(table)
    if r.hidden_s:
        hidden = Table(title="hidden (not in the step time): communication behind compute, "
                             "host dispatch behind the device's work")
        hidden.add_column("term")
        hidden.add_column("hidden", justify="right")
        hidden.add_column("exposed", justify="right")
        for name, t in r.hidden_s.items():
            hidden.add_row(f"{name}:hidden", fmt_seconds(t), fmt_seconds(r.breakdown_s[name]))
        con.print(hidden)
    mem = Table(title="memory per GPU")
    mem.add_column("term")
    mem.add_column("bytes", justify="right")
    for name, nbytes in r.memory_breakdown_bytes.items():
        if nbytes > 0:
            mem.add_row(name, fmt_bytes(nbytes))
    mem.add_row("[bold]total[/]", f"[bold]{fmt_bytes(r.memory_per_gpu_bytes)}[/]")
    con.print(mem)


def print_collective(res: dict[str, Any]) -> None:
    con = console()
    con.print(f"{res['op']} of {fmt_bytes(res['bytes'])} over {res['ranks']} "
              f"rank{'s' if res['ranks'] != 1 else ''} "
              f"({res['ranks_per_node']} per node, {res['scope']}) on {res['hardware']}")
    if res.get("scope") != "intra" and res.get("fabric_level"):  # (a level may be named node)
        con.print(f"reaches the fabric's {res['fabric_level']} level, priced on its slowest "
                  f"level crossed: {res['priced_on']}")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("time", fmt_seconds(res["time_s"]))
    protocol = f" ({res['protocol']} protocol)" if res.get("protocol") else ""
    table.add_row("algorithm", res["algorithm"] + protocol)
    if res["algbw_bytes_per_s"] is None:  # one rank: nothing moves
        table.add_row("algbw", "n/a (one rank moves nothing)")
        table.add_row("busbw", "n/a")
    else:
        table.add_row("algbw", f"{fmt_fixed(res['algbw_bytes_per_s'] / 1e9, '.2f')} GB/s")
        table.add_row("busbw", f"{fmt_fixed(res['busbw_bytes_per_s'] / 1e9, '.2f')} GB/s "
                      f"(factor {fmt_fixed(res['bus_factor'], '.3f')})")
    con.print(table)
    options = res.get("by_option_s") or res["by_algorithm_s"]
    if len(options) > 1:
        other = Table(title="by algorithm / protocol")
        other.add_column("algorithm / protocol")
        other.add_column("time", justify="right")
        for alg, t in sorted(options.items(), key=lambda kv: kv[1]):
            other.add_row(alg, fmt_seconds(t))
        con.print(other)


# a mixture of experts' active count in the presets table, marked by what its card leaves out
# (TransformerSpec.active_count)
_ACTIVE_MARKS = {"all": "", "no_embedding": "*", "no_embeddings": "**"}
_ACTIVE_NOTES = {"*": "without the embedding table", "**": "without the embedding table and the "
                 "output layer"}


def preset_parameters(model: Any) -> dict[str, float]:
    """A model preset's parameters, active parameters and its multi-token-prediction modules'
    (perfmodel.params; a layer graph's parameters, all active)."""
    if getattr(model, "kind", "") == "layers":
        return {"parameters": float(model.parameters), "active_parameters": float(model.parameters),
                "mtp_parameters": 0.0}
    from perfmodel.params import parameter_counts

    counts = parameter_counts(model)
    return {"parameters": float(counts.total), "active_parameters": float(counts.reported),
            "mtp_parameters": float(counts.mtp)}


def print_presets(as_json: bool) -> None:
    from perfmodel.specs import list_presets, load_hardware, load_model

    names = list_presets()
    if as_json:
        by_model = {name: preset_parameters(load_model(name)) for name in names["models"]}
        kernels = {name: list(load_hardware(name).flash_attention_names())
                   for name in names["hardware"]}
        print(json_text(document("presets", {**names, "model_parameters": by_model,
                                             "flash_kernels": kernels})))
        return
    con = console()
    hw_rows = []
    for name in names["hardware"]:
        h = load_hardware(name)
        # the 16-bit peak: bf16's, or fp16's (named) on a GPU without bf16 (V100)
        peak = h.peak_flops_per_s.get("bf16") or h.peak_flops_per_s.get("fp16", 0)
        which = "" if "bf16" in h.peak_flops_per_s else " (fp16)"
        hw_rows.append([name, h.gpu_name, str(h.gpus_per_node), fmt_bytes(h.memory_bytes),
                        f"{fmt_fixed(peak / 1e12, '.0f')} TFLOP/s{which}",
                        f"{fmt_fixed(h.intra_node.bandwidth_bytes_per_s / 1e9, '.0f')} GB/s",
                        f"{fmt_fixed(h.inter_node.bandwidth_bytes_per_s / 1e9, '.0f')} GB/s",
                        " > ".join(f"{lv.name} {lv.gpus}" if lv.gpus else lv.name
                                   for lv in h.levels) or "node > network",
                        f"{h.overlap_compute_slowdown:g}",
                        ", ".join(h.flash_attention_names()) or "-"])
    print_fitted(con, "hardware presets", _columns(
        ("name", "GPU", "GPUs/node", "memory", "16-bit peak", "intra-node", "inter-node/node",
         "fabric levels (GPUs)", "overlap slowdown", "flash kernels"),
        hw_rows, right=("GPUs/node", "memory", "16-bit peak", "intra-node", "inter-node/node",
                        "overlap slowdown")))
    models, graphs = [], []
    marks: set[str] = set()
    for name in names["models"]:
        m = load_model(name)
        if getattr(m, "kind", "") == "layers":
            graphs.append([name, str(len(m.layers)), f"{fmt_fixed(m.parameters / 1e6, '.1f')}M",
                           fmt_fixed(m.flops_per_sample / 1e9, ".2f"),
                           "x".join(map(str, m.input_shape)),
                           m.source])
            continue
        counts = preset_parameters(m)
        size = fmt_count(counts["parameters"])
        if counts["active_parameters"] != counts["parameters"]:
            mark = _ACTIVE_MARKS[m.active_count]
            marks.add(mark)
            size += f" ({fmt_count(counts['active_parameters'])} active{mark})"
        if counts["mtp_parameters"]:
            size += f" + {fmt_count(counts['mtp_parameters'])} MTP"
        models.append([name, str(m.layers), str(m.hidden), str(m.heads), str(m.kv_heads),
                       str(m.ffn_hidden), str(m.seq_len), str(m.vocab), size, m.source])
    print_with_sources(con, "model presets", _columns(
        ("name", "layers", "hidden", "heads", "kv", "ffn", "seq", "vocab", "parameters",
         "source"), models, right=("layers", "hidden", "heads", "kv", "ffn", "seq", "vocab",
                                   "parameters")))
    for mark, what in _ACTIVE_NOTES.items():
        if mark in marks:
            con.print(f"{mark} active as the model's card counts them: {what}", soft_wrap=True)
    print_with_sources(con, "layer-graph presets (Pr x Pc grid)", _columns(
        ("name", "layers", "parameters", "GFLOPs / sample", "input", "source"), graphs,
        right=("layers", "parameters", "GFLOPs / sample")))


def _columns(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = ()
             ) -> list[tuple[str, bool, list[str]]]:
    """Rows of cells as print_fitted's columns (left-aligned unless named in `right`)."""
    return [(h, h not in right, [row[i] for row in rows]) for i, h in enumerate(headers)]


def print_with_sources(con: Console, title: str, columns: Sequence[tuple[str, bool, list[str]]],
                       heading: str = "sources") -> None:
    """A table whose last column is long text (a source): whole when it fits; else the table
    without it, then under `heading` one wrapped line per row: first cell, that text."""
    if natural_width(con, _table(title, columns, ruled=True)) <= con.width:
        con.print(_table(title, columns, ruled=True))
        return
    print_fitted(con, title, columns[:-1])
    sources = Table.grid(padding=(0, 1))
    sources.add_column(no_wrap=True)
    sources.add_column()
    for name, source in zip(columns[0][2], columns[-1][2], strict=True):
        sources.add_row(f"  {name}:", source)
    con.print(heading)
    con.print(sources)


OBJECTIVE_UNITS = {"s": "seconds", "price units": "in the units of --gpu-hour-price",
                   "price units per step": "per step, in the units of --gpu-hour-price"}
PLAN_COLUMN_COUNT = 12  # the columns that describe a plan; the rest are what it achieves


def plan_columns(top: Sequence[Any], plans: Sequence[dict[str, Any]]
                 ) -> list[tuple[str, bool, list[str]]]:
    """recommend's table as (header, left-aligned, cells) columns: the plan's options, then its
    step time, throughput, MFU, memory and, with --tokens / --gpu-hour-price, its GPUs, time to
    train, GPU-hours and cost (plans: Recommendation.to_dict's, in the same order as top)."""
    rows = []
    for rank, (p, d) in enumerate(zip(top, plans, strict=True), start=1):
        pl = p.plan
        sched = _value(pl.schedule) + (f" v={pl.virtual_stages}" if pl.virtual_stages > 1 else "")
        row = {"#": str(rank), "dp": str(pl.dp), "tp": str(pl.tp), "layout": layout_text(pl),
               "pp": str(pl.pp), "cp": str(pl.cp) + (f" {_value(pl.cp_comm)}" if pl.cp > 1
                                                     else ""),
               "ep": str(pl.ep), "etp": str(pl.etp), "mb": str(pl.micro_batch), "schedule": sched,
               "recompute": _value(pl.recompute), "sp": "yes" if pl.sequence_parallel else "",
               "zero": str(pl.zero), "overlap": overlaps(pl, p.model),
               "placement": ",".join(pl.placement),
               "step time": fmt_seconds(p.step_time_s),
               "tokens/s": fmt_fixed(p.tokens_per_s, ",.0f"),
               "MFU": fmt_fixed(p.mfu, ".1%"), "memory/GPU": fmt_bytes(p.memory_per_gpu_bytes)}
        if "time_to_train_s" in d or "cost_per_step" in d:
            row["GPUs"] = f"{pl.gpus:,}"
        if "time_to_train_s" in d:
            row["time to train"] = fmt_duration(d["time_to_train_s"])
            row["GPU-hours"] = fmt_fixed(d['gpu_hours'], ',.0f')
        if "cost" in d:
            row["cost"] = fmt_price(d["cost"])
        elif "cost_per_step" in d:
            row["cost/step"] = fmt_price(d["cost_per_step"])
        rows.append(row)
    left = {"layout", "schedule", "recompute", "placement", "cp"}
    headers = list(rows[0]) if rows else []
    # context and expert parallelism: their columns only where a plan has them
    headers = [h for h in headers if h not in ("cp", "ep", "etp")
               or any(row[h] != "1" for row in rows)]
    return [(h, h in left, [row[h] for row in rows]) for h in headers]


def _table(title: str, columns: Sequence[tuple[str, bool, list[str]]], ruled: bool) -> Table:
    """The columns as a table: with heavy rules, or (narrow) only a line under the headers and
    one space between columns."""
    table = (Table(title=title, box=box.HEAVY_HEAD) if ruled else
             Table(title=title, box=box.SIMPLE_HEAD, padding=0, pad_edge=False,
                   show_edge=False))
    for header, left, _ in columns:
        table.add_column(header, justify="left" if left else "right", no_wrap=True)
    for cells in zip(*(c[2] for c in columns), strict=True):
        table.add_row(*cells)
    return table


def natural_width(con: Console, table: Table) -> int:
    """The width a table takes when nothing limits it (Console.measure clamps to the console)."""
    return Measurement.get(con, con.options.update(max_width=10**6), table).maximum


def print_fitted(con: Console, title: str, columns: Sequence[tuple[str, bool, list[str]]],
                 split: int | None = None) -> None:
    """Columns (header, left-aligned, cells) laid out to fit the console without cutting a cell,
    the first layout that fits: one table; two that share the first column, split after `split`
    columns (when given); the same without vertical rules; else one line of text per row (which
    wraps between words)."""
    layouts = [[(title, columns)]]
    if split is not None:
        layouts.append([(title, columns[:split]),
                        (f"{title} (continued)", [columns[0], *columns[split:]])])
    for ruled in (True, False):
        for layout in layouts:
            tables = [_table(t, c, ruled) for t, c in layout]
            if all(natural_width(con, t) <= con.width for t in tables):
                for t in tables:
                    con.print(t)
                return
    con.print(title)
    for row in zip(*(c[2] for c in columns), strict=True):
        cells = [f"{h} {v}" for (h, _, _), v in zip(columns[1:], row[1:], strict=True) if v]
        con.print(f"{columns[0][0]} {row[0]}: " + ", ".join(cells), markup=False)


def budget_line(data: dict[str, Any], first: dict[str, Any]) -> str:
    """What the time to train and the cost are of, when --tokens / --gpu-hour-price are given."""
    parts = []
    if data.get("tokens"):
        per_step = first["plan"]["global_batch"] * data["seq_len"]
        parts.append(f"time to train {data['tokens']:.4g} tokens: "
                     f"{fmt_fixed(first['steps_to_train'], ',.0f')} "
                     f"step{'' if first['steps_to_train'] == 1 else 's'} of {per_step:,} tokens "
                     "(global batch x sequence length)")
    if data.get("gpu_hour_price"):
        what = "the token budget" if data.get("tokens") else "one step"
        parts.append(f"cost of {what} at {data['gpu_hour_price']:g} per GPU-hour (in the "
                     "price's units)")
    return "; ".join(parts)


def bullets(lines: Sequence[str]) -> Table:
    """Lines as an indented list whose wrapped lines stay under their text."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for line in lines:
        grid.add_row("  -", line)
    return grid


def print_recommendation(rec: Any, data: dict[str, Any]) -> None:
    con = console()
    r = rec.result
    from perfmodel.recommend import memory_limit_line

    if "parameters" in data:
        con.print(model_line(data["model"], data["model_source"], data["parameters"],
                             data["seq_len"], data["seq_len_from"],
                             data.get("mtp_parameters", 0.0)), markup=False)
    skipped = (f" ({r.skipped:,} more skipped: a lower bound on their step time ranks them "
               f"below the best, or they do not fit and it says they are not faster than it)"
               ) if r.skipped else ""
    con.print(f"searched {r.enumerated:,} plans in {r.search_time_s:.2f} s: {r.evaluated:,} "
              f"evaluated after the memory bound{skipped}, {r.feasible:,} fit")
    con.print(f"ranked by {r.request.objective.value.replace('_', ' ')} "
              f"({OBJECTIVE_UNITS[data.get('objective_unit', 's')]})")
    con.print(memory_limit_line(r))
    if not rec.top:
        info = rec.explanation["infeasible"]
        con.print(f"[red]no plan[/]: {info['reason']}")
        for near in info["nearest"]:
            when = (f", {fmt_seconds(near['step_time_s'])} per step"
                    if near["step_time_s"] is not None else " (model states alone)")
            con.print(f"  nearest: {near['plan']}: {fmt_bytes(near['memory_per_gpu_bytes'])} "
                      f"per GPU{when}")
        return
    plans = data["plans"]
    budget = budget_line(data, plans[0]) if plans else ""
    if budget:
        con.print(budget, markup=False)
    print_fitted(con, "best plans", plan_columns(rec.top, plans), PLAN_COLUMN_COUNT)
    best = rec.top[0]
    con.print(f"[bold]best plan[/]: {rec.explanation['best']}")
    breakdown = Table(title="its step time")
    breakdown.add_column("term")
    breakdown.add_column("time", justify="right")
    breakdown.add_column("share", justify="right")
    for name, t in best.breakdown_s.items():
        if t > 0:
            breakdown.add_row(name, fmt_seconds(t), fmt_share(t, best.step_time_s))
    con.print(breakdown)
    con.print("[bold]what binds it[/]")
    con.print(bullets(rec.explanation["binding"]))
    if "fp8" in rec.explanation:
        con.print(f"[bold]FP8[/]: {rec.explanation['fp8']['says']}")
    if rec.explanation.get("parallelism"):
        con.print("[bold]what context / expert parallelism does[/]")
        con.print(bullets([w["note"] for w in rec.explanation["parallelism"]]))
    if "runner_up" in rec.explanation:
        ru = rec.explanation["runner_up"]
        if ru.get("ties"):
            con.print(f"[bold]ties[/]: {ru['ties']} of the plans shown take the best plan's "
                      f"step time and memory (they differ in "
                      f"{', '.join(ru['ties_differ_in'])}, which costs nothing here)")
        trades = ", ".join(ru["trades"]) or "nothing (a tie)"
        # (ranked by cost or time to train, the runner-up can be faster a step)
        pace = "slower" if ru["slower_by_s"] >= 0 else "faster"
        con.print(f"[bold]runner-up[/] {ru['plan']}: {pace} by "
                  f"{fmt_seconds(abs(ru['slower_by_s']))} a step, "
                  f"memory {fmt_bytes(ru['memory_delta_bytes'], signed=True)}; trades {trades}")
    curve = rec.explanation["micro_batch_curve"]
    print_fitted(con, "throughput against micro-batch size (same layout)", [
        ("micro-batch", False, [str(row["micro_batch"]) for row in curve]),
        ("step time", False, [fmt_seconds(row["step_time_s"]) for row in curve]),
        ("tokens/s", False, [fmt_fixed(row['tokens_per_s'], ',.0f') for row in curve]),
        ("memory/GPU", False, [fmt_bytes(row["memory_per_gpu_bytes"]) for row in curve]),
        ("fits", False, ["yes" if row["fits"] else "no (memory limit)" for row in curve])])
    if "sensitivities" in data:
        sens = Table(title="sensitivity of the step time (elasticity: % change per 1%, by "
                           "central differences; at a kink, the mean of its two slopes)")
        sens.add_column("hardware parameter")
        sens.add_column("elasticity", justify="right")
        for name, value in sorted(data["sensitivities"].items(), key=lambda kv: kv[1]):
            # three significant digits whatever the size (to three decimals, 0.000586 read
            # +0.001 beside 0.000172's +0.000172)
            sens.add_row(name, fmt_fixed(value, '+.3g'))
        con.print(sens)
    if "what_if" in data and data["what_if"]["best"]:
        w = data["what_if"]
        plan = w["best"]["plan"]
        degrees = f"dp={plan['dp']} tp={plan['tp']} pp={plan['pp']}" + "".join(
            f" {k}={plan[k]}" for k in ("cp", "ep", "etp") if plan.get(k, 1) > 1) + (
            f" v={plan['virtual_stages']}" if plan.get("virtual_stages", 1) > 1 else "")
        con.print(f"[bold]what if[/] {', '.join(w['changes'])}: best becomes {degrees} "
                  f"mb={plan['micro_batch']} {plan['schedule']}, "
                  f"{fmt_seconds(w['best']['step_time_s'])} per step "
                  f"(speed-up {fmt_fixed(w['speedup'], '.3f')}x)")
    if "validation" in data:
        v = data["validation"]
        for caveat in v.get("caveats") or []:  # first: why the numbers below do not compare
            con.print(f"[bold]validation[/] cannot be compared: {caveat}")
        if v.get("measured_step_time_s") is None:
            con.print(f"[bold]validation[/] of the scaled-down plan: {v.get('status')}")
        else:
            con.print(f"[bold]validation[/] of the best plan scaled down to {v['ranks']} "
                      f"{v['backend']} ranks: predicted {fmt_seconds(v['predicted_step_time_s'])}, "
                      f"measured {fmt_seconds(v['measured_step_time_s'])} "
                      f"({fmt_fixed(v['relative_error'], '+.1%')})")


def memory_verdict_text(r: Any, markup: bool = True) -> str:
    """A transformer prediction's memory verdict in words (perfmodel.predict.memory_verdict):
    tight says by how much, and what would leave room."""
    verdict = r.memory_verdict
    if verdict == "fits":
        return "fits"
    if verdict == "does not fit":
        return "[red]does NOT fit[/]" if markup else "does NOT fit"
    without = r.memory_without_margin_bytes
    text = (f"tight: {fmt_bytes(without)} without the caching allocator's fragmentation "
            f"margin fits, {fmt_bytes(r.memory_per_gpu_bytes - r.memory_capacity_bytes)} over "
            "with it; runs where the allocator fragments less, as with expandable segments "
            "(--expandable-segments)")
    return f"[yellow]{text}[/]" if markup else text


def print_grid_prediction(r: Any) -> None:
    con = console()
    p = r.plan
    con.print(f"[bold]{r.model.name}[/] on [bold]{p.gpus} x {r.hardware.gpu_name}[/]: Pr={p.pr} "
              f"(model) x Pc={p.pc} (data), batch {p.global_batch}, norm {p.norm.value}, "
              f"collectives {p.variant.value}"
              + (f" (algorithm {r.hardware.collective_algorithm})"
                 if r.hardware.collective_algorithm != "auto" else "") + f", {p.dtype}")
    con.print(f"step time {fmt_seconds(r.step_time_s)}, "
              f"{fmt_fixed(r.samples_per_s, ',.1f')} samples/s, "
              f"MFU {fmt_fixed(r.mfu, '.1%')}, memory per GPU {fmt_bytes(r.memory_per_gpu_bytes)} "
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
        table.add_row(name, fmt_seconds(t), fmt_share(t, r.step_time_s))
    con.print(table)


FRAME_HEADERS = {"step_time_s": "step time", "samples_per_s": "samples/s", "mfu": "MFU",
                 "communication_share": "communication", "global_batch": "global batch",
                 "memory_per_gpu_bytes": "memory/GPU", "fits_in_memory": "fits"}


def print_frame(frame: Any, title: str) -> None:
    """A sweep's table; a dotted hardware field is a header on two lines (inter_node. /
    bandwidth_bytes_per_s)."""
    con = console()
    columns = [c for c in frame.columns if not c.startswith("time:")]

    def cell(col: str, value: Any) -> str:
        if col == "step_time_s":
            return fmt_seconds(value)
        if col in ("mfu", "communication_share"):
            return fmt_fixed(value, ".1%")
        if col == "memory_per_gpu_bytes":
            return fmt_bytes(value)
        if col == "fits_in_memory":
            return "yes" if value else "NO"
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    print_fitted(con, title, [(FRAME_HEADERS.get(col, col.replace(".", ".\n")), False,
                               [cell(col, v) for v in frame[col]]) for col in columns])


def print_grid_recommendation(plans: list[Any], evaluated: int, seconds: float) -> None:
    con = console()
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
                      r.plan.variant.value, fmt_seconds(r.step_time_s),
                      fmt_fixed(r.samples_per_s, ",.0f"), fmt_fixed(r.mfu, ".1%"),
                      fmt_fixed(comm / r.step_time_s, ".1%"),
                      fmt_bytes(r.memory_per_gpu_bytes))
    con.print(table)
