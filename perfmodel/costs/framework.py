"""What the training framework adds to the kernels of a transformer's parts (measured).

A part (one transformer layer, the embedding, the output layer with its loss) takes, per
micro-batch on one rank,

    t_fwd = s * C_fwd + c_fwd        t_bwd = s * C_bwd + c_bwd                              [s]

plus its collectives (perfmodel.costs.collectives). C is the part's roofline compute
(perfmodel.costs.compute), s its compute scale and c_fwd, c_bwd fixed costs, all three measured by
`perfmodel calibrate run` (stage layers: the validation job's own modules, timed at several
widths and token counts, calibration.layers) for each tensor-parallel style and degree. The fixed
cost is the framework's per-micro-batch work whatever the size (Python module calls, the
dispatcher, autograd, DTensor's sharding propagation and redistributions, launches); the scale is
how much slower the framework runs the kernels than their roofline, as measured in isolation
(fresh activations instead of hot operands; on CPUs the communication threads take cycles from
compute while a collective is in flight).

Between the degrees measured a value is interpolated linearly in log2(tp), beyond them it stays at
the nearest one. A style with no measurement keeps perfmodel's generic cost: kernel_overhead_s per
kernel (and s = 1); the returned weight says which share of a plan is calibrated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy as sp


def interpolate_log2(tp: sp.Expr, points: Sequence[tuple[int, sp.Expr]]) -> sp.Expr:
    """Piecewise-linear in log2(tp) through (degree, value) points, constant outside them.

    y = y_0 + sum_i (y_{i+1} - y_i) * clamp((log2 tp - log2 d_i) / (log2 d_{i+1} - log2 d_i), 0, 1)
    """
    points = sorted(points)
    if not points:
        raise ValueError("interpolate_log2 needs at least one point")
    value = sp.sympify(points[0][1])
    for (d0, y0), (d1, y1) in zip(points, points[1:], strict=False):
        x = (sp.log(tp) - sp.log(d0)) / (sp.log(d1) - sp.log(d0))
        value += (y1 - y0) * sp.Min(1, sp.Max(0, x, evaluate=False), evaluate=False)
    return value


def part_costs(
    measured: Mapping[str, Sequence[tuple[int, tuple[sp.Expr, sp.Expr, sp.Expr]]]],
    weights: Mapping[str, sp.Expr],
    tp: sp.Expr,
) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
    """(scale, forward overhead, backward overhead, calibrated weight) of one part.

    measured: style -> [(tp degree, (forward_overhead_s, backward_overhead_s, compute_scale))];
    weights: style -> 0/1 indicator that the plan runs in that style (they sum to 1).
    A style without measurements adds its weight to the scale (s = 1) and nothing else.
    """
    scale, fwd, bwd, calibrated = (sp.Integer(0),) * 4
    for style, w in weights.items():
        points = measured.get(style, ())
        if not points:
            scale += w
            continue
        fwd += w * interpolate_log2(tp, [(d, v[0]) for d, v in points])
        bwd += w * interpolate_log2(tp, [(d, v[1]) for d, v in points])
        scale += w * interpolate_log2(tp, [(d, v[2]) for d, v in points])
        calibrated += w
    return scale, fwd, bwd, calibrated
