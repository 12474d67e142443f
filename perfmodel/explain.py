"""`perfmodel explain`: the formulas behind a prediction, with every symbol's meaning and value."""

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
    family = family_of(model, hardware, plan)
    built = build(family)
    result = predict(model, hardware, plan)
    values = values_of(model, hardware, plan)
    show = sp.latex if latex else (lambda e: sp.sstr(e))
    stage = result.bottleneck_stage
    t_mb = sp.Symbol("t_mb")
    T_dp, T_opt = sp.Symbol("T_dp"), sp.Symbol("T_opt")
    lines = [
        f"# {model.name} on {plan.gpus} x {hardware.gpu_name}: predicted step time "
        f"{result.step_time_s:.6g} s (slowest stage: {stage})",
        "",
        "step time:",
        "  " + show(sp.Eq(sp.Symbol("T_step"), (S.B / (S.dp * S.b) + (S.pp - 1) / S.v) * t_mb + T_dp + T_opt)),
        "  t_mb  = time of one micro-batch on the slowest stage (sum of the per-micro-batch terms below)",
        "  m     = B / (dp b) micro-batches; bubble = (pp - 1)/v * t_mb",
        "",
        "terms (seconds per step):",
    ]
    for key, expr in built.time_terms.items():
        name = key.split(":", 1)[1] if ":" in key else key
        if ":" in key and not key.startswith(f"{stage}:"):
            continue
        if only and name not in only and not any(name.startswith(o) for o in only):
            continue
        value = result.breakdown_s.get(name, 0.0)
        lines.append(f"- {name} = {value:.6g} s")
        lines.append("    " + show(expr))
    lines += ["", "symbols:"]
    by_sym = S.by_symbol()
    used = set().union(*(sp.sympify(e).free_symbols for e in built.time_terms.values()))
    for sym in sorted(used, key=lambda s_: s_.name):
        name, meaning = by_sym.get(sym, (sym.name, ""))
        lines.append(f"  {sp.latex(sym) if latex else sym.name:>22} = {values.get(name, float('nan')):<14.6g}"
                     f" {meaning}")
    return "\n".join(lines)
