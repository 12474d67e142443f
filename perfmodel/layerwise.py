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
parallelism, Pc = P pure data parallelism. A layer with fewer output units u (filters, neurons) than
Pr is split over c = min(Pr, u) of the Pr processes (its weights, GEMM columns, weight gradients and
their Pc all-reduce divided by c, not Pr), yet all Pr need its output and its input gradient: the
collectives then have c contributors and Pr receivers (perfmodel.costs.collectives), realised as
the ordinary collective over Pr (`--contributors standard`: padded all-gather, zeros in the
all-reduce), as the collective among the c followed by a copy to the Pr - c others (`specialised`),
or the cheaper of the two per call (`auto`); with the split variant only the gather/reduce runs
among the c, the broadcast reaches all Pr.
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
from functools import cache, lru_cache
from typing import Any

from perfmodel.costs.collectives import Realisation
from perfmodel.errors import PerfmodelError, PlanError
from perfmodel.output import require_finite
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.layers import LayerGraphSpec

# a layer graph trains in these (no FP8 recipe for a CNN or MLP; perfmodel.cli.GRID_DTYPES,
# tests/unit/test_batch_report_probe_2026_12_02.py checks they agree)
GRID_DTYPES = ("fp32", "tf32", "bf16", "fp16")


class Norm(StrEnum):
    LOCAL = "local"  # batch norm on each process's samples
    SYNC = "sync"  # synchronized batch norm
    GROUP = "group"  # group norm: no batch statistics


class Variant(StrEnum):
    FUSED = "fused"  # Allgather, Allreduce
    SPLIT = "split"  # Gather + Broadcast, Reduce + Broadcast


Contributors = Realisation  # standard | specialised | auto: layers split over fewer ranks than Pr


@dataclass(frozen=True, kw_only=True)
class GridPlan:
    pr: int
    pc: int
    global_batch: int
    norm: Norm = Norm.LOCAL
    variant: Variant = Variant.FUSED
    contributors: Contributors = Contributors.STANDARD
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        from perfmodel.specs.loading import plain
        from perfmodel.strategy import _positive_int

        for key in ("pr", "pc", "global_batch"):  # np.int64, 8.0, "8": as Plan takes them
            object.__setattr__(self, key, _positive_int(plain(getattr(self, key)), key))
        object.__setattr__(self, "norm", _enum(Norm, self.norm, "norm"))
        object.__setattr__(self, "variant", _enum(Variant, self.variant, "collective_variant"))
        object.__setattr__(self, "contributors", _enum(Contributors, self.contributors,
                                                       "contributors"))
        if self.dtype not in GRID_DTYPES:
            raise PlanError(f"dtype must be one of {', '.join(GRID_DTYPES)}, got '{self.dtype}'")
        if self.global_batch % self.pc:
            raise PlanError(
                f"global_batch ({self.global_batch}) must be divisible by pc ({self.pc})")

    @property
    def gpus(self) -> int:
        return self.pr * self.pc

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["norm"], out["variant"] = self.norm.value, self.variant.value
        out["contributors"] = self.contributors.value
        out["gpus"] = self.gpus
        return out


def _keyword_fields() -> None:
    from perfmodel.specs.loading import keyword_fields

    keyword_fields(GridPlan, PlanError, "grid plan")


