"""Plots from the API (matplotlib, Agg): the same functions back the CLI's --plot options."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Render to memory, then write the file atomically."""
    from perfmodel.batch import write_bytes_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    write_bytes_atomic(Path(path), buffer.getvalue())


def pareto_front(times: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the plans no other plan beats in both step time and memory, fastest first."""
    order = np.lexsort((memory, times))
    front, best_memory = [], np.inf
    for i in order:
        if memory[i] < best_memory:
            front.append(i)
            best_memory = memory[i]
    return np.array(front, dtype=int)


def pareto_plot(result: Any, path: Path) -> None:
    """Every evaluated plan in step time against memory per GPU, the Pareto front and the limit."""
    plt = _figure()
    ok = np.isfinite(result.step_time_s)
    t, mem = result.step_time_s[ok], result.memory_bytes[ok] / 2**30
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(t, mem, s=4, alpha=0.25, color="tab:gray", label="evaluated plans")
    front = pareto_front(t, mem)
    ax.plot(t[front], mem[front], "o-", color="tab:blue", ms=3, label="Pareto front")
    ax.axhline(result.capacity_bytes / 2**30, color="tab:red", ls="--", label="memory limit")
    if len(result.order):
        best = result.order[0]
        ax.plot(result.step_time_s[best], result.memory_bytes[best] / 2**30, "*", ms=14,
                color="tab:orange", label="recommended")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step time [s]")
    ax.set_ylabel("memory per GPU [GiB]")
    ax.legend(loc="best", fontsize=8)
    ax.set_title("time-memory trade-off of every plan")
    save_figure(fig, path)
    plt.close(fig)


def breakdown_plot(prediction: Any, path: Path) -> None:
    """Horizontal bars of the step-time breakdown."""
    plt = _figure()
    items = [(k, v) for k, v in prediction.breakdown_s.items() if v > 0]
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(items) + 1.5))
    ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step")
    ax.set_title(f"{prediction.model.name}: {prediction.step_time_s:.4g} s per step")
    save_figure(fig, path)
    plt.close(fig)


def memory_plot(prediction: Any, path: Path) -> None:
    """Horizontal bars of the memory breakdown, with the capacity."""
    plt = _figure()
    items = [(k, v / 2**30) for k, v in prediction.memory_breakdown_bytes.items() if v > 0]
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(items) + 1.5))
    ax.barh([k for k, _ in items], [v for _, v in items], color="tab:green")
    ax.invert_yaxis()
    ax.axvline(prediction.memory_capacity_bytes / 2**30, color="tab:red", ls="--", label="capacity")
    ax.set_xlabel("GiB per GPU")
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)


def prediction_plot(prediction: Any, path: Path) -> None:
    """The step-time breakdown and the memory breakdown of one prediction, side by side."""
    plt = _figure()
    times = [(k, v) for k, v in prediction.breakdown_s.items() if v > 0]
    mem = [(k, v / 2**30) for k, v in prediction.memory_breakdown_bytes.items() if v > 0]
    rows = max(len(times), len(mem))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.32 * rows + 1.8))
    left.barh([k for k, _ in times], [v for _, v in times], color="tab:blue")
    left.invert_yaxis()
    left.set_xlabel("seconds per step")
    left.set_title(f"step time {prediction.step_time_s:.4g} s, MFU {prediction.mfu:.1%}")
    right.barh([k for k, _ in mem], [v for _, v in mem], color="tab:green")
    right.invert_yaxis()
    right.axvline(prediction.memory_capacity_bytes / 2**30, color="tab:red", ls="--",
                  label="capacity")
    right.set_xlabel("GiB per GPU")
    right.set_title(f"memory {prediction.memory_per_gpu_bytes / 2**30:.1f} GiB per GPU")
    right.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{prediction.model.name} on {prediction.plan.gpus} x {prediction.hardware.gpu_name}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def sweep_plot(frame: Any, varied: list[str], path: Path, title: str = "") -> None:
    """Step time (and its communication share) against the first varied field, one line per value
    of the others."""
    plt = _figure()
    x = varied[0]
    others = varied[1:]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    groups = frame.groupby(others) if others else [((), frame)]
    for key, group in groups:
        label = ", ".join(f"{k}={v:g}" for k, v in zip(others, key if isinstance(key, tuple) else (key,),
                                                         strict=True)) or None
        group = group.sort_values(x)
        top.plot(group[x], group["step_time_s"], "o-", label=label)
        bottom.plot(group[x], group["communication_share"] * 100, "o-", label=label)
    top.set_xscale("log")
    top.set_yscale("log")
    top.set_ylabel("step time [s]")
    bottom.set_ylabel("communication [% of step]")
    bottom.set_xlabel(x)
    if others:
        top.legend(fontsize=8)
    top.set_title(title)
    save_figure(fig, path)
    plt.close(fig)
