"""`perfmodel explain`: the formulas behind a prediction, with every symbol's meaning and value.

The formulas are those of the plan's own family (its options fixed), so they read without the 0/1
indicators of the universal expression that `predict` evaluates; both give the same numbers.
"""

from __future__ import annotations

from typing import Any

import sympy as sp

from perfmodel import codegen
from perfmodel import symbols as S
from perfmodel.errors import PerfmodelError, PlanError
from perfmodel.evaluate import _built, compile_outputs, family_of, fp8_recipe_of, values_of
from perfmodel.predict import heaviest_stage, predict
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.loading import suggest
from perfmodel.specs.model import TransformerSpec
from perfmodel.step import compose as CO
from perfmodel.step.compose import STEP_SYMBOLS, STEP_TERMS
from perfmodel.strategy import Plan


def explain_text(model: TransformerSpec | str, hardware: HardwareSpec | str,
                 plan: Plan | dict[str, Any], *, latex: bool = False,
                 only: tuple[str, ...] | str = ()) -> str:
    from perfmodel.predict import resolve_inputs

    # a preset's name, a file, a dict plan: as predict takes them; one term as a string
    model, hardware, plan = resolve_inputs(model, hardware, plan)
    if isinstance(only, str):
        only = (only,)
    elif only is None:
        only = ()
    elif not isinstance(only, (tuple, list)) or not all(isinstance(t, str) for t in only):
        raise PlanError(f"only is a term's name or a list of them, got {only!r}")
    only = tuple(only)
    family = family_of(model, hardware, plan, specialise=True)
    built = _built(family)
    result = predict(model, hardware, plan, refuse_idle=False)
    show = sp.latex if latex else S.plain_str
    stage = result.breakdown_stage  # the terms predict's breakdown shows
    m = plan.num_micro_batches
    composed = built.stages[stage]
    # every number printed, compiled once (and cached on disk) as predict's families are:
    # substituting into each tree rebuilt every Min and Max (a minute on a mixture of experts)
    printed = _printed(built, stage)
    compiled = compile_outputs(family, f"explain-{stage}", lambda b: _printed(b, stage))
    values = values_of(model, hardware, plan)
    out = compiled(values)
    numbers = {sp.sympify(e): float(out[name]) for name, e in printed.items()}

    def number(expr: sp.Expr) -> float:
        return numbers[sp.sympify(expr)]

    lines = [
        f"# {model.name} on {plan.gpus} x {hardware.gpu_name}: predicted step time "
        f"{result.step_time_s:.6g} s (slowest stage: {result.bottleneck_stage})",
        "",
        *fabric_lines(hardware, plan),
        attention_line(model, hardware, plan),
        "",
        "step time, as perfmodel.step composes it:",
        *(f"  {show(sym)} = {show(expr, order='none')}" for sym, expr in built.composition.items()),
        "with",
    ]
    for sym, expr in built.term_values.items():
        if sym.name == "m":
            lines.append(f"  m = {show(expr)} = {m} micro-batches")
        elif sym.name.startswith("t_"):
            lines.append(f"  {sym} = {number(expr):.6g} s: one micro-batch on the {sym.name[2:]} "
                         "stage, the sum of its terms")
        elif sym.name == "W_fill":
            lines.append(f"  W_fill = {number(expr):.6g} s: the weight gradients a zero-bubble "
                         "schedule moves into the bubble (zb: 2 x, zbv: 3 x half the backward "
                         "GEMMs of the faster stage; 0 otherwise)")
        elif sym.name == "T_zbv":
            lines.append(f"  T_zbv = {number(expr):.6g} s: ZB-V's bubble as its order runs, the "
                         "longest of its chains of passes on the other stages' pace less what "
                         "the slowest stage's own work covers (perfmodel.step.pipeline."
                         "zbv_bubble_s; docs/timeline.md)")
    sums_at = len(lines)  # the stages' host and device sums, named where a step term holds them
    lines.append("  and T_bubble, T_dp, ..., T_opt the step terms below")
    if composed.host_share is not None:  # an asynchronous device: host and device overlap
        x, share, host, device = composed.host_share
        p = CO.HOST_DEVICE_SHARPNESS
        sections = composed.synced
        if sections is not None and sum(number(v) for v in sections) > 0:
            h_r, d_r, h_a, d_a = (number(v) for v in sections)
            how, where = "(t - D) / H", (
                f"; t = D_A + ((H_R + e_A)^{p} + D_R^{p})^(1/{p}) + (H_B^{p} + D_B^{p})^(1/{p}), "
                f"e_A = (H_A^{p} + D_A^{p})^(1/{p}) - D_A: its MoE layers synchronise the host "
                f"in each forward (the token counts), their routed sections H_R = {h_r:.6g} s, "
                f"D_R = {d_r:.6g} s (exchange, experts, combine), the rest of those forwards "
                f"H_A = {h_a:.6g} s, D_A = {d_a:.6g} s, the rest of the micro-batch H_B = H - "
                "H_R - H_A, D_B = D - D_R - D_A")
        else:
            how, where = f"((H^{p} + D^{p})^(1/{p}) - D) / H", ""
        lines += [f"  {show(x)} = {how} = {number(share):.6g}: the share of the host's time the "
                  f"device does not hide, H = {number(host):.6g} s (the host terms' sum), D = "
                  f"{number(device):.6g} s (the device's: compute and communication){where}"]

    def under(name: str, prefix: str) -> bool:
        """name is the term prefix or one under it (comm/tp: not comm/tp_grads)."""
        prefix = prefix.rstrip("/")
        return name == prefix or name.startswith(prefix + "/")

    def wanted(name: str) -> bool:
        return not only or any(under(name, o) for o in only)

    # a step term that hides behind a stage's micro-batch (the overlaps' windows) holds that
    # stage's host share, host and device sums, and its forward or backward whole, hundreds of
    # thousands of characters each: named (the largest first: a share holds its sums)
    sums: dict[sp.Expr, sp.Expr] = {}
    what_of: dict[sp.Symbol, str] = {}
    windows = _windows(built)
    for name, expr in windows.items():
        phase, where = WINDOWS[name]
        sums[expr] = sym = sp.Symbol(name)
        what_of[sym] = (f"one micro-batch's {phase} on the {where} stage as it runs (the "
                        "window a data-parallel overlap hides behind: "
                        + ("its phases' host and device time, one segment from its start)"
                           if phase == "forward" else "the micro-batch less its forward)"))
    # (the parameter gathers of every micro-batch hide behind both, whose like terms sympy
    # has gathered: a forward GEMM's and its backward's one product)
    both = sp.Add(*windows.values())
    if both not in sums:
        sums[both] = sp.Add(*map(sp.Symbol, windows))
    for st, each in built.stages.items():
        if each.host_share is None:
            continue
        x, value, host, device = each.host_share
        if st != stage:  # the breakdown stage's share is defined above, with its formula
            sums[sp.sympify(value)] = x
            what_of[x] = (f"the share of the host's time the device does not hide on the {st} "
                          f"stage (as x_host_{stage} below, of that stage's own sums)")
        sums[sp.sympify(host)] = sp.Symbol(f"H_{st}")
        sums[sp.sympify(device)] = sp.Symbol(f"D_{st}")
        what_of[sp.Symbol(f"H_{st}")] = ("the host's dispatch of one micro-batch (the host "
                                         f"terms' sum) on the {st} stage")
        what_of[sp.Symbol(f"D_{st}")] = ("the device's time of one micro-batch (compute and "
                                         f"communication) on the {st} stage")
    if composed.host_share is not None:
        sums[sp.sympify(composed.host_share[1])] = composed.host_share[0]
    # the share a pool of overlaps hides together (FSDP's gathers and reductions: their windows
    # share the backwards), which each of its terms holds whole, every collective's time in it
    for pool, share in _pool_shares(built).items():
        sym = sp.Symbol(f"r_{pool}")
        sums[sp.sympify(share)] = sym
        what_of[sym] = (f"the share of what the {pool} pool's overlaps hide alone that they "
                        "hide together: 1 - I (1 - min(1, (1 + k) P / sum h)), P the compute "
                        "their windows span (FSDP's gathers and reductions share the backwards)")
    # (a number is never named: every 0 or 1 of the formulas would take its name)
    sums = {e: sym for e, sym in sums.items() if not e.is_number}

    def named(expr: sp.Expr) -> sp.Expr:
        return codegen.xreplace_shared(sp.sympify(expr), sums, lattice_as_is=True,
                                       partial_sums=True) if sums \
            else expr

    step_shown = {name: named(built.time_terms[name]) for name in STEP_SYMBOLS
                  if name in built.time_terms and name != "pipeline/bubble" and wanted(name)}
    used_sums = codegen.free_symbols(list(step_shown.values())) & set(sums.values())
    for expr, sym in sums.items():
        if sym in used_sums and sym in what_of:
            unit = "" if sym.name.startswith(("x_", "r_")) else " s"
            lines.insert(sums_at, f"  {show(sym)} = {number(expr):.6g}{unit}: {what_of[sym]}")
            sums_at += 1
    mem_stage = heaviest_stage({st: sum(number(e) for e in terms.values())
                                for st, terms in built.memory_terms.items()})
    memory_terms = built.memory_terms[mem_stage]
    names = sorted({*built.stage_terms[stage], *STEP_TERMS,
                    *(t for t in built.time_terms if t in STEP_SYMBOLS),
                    *(f"memory/{k}" for k in memory_terms), "memory/reserved"})
    for o in only:  # a typo must not silently print nothing
        if not any(under(n, o) for n in names):
            raise PerfmodelError(f"--term: no term '{o}'{suggest(o, names)}; terms (or a group "
                                 f"of them): {', '.join(names)}")

    if any(wanted(name) for name in built.stage_terms[stage]):
        lines += ["", f"per micro-batch terms of t_{stage} (value per micro-batch; x m per "
                      "step):"]
    for name, per_mb in built.stage_terms[stage].items():
        if not wanted(name):
            continue
        value = number(per_mb)
        lines.append(f"- {name} = {value:.6g} s per micro-batch, {value * m:.6g} s per step")
        lines.append("    " + show(composed.display[name]))
    if any(wanted(name) and name in built.time_terms for name in STEP_SYMBOLS):
        lines += ["", "step terms (per step):"]
    for name, sym in STEP_SYMBOLS.items():
        if not wanted(name) or name not in built.time_terms:  # an fp8 plan's alone: its own
            continue
        lines.append(f"- {name} ({sym}) = {result.breakdown_s[name]:.6g} s per step")
        if name != "pipeline/bubble":  # its formula is the composition's, above
            lines.append("    " + show(step_shown[name]))
    lines += _memory_lines(memory_terms, mem_stage, hardware, result, number, show, wanted)
    lines += ["", "symbols:"]
    by_sym = S.by_symbol()
    shown_memory = [e for k, e in memory_terms.items() if wanted(f"memory/{k}")]
    # the symbols of the terms shown (--term: those alone), and of the composition and m above
    shown_time = [e for name, e in built.time_terms.items()  # (stage terms: STAGE:NAME)
                  if wanted(name.split(":", 1)[-1])]
    above = [*built.composition.values(),
             *(e for sym, e in built.term_values.items() if sym.name == "m")]
    used = codegen.free_symbols([sp.sympify(e) for e in (*shown_time, *shown_memory)]) | {
        sym for sym in codegen.free_symbols([sp.sympify(e) for e in above]) if sym in by_sym}
    for sym in sorted(used, key=lambda s_: s_.name):
        name, meaning = by_sym.get(sym, (sym.name, ""))
        label = sp.latex(sym) if latex else S.plain_name(sym.name)
        shown = f"{values[name]:<14.6g}" if name in values else f"{'-':<14}"  # never 'nan'
        lines.append(f"  {label:>22} = {shown} {meaning}")
    return "\n".join(lines)