_keyword_fields()


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
    layer_degrees: dict[str, int] = dataclasses.field(default_factory=dict)  # c = min(Pr, units)

    def breakdown_frame(self) -> Any:
        """The step time's terms as a pandas DataFrame (seconds, share), as Prediction's."""
        from perfmodel.output import breakdown_frame

        return breakdown_frame(self.breakdown_s, self.step_time_s)

    def memory_frame(self) -> Any:
        """The memory per GPU's terms as a pandas DataFrame (bytes, GiB), as Prediction's."""
        from perfmodel.output import memory_frame

        return memory_frame(self.memory_breakdown_bytes)

    def summary(self) -> str:
        """One line: model, hardware, grid, step time, throughput, MFU and memory (what the
        object shows in a notebook or a REPL; to_dict holds every field)."""
        from perfmodel.output import fmt_bytes

        plan = self.plan
        verdict = "fits" if self.fits_in_memory else "does not fit"
        return (f"{self.model.name} on {plan.gpus:,} x {self.hardware.name} (Pr {plan.pr} x Pc "
                f"{plan.pc}, batch {plan.global_batch}, {plan.dtype}, {plan.norm.value} norm): "
                f"step {self.step_time_s:.4g} s, {self.samples_per_s:,.1f} samples/s, MFU "
                f"{self.mfu:.1%}, memory {fmt_bytes(self.memory_per_gpu_bytes)} of "
                f"{fmt_bytes(self.hardware.memory_bytes)} per GPU: {verdict}")

    def __repr__(self) -> str:
        # the generated one printed every field, the model's layers and the hardware with them
        return f"<GridPrediction {self.summary()}>"

    def _repr_html_(self) -> str:
        """Jupyter's view: the summary line and the step time's breakdown."""
        from perfmodel.output import breakdown_html

        return breakdown_html(self.summary(), self.breakdown_s, self.step_time_s)

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "samples_per_s": self.samples_per_s,
                "breakdown_s": dict(self.breakdown_s),
                "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
                "memory_breakdown_bytes": dict(self.memory_breakdown_bytes),
                "fits_in_memory": self.fits_in_memory,
                "model_flops_per_step": self.model_flops_per_step, "mfu": self.mfu,
                "plan": self.plan.to_dict(), "model": self.model.name,
                "hardware": self.hardware.name, "layer_degrees": dict(self.layer_degrees)}


BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
TERMS = ("compute/forward", "compute/backward", "comm/model_parallel", "comm/data_parallel",
         "comm/norm", "optimizer/step")


def layer_degree(units: float, pr: Any) -> Any:
    """c = min(Pr, u): the processes a layer of u output units (filters, neurons) is split over. A
    sympy Min for a symbolic Pr, so that one compiled expression serves every Pr."""
    import sympy as sp

    u = sp.Integer(int(units)) if float(units).is_integer() else sp.Float(units)
    if isinstance(pr, int):
        return min(pr, u)
    return sp.Min(pr, u)


