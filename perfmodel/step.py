"""Compose the cost formulas into a step time and a per-GPU memory, as named sympy terms.

`build(family)` returns the named terms of a Family (see perfmodel.family): options left open are 0/1
indicator symbols, so the universal family is one expression for every plan; perfmodel.evaluate
lambdifies it once and evaluates arrays of plans. A fixed family gives the same formulas specialised.

Step time (per optimizer step, slowest pipeline stage, no overlap of compute and tensor-parallel
communication, as in Megatron-LM):
    T_step = (m + (pp - 1)/v) * t_mb + T_dp + T_dp_framework + T_opt
    t_mb   = t_fwd + t_bwd + t_recompute + t_tp + t_kernels + t_p2p     (one micro-batch, one stage)
T_dp_framework: the gradient sync's memory passes and FSDP2's reduction hooks. Where ranks
time-share a device (ranks_per_device rho > 1) the bubble (pp - 1)/v shrinks to
min((pp - 1)/v, max(0, (m + (pp - 1)/v)/rho - m)) micro-batch times.
t_fwd and t_bwd hold the rooflines of the kernels and, where `calibrate run` measured them, what the
framework adds to each part (perfmodel.costs.framework); t_kernels is the generic per-kernel cost of
the parts it did not measure.
with m = B / (dp b) micro-batches (Narayanan et al. SC21, Sec. 2.2: bubble (pp - 1)/(v m) of ideal).
The first stage holds the embedding, the last the output layer and loss; with pp = 1 one stage holds
both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import collectives as C
from perfmodel.costs import compute as K
from perfmodel.costs import framework as FW
from perfmodel.costs import layouts as LY
from perfmodel.costs import memory as M
from perfmodel.family import SCOPES, Family

I = S.FLAGS  # noqa: E741  (indicator symbols by option name)


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
    time_terms: dict[str, sp.Expr]  # "stage:name" or name -> seconds per step
    stage_time: dict[str, sp.Expr]  # stage -> seconds per micro-batch
    step_time: sp.Expr
    memory_terms: dict[str, dict[str, sp.Expr]]  # stage -> name -> bytes
    quantities: dict[str, sp.Expr]  # model FLOPs, parameters, micro-batches ...
    ledger: list[CommOp] = field(default_factory=list)


def flag(value: object, name: str) -> sp.Expr:
    """A fixed option as 0/1, an open one (None) as its indicator symbol."""
    if value is None:
        return I[name]
    return sp.Integer(1 if value else 0)


_AXIS_DEGREE = {"tp": S.tp, "dp": S.dp, "pp": S.pp, "tpa": S.q_a, "tpb": S.q_b, "tpc": S.q_c}
_AXIS_PER_NODE = {"tp": S.k_tp, "dp": S.k_dp, "pp": S.k_pp, "tpa": S.k_a, "tpb": S.k_b,
                  "tpc": S.k_c}


def active(n: sp.Expr) -> sp.Expr:
    """1 when a group has more than one rank, else 0 (degrees are whole numbers >= 1)."""
    return sp.Min(1, n - 1, evaluate=False)


def _scope_time(op: str, nbytes: sp.Expr, axis: str, scope: str, fam: Family) -> sp.Expr:
    """Time of one collective of an axis's group when the group lies `scope` (intra/inter/mixed)."""
    n, k = _AXIS_DEGREE[axis], _AXIS_PER_NODE[axis]
    fit_scope = "intra" if scope == "intra" else "inter"
    fitted = sorted(alg for (o, sc, alg) in fam.fits if o == op and sc == fit_scope)
    if fitted:
        alpha, busbw, alpha_small, busbw_small, breakpoint = S.fit_symbols(op, fit_scope)
        steps, factor = C.steps(op, n, fitted[0]), C.bus_factor(op, n)
        large = steps * alpha + factor * nbytes / busbw
        small = steps * alpha_small + factor * nbytes / busbw_small
        return sp.Piecewise((small, nbytes < breakpoint), (large, True))
    algs = list(C.ALGORITHMS[C.Op(op)])
    if fam.algorithm not in ("auto", "hierarchical") and C.Algorithm(fam.algorithm) in algs:
        algs = [C.Algorithm(fam.algorithm)]
    if scope == "intra":
        options = [C.collective_time(op, nbytes, n, S.alpha_i, S.beta_i, alg) for alg in algs]
    elif scope == "inter":
        beta = S.beta_o / S.G
        options = [C.collective_time(op, nbytes, n, S.alpha_o, beta, alg) for alg in algs]
    else:
        flat_beta = sp.Min(S.beta_i, S.beta_o * k / S.G, evaluate=False)
        options = [C.collective_time(op, nbytes, n, S.alpha_o, flat_beta, alg) for alg in algs]
        hier = C.hierarchical_time(op, nbytes, n, k, S.alpha_i, S.beta_i, S.alpha_o, S.beta_o / S.G)
        options = [hier] if fam.algorithm == "hierarchical" else [*options, hier]
    if fam.algorithm == "hierarchical" and scope != "mixed":
        options = options[:1]
    return options[0] if len(options) == 1 else sp.Min(*options, evaluate=False)


