"""The host stage of `calibrate run`: the host time of one framework op, on the device it runs on.

n transformer blocks of the validation job's own layer (workload.model.Block) in sequence, at tiny
shapes (hidden 16, 8 tokens: the device's work is microseconds), run forward and backward as a
training step runs them, the device synchronised once at the end of each step (as a step ends),
and their forward alone likewise. With the device's time near zero a step takes what the host
takes to issue it. Its framework ops are counted once, under torch's dispatcher (a
TorchDispatchMode counting every aten op, views included: the ops perfmodel.step.host counts
for a layer), the forward's and the step's, and three fits over n give the host time per op:
    t(n)   = c + ops(n) x host_op_overhead_s                          (the step: forward and
                                                                     backward alike)
    t_f(n) = c_f + ops_f(n) x t_f                                     (the forward's ops, issued
                                                                     through Python modules)
    t(n) - t_f(n) = c_b + (ops(n) - ops_f(n)) x t_b                  (the backward's, which
                                                                     autograd's engine issues)
Where the forward and backward fits both hold, the profile takes host_op_overhead_s = t_f and
host_op_backward_overhead_s = t_b (the development machine's CPU, torch 2.13: 4.2-4.8 and
2.5-3.6 us in three runs); else the step's one cost. On an asynchronous device (a GPU) that is
what perfmodel.step overlaps with the device's time; on CPU ranks it is recorded but the step
model keeps adding its measured per-kernel costs there.
torch is imported only inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from calibration.measure import measure
from perfmodel.errors import DataError

HOST_BLOCKS = (1, 2, 4, 8, 16)
# below a nanosecond an op the time did not grow with the ops: no framework op dispatches faster
MIN_OP_S = 1e-9
# a GPT layer as the validation job builds it (workload.model), at shapes whose kernels take
# microseconds: the time measured is the host's
HOST_SPEC = {"hidden": 16, "heads": 2, "kv_heads": 2, "ffn_hidden": 64, "seq_len": 8,
             "vocab": 32, "bias": True, "gated_mlp": False, "norm": "layernorm"}


def host_count(sweep: Any) -> int:
    return len(sweep.host_blocks)


def count_ops(torch: Any, fn: Any) -> int:
    """The aten ops one call of fn dispatches (views included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.ops


def bench_host(ctx: Any, sweep: Any, rec: Any) -> Iterator[None]:
    """Forward and backward of 1 to 16 tiny blocks, and their forward alone; their ops counted,
    their time measured."""
    from workload.model import Block

    torch = ctx.torch
    for n in sweep.host_blocks:
        blocks = torch.nn.Sequential(*(Block(HOST_SPEC) for _ in range(n))).to(ctx.device)
        x = torch.randn(1, HOST_SPEC["seq_len"], HOST_SPEC["hidden"], device=ctx.device,
                        requires_grad=True)

        def forward(blocks: Any = blocks, x: Any = x) -> Any:
            return blocks(x).sum()

        def step(forward: Any = forward) -> None:
            forward().backward()

        step()  # the gradients exist from here on: they accumulate, as in a step's micro-batches
        ops, forward_ops = count_ops(torch, step), count_ops(torch, forward)
        med, spread = measure(step, sweep, ctx)
        f_med, f_spread = measure(forward, sweep, ctx)
        rec.add({"kind": "host_ops", "blocks": n, "ops": ops, "time_s": ctx.slowest(med),
                 "spread": spread, "forward_ops": forward_ops,
                 "forward_time_s": ctx.slowest(f_med), "forward_spread": f_spread,
                 "ranks": ctx.world})
        yield


def _line(x: np.ndarray, t: np.ndarray, what: str) -> tuple[float, float, np.ndarray]:
    """(slope, intercept, relative residuals) of t over x, least squares."""
    if len(np.unique(x)) < 2:
        raise DataError(f"host stage: need {what} of at least 2 op counts")
    slope, intercept = np.polyfit(x, t, 1)
    return float(slope), float(intercept), np.abs((intercept + slope * x) / t - 1)


class HostOpModel:
    """t = c + ops x host_op_overhead_s over the host stage's records (least squares), and the
    forward's and the backward's own costs where the records time the forward alone (module
    doc)."""

    def fit(self, records: pd.DataFrame) -> HostOpModel:
        rows = records[(records["ops"] > 0) & (records["time_s"] > 0)]
        ops, t = rows["ops"].to_numpy(float), rows["time_s"].to_numpy(float)
        slope, intercept, err = _line(ops, t, "steps")
        if slope <= 0:
            raise DataError(f"host stage: the time does not grow with the ops (slope "
                            f"{slope:.3g} s per op): too noisy to fit")
        self.host_op_overhead_s_, self.intercept_s_ = slope, intercept
        self.residuals_ = {"median_rel_error": float(np.median(err)),
                           "worst_rel_error": float(np.max(err))}
        self.n_points_ = len(rows)
        self.forward_s_: float | None = None
        self.backward_s_: float | None = None
        self.split_note_ = ""
        if "forward_time_s" in rows:
            self._fit_split(rows)
        return self

    def _fit_split(self, rows: pd.DataFrame) -> None:
        """The forward's and the backward's cost per op, kept where both grow with their ops."""
        timed = rows[(rows["forward_time_s"] > 0) & (rows["forward_ops"] > 0)
                     & (rows["time_s"] > rows["forward_time_s"])]
        if timed["forward_ops"].nunique() < 2:
            return
        f_ops, f_t = timed["forward_ops"].to_numpy(float), timed["forward_time_s"].to_numpy(float)
        b_ops = timed["ops"].to_numpy(float) - f_ops
        b_t = timed["time_s"].to_numpy(float) - f_t
        forward, _, _ = _line(f_ops, f_t, "forwards")
        backward, _, _ = _line(b_ops, b_t, "backwards")
        if min(forward, backward) < MIN_OP_S:
            self.split_note_ = (f"host stage: the forward's ({forward:.3g} s per op) or the "
                                f"backward's ({backward:.3g}) time does not grow with its ops: "
                                "one cost per op kept")
            return
        self.forward_s_, self.backward_s_ = forward, backward

    def hardware(self) -> dict[str, float]:
        """The profile's fields: the forward's and the backward's cost per op where both were
        fitted, else the step's one."""
        if self.forward_s_ is not None and self.backward_s_ is not None:
            return {"host_op_overhead_s": self.forward_s_,
                    "host_op_backward_overhead_s": self.backward_s_}
        return {"host_op_overhead_s": self.host_op_overhead_s_}

    def summary(self) -> dict[str, Any]:
        split: dict[str, float | None] = {} if self.forward_s_ is None else {
            "forward_op_s": self.forward_s_, "backward_op_s": self.backward_s_}
        return {"kind": "host_ops", "params": {"host_op_overhead_s": self.host_op_overhead_s_},
                **split, "intercept_s": self.intercept_s_, **self.residuals_,
                "n_points": self.n_points_,
                "note": "framework ops (aten, views included) of n blocks of the validation "
                        "job's layer at tiny shapes, forward and backward; slope of the step's "
                        "time over them, and of the forward's and the backward's alone "
                        "(forward_op_s, backward_op_s)"}
