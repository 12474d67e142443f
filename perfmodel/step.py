"""Compose the cost formulas into a step time and a per-GPU memory, as named sympy terms.

A `Family` fixes everything structural about a prediction (schedule, recompute mode, which links each
parallel axis uses, ...); numbers (sizes, degrees, hardware) stay symbols. `build(family)` returns the
named terms once per family; perfmodel.evaluate lambdifies them once and evaluates arrays of plans.

Step time (per optimizer step, slowest pipeline stage, no overlap of compute and tensor-parallel
communication, as in Megatron-LM):
    T_step = (m + (pp - 1)/v) * t_mb + T_dp + T_opt
    t_mb   = t_fwd + t_bwd + t_recompute + t_tp + t_kernels + t_p2p     (one micro-batch, one stage)
with m = B / (dp b) micro-batches (Narayanan et al. SC21, Sec. 2.2: bubble (pp - 1)/(v m) of ideal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import collectives as C
from perfmodel.costs import compute as K
from perfmodel.costs import memory as M
from perfmodel.family import Family


@dataclass(frozen=True)
class CommOp:
    """One kind of collective a rank issues: per call `nbytes` (nccl-tests convention), `calls` per step."""

    name: str
    axis: str
    op: str
    phase: str
    calls: sp.Expr
    nbytes: sp.Expr
    stage: str = "every"  # every stage, or only the "first" (embedding) or "last" (output layer)


@dataclass
class Model:
    """The built expressions of one family."""

    family: Family
    time_terms: dict[str, sp.Expr]  # name -> seconds per step (slowest stage)
    stage_time: dict[str, sp.Expr]  # stage -> seconds per micro-batch
    step_time: sp.Expr
    memory_terms: dict[str, dict[str, sp.Expr]]  # stage -> name -> bytes
    quantities: dict[str, sp.Expr]  # model FLOPs, parameters, micro-batches ...
    ledger: list[CommOp] = field(default_factory=list)


_AXIS_DEGREE = {"tp": S.tp, "dp": S.dp, "pp": S.pp}
_AXIS_PER_NODE = {"tp": S.k_tp, "dp": S.k_dp, "pp": S.k_pp}


def active(n: sp.Expr) -> sp.Expr:
    """1 when a group has more than one rank, else 0 (degrees are whole numbers >= 1)."""
    return sp.Min(1, n - 1)


def group_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    """Time of one collective over the group of a parallel axis, on the links its placement gives.

    intra: all ranks in one node (NVLink); inter: one rank per node, the node's NICs shared by its
    G GPUs; mixed: k ranks per node: the cheaper of a flat ring (its inter-node hop shares the NICs
    among G/k groups) and the hierarchical form. The algorithm is the cheapest unless the hardware
    fixes one. A calibrated fit for (op, scope) replaces the generic link model.
    """
    n, k, scope = _AXIS_DEGREE[axis], _AXIS_PER_NODE[axis], fam.scope(axis)
    fit_scope = "intra" if scope == "intra" else "inter"
    fitted = [alg for (o, sc, alg) in fam.fits if o == op and sc == fit_scope]
    if fitted:
        alpha, busbw = S.fit_symbols(op, fit_scope)
        t = C.steps(op, n, fitted[0]) * alpha + C.bus_factor(op, n) * nbytes / busbw
        return active(n) * t
    algs = list(C.ALGORITHMS[C.Op(op)])
    if fam.algorithm not in ("auto", "hierarchical") and C.Algorithm(fam.algorithm) in algs:
        algs = [C.Algorithm(fam.algorithm)]
    if scope == "intra":
        options = [C.collective_time(op, nbytes, n, S.alpha_i, S.beta_i, alg) for alg in algs]
    elif scope == "inter":
        beta = S.beta_o / S.G
        options = [C.collective_time(op, nbytes, n, S.alpha_o, beta, alg) for alg in algs]
    else:
        flat_beta = sp.Min(S.beta_i, S.beta_o * k / S.G)
        options = [C.collective_time(op, nbytes, n, S.alpha_o, flat_beta, alg) for alg in algs]
        hier = C.hierarchical_time(op, nbytes, n, k, S.alpha_i, S.beta_i, S.alpha_o, S.beta_o / S.G)
        if fam.algorithm == "hierarchical":
            options = [hier]
        else:
            options.append(hier)
    if fam.algorithm == "hierarchical" and scope != "mixed":
        options = options[:1]
    t = options[0] if len(options) == 1 else sp.Min(*options)
    return active(n) * t


def device() -> K.Device:
    return K.Device(S.F, S.W, S.t_k, dict(S.GEMM))


def build(fam: Family) -> Model:
    """All terms of the step time and memory of one family, in the symbols of perfmodel.symbols."""
    L, h, a, kv, f, s, V = S.L, S.h, S.a, S.kv, S.f, S.s, S.V
    dp, tp, pp, b, B, v, e = S.dp, S.tp, S.pp, S.b, S.B, S.v, S.e
    dev = device()
    T = b * s
    m = B / (dp * b)
    layers_per_stage = L / pp
    sp_ = fam.sequence_parallel

    # --- compute of one layer, forward, one micro-batch ---------------------------------------
    gemms = K.layer_gemms(T, b, s, h, a, kv, f, tp, fam.gated)
    gemm_t = {g.name: K.gemm_time(g, e, dev) for g in gemms}
    ew = K.elementwise_bytes(T, b, s, h, a, f, tp, e, sequence_parallel=sp_, flash=fam.flash,
                             gated=fam.gated, rms=not fam.layernorm)
    attention_ew = sum((ew[k] for k in ("softmax", "attention_dropout") if k in ew), sp.Integer(0))
    other_ew = sum((v_ for k, v_ in ew.items() if k not in ("softmax", "attention_dropout")),
                   sp.Integer(0))
    layer_fwd = {
        "gemm": sum((t for n_, t in gemm_t.items() if n_ not in K.ATTENTION_CORE), sp.Integer(0)),
        "attention": sum((gemm_t[n_] for n_ in K.ATTENTION_CORE), sp.Integer(0))
        + K.memory_time(attention_ew, dev),
        "elementwise": K.memory_time(other_ew, dev),
    }
    logits = K.logits_gemm(T, h, V, tp)
    head_fwd = K.gemm_time(logits, e, dev) + K.memory_time(K.cross_entropy_bytes(T, V, tp), dev)
    embed_fwd = K.memory_time(2 * e * T * h / (tp if sp_ else 1), dev)

    # --- tensor-parallel communication of one layer (Megatron 1D) ------------------------------
    ledger: list[CommOp] = []
    act_bytes = e * T * h  # a full activation of the micro-batch
    if sp_:
        tp_fwd_ops = [("all_gather", 2), ("reduce_scatter", 2)]
        tp_bwd_ops = [("reduce_scatter", 2), ("all_gather", 2)]
    else:
        tp_fwd_ops = [("all_reduce", 2)]
        tp_bwd_ops = [("all_reduce", 2)]
    tp_layer = {
        phase: sum((c * group_time(op, act_bytes, "tp", fam) for op, c in ops), sp.Integer(0))
        for phase, ops in (("fwd", tp_fwd_ops), ("bwd", tp_bwd_ops))
    }
    stage_layers_calls = m * layers_per_stage
    for phase, ops in (("fwd", tp_fwd_ops), ("bwd", tp_bwd_ops)):
        for op, c in ops:
            ledger.append(CommOp(f"tp/layer/{op}", "tp", op, phase, c * stage_layers_calls, act_bytes))
    if fam.recompute == "full":
        for op, c in tp_fwd_ops:
            ledger.append(CommOp(f"tp/recompute/{op}", "tp", op, "bwd", c * stage_layers_calls,
                                 act_bytes))
    # embedding (vocabulary-parallel): all-reduce (or reduce-scatter with SP) of its output forward;
    # output layer: its input is gathered (SP) forward and reduced backward; cross entropy
    # all-reduces max, sum and target logits over T fp32 values.
    embed_op = "reduce_scatter" if sp_ else "all_reduce"
    embed_tp = group_time(embed_op, act_bytes, "tp", fam)
    head_in_fwd = group_time("all_gather", act_bytes, "tp", fam) if sp_ else sp.Integer(0)
    head_in_bwd = group_time("reduce_scatter" if sp_ else "all_reduce", act_bytes, "tp", fam)
    ce_tp = 3 * group_time("all_reduce", 4 * T, "tp", fam)
    head_tp = head_in_fwd + head_in_bwd + ce_tp
    ledger.append(CommOp(f"tp/embedding/{embed_op}", "tp", embed_op, "fwd", m, act_bytes, "first"))
    if sp_:
        ledger.append(CommOp("tp/output/all_gather", "tp", "all_gather", "fwd", m, act_bytes, "last"))
    head_bwd_op = "reduce_scatter" if sp_ else "all_reduce"
    ledger.append(CommOp(f"tp/output/{head_bwd_op}", "tp", head_bwd_op, "bwd", m, act_bytes, "last"))
    ledger.append(CommOp("tp/cross_entropy/all_reduce", "tp", "all_reduce", "fwd", 3 * m, 4 * T,
                         "last"))

    # --- recompute --------------------------------------------------------------------------------
    if fam.recompute == "full":
        recompute_layer = layer_fwd["gemm"] + layer_fwd["attention"] + layer_fwd["elementwise"]
        recompute_tp = tp_layer["fwd"]
    elif fam.recompute == "selective":
        recompute_layer = layer_fwd["attention"]
        recompute_tp = sp.Integer(0)
    else:
        recompute_layer = recompute_tp = sp.Integer(0)

    kernels_layer = K.kernels_per_layer_forward(sequence_parallel=sp_, flash=fam.flash)
    kernels_mult = 3 + (1 if fam.recompute == "full" else 0)

    # --- pipeline point-to-point: activations forward, gradients backward, v chunks per GPU --------
    p2p_bytes = act_bytes / tp  # Megatron scatter-gather / sequence-parallel: 1/tp of the activation
    p2p_one = group_time("send_recv", p2p_bytes, "pp", fam)
    p2p_mb = 2 * v * p2p_one

    # --- stages -------------------------------------------------------------------------------------
    stages = ("first", "last") if fam.multi_stage else ("all",)
    stage_terms: dict[str, dict[str, sp.Expr]] = {}
    for st in stages:
        has_embed = st in ("first", "all")
        has_head = st in ("last", "all")
        fwd = {k_: layers_per_stage * t for k_, t in layer_fwd.items()}
        fwd["embedding_logits"] = (embed_fwd if has_embed else 0) + (head_fwd if has_head else 0)
        terms = {f"compute/forward/{k_}": t for k_, t in fwd.items()}
        terms.update({f"compute/backward/{k_}": 2 * t for k_, t in fwd.items()})
        terms["compute/recompute"] = layers_per_stage * recompute_layer
        terms["comm/tp"] = layers_per_stage * (tp_layer["fwd"] + tp_layer["bwd"] + recompute_tp) + (
            embed_tp if has_embed else 0) + (head_tp if has_head else 0)
        terms["overhead/kernels"] = S.t_k * (kernels_mult * kernels_layer * layers_per_stage
                                             + (12 if has_head else 0) + (3 if has_embed else 0))
        terms["pipeline/p2p"] = p2p_mb
        stage_terms[st] = {k_: sp.sympify(t) for k_, t in terms.items()}
    stage_time = {st: sum(t.values(), sp.Integer(0)) for st, t in stage_terms.items()}
    t_mb = stage_time["all"] if not fam.multi_stage else sp.Max(stage_time["first"], stage_time["last"])
    ledger.append(CommOp("pp/send_recv", "pp", "send_recv", "fwd+bwd", 2 * v * m * active(pp),
                         p2p_bytes))

    # --- parameters and data-parallel gradient synchronisation ---------------------------------------
    lp = M.layer_params(h, a, kv, f, gated=fam.gated, bias=fam.bias, qkv_bias=fam.qkv_bias,
                        layernorm=fam.layernorm)
    layer_params_gpu = lp["sharded"] / tp + lp["replicated"]
    emb = M.embedding_params(h, V, s, learned_positions=fam.learned_positions)
    final_norm = (2 if fam.layernorm else 1) * h
    output_gpu = V * h / tp
    stage_params: dict[str, sp.Expr] = {}
    for st in stages:
        p = layers_per_stage * layer_params_gpu
        if st in ("first", "all"):
            p += emb["sharded"] / tp + emb["replicated"]
        if st in ("last", "all"):
            p += final_norm
            if not fam.tied_embeddings or st == "last":
                p += output_gpu  # a tied output layer on the last stage keeps its own copy
        stage_params[st] = p
    params_gpu = stage_params["all"] if not fam.multi_stage else sp.Max(*stage_params.values())
    per_param = M.model_state_bytes_per_param(fam.precision)
    grad_bytes = per_param["gradients"] * params_gpu
    weight_bytes = per_param["weights"] * params_gpu
    if fam.zero == 0:  # DDP / Megatron: all-reduce the gradients
        dp_ops = [("all_reduce", grad_bytes, sp.Integer(1))]
    elif fam.zero in (1, 2):  # distributed optimizer: reduce-scatter gradients, all-gather weights
        dp_ops = [("reduce_scatter", grad_bytes, sp.Integer(1)),
                  ("all_gather", weight_bytes, sp.Integer(1))]
    else:  # ZeRO-3 / FSDP: gather weights forward and backward, reduce-scatter gradients, per micro-batch
        dp_ops = [("all_gather", weight_bytes, 2 * m), ("reduce_scatter", grad_bytes, m)]
    t_dp_sync = sum((calls * group_time(op, nb, "dp", fam) for op, nb, calls in dp_ops), sp.Integer(0))
    for op, nb, calls in dp_ops:
        ledger.append(CommOp(f"dp/{op}", "dp", op, "step" if fam.zero < 3 else "fwd+bwd",
                             calls * active(dp), nb))
    if fam.overlap_grad_sync:
        hide = stage_terms[stages[-1]]
        bwd_last = sum((t for k_, t in hide.items() if k_.startswith("compute/backward")), sp.Integer(0))
        window = bwd_last * (m if fam.zero == 3 else 1)
        t_dp = sp.Max(0, t_dp_sync - window)
    else:
        t_dp = t_dp_sync

    # --- optimizer: memory-bound passes over the local parameters (see costs.memory) -------------
    local_params = params_gpu / (dp if fam.zero >= 1 else 1)
    t_opt = K.memory_time(M.optimizer_step_bytes_per_param(fam.precision) * local_params, dev) \
        + 8 * S.t_k

    # --- time terms for the slowest stage -------------------------------------------------------------
    time_terms = {}
    for st in stages:
        for name, t in stage_terms[st].items():
            time_terms[f"{st}:{name}"] = m * t
    time_terms["pipeline/bubble"] = (pp - 1) / v * t_mb
    time_terms["comm/dp"] = t_dp
    time_terms["optimizer/step"] = t_opt
    step_time = (m + (pp - 1) / v) * t_mb + t_dp + t_opt

    # --- memory per GPU, per stage --------------------------------------------------------------------
    div = M.zero_divisors(fam.zero, dp)
    act_layer = M.layer_activation_bytes(b, s, h, a, kv, f, tp, e, sequence_parallel=sp_,
                                         recompute=fam.recompute, flash=fam.flash, gated=fam.gated)
    inflight = M.inflight_micro_batches(fam.schedule, pp, m, v)
    memory_terms: dict[str, dict[str, sp.Expr]] = {}
    for st in stages:
        mem = {name: per_param[name] * stage_params[st] / div[name] for name in per_param}
        stage_inflight = inflight if st in ("first", "all") else sp.Integer(1)
        mem["activations/layers"] = act_layer * layers_per_stage * stage_inflight
        if fam.recompute == "full":
            mem["activations/recompute_buffer"] = M.layer_activation_bytes(
                b, s, h, a, kv, f, tp, e, sequence_parallel=sp_, recompute="none",
                flash=fam.flash, gated=fam.gated)
        extra = sp.Integer(0)
        if st in ("first", "all"):
            extra += T * h / (tp if sp_ else 1) * stage_inflight  # embedding dropout mask
        if st in ("last", "all"):
            extra += 2 * e * T * h / (tp if sp_ else 1) + 2 * 4 * T * V / tp  # final norm, fp32 logits
        mem["activations/embedding_output"] = extra
        if fam.zero == 3:
            mem["buffers/zero3_gather"] = 2 * e * layer_params_gpu  # a gathered layer, prefetched one
        memory_terms[st] = mem

    # model FLOPs: 3 x forward (Narayanan et al. 2021, Eq. 3 without recompute); hardware FLOPs add
    # what recompute repeats (full: every layer's forward; selective: the attention core), never logits
    full_gemms = K.layer_gemms(T, b, s, h, a, kv, f, 1, fam.gated)
    layer_flops = sum((g.flops for g in full_gemms), sp.Integer(0))
    fwd_flops_mb = L * layer_flops + logits.flops * tp
    model_flops = 3 * fwd_flops_mb * m * dp
    if fam.recompute == "full":
        repeated = L * layer_flops
    elif fam.recompute == "selective":
        repeated = L * sum((g.flops for g in full_gemms if g.name in K.ATTENTION_CORE), sp.Integer(0))
    else:
        repeated = sp.Integer(0)
    hw_flops = model_flops + repeated * m * dp
    total_params = L * (lp["sharded"] + lp["replicated"]) + emb["sharded"] + emb["replicated"] + (
        final_norm) + (0 if fam.tied_embeddings else V * h)
    quantities = {
        "micro_batches": m,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        "parameters": total_params,
        "parameters_per_gpu": params_gpu,
        "tokens_per_step": B * s,
    }
    return Model(fam, time_terms, stage_time, step_time, memory_terms, quantities, ledger)
