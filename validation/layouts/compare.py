"""`perfmodel validate` for the 2D and 3D tensor layouts: time one transformer block of the model
under the layout on local ranks, and set the collectives it issued against the model's ledger.

The job runs one block (pre-norm LayerNorm, fused QKV without bias, causal attention, GELU MLP) at
the model's hidden size, heads, MLP width and sequence length with the plan's micro-batch; the
prediction is for the whole model, so measured times are also given times the layer count (the
embedding, the LM head and the data-parallel sync are not run). Mesh axes map onto the model's
tensor-parallel sub-axes: 2D "col" (where X blocks travel) -> tpa, "row" -> tpb; 3D a, b, c -> tpa,
tpb, tpc.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from perfmodel.errors import PlanError

AXIS_MAP = {"2d": {"col": "tpa", "row": "tpb"}, "3d": {"a": "tpa", "b": "tpb", "c": "tpc"}}


def block_dims(model: Any, plan: Any) -> dict[str, int]:
    """The block the job runs, from a TransformerSpec and a Plan; PlanError when the job's block
    cannot represent the model (grouped-query attention, gated MLP)."""
    if model.kv_heads != model.heads:
        raise PlanError(
            "the 2D/3D validation block has multi-head attention: kv_heads must equal "
            f"heads (got {model.kv_heads} and {model.heads}); override with --heads"
        )
    head_dim = getattr(model, "head_dim", model.hidden // model.heads)
    if model.heads * head_dim != model.hidden:
        raise PlanError("the 2D/3D validation block's attention is hidden wide: heads x head_dim "
                        f"({model.heads} x {head_dim}) must equal hidden ({model.hidden})")
    if getattr(model, "gated_mlp", False):
        raise PlanError("the 2D/3D validation block has a plain GELU MLP, the model a gated one")
    return {
        "batch": int(plan.micro_batch),
        "seq": int(model.seq_len),
        "hidden": int(model.hidden),
        "heads": int(model.heads),
        "ffn": int(model.ffn_hidden),
    }


def per_layer_ledger(ledger: list[dict[str, Any]], layers: int) -> list[dict[str, Any]]:
    """The model's per-layer tensor-parallel collectives (stage "every"), calls per layer."""
    out = []
    for r in ledger:
        if r.get("stage") == "every" and str(r.get("axis", "")).startswith("tp"):
            out.append({**r, "calls": float(r["calls"]) / layers})
    return out


