"""Layer-wise model parallelism of layer graphs (CNNs, MLPs) on a Pr x Pc grid.

Gholami, Azad, Jin, Keutzer, Buluc, "Integrated Model, Batch and Domain Parallelism in Training
Neural Networks" (SPAA 2018): P = Pr x Pc processes; Pr splits every conv/linear layer by output
channels / neurons, Pc splits the batch. Per split layer l and step, on every process:
  forward : all-gather along Pr of the layer's output for the local batch (e * out_l * B/Pc bytes)
  backward: all-reduce along Pr of the input gradient (e * in_l * B/Pc), except the first layer;
            all-reduce along Pc of the weight gradient (e * params_l / Pr)
Castelló, Dolz, Quintana-Ortí, Duato, "Analysis of model parallelism for distributed neural
networks" (EuroMPI 2019): the same exchanges as Gather + Broadcast (instead of Allgather) and
Reduce + Broadcast (instead of Allreduce), `--collective-variant split`. Pr = P is their pure model
parallelism, Pc = P pure data parallelism.
Normalization (PLOS ONE 18(11) e0293338): batch norm local to a process costs no communication;
synchronized batch norm all-reduces 2 fp32 statistics per channel along Pc forward and backward;
group norm needs none.
The Pr group takes the axis "tp" of the link model (inside a node first), the Pc group "dp", so the
collectives reuse perfmodel.step.group_time (algorithms, hierarchy, calibrated fits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from perfmodel.errors import PlanError
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.layers import LayerGraphSpec


class Norm(StrEnum):
    LOCAL = "local"  # batch norm on each process's samples
    SYNC = "sync"  # synchronized batch norm
    GROUP = "group"  # group norm: no batch statistics


class Variant(StrEnum):
    FUSED = "fused"  # Allgather, Allreduce
    SPLIT = "split"  # Gather + Broadcast, Reduce + Broadcast


@dataclass(frozen=True, kw_only=True)
class GridPlan:
    pr: int
    pc: int
    global_batch: int
    norm: Norm = Norm.LOCAL
    variant: Variant = Variant.FUSED
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        for key in ("pr", "pc", "global_batch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{key} must be a whole number >= 1, got {value!r}")
        object.__setattr__(self, "norm", _enum(Norm, self.norm, "norm"))
        object.__setattr__(self, "variant", _enum(Variant, self.variant, "collective_variant"))
        if self.dtype not in ("fp32", "tf32", "bf16", "fp16"):
            raise PlanError(f"dtype must be one of fp32, tf32, bf16, fp16, got '{self.dtype}'")
        if self.global_batch % self.pc:
            raise PlanError(f"global_batch ({self.global_batch}) must be divisible by pc ({self.pc})")

    @property
    def gpus(self) -> int:
        return self.pr * self.pc

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["norm"], out["variant"] = self.norm.value, self.variant.value
        out["gpus"] = self.gpus
        return out


def _enum(cls: Any, value: Any, field: str) -> Any:
    allowed = [m.value for m in cls]
    if str(value) not in allowed:
        raise PlanError(f"{field} must be one of {', '.join(allowed)}, got '{value}'")
    return cls(str(value))


@dataclass(frozen=True)
class GridPrediction:
    step_time_s: float
    samples_per_s: float
    breakdown_s: dict[str, float]
    memory_per_gpu_bytes: float
    memory_breakdown_bytes: dict[str, float]
    fits_in_memory: bool
    model_flops_per_step: float
    mfu: float
    plan: GridPlan
    model: LayerGraphSpec
    hardware: HardwareSpec

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "samples_per_s": self.samples_per_s,
                "breakdown_s": self.breakdown_s, "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
                "memory_breakdown_bytes": self.memory_breakdown_bytes,
                "fits_in_memory": self.fits_in_memory,
                "model_flops_per_step": self.model_flops_per_step, "mfu": self.mfu,
                "plan": self.plan.to_dict(), "model": self.model.name, "hardware": self.hardware.name}


BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
TERMS = ("compute/forward", "compute/backward", "comm/model_parallel", "comm/data_parallel",
         "comm/norm", "optimizer/step")


def build_terms(model: LayerGraphSpec, fam: Any, norm: Norm | None = None,
                variant: Variant | None = None) -> dict[str, Any]:
    """Named sympy terms of one step, in the symbols of perfmodel.symbols (tp = Pr, dp = Pc).

    norm and variant left None stay 0/1 indicators (is_sync_bn, is_split_collectives), so one
    compiled expression serves every choice."""
    import sympy as sp

    from perfmodel import symbols as S
    from perfmodel.costs.compute import Gemm, gemm_time, memory_time
    from perfmodel.step import device, group_time

    dev = device(fam.gemm_split_k)
    pr, pc, e, B = S.tp, S.dp, S.e, S.B
    local = B / pc
    zero = sp.Integer(0)
    fwd = bwd = comm_mp = comm_dp = comm_norm = zero
    first = True

    from perfmodel.step import flag

    split_flag = flag(None if variant is None else variant is Variant.SPLIT, "split_collectives")
    sync_flag = flag(None if norm is None else norm is Norm.SYNC, "sync_bn")

    def fused_or_split(fused: str, split: tuple[str, str], nbytes: Any, axis: str) -> Any:
        return (1 - split_flag) * group_time(fused, nbytes, axis, fam) + split_flag * sum(
            (group_time(op, nbytes, axis, fam) for op in split), zero)

    for layer in model.layers:
        if layer.splits:
            g = Gemm(layer.name, local * layer.gemm_m, layer.gemm_n / pr, layer.gemm_k)
            t = gemm_time(g, e, dev)
            fwd += t
            bwd += 2 * t
            comm_mp += fused_or_split("all_gather", ("reduce", "broadcast"),
                                      e * layer.out_elements * local, "tp")
            if not first:
                comm_mp += fused_or_split("all_reduce", ("reduce", "broadcast"),
                                          e * layer.in_elements * local, "tp")
            comm_dp += group_time("all_reduce", 4 * layer.params / pr, "dp", fam)
            first = False
        else:
            t = memory_time(e * (layer.in_elements + layer.out_elements) * local, dev)
            fwd += t
            bwd += 2 * t
            if layer.kind == "norm":
                comm_norm += sync_flag * 2 * group_time("all_reduce", 2 * 4 * layer.channels, "dp", fam)
            if layer.params:
                comm_dp += group_time("all_reduce", 4 * layer.params, "dp", fam)
    params_local = sum(layer.params / (pr if layer.splits else 1) for layer in model.layers)
    activations = sum(layer.out_elements for layer in model.layers) * local * e
    # SGD with momentum in fp32: read weight, gradient, momentum; write weight, momentum
    optimizer = memory_time(20 * params_local, dev)
    time_terms = dict(zip(TERMS, (fwd, bwd, comm_mp, comm_dp, comm_norm, optimizer), strict=True))
    memory_terms = {"weights": 4 * params_local, "gradients": 4 * params_local,
                    "optimizer_states": 4 * params_local, "activations": activations}
    return {"time": time_terms, "memory": memory_terms}


@lru_cache(maxsize=32)
def _compiled(model: LayerGraphSpec, fam: Any) -> tuple[Any, ...]:
    import sympy as sp

    from perfmodel import symbols as S

    terms = build_terms(model, fam)
    exprs = [*terms["time"].values(), *terms["memory"].values()]
    table = S.table()
    used = set().union(*(sp.sympify(x).free_symbols for x in exprs))
    names = tuple(name for name, (sym, _) in table.items() if sym in used)
    fn = sp.lambdify([table[n][0] for n in names], exprs, modules="numpy", cse=True)
    return names, fn, tuple(terms["time"]), tuple(terms["memory"])


def _as_transformer_plan(plan: GridPlan) -> tuple[Any, Any]:
    """The link model's view of a grid: Pr on the "tp" axis, Pc on "dp" (a placeholder
    transformer supplies the symbols the layer graph does not use)."""
    from perfmodel.specs.model import TransformerSpec
    from perfmodel.strategy import Plan

    dummy = TransformerSpec(name="-", layers=1, hidden=1, heads=1, seq_len=1, vocab=1)
    proxy = Plan(gpus=plan.gpus, tp=plan.pr, dp=plan.pc, global_batch=plan.global_batch,
                 micro_batch=plan.global_batch // plan.pc, dtype=plan.dtype)
    return dummy, proxy


def predict_grid(model: LayerGraphSpec, hardware: HardwareSpec, plan: GridPlan) -> GridPrediction:
    """Step time and memory of a layer graph on a Pr x Pc grid."""
    from perfmodel.evaluate import family_of, values_of

    dummy, proxy = _as_transformer_plan(plan)
    fam = dataclasses.replace(family_of(dummy, hardware, proxy), tp_layout="1d")  # scopes open
    names, fn, time_names, mem_names = _compiled(model, fam)
    values = values_of(dummy, hardware, proxy)
    values["is_sync_bn"] = float(plan.norm is Norm.SYNC)
    values["is_split_collectives"] = float(plan.variant is Variant.SPLIT)
    out = [float(x) for x in fn(*[values[n] for n in names])]
    times = dict(zip(time_names, out[: len(time_names)], strict=True))
    memory = dict(zip(mem_names, out[len(time_names):], strict=True))
    if hardware.memory_reserved_bytes:
        memory["reserved"] = float(hardware.memory_reserved_bytes)
    step = sum(times.values())
    flops = 3 * model.flops_per_sample * plan.global_batch
    total_memory = sum(memory.values())
    return GridPrediction(
        step_time_s=step, samples_per_s=plan.global_batch / step, breakdown_s=times,
        memory_per_gpu_bytes=total_memory, memory_breakdown_bytes=memory,
        fits_in_memory=total_memory <= hardware.memory_bytes, model_flops_per_step=flops,
        mfu=flops / (step * plan.gpus * hardware.peak(plan.dtype)), plan=plan, model=model,
        hardware=hardware)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_grid(model: LayerGraphSpec, hardware: HardwareSpec, gpus: int, global_batch: int,
              **kw: Any) -> list[GridPrediction]:
    """Every Pr x Pc split of the GPUs (Pc dividing the batch), fastest first."""
    out = []
    for pr in divisors(gpus):
        pc = gpus // pr
        if global_batch % pc:
            continue
        out.append(predict_grid(model, hardware, GridPlan(pr=pr, pc=pc, global_batch=global_batch,
                                                          **kw)))
    if not out:
        raise PlanError(f"no Pr x Pc split of {gpus} GPUs has Pc dividing the batch {global_batch}")
    return sorted(out, key=lambda p: p.step_time_s)


def communication_in_pr(model: LayerGraphSpec, gpus: int, global_batch: int,
                        bytes_per_element: int = 4) -> dict[str, Any]:
    """Seed 000's analysis: the communication of one step as a function of Pr (Pc = P / Pr) with a
    uniform alpha-beta network and ring collectives; its minimiser in closed form (sympy) and over
    the divisors of P."""
    import sympy as sp

    Pr = sp.Symbol("P_r", positive=True)
    P, Bt, alpha, beta = sp.Integer(gpus), sp.Integer(global_batch), *sp.symbols("alpha beta",
                                                                                 positive=True)
    Pc = P / Pr
    e = bytes_per_element
    total = sp.Integer(0)
    first = True
    for layer in model.layers:
        if not layer.splits:
            continue
        out_b = e * layer.out_elements * Bt / Pc
        total += (Pr - 1) * alpha + (Pr - 1) / Pr * out_b / beta  # all-gather along Pr
        if not first:
            in_b = e * layer.in_elements * Bt / Pc
            total += 2 * (Pr - 1) * alpha + 2 * (Pr - 1) / Pr * in_b / beta  # all-reduce along Pr
        w_b = 4 * layer.params / Pr
        total += 2 * (Pc - 1) * alpha + 2 * (Pc - 1) / Pc * w_b / beta  # all-reduce along Pc
        first = False
    total = sp.simplify(total)
    closed = None
    try:
        sols = [s_ for s_ in sp.solve(sp.diff(total, Pr), Pr) if s_.is_positive is not False]
        if sols:
            closed = sols[0]
    except (NotImplementedError, ValueError):
        closed = None
    return {"total": total, "pr": Pr, "alpha": alpha, "beta": beta, "closed_form": closed}


def exact_minimiser(comm: dict[str, Any], gpus: int, alpha: float, beta: float) -> tuple[int, float]:
    import sympy as sp

    f = sp.lambdify(comm["pr"], comm["total"].subs({comm["alpha"]: alpha, comm["beta"]: beta}))
    best = min(divisors(gpus), key=lambda d: float(f(d)))
    return best, float(f(best))


def sweep(model: LayerGraphSpec, hardware: HardwareSpec, plan: GridPlan,
          vary: dict[str, list[float]], best_pr: bool = False) -> Any:
    """A table (pandas) of predictions over values of hardware fields (dotted names, e.g.
    peak_flops_per_s, memory_bandwidth_bytes_per_s, inter_node.bandwidth_bytes_per_s), `gpus`
    (node count x GPUs per node; Pc grows, Pr kept) and `global_batch`; one row per combination."""
    import itertools

    import pandas as pd

    keys = list(vary)
    rows = []
    for combo in itertools.product(*(vary[k] for k in keys)):
        hw, kw = hardware, {"pr": plan.pr, "pc": plan.pc, "global_batch": plan.global_batch,
                            "norm": plan.norm, "variant": plan.variant, "dtype": plan.dtype}
        for key, value in zip(keys, combo, strict=True):
            if key == "gpus":
                if int(value) % plan.pr:
                    raise PlanError(f"sweep gpus={value} is not a multiple of pr={plan.pr}")
                kw["pc"] = int(value) // plan.pr
            elif key == "global_batch":
                kw["global_batch"] = int(value)
            else:
                hw = _set_field(hw, key, float(value), kw["dtype"])
        if best_pr:
            gpus = kw["pr"] * kw["pc"]
            result = best_grid(model, hw, gpus, kw["global_batch"], norm=kw["norm"],
                               variant=kw["variant"], dtype=kw["dtype"])[0]
        else:
            result = predict_grid(model, hw, GridPlan(**kw))
        row = dict(zip(keys, combo, strict=True))
        row.update({"pr": result.plan.pr, "pc": result.plan.pc, "step_time_s": result.step_time_s,
                    "samples_per_s": result.samples_per_s, "mfu": result.mfu})
        comm = sum(v for k, v in result.breakdown_s.items() if k.startswith("comm/"))
        row["communication_share"] = comm / result.step_time_s
        row.update({f"time:{k}": v for k, v in result.breakdown_s.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _set_field(hardware: HardwareSpec, dotted: str, value: float, dtype: str) -> HardwareSpec:
    from perfmodel.recommend import apply_what_if

    if dotted == "peak_flops_per_s":  # the FLOP rate in the plan's dtype; the others scale with it
        ref = hardware.peak(dtype)
        return apply_what_if(hardware, f"peak_flops_per_s={value / ref!r}x")
    return apply_what_if(hardware, f"{dotted}={value!r}")