def _memory_lines(terms: dict[str, Any], stage: str, hardware: HardwareSpec, result: Any,
                  number: Any, show: Any, wanted: Any) -> list[str]:
    """The memory per GPU of the stage that holds the most, term by term (memory/NAME, as
    --term selects them), with the formulas perfmodel.step.memory counts them by."""
    picked = {k: e for k, e in terms.items() if wanted(f"memory/{k}")}
    reserved = float(hardware.memory_reserved_bytes or 0)
    if not picked and not (reserved and wanted("memory/reserved")):
        return []
    where = "every GPU" if result.plan.pp == 1 else \
        f"the {stage} stage's GPUs (the stage that holds the most)"
    from perfmodel.render import memory_verdict_text

    out = ["", f"memory per GPU [bytes] on {where}: {result.memory_per_gpu_bytes / 2**30:.4g} "
               f"GiB of {result.memory_capacity_bytes / 2**30:.4g} GiB "
               f"- {memory_verdict_text(result, markup=False)}:"]
    for name, expr in picked.items():
        value = number(expr)
        out.append(f"- memory/{name} = {value:.6g} B ({value / 2**30:.4g} GiB)")
        out.append("    " + show(expr))
    if reserved and wanted("memory/reserved"):
        out.append(f"- memory/reserved = {reserved:.6g} B ({reserved / 2**30:.4g} GiB): the CUDA "
                   "context and libraries' workspaces (the hardware's memory_reserved_bytes)")
    return out