def build_terms(model: LayerGraphSpec, fam: Any, norm: Norm | None = None,
                variant: Variant | None = None,
                contributors: Contributors | None = None) -> dict[str, Any]:
    """Named sympy terms of one step, in the symbols of perfmodel.symbols (tp = Pr, dp = Pc).

    norm, variant and contributors left None stay 0/1 indicators (is_sync_bn,
    is_split_collectives, is_contributors_specialised, is_contributors_auto), so one compiled
    expression serves every choice."""
    import sympy as sp
    from sympy.core.parameters import evaluate

    from perfmodel import symbols as S
    from perfmodel.costs.collectives import spread_rounds
    from perfmodel.costs.compute import Gemm, gemm_time, memory_time
    from perfmodel.step import device, flag, group_time
    from perfmodel.step.context import active

    dev = device(fam)
    pr, pc, e, B = S.tp, S.dp, S.e, S.B
    local = B / pc
    zero = sp.Integer(0)
    fwd = bwd = comm_mp = comm_dp = comm_norm = zero
    first = True

    split_flag = flag(None if variant is None else variant is Variant.SPLIT, "split_collectives")
    sync_flag = flag(None if norm is None else norm is Norm.SYNC, "sync_bn")
    spec_flag = flag(None if contributors is None else contributors is Contributors.SPECIALISED,
                     "contributors_specialised")
    auto_flag = flag(None if contributors is None else contributors is Contributors.AUTO,
                     "contributors_auto")

    # each collective of the Pr group built once on a placeholder size, then sized per layer
    size = sp.Dummy("nbytes")
    templates: dict[str, Any] = {}

    def on_scope(scope: str) -> Any:
        scopes = tuple((axis, scope if axis == "tp" else sc) for axis, sc in fam.scopes)
        return dataclasses.replace(fam, scopes=scopes)

    def spread_round() -> Any:
        """One round of the copy to the non-contributors: every holder sends the buffer to one
        process. Inside a node: alpha_i + n / beta_i. Across nodes (whenever the Pr group spans
        nodes; conservative when the contributors fill less than a node) the cheaper of the flat
        pairs, all holders of a node sharing its NICs (alpha_o + n G / beta_o), and a scatter +
        all-gather: each of the k ranks of a receiving node takes n / k from its pair across
        nodes, then they all-gather the n inside the node."""
        intra = group_time("send_recv", size, "tp", on_scope("intra"))
        inter = group_time("send_recv", size, "tp", on_scope("inter"))
        with evaluate(False):
            scattered = (inter.xreplace({size: size / S.k_tp})
                         + group_time("all_gather", size, "tp", on_scope("intra")).xreplace(
                             {S.tp: S.k_tp}))
        inter = sp.Min(inter, scattered, evaluate=False)
        if fam.scope("tp") is not None:
            return intra if fam.scope("tp") == "intra" else inter
        return S.FLAGS["tp_intra"] * intra + (1 - S.FLAGS["tp_intra"]) * inter

    def on_pr(op: str, nbytes: Any, ranks: Any = None) -> Any:
        """op over the Pr group, or over its first `ranks` processes (the contributors: the
        same links, at most `ranks` of them in a node); op "spread": one round of the copy."""
        if op not in templates:
            templates[op] = spread_round() if op == "spread" else group_time(op, size, "tp", fam)
        t = templates[op]
        with evaluate(False):  # rebuilding every Min of the template evaluated would take minutes
            if ranks is not None:
                t = t.xreplace({S.tp: ranks, S.k_tp: sp.Min(S.k_tp, ranks)})
            return t.xreplace({size: nbytes})

    def mix(*weighted: tuple[Any, Any]) -> Any:
        """sum(weight * term), leaving out the terms a fixed option sets to 0 (not built)."""
        return sum((w * term() for w, term in weighted if w != 0), zero)

    def realised(standard: Any, specialised: Any) -> Any:
        standard, specialised = cache(standard), cache(specialised)
        return mix((1 - spec_flag - auto_flag, standard), (spec_flag, specialised),
                   (auto_flag, lambda: sp.Min(standard(), specialised(), evaluate=False)))

    def contributed(fused: str, first_op: str, nbytes: Any, c: Any) -> Any:
        """The fused collective (all_gather, all_reduce) or its split form (first_op + broadcast)
        with c contributors and Pr receivers, in the plan's realisation."""
        rounds = spread_rounds(c, pr)
        padded = nbytes * pr / c if fused == "all_gather" else nbytes  # blocks padded to n/c
        fused_t = lambda: realised(  # noqa: E731
            lambda: on_pr(fused, padded),
            lambda: on_pr(fused, nbytes, c) + rounds * on_pr("spread", nbytes))
        split_t = lambda: realised(  # noqa: E731
            lambda: on_pr(first_op, nbytes) + on_pr("broadcast", nbytes),
            lambda: on_pr(first_op, nbytes, c) + on_pr("broadcast", nbytes))
        return mix((1 - split_flag, fused_t), (split_flag, split_t))

    # a layer's terms are built on a placeholder degree, then given min(Pr, units) unevaluated
    # (sympy comparing every Min and Max of the GEMM and link models with it would take minutes)
    deg = sp.Dummy("c", positive=True, integer=True)
    params_local = zero
    for layer in model.layers:
        if layer.splits:
            g = Gemm(layer.name, local * layer.gemm_m, layer.gemm_n / deg, layer.gemm_k)
            t = gemm_time(g, e, dev)
            mp = contributed("all_gather", "reduce", e * layer.out_elements * local, deg)
            if not first:
                mp += contributed("all_reduce", "reduce", e * layer.in_elements * local, deg)
            dp = group_time("all_reduce", 4 * layer.params / deg, "dp", fam)
            with evaluate(False):
                t, mp, dp = (x.xreplace({deg: layer_degree(layer.gemm_n, pr)}) for x in (t, mp, dp))
            fwd += t
            bwd += 2 * t
            comm_mp += mp
            comm_dp += dp
            params_local += layer.params / layer_degree(layer.gemm_n, pr)
            first = False
        else:
            t = memory_time(e * (layer.in_elements + layer.out_elements) * local, dev)
            fwd += t
            bwd += 2 * t
            if layer.kind == "norm":
                comm_norm += sync_flag * 2 * group_time("all_reduce", 2 * 4 * layer.channels,
                                                        "dp", fam)
            if layer.params:
                comm_dp += group_time("all_reduce", 4 * layer.params, "dp", fam)
                params_local += layer.params
    activations = sum(layer.out_elements for layer in model.layers) * local * e
    # SGD with momentum in fp32: read weight, gradient, momentum; write weight, momentum
    optimizer = memory_time(20 * params_local, dev)
    time_terms = dict(zip(TERMS, (fwd, bwd, comm_mp, comm_dp, comm_norm, optimizer), strict=True))
    # beyond the tensors, as a transformer's (perfmodel.step.memory): one NCCL communicator's
    # buffers for each of the Pr and Pc groups the rank is in, and the caching allocator's
    # fragmentation of what is allocated and freed every step (the activations)
    memory_terms = {"weights": 4 * params_local, "gradients": 4 * params_local,
                    "optimizer_states": 4 * params_local, "activations": activations,
                    "reserved/nccl_buffers": S.M_nccl * (active(pr) + active(pc)),
                    "reserved/fragmentation": activations * S.f_frag / (1 - S.f_frag)}
    return {"time": time_terms, "memory": memory_terms}


