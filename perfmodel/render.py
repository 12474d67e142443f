"""Readable output for the terminal (rich tables)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from perfmodel.predict import Prediction


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


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


def print_prediction(r: Prediction) -> None:
    con = _console()
    p = r.plan
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
    table.add_row("algorithm", res["algorithm"])
    table.add_row("algbw", f"{res['algbw_bytes_per_s'] / 1e9:.2f} GB/s")
    table.add_row("busbw", f"{res['busbw_bytes_per_s'] / 1e9:.2f} GB/s (factor {res['bus_factor']:.3f})")
    con.print(table)
    if len(res["by_algorithm_s"]) > 1:
        other = Table(title="by algorithm")
        other.add_column("algorithm")
        other.add_column("time", justify="right")
        for alg, t in sorted(res["by_algorithm_s"].items(), key=lambda kv: kv[1]):
            other.add_row(alg, fmt_seconds(t))
        con.print(other)


def print_presets(as_json: bool) -> None:
    from perfmodel.specs import list_presets, load_hardware, load_model

    names = list_presets()
    if as_json:
        print(json.dumps(names, indent=2))
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
    for name in names["models"]:
        m = load_model(name)
        md.add_row(name, str(m.layers), str(m.hidden), str(m.heads), str(m.kv_heads),
                   str(m.ffn_hidden), str(m.seq_len), str(m.vocab), m.source)
    con.print(md)