def _printed(built: Any, stage: str) -> dict[str, Any]:
    """What explain prints a number of, named: the composition's values, the stage's terms, every
    stage's memory terms and, on an asynchronous device, the host's share and its sections."""
    out = {f"value:{sym.name}": e for sym, e in built.term_values.items()}
    out.update({f"term:{name}": e for name, e in built.stage_terms[stage].items()})
    out.update({f"memory:{st}:{name}": e for st, terms in built.memory_terms.items()
                for name, e in terms.items()})
    for st, each in built.stages.items():  # every stage's host share, host and device sums
        if each.host_share is not None:
            out.update({f"host_share:{st}": each.host_share[1],
                        f"host_sum:{st}": each.host_share[2],
                        f"device_sum:{st}": each.host_share[3]})
    out.update({f"window:{name}": e for name, e in _windows(built).items()})
    out.update({f"pool:{name}": e for name, e in _pool_shares(built).items()})
    composed = built.stages[stage]
    if composed.host_share is not None:
        out.update({f"host:{i}": e for i, e in enumerate(composed.host_share[1:])})
        out.update({f"synced:{i}": e for i, e in enumerate(composed.synced or ())})
    return out


def _pool_shares(built: Any) -> dict[str, Any]:
    """Each pool of the step's overlaps: its share r (perfmodel.step.compose.pool_shares), with
    the step's micro-batches as perfmodel.step.recipe composes the step."""
    m = built.term_values.get(CO.M_SYM, sp.Integer(1))
    return {name: share for phase in built.phases.get("step", ())
            for name, share in CO.pool_shares(phase, m).items()}