def group_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    """Time of one collective over the group of a parallel axis, on the links its placement gives.

    intra: all ranks in one node (NVLink); inter: one rank per node, the node's NICs shared by its
    G GPUs; mixed: k ranks per node: the cheaper of a flat ring (its inter-node hop shares the NICs
    among G/k groups) and the hierarchical form. The algorithm is the cheapest unless the hardware
    fixes one. A calibrated fit for (op, scope) replaces the generic link model. An open scope is
    the sum of the three, each weighted by its indicator.
    """
    n, scope = _AXIS_DEGREE[axis], fam.scope(axis)
    if scope is not None:
        return active(n) * _scope_time(op, nbytes, axis, scope, fam)
    fitted = {sc for sc in SCOPES if any(o == op and fs == ("intra" if sc == "intra" else "inter")
                                         for (o, fs, _) in fam.fits)}
    generic = _open_scope_time(op, nbytes, axis, fam)
    if not fitted:
        return active(n) * generic
    return active(n) * sum((I[f"{axis}_{sc}"] * (_scope_time(op, nbytes, axis, sc, fam)
                                                 if sc in fitted else generic)
                            for sc in SCOPES), sp.Integer(0))


_NEVER_S = sp.Float(1e30)  # a time no algorithm takes: removes an option from a Min


def _open_scope_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    """The generic link model of _scope_time for a scope left open, written once: the scope picks
    the latency and bandwidth through its indicators, and the hierarchical form competes only in
    mixed groups. Equal to sum(I_scope * _scope_time(scope)) with a third of the operations."""
    n, k = _AXIS_DEGREE[axis], _AXIS_PER_NODE[axis]
    i_intra, i_inter, i_mixed = (I[f"{axis}_{sc}"] for sc in SCOPES)
    alpha = i_intra * S.alpha_i + (1 - i_intra) * S.alpha_o
    beta = i_intra * S.beta_i + i_inter * S.beta_o / S.G + i_mixed * sp.Min(
        S.beta_i, S.beta_o * k / S.G, evaluate=False)
    algs = list(C.ALGORITHMS[C.Op(op)])
    if fam.algorithm not in ("auto", "hierarchical") and C.Algorithm(fam.algorithm) in algs:
        algs = [C.Algorithm(fam.algorithm)]
    if fam.algorithm == "hierarchical":
        algs = algs[:1]
    options = [C.collective_time(op, nbytes, n, alpha, beta, alg) for alg in algs]
    if op not in ("all_to_all", "send_recv"):
        hier = C.hierarchical_time(op, nbytes, n, k, S.alpha_i, S.beta_i, S.alpha_o, S.beta_o / S.G)
        if fam.algorithm == "hierarchical":
            # fixed: hierarchical in mixed groups, the first algorithm elsewhere
            return i_mixed * hier + (1 - i_mixed) * options[0]
        options.append(hier + _NEVER_S * (1 - i_mixed))
    return options[0] if len(options) == 1 else sp.Min(*options, evaluate=False)


# the optional terms of the GEMM model: the Family flag that says a hardware has one, its parameters
_GEMM_OPTIONAL = {
    "gemm_split_k": ("split_k_ratio", "split_k_chunk"),
    "gemm_large_kernel": ("large_flops", "large_max_fraction", "large_parallel_half"),
    "gemm_epilogue": ("epilogue_s",),
}


def device(fam: Family | None = None) -> K.Device:
    """The device's symbols. The optional terms of the GEMM model (perfmodel.costs.gemm_efficiency:
    split-K, the large-tile kernel, the epilogue) enter the expressions only for hardware whose
    GEMM fit has them (Family.gemm_split_k, gemm_large_kernel, gemm_epilogue)."""
    dropped = {name for flag_, names in _GEMM_OPTIONAL.items()
               if fam is None or not getattr(fam, flag_) for name in names}
    gemm = {name: sym for name, sym in S.GEMM.items() if name not in dropped}
    return K.Device(S.F, S.W, S.t_k, gemm)


