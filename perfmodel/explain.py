"""`perfmodel explain`: the formulas behind a prediction, with every symbol's meaning and value.

The formulas are those of the plan's own family (its options fixed), so they read without the 0/1
indicators of the universal expression that `predict` evaluates; both give the same numbers.
"""

from __future__ import annotations

import sympy as sp

from perfmodel import symbols as S
from perfmodel.evaluate import family_of, values_of
from perfmodel.predict import predict
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import TransformerSpec
from perfmodel.step import build
from perfmodel.strategy import Plan


def explain_text(model: TransformerSpec, hardware: HardwareSpec, plan: Plan, *, latex: bool = False,
                 only: tuple[str, ...] = ()) -> str:
    family = family_of(model, hardware, plan, specialise=True)
    built = build(family)
    result = predict(model, hardware, plan)
    values = values_of(model, hardware, plan)
    subs = {sym: values[name] for name, (sym, _) in S.table().items() if name in values}
    show = sp.latex if latex else sp.sstr
    stage = "first" if result.bottleneck_stage in ("first", "all") else "last"
    m = plan.num_micro_batches
    t_mb, T_dp, T_opt = sp.symbols("t_mb T_dp T_opt")
    lines = [
        f"# {model.name} on {plan.gpus} x {hardware.gpu_name}: predicted step time "
        f"{result.step_time_s:.6g} s (slowest stage: {result.bottleneck_stage})",
        "",
        "step time:",
        "  " + show(sp.Eq(sp.Symbol("T_step"),
                          (S.B / (S.dp * S.b) + (S.pp - 1) / S.v) * t_mb + T_dp + T_opt)),
        f"  m = B / (dp b) = {m} micro-batches; t_mb = one micro-batch on the slowest stage, the sum"
        " of the terms below; the pipeline bubble is (pp - 1)/v t_mb",
        "",
        "per micro-batch terms of t_mb (value per micro-batch; x m per step):",
    ]

    def wanted(name: str) -> bool:
        return not only or any(name == o or name.startswith(o) for o in only)

    for key, expr in built.time_terms.items():
        if not key.startswith(f"{stage}:"):
            continue
        name = key.split(":", 1)[1]
        if not wanted(name):
            continue
        per_mb = expr / S.B * S.dp * S.b  # the factor m cancels
        value = float(per_mb.subs(subs))
        lines.append(f"- {name} = {value:.6g} s per micro-batch, {value * m:.6g} s per step")
        lines.append("    " + show(per_mb))
    for name, sym in (("comm/dp", T_dp), ("optimizer/step", T_opt)):
        if wanted(name):
            lines.append(f"- {name} ({sym}) = {result.breakdown_s[name]:.6g} s per step")
            lines.append("    " + show(built.time_terms[name]))
    if wanted("pipeline/bubble"):
        lines.append(f"- pipeline/bubble = (pp - 1)/v t_mb = {result.breakdown_s['pipeline/bubble']:.6g} s")
    lines += ["", "symbols:"]
    by_sym = S.by_symbol()
    used = set().union(*(sp.sympify(e).free_symbols for e in built.time_terms.values()))
    for sym in sorted(used, key=lambda s_: s_.name):
        name, meaning = by_sym.get(sym, (sym.name, ""))
        label = sp.latex(sym) if latex else sym.name
        lines.append(f"  {label:>22} = {values.get(name, float('nan')):<14.6g} {meaning}")
    return "\n".join(lines)