# the windows the step's data-parallel overlaps hide behind, as perfmodel.step.recipe builds
# them, by the name explain gives them: (phase, stage)
WINDOWS = {"F_first": ("forward", "first"), "B_last": ("backward", "last")}


def _windows(built: Any) -> dict[str, Any]:
    """Each of WINDOWS: the first stage's forward (the parameter gathers hide behind it) and the
    last stage's backward (the gradient reduction)."""
    phase_s = {"forward": CO.forward_s, "backward": CO.backward_s}
    return {name: sp.sympify(phase_s[phase](built.stages[stage]))
            for name, (phase, stage) in WINDOWS.items()}


def attention_line(model: TransformerSpec, hardware: HardwareSpec, plan: Plan) -> str:
    """How the attention core is costed: which flash kernel (the plan's --attention-kernel, else
    the hardware's default for the dtype) and where its speed comes from, whose E_fa and s_fa
    the formulas below take; or unfused, or the fused kernel's FLOPs at the GEMM efficiency
    where no kernel is measured for the dtype (I_fa 0). The plan as resolve_inputs resolved it
    (its flash_attention decided)."""
    from perfmodel.encode import compute_dtype

    if not plan.flash_attention:
        return "attention: unfused (the scores and their softmax in memory)"
    dtype = compute_dtype(plan.dtype)
    kernel = hardware.flash_kernel(dtype, plan.attention_kernel)
    if kernel is None:
        return (f"attention: fused, no flash kernel of {hardware.name} measured for {dtype}: its "
                f"FLOPs at the {dtype} GEMM efficiency (I_fa = 0)")
    named = f" {kernel.name}" if kernel.name else ""
    chosen = "named by --attention-kernel" if plan.attention_kernel else "the hardware's default"
    dims = ", ".join(str(p.head_dim) for p in kernel.by_head_dim)
    return (f"attention: flash, kernel{named} ({kernel.kernel}), {chosen}; measured at head "
            f"dims {dims} (the model's: {model.attention_head_dim}): its E_fa and s_fa below")