@lru_cache(maxsize=32)
def _compiled(model: LayerGraphSpec, fam: Any, contributors: Contributors) -> tuple[Any, ...]:
    """One numpy function per model, link family and realisation of the collectives with fewer
    contributors than Pr (fixed: the three open would triple the expression and its compile time);
    every Pr, Pc, batch, norm and collective variant share it."""
    import hashlib

    from perfmodel.evaluate import cached, family_key, outputs_source

    kinds = ("time", "memory")
    names: dict[str, tuple[str, ...]] = {}

    def source() -> str:  # the numpy code of perfmodel.codegen, as the transformer families'
        terms = build_terms(model, fam, contributors=contributors)
        return outputs_source({f"{kind}:{name}": expr for kind in kinds
                               for name, expr in terms[kind].items()})

    # filed on disk like the transformer families (sympy.lambdify with its common
    # subexpressions took 30 s for AlexNet on every run: Max's simplification in its
    # preprocessing); keyed by the model's layers, the link family and the realisation
    key = hashlib.sha256(f"layers/{model!r}/{family_key(fam)}/{contributors.value}".encode())
    namespace = cached(f"layers-{key.hexdigest()[:20]}", source)
    meta = namespace["META"]
    for kind in kinds:
        names[kind] = tuple(out.split(":", 1)[1] for out in meta["outs"]
                            if out.startswith(f"{kind}:"))
    return tuple(meta["args"]), namespace["family"], names["time"], names["memory"]