def build(fam: Family) -> Model:
    """All terms of the step time and memory of one family, in the symbols of perfmodel.symbols."""
    L, h, a, kv, f, s, V = S.L, S.h, S.a, S.kv, S.f, S.s, S.V
    d = S.d if fam.free_head_dim else h / a  # the head size; the attention is a*d wide
    dp, tp, pp, b, B, v, e = S.dp, S.tp, S.pp, S.b, S.B, S.v, S.e
    dev = device(fam)
    T = b * s
    m = B / (dp * b)
    layers_per_stage = L / pp
    multi = active(pp)  # 1 with several pipeline stages, 0 with one
    single = 1 - multi
    sp_ = flag(fam.sequence_parallel, "sequence_parallel")
    full = flag(None if fam.recompute is None else fam.recompute == "full", "recompute_full")
    sel = flag(None if fam.recompute is None else fam.recompute == "selective", "recompute_selective")
    z1, z2, z3 = (flag(None if fam.zero is None else fam.zero >= k_, f"zero{k_}") for k_ in (1, 2, 3))
    gpipe = flag(None if fam.schedule is None else fam.schedule == "gpipe", "gpipe")
    inter = flag(None if fam.schedule is None else fam.schedule == "interleaved", "interleaved")
    zb = flag(None if fam.schedule is None else fam.schedule in ("zb", "zbv"), "zero_bubble")
    zbv = flag(None if fam.schedule is None else fam.schedule == "zbv", "zbv")
    flash = flag(fam.flash, "flash")
    overlap = flag(fam.overlap_grad_sync, "overlap_grad_sync")
    gated = flag(fam.gated, "gated")
    grid2 = flag(None if fam.tp_layout is None else fam.tp_layout == "2d", "tp2d")  # 2d and 2.5d
    grid3 = flag(None if fam.tp_layout is None else fam.tp_layout == "3d", "tp3d")
    mega = 1 - grid2 - grid3  # Megatron 1D
    qa, qb, qc = S.q_a, S.q_b, S.q_c
    # every activation is split over the tp ranks with sequence parallelism or a 2d/3d grid
    dist = mega * sp_ + (1 - mega)
    rep = 1 + dist * (tp - 1)

    # --- compute of one layer, forward, one micro-batch ---------------------------------------
    gemms = K.layer_gemms(T, b, s, h, a, kv, f, tp, gated, d)
    gemm_t = {g.name: K.gemm_time(g, e, dev) for g in gemms}
    linears = LY.linear_shapes(h, a, kv, f, gated, d)
    if fam.tp_layout != "1d":  # the grid layouts replace the four linear layers' GEMMs
        for name, K_, M_ in linears:
            grid = LY.grid_gemms(name, T, K_, M_, qa, qc)
            grid_t = grid2 * K.gemm_time(grid["2d"], e, dev) \
                + grid3 * K.gemm_time(grid["3d"], e, dev)
            gemm_t[name] = mega * gemm_t[name] + grid_t
    ew = K.elementwise_bytes(T, b, s, h, a, f, tp, e, sequence_parallel=dist, flash=flash, gated=gated)
    attention_ew = ew["softmax"] + ew["attention_dropout"]
    other_ew = ew["layernorm"] + ew["activation"] + ew["dropout_add"]
    layer_fwd = {
        "gemm": sum((t for n_, t in gemm_t.items() if n_ not in K.ATTENTION_CORE), sp.Integer(0)),
        "attention": sum((gemm_t[n_] for n_ in K.ATTENTION_CORE), sp.Integer(0))
        + K.memory_time(attention_ew, dev),
        "elementwise": K.memory_time(other_ew, dev),
    }
    logits = K.logits_gemm(T, h, V, tp)
    head_fwd = K.gemm_time(logits, e, dev) + K.memory_time(K.cross_entropy_bytes(T, V, tp), dev)
    embed_fwd = K.memory_time(2 * e * T * h / rep, dev)

    # --- tensor-parallel communication (Megatron 1D) ---------------------------------------------
    # per layer, forward: 2 all-reduces, or with sequence parallelism 2 all-gathers + 2
    # reduce-scatters; backward the same collectives again (their adjoints).
    ledger: list[CommOp] = []
    act_bytes = e * T * h  # a full activation of the micro-batch
    ag = group_time("all_gather", act_bytes, "tp", fam)
    rs = group_time("reduce_scatter", act_bytes, "tp", fam)
    ar = group_time("all_reduce", act_bytes, "tp", fam)
    tp_layer_one_way = sp_ * 2 * (ag + rs) + (1 - sp_) * 2 * ar
    calls_layers = m * layers_per_stage
    tp_on = active(tp)  # no tensor-parallel collective when tp = 1
    for phase, repeat in (("fwd", 1), ("bwd", 1), ("recompute", full)):
        for op, count in (("all_gather", 2 * sp_), ("reduce_scatter", 2 * sp_),
                          ("all_reduce", 2 * (1 - sp_))):
            ledger.append(CommOp(f"tp/layer/{op}", "tp", op, "bwd" if phase == "recompute" else phase,
                                 mega * tp_on * repeat * count * calls_layers, act_bytes))
    tp_layer = {"fwd": mega * tp_layer_one_way, "bwd": mega * tp_layer_one_way}
    if fam.tp_layout != "1d":  # 2d / 2.5d / 3d grids: see perfmodel.costs.layouts
        vectors = 1 + flag(fam.layernorm, "layernorm")  # weight and bias, or RMSNorm's weight
        grid_ops = [(grid2, op) for _, K_, M_ in linears for op in LY.summa_comm(T, K_, M_, e, qa, qc)]
        grid_ops += [(grid3, op) for name, K_, M_ in linears
                     for op in LY.cube_comm(T, K_, M_, e, qa,
                                            swapped=name in ("attention_output", "mlp_down"))]
        grid_ops += [(grid2, op) for op in LY.norm_comm(T, qa * qc, "tpa")]
        grid_ops += [(grid3, op) for op in LY.norm_comm(T, qa * qa, "tpb")]
        grid_ops += [(grid2, op) for op in LY.norm_weight_grads(h, qa, S.wbytes, vectors, ("tpb",))]
        grid_ops += [(grid3, op) for op in LY.norm_weight_grads(h, qa, S.wbytes, vectors,
                                                                 ("tpa", "tpc"))]
        for weight, op in grid_ops:
            t = weight * op.count * group_time(op.op, op.nbytes, op.axis, fam)
            tp_layer[op.phase] = tp_layer[op.phase] + t
            for phase, repeat in ((op.phase, 1),) + ((("bwd", full),) if op.phase == "fwd" else ()):
                ledger.append(CommOp(f"{op.axis}/layer/{op.op}", op.axis, op.op, phase,
                                     weight * repeat * op.count * active(_AXIS_DEGREE[op.axis])
                                     * calls_layers, op.nbytes))
    tp_layer_fwd_all = tp_layer["fwd"]
    # embedding (vocabulary-parallel): all-reduce of its output forward; with sequence parallelism
    # the sequence is then split (its backward all-gathers), and without learned positions the
    # all-reduce and split fuse into a reduce-scatter (Megatron-LM). Output layer: its input is
    # gathered (SP) forward and reduced backward; cross entropy all-reduces max, sum and target
    # logits over T fp32 values.
    lpos = flag(fam.learned_positions, "learned_positions")
    embed_rs = sp_ * (1 - lpos)  # 1: reduce-scatter instead of all-reduce
    embed_tp = embed_rs * rs + (1 - embed_rs) * ar + sp_ * ag
    head_tp = sp_ * (ag + rs) + (1 - sp_) * ar + 3 * group_time("all_reduce", 4 * T, "tp", fam)
    for op, count, phase in (("reduce_scatter", embed_rs, "fwd"), ("all_reduce", 1 - embed_rs, "fwd"),
                             ("all_gather", sp_, "bwd")):
        ledger.append(CommOp(f"tp/embedding/{op}", "tp", op, phase, tp_on * count * m, act_bytes,
                             "first"))
    ledger.append(CommOp("tp/output/all_gather", "tp", "all_gather", "fwd", tp_on * sp_ * m, act_bytes,
                         "last"))
    for op, count in (("reduce_scatter", sp_), ("all_reduce", 1 - sp_)):
        ledger.append(CommOp(f"tp/output/{op}", "tp", op, "bwd", tp_on * count * m, act_bytes, "last"))
    ledger.append(CommOp("tp/cross_entropy/all_reduce", "tp", "all_reduce", "fwd", tp_on * 3 * m, 4 * T,
                         "last"))

    # --- recompute: full repeats every layer's forward (and its communication), selective only the
    # attention core (Korthikanti et al. 2022, Sec. 5)
    layer_fwd_total = layer_fwd["gemm"] + layer_fwd["attention"] + layer_fwd["elementwise"]
    recompute_layer = full * layer_fwd_total + sel * layer_fwd["attention"]
    recompute_tp = full * tp_layer_fwd_all
    kernels = K.kernels_per_layer_forward(sequence_parallel=sp_, flash=flash) * (3 + full)

    # --- what the framework adds to each part, where calibrate run measured it (costs.framework) --
    styles = {"plain": 1 - mega * tp_on, "tp": mega * tp_on * (1 - sp_),
              "tp_sp": mega * tp_on * sp_}
    measured: dict[str, dict[str, list]] = {}
    for part, style, degree in sorted(fam.layer_costs):
        measured.setdefault(part, {}).setdefault(style, []).append(
            (degree, S.layer_cost_symbols(part, style, degree)))
    costs = {part: FW.part_costs(measured.get(part, {}), styles, tp)
             for part in ("layer", "embedding", "output")}
    (s_l, cf_l, cb_l, cal_l), (s_e, cf_e, cb_e, cal_e), (s_o, cf_o, cb_o, cal_o) = (
        costs[p_] for p_ in ("layer", "embedding", "output"))
    layer_fw = {"fwd": (s_l - 1) * layer_fwd_total + cf_l,
                "bwd": (s_l - 1) * 2 * layer_fwd_total + cb_l}
    recompute_fw = full * layer_fw["fwd"] + sel * (s_l - 1) * layer_fwd["attention"]

    # --- pipeline point-to-point: activations forward, gradients backward, v chunks per GPU --------
    p2p_bytes = act_bytes / tp  # Megatron scatter-gather / sequence-parallel: 1/tp of the activation
    p2p_mb = 2 * v * group_time("send_recv", p2p_bytes, "pp", fam)
    # messages a rank sends or receives: 4 per chunk and micro-batch (activation in and out,
    # gradient in and out), less the 2 the very first and very last chunk of the model skip
    # (V shape: rank 0 holds the model's first and last chunks, 2 messages each; the last rank
    # holds two middle chunks)
    for stage, per_chunk in (("first", 4 * v - 2 - zbv * (4 * v - 6)), ("last", 4 * v - 2 + 2 * zbv),
                             ("middle", 4 * v)):
        ledger.append(CommOp("pp/send_recv", "pp", "send_recv", "fwd+bwd", per_chunk * m * multi,
                             p2p_bytes, stage))

    # --- stages: the first holds the embedding, the last the output layer (one stage: both) -------
    has = {"first": (sp.Integer(1), single), "last": (single, sp.Integer(1))}  # (embedding, head)
    stage_terms: dict[str, dict[str, sp.Expr]] = {}
    for st, (has_embed, has_head) in has.items():
        fwd = {k_: layers_per_stage * t for k_, t in layer_fwd.items()}
        fwd["embedding_logits"] = has_embed * embed_fwd + has_head * head_fwd
        terms = {f"compute/forward/{k_}": t for k_, t in fwd.items()}
        terms.update({f"compute/backward/{k_}": 2 * t for k_, t in fwd.items()})
        for phase, name, mult in (("fwd", "forward", 1), ("bwd", "backward", 2)):
            terms[f"compute/{name}/framework"] = layers_per_stage * layer_fw[phase] \
                + has_embed * ((s_e - 1) * mult * embed_fwd + (cf_e if mult == 1 else cb_e)) \
                + has_head * ((s_o - 1) * mult * head_fwd + (cf_o if mult == 1 else cb_o))
        terms["compute/recompute"] = layers_per_stage * (recompute_layer + recompute_fw)
        terms["comm/tp"] = layers_per_stage * (tp_layer["fwd"] + tp_layer["bwd"] + recompute_tp) \
            + has_embed * embed_tp + has_head * head_tp
        # a tensor-parallel layer's kernels cost kernel_overhead_tp_s each where it was measured
        t_layer_kernel = S.t_k + active(tp) * sp.Max(0, S.t_ktp - S.t_k, evaluate=False)
        terms["overhead/kernels"] = (1 - cal_l) * t_layer_kernel * kernels * layers_per_stage \
            + S.t_k * (12 * has_head * (1 - cal_o) + 3 * has_embed * (1 - cal_e))
        terms["pipeline/p2p"] = p2p_mb
        stage_terms[st] = {k_: sp.sympify(t) for k_, t in terms.items()}

    # --- parameters and data-parallel gradient synchronisation ---------------------------------------
    lp = M.layer_params(h, a, kv, f, gated=gated, bias=flag(fam.bias, "bias"),
                        qkv_bias=flag(fam.qkv_bias, "qkv_bias"), layernorm=flag(fam.layernorm, "layernorm"),
                        d=d)
    # 1d and 3d spread the matrices over all tp ranks, 2d/2.5d over a q x q grid (copied over the
    # depth); the grids split the norms' vectors along a
    layer_params_gpu = lp["sharded"] / (mega * tp + grid2 * qa * qb + grid3 * tp) \
        + lp["replicated"] / (mega + (1 - mega) * qa)
    emb = M.embedding_params(h, V, s, learned_positions=flag(fam.learned_positions, "learned_positions"))
    tied = flag(fam.tied_embeddings, "tied")
    final_norm = (1 + flag(fam.layernorm, "layernorm")) * h
    output_gpu = V * h / tp
    # a tied output layer on a separate last stage keeps its own copy (Megatron-LM)
    stage_params = {
        "first": layers_per_stage * layer_params_gpu + emb["sharded"] / tp + emb["replicated"]
        + single * (final_norm + (1 - tied) * output_gpu),
        "last": layers_per_stage * layer_params_gpu + final_norm + output_gpu * (1 - tied * single)
        + single * (emb["sharded"] / tp + emb["replicated"]),
    }
    params_gpu = sp.Max(stage_params["first"], stage_params["last"], evaluate=False)
    grad_bytes = S.gbytes * params_gpu
    weight_bytes = S.wbytes * params_gpu
    t_ar = group_time("all_reduce", grad_bytes, "dp", fam)
    t_rs = group_time("reduce_scatter", grad_bytes, "dp", fam)
    t_ag = group_time("all_gather", weight_bytes, "dp", fam)
    # ZeRO 3 (FSDP2): one unit per layer and one for the rest (embedding, final norm, output
    # layer); each unit's weights are gathered forward and backward every micro-batch, its
    # gradients reduce-scattered once per step (accumulated unsharded in between)
    # (sizes padded as FSDP2 pads them: each parameter's rows to a multiple of dp)
    flags = dict(gated=gated, bias=flag(fam.bias, "bias"), qkv_bias=flag(fam.qkv_bias, "qkv_bias"),
                 layernorm=flag(fam.layernorm, "layernorm"))
    layer_unit = M.fsdp_padded(M.layer_tensors(h, a, kv, f, tp, d=d, **flags), dp)
    # the root unit of the first stage (and of a single stage): embedding, positions, final norm and
    # an untied output layer; a last stage alone holds the final norm and the output layer
    root_first = M.fsdp_padded(M.root_tensors(
        h, V, s, tp, learned_positions=lpos, layernorm=flags["layernorm"], output=single * (1 - tied)),
        dp)
    root_last = M.fsdp_padded([((1 + flags["layernorm"]) * h, 1), (V / tp, h)], dp)
    root_unit = single * root_first + multi * sp.Max(root_first, root_last, evaluate=False)
    units = ((layers_per_stage, layer_unit), (sp.Integer(1), root_unit))
    t_units = sum((n_ * (2 * m * group_time("all_gather", S.wbytes * p_, "dp", fam)
                         + group_time("reduce_scatter", S.gbytes * p_, "dp", fam))
                   for n_, p_ in units), sp.Integer(0))
    # ZeRO 0 (DDP/Megatron): all-reduce the gradients; ZeRO 1-2 (distributed optimizer): reduce-
    # scatter gradients and all-gather weights
    t_dp_sync = (1 - z1) * t_ar + (z1 - z3) * (t_rs + t_ag) + z3 * t_units
    for name, op, calls, nb in (("all_reduce", "all_reduce", 1 - z1, grad_bytes),
                                ("reduce_scatter", "reduce_scatter", z1 - z3, grad_bytes),
                                ("all_gather", "all_gather", z1 - z3, weight_bytes)):
        ledger.append(CommOp(f"dp/{name}", "dp", op, "step", calls * active(dp), nb))
    for unit, (n_, p_) in zip(("layer", "root"), units, strict=True):
        ledger.append(CommOp(f"dp/fsdp_{unit}/all_gather", "dp", "all_gather", "fwd+bwd",
                             z3 * active(dp) * 2 * m * n_, S.wbytes * p_))
        ledger.append(CommOp(f"dp/fsdp_{unit}/reduce_scatter", "dp", "reduce_scatter", "step",
                             z3 * active(dp) * n_, S.gbytes * p_))
    bwd_last = sum((t for k_, t in stage_terms["last"].items() if k_.startswith("compute/backward")),
                   sp.Integer(0))
    window = bwd_last * (1 + z3 * (m - 1))  # what the sync can hide behind
    # sequence parallelism leaves the norms' weight gradients partial on the tp ranks: one
    # all-reduce per step of every norm vector (Megatron-LM allreduce_layernorm_grads)
    norm_vectors = (1 + flag(fam.layernorm, "layernorm")) * h * (2 * layers_per_stage + 1)
    t_norm_grads = sp_ * group_time("all_reduce", S.wbytes * norm_vectors, "tp", fam)
    ledger.append(CommOp("tp/norm_grads/all_reduce", "tp", "all_reduce", "step", tp_on * sp_,
                         S.wbytes * norm_vectors))
    t_dp = overlap * sp.Max(0, t_dp_sync - window, evaluate=False) + (1 - overlap) * t_dp_sync
    # the sync's memory passes, on the compute stream (never hidden by overlap): DDP (ZeRO 0)
    # copies the gradients into its flat buckets, scales them and copies them back (3 reads and
    # writes of the gradients; PyTorch DDP's default, without gradient_as_bucket_view); FSDP2
    # (ZeRO 1-3) copies a unit's shard into the all-gather buffer and the gathered unit out of it,
    # and the gradients into the reduce-scatter buffer and the reduced shard out: each a read and
    # a write of (1 + 1/dp) of the unit
    sharded = 2 * (1 + 1 / dp)
    copy_bytes = (1 - z1) * 6 * grad_bytes + (z1 - z3) * sharded * (grad_bytes + weight_bytes) \
        + z3 * sum((n_ * sharded * p_ * (2 * m * S.wbytes + S.gbytes) for n_, p_ in units),
                   sp.Integer(0))
    # and FSDP2's hooks per unit (unshard, reshard, post-backward), where calibrate run measured
    # them: per micro-batch forward and backward (charged to them below), per step the reduction
    fsdp_units = z1 * active(dp) * (layers_per_stage + 1)
    t_dp_framework = active(dp) * K.memory_time(copy_bytes, dev) + fsdp_units * S.t_fsdp_r

    # --- optimizer: memory-bound passes over the local parameters (see costs.memory) -------------
    local_params = params_gpu / (1 + z1 * (dp - 1))
    t_opt = S.stepbytes * local_params / S.W_opt + 8 * S.t_k + S.t_opt0

    # --- the fixed cost of every collective call (launch, and on CPUs the framework's dispatch) ------
    for st in stage_terms:
        stage_terms[st]["compute/forward/framework"] += fsdp_units * S.t_fsdp_f
        stage_terms[st]["compute/backward/framework"] += fsdp_units * S.t_fsdp_b
        per_mb = sum((op.calls for op in ledger if op.phase != "step" and op.stage in ("every", st)),
                     sp.Integer(0)) / m
        stage_terms[st]["overhead/collectives"] = S.t_coll * per_mb
    step_calls = sum((op.calls for op in ledger if op.phase == "step"), sp.Integer(0))
    t_opt = t_opt + S.t_coll * step_calls
    stage_time = {st: sum(t.values(), sp.Integer(0)) for st, t in stage_terms.items()}
    t_mb = sp.Max(stage_time["first"], stage_time["last"], evaluate=False)

    # --- time terms for the slowest stage -------------------------------------------------------------
    time_terms: dict[str, sp.Expr] = {}
    for st in stage_terms:
        for name, t in stage_terms[st].items():
            time_terms[f"{st}:{name}"] = m * t
    # zero-bubble schedules split the backward into input gradients (B) and weight gradients (W)
    # and fill the bubble with W: ZB1P leaves (pp - 1)(F + B - W), ZB-V (pp - 1)(F + B - 2W) per
    # chunk (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 3 and 6). W is the
    # weight-gradient half of the backward GEMMs of the slowest stage.
    w_mb = {st: (stage_terms[st]["compute/backward/gemm"]
                 + stage_terms[st]["compute/backward/embedding_logits"]) / 2 for st in stage_terms}
    w_fill = zb * (2 + zbv) * sp.Min(w_mb["first"], w_mb["last"], evaluate=False)  # t_mb = F+B+W
    # ranks time-sharing a device (rho > 1, CPU ranks on fewer cores) run faster while others
    # wait: the pipeline takes max(m, (m + B) / rho) micro-batch times with B = (pp - 1) / v (the
    # rates are per rank with every rank busy, so m of them are the cores' work), and the bubble
    # lasts min(B, max(0, (m + B) / rho - m)) micro-batch times (B when rho = 1)
    bubble = (pp - 1) / v
    kept = sp.Min(bubble, sp.Max(0, (m + bubble) / S.rho - m, evaluate=False), evaluate=False)
    time_terms["pipeline/bubble"] = kept * sp.Max(0, t_mb - w_fill, evaluate=False)
    time_terms["comm/dp"] = t_dp
    time_terms["comm/dp_framework"] = t_dp_framework
    time_terms["comm/tp_grads"] = t_norm_grads
    time_terms["optimizer/step"] = t_opt
    step_time = m * t_mb + time_terms["pipeline/bubble"] + t_dp + t_dp_framework + t_norm_grads \
        + t_opt

    # --- memory per GPU, per stage --------------------------------------------------------------------
    per_param = {"weights": S.wbytes, "gradients": S.gbytes, "optimizer_states": S.obytes}
    div = M.zero_divisors(z1, z2, z3, dp)
    act_kw = dict(sequence_parallel=dist, flash=flash, gated=gated, d=d)
    act_layer = M.layer_activation_bytes(b, s, h, a, kv, f, tp, e, full=full, selective=sel, **act_kw)
    full_layer = M.layer_activation_bytes(b, s, h, a, kv, f, tp, e, full=0, selective=0, **act_kw)
    inflight = M.inflight_micro_batches(gpipe, inter + zb * (1 - zbv) * active(v), pp, m, v)
    memory_terms: dict[str, dict[str, sp.Expr]] = {}
    for st, (has_embed, has_head) in has.items():
        mem = {name: per_param[name] * stage_params[st] / div[name] for name in per_param}
        stage_inflight = inflight if st == "first" else single * inflight + multi
        mem["activations/layers"] = act_layer * layers_per_stage * stage_inflight
        mem["activations/recompute_buffer"] = full * full_layer
        # embedding dropout mask per in-flight micro-batch; final norm input and fp32 logits
        mem["activations/embedding_output"] = has_embed * T * h / rep * stage_inflight + has_head * (
            2 * e * T * h / rep + 2 * 4 * T * V / tp)
        mem["buffers/zero3_gather"] = z3 * 2 * S.wbytes * layer_params_gpu  # a layer and the next
        memory_terms[st] = {k_: sp.sympify(x) for k_, x in mem.items()}

    # model FLOPs: 3 x forward (Narayanan et al. 2021, Eq. 3 without recompute); hardware FLOPs add
    # what recompute repeats (full: every layer's forward; selective: the attention core), never logits
    full_gemms = K.layer_gemms(T, b, s, h, a, kv, f, 1, gated, d)
    layer_flops = sum((g.flops for g in full_gemms), sp.Integer(0))
    core_flops = sum((g.flops for g in full_gemms if g.name in K.ATTENTION_CORE), sp.Integer(0))
    fwd_flops_mb = L * layer_flops + logits.flops * tp
    model_flops = 3 * fwd_flops_mb * m * dp
    hw_flops = model_flops + L * (full * layer_flops + sel * core_flops) * m * dp
    total_params = L * (lp["sharded"] + lp["replicated"]) + emb["sharded"] + emb["replicated"] \
        + final_norm + (1 - tied) * V * h
    # one part's raw times per micro-batch on one rank (kernels' rooflines; collectives with their
    # fixed cost per call), without what the framework adds: what calibration.layers fits against
    def calls_per_layer(phase: str) -> sp.Expr:
        return sum((op.calls for op in ledger if "/layer/" in op.name and op.phase == phase),
                   sp.Integer(0)) / calls_layers

    ce_ar = group_time("all_reduce", 4 * T, "tp", fam)
    part_comm = {
        "layer": (tp_layer["fwd"] + S.t_coll * calls_per_layer("fwd"),
                  tp_layer["bwd"] + recompute_tp + S.t_coll * calls_per_layer("bwd")),
        "embedding": (embed_rs * rs + (1 - embed_rs) * ar + S.t_coll * tp_on,
                      sp_ * ag + S.t_coll * tp_on * sp_),
        "output": (sp_ * ag + 3 * ce_ar + S.t_coll * tp_on * (sp_ + 3),
                   sp_ * rs + (1 - sp_) * ar + S.t_coll * tp_on),
    }
    part_compute = {"layer": layer_fwd_total, "embedding": embed_fwd, "output": head_fwd}
    # one layer's FSDP unit: a gather of its weights and a reduce-scatter of its gradients, each
    # with its copies (what calibration.layers fits the FSDP hooks against)
    unit_copies = sharded * layer_unit
    fsdp_unit = {
        "gather_s": group_time("all_gather", S.wbytes * layer_unit, "dp", fam)
        + K.memory_time(S.wbytes * unit_copies, dev),
        "reduce_s": group_time("reduce_scatter", S.gbytes * layer_unit, "dp", fam)
        + K.memory_time(S.gbytes * unit_copies, dev),
    }
    parts = {}
    for part, fwd_t in part_compute.items():
        parts[f"part:{part}:forward_s"] = fwd_t
        parts[f"part:{part}:backward_s"] = 2 * fwd_t
        parts[f"part:{part}:comm_forward_s"] = part_comm[part][0]
        parts[f"part:{part}:comm_backward_s"] = part_comm[part][1]
    parts.update({f"part:fsdp_unit:{k_}": v_ for k_, v_ in fsdp_unit.items()})
    quantities = {
        **parts,
        "micro_batches": m,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        "parameters": total_params,
        "parameters_per_gpu": params_gpu,
        "tokens_per_step": B * s,
    }
    return Model(fam, time_terms, stage_time, step_time, memory_terms, quantities, ledger)