def compare(
    layout: str, measured: list[dict[str, Any]], model_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Rows (axis, op, phase, nbytes) with the calls per block measured and modelled."""
    if layout not in AXIS_MAP:
        raise PlanError(f"no ledger comparison for layout {layout!r}")
    axes = AXIS_MAP[layout]
    got: dict[tuple, float] = defaultdict(float)
    want: dict[tuple, float] = defaultdict(float)
    for r in measured:
        got[(axes.get(r["axis"], r["axis"]), r["op"], r["phase"], int(r["nbytes"]))] += r["calls"]
    for r in model_rows:
        want[(r["axis"], r["op"], r["phase"], int(round(r["nbytes"])))] += r["calls"]
    rows = []
    for key in sorted(set(got) | set(want)):
        m, p = got.get(key, 0.0), want.get(key, 0.0)
        rows.append(
            {
                "axis": key[0],
                "op": key[1],
                "phase": key[2],
                "nbytes": key[3],
                "job_calls": m,
                "model_calls": p,
                "agree": abs(m - p) < 1e-9,
            }
        )
    return rows


def validate_layout(
    model: Any,
    hardware: Any,
    plan: Any,
    run_dir: Path,
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Run the block under plan.tp_layout (2d or 3d) on plan.tp local gloo ranks; a report with
    measured times, the prediction and the ledger comparison."""
    from perfmodel import comm_ledger, predict
    from workload.layouts.harness import run_layout

    layout = str(getattr(plan.tp_layout, "value", plan.tp_layout))
    if layout not in AXIS_MAP:
        raise PlanError(f"layout validation runs tp_layout 2d or 3d, got {layout}")
    if plan.dp != 1 or plan.pp != 1:
        raise PlanError("layout validation runs the tensor-parallel grid alone: use dp = pp = 1")
    if plan.dtype not in ("fp32", "tf32"):
        raise PlanError(f"layout validation runs fp32 on CPU; got dtype {plan.dtype}")
    # the layout job runs eagerly (no graphs, nothing compiled): predicted so, and before the
    # run, so that a plan the model refuses costs no run
    plan = plan.replace(stack="eager", kernels="eager" if plan.kernels.value == "compiled"
                        else plan.kernels)
    prediction = predict(model, hardware, plan, refuse_idle=False).to_dict()
    dims = block_dims(model, plan)
    measured = run_layout(layout, dims, {}, plan.tp, Path(run_dir), steps, warmup, timeout_s)
    rows = compare(
        layout,
        measured["collectives"],
        per_layer_ledger(comm_ledger(model, plan, hardware), model.layers),
    )
    layers = int(model.layers)
    return {
        "layout": layout,
        "ranks": plan.tp,
        "block_dims": dims,
        "layers": layers,
        "measured_block": {
            k: measured[k] for k in ("forward_s", "backward_s", "optimizer_s", "comm_s", "step_s")
        },
        "measured_block_x_layers_s": {
            k: measured[k] * layers for k in ("forward_s", "backward_s", "comm_s")
        },
        "predicted_breakdown_s": prediction["breakdown_s"],
        "predicted_step_time_s": prediction["step_time_s"],
        "ledger": rows,
        "ledger_agrees": all(r["agree"] for r in rows),
        "collectives": measured["collectives"],
        "notes": [
            "the job runs one transformer block; the prediction covers the whole model",
            "measured on CPU with gloo; the prediction is for the given hardware",
        ],
    }


def render(report: dict[str, Any]) -> list[str]:
    """Plain text lines for the CLI."""
    m, x = report["measured_block"], report["measured_block_x_layers_s"]
    lines = [
        f"{report['layout']} layout on {report['ranks']} ranks, block {report['block_dims']}",
        f"measured per block: forward {m['forward_s'] * 1e3:.2f} ms, backward "
        f"{m['backward_s'] * 1e3:.2f} ms, collectives {m['comm_s'] * 1e3:.2f} ms",
        f"x {report['layers']} layers: forward {x['forward_s'] * 1e3:.1f} ms, backward "
        f"{x['backward_s'] * 1e3:.1f} ms, collectives {x['comm_s'] * 1e3:.1f} ms; predicted "
        f"comm/tp {report['predicted_breakdown_s'].get('comm/tp', 0.0) * 1e3:.1f} ms",
        "collectives per block (job vs model):",
    ]
    for r in report["ledger"]:
        mark = "ok" if r["agree"] else "DIFFERS"
        lines.append(
            f"  {r['axis']:4} {r['phase']:3} {r['op']:14} {r['nbytes']:>10} B  "
            f"job {r['job_calls']:g}  model {r['model_calls']:g}  {mark}"
        )
    return lines


def mlp_widths(model: Any) -> list[int]:
    """[d_in, d_1, ..., d_out] of a layer graph made of linear layers (activations between them)."""
    linears = [layer for layer in model.layers if layer.kind == "linear"]
    if not linears or any(layer.kind == "conv" for layer in model.layers):
        raise PlanError(
            "Pr x Pc validation runs MLP layer graphs (linear layers); time a CNN with python -m "
            'workload.layouts --layout prpc --dims \'{"model": "cnn", ...}\''
        )
    widths = [int(linears[0].gemm_k)]
    for layer in linears:
        if int(layer.gemm_k) != widths[-1] or layer.gemm_m != 1:
            raise PlanError(
                f"layer {layer.name}: not a chain of linear layers (in {layer.gemm_k}, "
                f"previous out {widths[-1]})"
            )
        widths.append(int(layer.gemm_n))
    return widths


def validate_grid(
    model: Any,
    hardware: Any,
    plan: Any,
    run_dir: Path,
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Train the MLP layer graph on a Pr x Pc grid (perfmodel.layerwise.GridPlan) of local gloo
    ranks; measured forward, backward and per-axis collective times against predict_grid. A layer
    narrower than Pr runs on c = min(Pr, units) ranks, its collectives in the plan's realisation
    (contributors standard or specialised, as predict_grid models them)."""
    from perfmodel.layerwise import predict_grid
    from workload.layouts.harness import run_layout

    if plan.dtype not in ("fp32", "tf32"):
        raise PlanError(f"Pr x Pc validation runs fp32 on CPU; got dtype {plan.dtype}")
    contributors = str(getattr(plan.contributors, "value", plan.contributors))
    if contributors not in ("standard", "specialised"):
        raise PlanError(
            "Pr x Pc validation runs --contributors standard or specialised (auto picks per "
            f"call from the model's costs), got {contributors}"
        )
    dims = {"model": "mlp", "batch": int(plan.global_batch), "widths": mlp_widths(model)}
    measured = run_layout(
        "prpc",
        dims,
        {"pr": plan.pr, "pc": plan.pc, "contributors": contributors},
        plan.pr * plan.pc,
        Path(run_dir),
        steps,
        warmup,
        timeout_s,
    )
    prediction = predict_grid(model, hardware, plan).to_dict()
    per_axis: defaultdict[str, float] = defaultdict(float)
    for c in measured["collectives"]:
        per_axis[c["axis"]] += c["seconds"]
    pred = prediction["breakdown_s"]
    terms = [
        ("compute/forward", measured["forward_s"], pred.get("compute/forward")),
        ("compute/backward", measured["backward_s"], pred.get("compute/backward")),
        ("comm/model_parallel", per_axis["pr"], pred.get("comm/model_parallel")),
        ("comm/data_parallel", per_axis["pc"], pred.get("comm/data_parallel")),
        ("optimizer/step", measured["optimizer_s"], pred.get("optimizer/step")),
    ]
    return {
        "layout": "prpc",
        "ranks": plan.pr * plan.pc,
        "plan": {
            "pr": plan.pr,
            "pc": plan.pc,
            "global_batch": plan.global_batch,
            "contributors": contributors,
        },
        "layer_degrees": prediction["layer_degrees"],
        "mlp_widths": dims["widths"],
        "terms": [{"name": n, "measured_s": m, "predicted_s": p} for n, m, p in terms],
        "measured_step_time_s": measured["step_s"],
        "predicted_step_time_s": prediction["step_time_s"],
        "collectives": measured["collectives"],
        "notes": [
            "forward and backward include their collectives; the comm terms are the "
            "barrier-synchronised wall times of the collectives of a probe step"
        ],
    }


def render_grid(report: dict[str, Any]) -> list[str]:
    p = report["plan"]
    lines = [
        f"Pr x Pc = {p['pr']} x {p['pc']}, MLP {report['mlp_widths']}, batch "
        f"{p['global_batch']}: measured vs predicted"
    ]
    for t in report["terms"]:
        pred = "-" if t["predicted_s"] is None else f"{t['predicted_s'] * 1e3:.3f} ms"
        lines.append(f"  {t['name']:22} {t['measured_s'] * 1e3:9.3f} ms   {pred}")
    lines.append(
        f"  {'step':22} {report['measured_step_time_s'] * 1e3:9.3f} ms   "
        f"{report['predicted_step_time_s'] * 1e3:.3f} ms"
    )
    return lines
