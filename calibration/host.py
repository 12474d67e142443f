"""The host stage of `calibrate run`: the host time of one framework op, on the device it runs on.

n transformer blocks of the validation job's own layer (workload.model.Block) in sequence, at tiny
shapes (hidden 16, 8 tokens: the device's work is microseconds), run forward and backward as a
training step runs them, the device synchronised once at the end of each step (as a step ends).
With the device's time near zero the step takes what the host takes to issue it. Its framework
ops are counted once, under torch's dispatcher (a TorchDispatchMode counting every aten op, views
included: the ops perfmodel.step.host counts for a layer), and the fit over n,
    t(n) = c + ops(n) x host_op_overhead_s                                                   [s]
gives the host time per op (the slope; c: the loss and the synchronisation). On an asynchronous
device (a GPU) that is what perfmodel.step overlaps with the device's time; on CPU ranks it is
recorded but the step model keeps adding its measured per-kernel costs there.
torch is imported only inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from calibration.measure import measure
from perfmodel.errors import DataError

HOST_BLOCKS = (1, 2, 4, 8)
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
    """Forward and backward of 1, 2, 4, 8 tiny blocks; their ops counted, their time measured."""
    from workload.model import Block

    torch = ctx.torch
    for n in sweep.host_blocks:
        blocks = torch.nn.Sequential(*(Block(HOST_SPEC) for _ in range(n))).to(ctx.device)
        x = torch.randn(1, HOST_SPEC["seq_len"], HOST_SPEC["hidden"], device=ctx.device,
                        requires_grad=True)

        def step(blocks: Any = blocks, x: Any = x) -> None:
            blocks(x).sum().backward()

        step()  # the gradients exist from here on: they accumulate, as in a step's micro-batches
        ops = count_ops(torch, step)
        med, spread = measure(step, sweep, ctx)
        rec.add({"kind": "host_ops", "blocks": n, "ops": ops, "time_s": ctx.slowest(med),
                 "spread": spread, "ranks": ctx.world})
        yield


class HostOpModel:
    """t = c + ops x host_op_overhead_s over the host stage's records (least squares)."""

    def fit(self, records: pd.DataFrame) -> HostOpModel:
        rows = records[(records["ops"] > 0) & (records["time_s"] > 0)]
        if rows["ops"].nunique() < 2:
            raise DataError("host stage: need steps of at least 2 op counts")
        ops, t = rows["ops"].to_numpy(float), rows["time_s"].to_numpy(float)
        slope, intercept = np.polyfit(ops, t, 1)
        if slope <= 0:
            raise DataError(f"host stage: the time does not grow with the ops (slope "
                            f"{slope:.3g} s per op): too noisy to fit")
        self.host_op_overhead_s_, self.intercept_s_ = float(slope), float(intercept)
        predicted = intercept + slope * ops
        err = np.abs(predicted / t - 1)
        self.residuals_ = {"median_rel_error": float(np.median(err)),
                           "worst_rel_error": float(np.max(err))}
        self.n_points_ = len(rows)
        return self

    def summary(self) -> dict[str, Any]:
        return {"kind": "host_ops", "params": {"host_op_overhead_s": self.host_op_overhead_s_},
                "intercept_s": self.intercept_s_, **self.residuals_, "n_points": self.n_points_,
                "note": "framework ops (aten, views included) of n blocks of the validation "
                        "job's layer at tiny shapes, forward and backward; slope of the step's "
                        "time over them"}