def _as_transformer_plan(plan: GridPlan) -> tuple[Any, Any]:
    """The link model's view of a grid: Pr on the "tp" axis, Pc on "dp" (a placeholder
    transformer supplies the symbols the layer graph does not use)."""
    from perfmodel.specs.model import TransformerSpec
    from perfmodel.strategy import Dtype, Plan

    dummy = TransformerSpec(name="-", layers=1, hidden=1, heads=1, seq_len=1, vocab=1)
    proxy = Plan(gpus=plan.gpus, tp=plan.pr, dp=plan.pc, global_batch=plan.global_batch,
                 micro_batch=plan.global_batch // plan.pc, dtype=Dtype(plan.dtype))
    return dummy, proxy


def _grid_inputs(model: Any, hardware: Any, plan: Any = None
                 ) -> tuple[LayerGraphSpec, HardwareSpec, Any]:
    """A layer graph, its hardware and its GridPlan as predict takes a transformer's: a spec, a
    preset's name or a file; a GridPlan or a mapping of its fields."""
    from collections.abc import Mapping

    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model

    spec = load_model(model)
    if not isinstance(spec, LayerGraphSpec):
        raise PlanError(f"model '{spec.name}' is a transformer: predict it with perfmodel.predict "
                        "(a Pr x Pc grid is a layer graph's: CNN, MLP)")
    if plan is not None and not isinstance(plan, GridPlan):
        if not isinstance(plan, Mapping):
            raise PlanError(f"a grid plan is a GridPlan or a mapping of its fields, got "
                            f"{type(plan).__name__}")
        plan = GridPlan(**plan)
    return spec, load_hardware(hardware), plan


def predict_grid(model: LayerGraphSpec, hardware: HardwareSpec, plan: GridPlan) -> GridPrediction:
    """Step time and memory of a layer graph on a Pr x Pc grid."""
    from perfmodel.evaluate import family_of, values_of

    model, hardware, plan = _grid_inputs(model, hardware, plan)

    dummy, proxy = _as_transformer_plan(plan)
    fam = dataclasses.replace(family_of(dummy, hardware, proxy), tp_layout="1d")  # scopes open
    names, fn, time_names, mem_names = _compiled(model, fam, plan.contributors)
    values = values_of(dummy, hardware, proxy)
    values["is_sync_bn"] = float(plan.norm is Norm.SYNC)
    values["is_split_collectives"] = float(plan.variant is Variant.SPLIT)
    out = [float(x) for x in fn(*[values[n] for n in names])]
    times = dict(zip(time_names, out[: len(time_names)], strict=True))
    memory = dict(zip(mem_names, out[len(time_names):], strict=True))
    if hardware.memory_reserved_bytes:
        memory["reserved"] = float(hardware.memory_reserved_bytes)
    step = sum(times.values())
    context = (f"{model.name} on {hardware.name}, Pr={plan.pr} x Pc={plan.pc}, "
               f"batch {plan.global_batch}")
    require_finite({**times, "step_time_s": step}, "step time", context)
    require_finite(memory, "memory per GPU", context)
    flops = 3 * model.flops_per_sample * plan.global_batch
    total_memory = sum(memory.values())
    result = GridPrediction(
        step_time_s=step, samples_per_s=plan.global_batch / step, breakdown_s=times,
        memory_per_gpu_bytes=total_memory, memory_breakdown_bytes=memory,
        fits_in_memory=total_memory <= hardware.memory_bytes, model_flops_per_step=flops,
        mfu=flops / (step * plan.gpus * hardware.peak(plan.dtype)), plan=plan, model=model,
        hardware=hardware, layer_degrees=layer_degrees(model, plan.pr))
    require_finite(result.to_dict(), "prediction", context)
    return result


def layer_degrees(model: LayerGraphSpec, pr: int) -> dict[str, int]:
    """Every split layer's degree c = min(Pr, units): the processes that hold a part of it."""
    return {layer.name: int(layer_degree(layer.gemm_n, pr)) for layer in model.layers
            if layer.splits}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_grid(model: LayerGraphSpec, hardware: HardwareSpec, gpus: int, global_batch: int,
              **kw: Any) -> list[GridPrediction]:
    """Every Pr x Pc split of the GPUs (Pc dividing the batch), fastest first."""
    from perfmodel.specs.loading import plain
    from perfmodel.strategy import _positive_int

    model, hardware, _ = _grid_inputs(model, hardware)
    gpus = _positive_int(plain(gpus), "gpus")
    global_batch = _positive_int(plain(global_batch), "global_batch")
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


def _exact(x: float) -> Any:
    """A size as sympy's exact number (an integer where it is one, else the float's rational)."""
    import sympy as sp

    return sp.Integer(int(x)) if float(x).is_integer() else sp.Rational(x)


def communication_in_pr(model: LayerGraphSpec, gpus: int, global_batch: int,
                        bytes_per_element: int = 4,
                        contributors: Contributors | str = Contributors.STANDARD) -> dict[str, Any]:
    """Gholami et al. 2018's analysis (integrated model and data parallelism): the communication
    of one step as a function of Pr (Pc = P / Pr) with a uniform alpha-beta network and ring
    collectives; its minimiser in closed form (sympy) and over
    the divisors of P. A layer of u < P units is split over c = min(Pr, u) processes, its
    all-gather and all-reduce have c contributors and Pr receivers (in the given realisation, see
    perfmodel.costs.collectives); with such a Min in it sympy finds no closed form (None) and the
    exact minimiser is the answer."""
    import sympy as sp

    from perfmodel.costs.collectives import contributed_time

    how = _enum(Contributors, contributors, "contributors")
    Pr = sp.Symbol("P_r", positive=True)
    P, Bt = sp.Integer(gpus), sp.Integer(global_batch)
    alpha, beta = sp.symbols("alpha beta", positive=True)
    Pc = P / Pr
    e = bytes_per_element
    total = sp.Integer(0)
    first = True
    for layer in model.layers:
        if not layer.splits:
            continue
        # Pr never exceeds P: a layer of at least P units always splits over Pr
        c = Pr if layer.gemm_n >= gpus else layer_degree(layer.gemm_n, Pr)
        # sizes as exact numbers: with floats the terms of one GPU cancel to a rounding residue
        # (T_comm -4.3e-18 s at P = 1: a probe's, 2026-12-07)
        out_b = e * _exact(layer.out_elements) * Bt / Pc
        total += contributed_time("all_gather", out_b, c, Pr, alpha, beta, how)  # along Pr
        if not first:
            in_b = e * _exact(layer.in_elements) * Bt / Pc
            total += contributed_time("all_reduce", in_b, c, Pr, alpha, beta, how)  # along Pr
        w_b = 4 * _exact(layer.params) / c
        total += 2 * (Pc - 1) * alpha + 2 * (Pc - 1) / Pc * w_b / beta  # all-reduce along Pc
        first = False
    closed = None
    if total.has(sp.Min):
        total = sp.expand(total)
    else:
        total = sp.simplify(total)
        try:
            sols = [s_ for s_ in sp.solve(sp.diff(total, Pr), Pr) if s_.is_positive is not False]
            if sols:
                closed = sols[0]
        except (NotImplementedError, ValueError):
            closed = None
    return {"total": total, "pr": Pr, "alpha": alpha, "beta": beta, "closed_form": closed}


def exact_minimiser(comm: dict[str, Any], gpus: int, alpha: float,
                    beta: float) -> tuple[int, float]:
    import sympy as sp

    # exactly, in rationals: in floats the terms cancel to a rounding residue where there is no
    # communication (-4.3e-18 s on one GPU: a probe's, 2026-12-07); a few divisors, milliseconds
    total = comm["total"].subs({comm["alpha"]: sp.Rational(alpha), comm["beta"]: sp.Rational(beta)})
    times = {d: float(total.subs(comm["pr"], d)) for d in divisors(gpus)}
    best = min(times, key=lambda d: times[d])
    return best, times[best]


def sweep(model: LayerGraphSpec, hardware: HardwareSpec, plan: GridPlan,
          vary: dict[str, list[float]], best_pr: bool = False) -> Any:
    """A table (pandas) of predictions over values of hardware fields (dotted names, e.g.
    peak_flops_per_s, memory_bandwidth_bytes_per_s, inter_node.bandwidth_bytes_per_s), `gpus`
    (node count x GPUs per node; Pc grows, Pr kept) and `global_batch`; one row per combination,
    with its memory per GPU and whether it fits. best_pr: each point's fastest Pr x Pc split that
    fits (the fastest where none does)."""
    import itertools
    from collections.abc import Iterable, Mapping

    import pandas as pd

    model, hardware, plan = _grid_inputs(model, hardware, plan)
    if not isinstance(vary, Mapping):
        raise PlanError(f"vary is a mapping of a field to its values, got {type(vary).__name__}")
    for key, values in vary.items():  # a list of values: one number or a string is not
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise PlanError(f"vary {key}: give a list of values, got {values!r}")
    keys = list(vary)
    rows = []
    for combo in itertools.product(*(vary[k] for k in keys)):
        hw = hardware
        kw: dict[str, Any] = {"pr": plan.pr, "pc": plan.pc, "global_batch": plan.global_batch,
                              "norm": plan.norm, "variant": plan.variant,
                              "contributors": plan.contributors, "dtype": plan.dtype}
        for key, value in zip(keys, combo, strict=True):
            if key == "gpus":
                from perfmodel.strategy import _positive_int

                value = _positive_int(value, "sweep gpus")
                if int(value) % plan.pr:
                    raise PlanError(f"sweep gpus={value} is not a multiple of pr={plan.pr}")
                kw["pc"] = int(value) // plan.pr
            elif key == "global_batch":
                kw["global_batch"] = int(value)
            else:
                hw = _set_field(hw, key, float(value), kw["dtype"])
        if best_pr:  # the fastest split that fits, else the fastest (its row says it does not)
            gpus = kw["pr"] * kw["pc"]
            splits = best_grid(model, hw, gpus, kw["global_batch"], norm=kw["norm"],
                               variant=kw["variant"], contributors=kw["contributors"],
                               dtype=kw["dtype"])
            result = next((r for r in splits if r.fits_in_memory), splits[0])
        else:
            result = predict_grid(model, hw, GridPlan(**kw))
        row = dict(zip(keys, combo, strict=True))
        row.update({"pr": result.plan.pr, "pc": result.plan.pc, "step_time_s": result.step_time_s,
                    "samples_per_s": result.samples_per_s, "mfu": result.mfu,
                    # a point whose memory does not fit says so (it read as any other before
                    # 2026-12-07: a layer-graph probe's finding)
                    "memory_per_gpu_bytes": result.memory_per_gpu_bytes,
                    "fits_in_memory": result.fits_in_memory})
        comm = sum(v for k, v in result.breakdown_s.items() if k.startswith("comm/"))
        row["communication_share"] = comm / result.step_time_s
        row.update({f"time:{k}": v for k, v in result.breakdown_s.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _set_field(hardware: HardwareSpec, dotted: str, value: float, dtype: str) -> HardwareSpec:
    from perfmodel.recommend import apply_what_if

    if dotted == "peak_flops_per_s":  # the FLOP rate in the plan's dtype; the others scale with it
        ref = hardware.peak(dtype)
        # the plan's dtype takes the value as given (ref x value / ref may round below a bound
        # the value is at), the others their share of it
        given = f"peak_flops_per_s={value!r}"
        changes = sorted(((name, f"peak_flops_per_s.{name}="
                                 f"{value if name == dtype else flops * value / ref!r}")
                          for name, flops in hardware.peak_flops_per_s.items()),
                         key=lambda change: change[0] != dtype)  # the value given first
        for name, change in changes:
            try:
                hardware = apply_what_if(hardware, change, "--vary")
            except PerfmodelError as exc:  # named by the value given, not the one it became
                raise type(exc)(str(exc).replace(change, given) if name == dtype else
                                f"{exc} (from --vary {given}: every dtype's peak scaled with "
                                f"{dtype}'s)") from None
        return hardware
    return apply_what_if(hardware, f"{dotted}={value!r}", "--vary")