def fabric_lines(hardware: HardwareSpec, plan: Plan) -> list[str]:
    """Where each parallel group of the plan lies on the hardware's fabric: its ranks per node,
    the fabric level its ranks reach (the smallest whose domain holds them; perfmodel.encode.
    axis_levels) and the level whose link prices it beyond the node (the slowest it crosses)."""
    from perfmodel.encode import (
        axis_levels,
        axis_per_node,
        axis_ranks_per_node,
        fabric_of,
        plan_arrays,
    )
    from perfmodel.names import AXES

    fabric = hardware.fabric()
    arrays = plan_arrays(plan)
    per_node = axis_per_node(plan, hardware)
    degrees = {axis: int(degree[0]) for axis, (degree, _) in
               axis_ranks_per_node(arrays, hardware.gpus_per_node).items()}
    encoded = fabric_of(hardware)
    levels = {axis: (int(reach[0]), int(priced[0]))
              for axis, (reach, priced) in axis_levels(arrays, encoded).items()}
    if len(hardware.levels) <= 2:  # a two-level fabric: beyond the node, the one network
        levels = {axis: (min(reach, 1), 1) for axis, (reach, _) in levels.items()}
    described = " > ".join(f"{name} ({gpus} GPUs)" if gpus else f"{name} (the cluster)"
                           for name, gpus, _, _ in fabric)
    taken = int(encoded.domains(arrays)[0][0])
    taken_note = "" if taken == hardware.gpus_per_node else (
        f"; the job takes {taken} GPUs of each {fabric[0][0]} domain (the same in each, whole "
        "hosts, as Megatron-Bridge's launcher sets Slurm's --segment)")
    lines = [f"fabric: {described}{taken_note}; where each group of the plan lies:"]
    for axis in AXES:
        redundant = (axis == "dp_cp" and plan.cp == 1) \
            or (axis == "edp" and plan.ep * plan.etp == 1) \
            or (axis == "etp_ep" and min(plan.ep, plan.etp) == 1) \
            or (axis == "tp_dp_cp" and fp8_recipe_of(plan, hardware) != "delayed")
        if degrees[axis] <= 1 or redundant:
            continue
        ranks, scope = per_node[axis]
        reach, priced = levels[axis]
        if reach == 0:
            where = f"inside one {fabric[0][0]} domain, on its links"
        else:  # the slowest level's bandwidth, the latency of the levels it crosses
            name, _, share, latency = fabric[priced]
            if encoded.outer:  # (crossed_link's, as the step model prices the group)
                latency = dict(encoded.outer[reach - 1])["latency_s"]
            where = (f"reaches {fabric[reach][0]}, priced on {name} ({share / 1e9:.4g} GB/s per "
                     f"GPU, {latency * 1e6:.3g} us per step)")
        lines.append(f"  {axis}: {degrees[axis]} ranks, {ranks} per node ({scope}): {where}")
    return lines


def explain_grid_text(model: Any, hardware: HardwareSpec, plan: Any, *, latex: bool = False) -> str:
    """Gholami et al. 2018's analysis (integrated model and data parallelism) for a layer graph:
    communication as a function of Pr (Pc = P / Pr), the Pr that minimises it (closed form where
    sympy solves it, and exactly over the divisors of P), and the full model's step time for every
    split."""
    import dataclasses

    from perfmodel.layerwise import (
        communication_in_pr,
        divisors,
        exact_minimiser,
        layer_degrees,
        predict_grid,
    )

    P = plan.gpus
    e = 4 if plan.dtype in ("fp32", "tf32") else 2
    comm = communication_in_pr(model, P, plan.global_batch, e, plan.contributors)
    show = sp.latex if latex else sp.sstr
    # a uniform network as in the paper: the link the Pr x Pc grid mostly uses
    if P <= hardware.gpus_per_node:
        alpha = hardware.intra_node.latency_s
        beta = hardware.intra_node.effective_bandwidth_bytes_per_s
        link = "intra-node"
    else:
        alpha = hardware.inter_node.latency_s
        beta = hardware.inter_node.effective_bandwidth_bytes_per_s / hardware.gpus_per_node
        link = "inter-node (per GPU)"
    lines = [f"# {model.name}: {P} processes as Pr x Pc, batch {plan.global_batch}",
             "",
             "communication of one step, ring collectives on a uniform alpha-beta network "
             "(Gholami et al. 2018): all-gather of each layer's output and all-reduce of its input "
             "gradient along Pr, all-reduce of its weight gradient along Pc = P / Pr:",
             "  T_comm(P_r) = " + show(comm["total"])]
    narrow = {name: c for name, c in layer_degrees(model, P).items() if c < P}
    if narrow:
        lines += ["", "layers with fewer units than P, split over c = min(P_r, units) processes "
                      "(their all-gather and all-reduce: c contributors, P_r receivers, "
                      f"{plan.contributors.value}): "
                  + ", ".join(f"{name} ({c} units)" for name, c in narrow.items())]
    pr_star = comm["closed_form"]
    values = {comm["alpha"]: alpha, comm["beta"]: beta}
    if pr_star is not None:
        lines += ["", "dT_comm/dP_r = 0 at", "  P_r* = " + show(pr_star),
                  f"  = {float(pr_star.subs(values)):.4g} with alpha = {alpha:.4g} s, beta = "
                  f"{beta:.4g} B/s ({link})"]
        if not 1 <= float(pr_star.subs(values)) <= P:  # no split has it: the divisors decide
            lines.append(f"  (outside 1..{P}, the splits there are: the exact minimiser below "
                         "is the answer)")
    else:
        lines += ["", "dT_comm/dP_r = 0 has no closed form sympy finds; the exact minimiser "
                      "follows."]
    best, t_best = exact_minimiser(comm, P, alpha, beta)
    lines.append(f"exact minimiser over the divisors of {P}: P_r = {best} (Pc = {P // best}), "
                 f"T_comm = {t_best:.4g} s")
    beyond = [what for what, on in (
        ("synchronized batch norm's all-reduces of the statistics (--norm sync)",
         plan.norm.value == "sync"),
        ("the split collectives (--collective-variant split: gather or reduce, then broadcast)",
         plan.variant.value == "split")) if on]
    if beyond:  # the analysis is the paper's case; the table below is the plan's
        lines.append("T_comm(P_r) above is Gholami et al.'s case, the fused collectives "
                     f"without synchronized statistics: {' and '.join(beyond)} are in the full "
                     "model's times below, not in it")
    lines += ["", "full model (compute, link placement, optimizer):"]
    rows = []
    for pr in divisors(P):
        pc = P // pr
        if plan.global_batch % pc:
            continue
        r = predict_grid(model, hardware, dataclasses.replace(plan, pr=pr, pc=pc))
        comm_s = sum(v for k, v in r.breakdown_s.items() if k.startswith("comm/"))
        rows.append((r.step_time_s, pr, pc, comm_s))
        lines.append(f"  Pr = {pr:>4} x Pc = {pc:>4}: step {r.step_time_s:.4g} s, communication "
                     f"{comm_s:.4g} s")
    fastest = min(rows)
    kind = "pure data parallel" if fastest[1] == 1 else (
        "pure model parallel" if fastest[2] == 1 else "hybrid")
    lines.append(f"fastest: Pr = {fastest[1]} x Pc = {fastest[2]} ({kind}), {fastest[0]:.4g} s")
    return "\n".join(lines)
