"""The symbols of the step model, with their meaning and unit (shown by `perfmodel explain`)."""

from __future__ import annotations

import dataclasses

import sympy as sp

from perfmodel.specs.hardware import GemmEfficiency

_P = {"positive": True}

# name -> (symbol, meaning)
_TABLE: dict[str, tuple[sp.Symbol, str]] = {}


def _sym(name: str, latex: str, meaning: str) -> sp.Symbol:
    symbol = sp.Symbol(latex, **_P)
    _TABLE[name] = (symbol, meaning)
    return symbol


# model
L = _sym("layers", "L", "transformer layers")
h = _sym("hidden", "h", "hidden size")
a = _sym("heads", "a", "attention heads")
kv = _sym("kv_heads", "n_kv", "key/value heads")
f = _sym("ffn_hidden", "f", "MLP hidden size")
d = _sym("head_dim", "d", "size of one attention head (the attention is a d wide)")
s = _sym("seq_len", "s", "sequence length [tokens]")
V = _sym("vocab", "V", "vocabulary size")
# plan
dp = _sym("dp", "dp", "data-parallel degree")
tp = _sym("tp", "tp", "tensor-parallel degree")
pp = _sym("pp", "pp", "pipeline-parallel degree")
b = _sym("micro_batch", "b", "micro-batch size [samples]")
B = _sym("global_batch", "B", "global batch size [samples]")
v = _sym("virtual_stages", "v", "virtual pipeline stages per GPU (interleaving)")
e = _sym("bytes_per_element", "e", "bytes per activation/weight element")
k_tp = _sym("tp_per_node", "k_tp", "ranks of one tensor-parallel group inside one node")
k_dp = _sym("dp_per_node", "k_dp", "ranks of one data-parallel group inside one node")
k_pp = _sym("pp_per_node", "k_pp", "ranks of one pipeline group inside one node")
# the tensor-parallel grid of the 2d / 2.5d / 3d layouts: sub-axes a (innermost), b, c
q_a = _sym("tpa", "q_a", "tensor-parallel grid: ranks along its first axis (q)")
q_b = _sym("tpb", "q_b", "tensor-parallel grid: ranks along its second axis (q)")
q_c = _sym("tpc", "q_c", "tensor-parallel grid: ranks along its third axis (d for 2.5d, q for 3d)")
k_a = _sym("tpa_per_node", "k_a", "ranks of one grid-axis-a group inside one node")
k_b = _sym("tpb_per_node", "k_b", "ranks of one grid-axis-b group inside one node")
k_c = _sym("tpc_per_node", "k_c", "ranks of one grid-axis-c group inside one node")
# hardware
F = _sym("peak_flops_per_s", "F_peak", "peak FLOP/s of one GPU in the plan's dtype")
W = _sym("memory_bandwidth_bytes_per_s", "W_mem", "effective memory bandwidth [B/s]")
W_opt = _sym("optimizer_bandwidth_bytes_per_s", "W_opt",
             "memory bandwidth the optimizer step reaches over its bytes per parameter [B/s]")
t_k = _sym("kernel_overhead_s", "t_kernel", "launch + framework overhead per kernel [s]")
t_ktp = _sym("kernel_overhead_tp_s", "t_kernel_tp",
             "overhead per kernel of a tensor-parallel layer, when measured (0: as t_kernel) [s]")
t_opt0 = _sym("optimizer_overhead_s", "t_opt0", "fixed cost of one optimizer step [s]")
t_fsdp_f = _sym("fsdp_forward_overhead_s", "t_fsdp^fwd",
                "fixed cost of one FSDP unit's forward hooks per micro-batch [s]")
t_fsdp_b = _sym("fsdp_backward_overhead_s", "t_fsdp^bwd",
                "fixed cost of one FSDP unit's backward hooks per micro-batch [s]")
t_fsdp_r = _sym("fsdp_reduce_overhead_s", "t_fsdp^red",
                "fixed cost of one FSDP unit's gradient reduction per step [s]")
t_coll = _sym("collective_overhead_s", "t_coll", "fixed cost of one collective call (launch, dispatch) [s]")
G = _sym("gpus_per_node", "G", "GPUs per node")
rho = _sym("ranks_per_device", "rho", "ranks time-sharing one device (1 on GPUs)")
alpha_i = _sym("intra_latency_s", "alpha_intra", "intra-node latency per step [s]")
beta_i = _sym("intra_bandwidth", "beta_intra", "intra-node bandwidth per GPU, effective [B/s]")
alpha_o = _sym("inter_latency_s", "alpha_inter", "inter-node latency per step [s]")
beta_o = _sym("inter_bandwidth", "beta_inter", "inter-node bandwidth per node, effective [B/s]")

# bytes per parameter, by precision (see perfmodel.costs.memory)
wbytes = _sym("weight_bytes_per_param", "e_w", "bytes per parameter of the weights")
gbytes = _sym("grad_bytes_per_param", "e_g", "bytes per parameter of the gradients")
obytes = _sym("optimizer_bytes_per_param", "e_o", "bytes per parameter of the optimizer states")
stepbytes = _sym("optimizer_step_bytes_per_param", "e_step",
                 "bytes the optimizer step reads and writes per local parameter")

# options as 0/1 indicators, so that one expression covers every plan
FLAGS: dict[str, sp.Symbol] = {
    name: _sym(f"is_{name}", f"I_{{{name}}}", f"1 if {meaning}, else 0")
    for name, meaning in [
        ("sequence_parallel", "sequence parallelism"),
        ("recompute_full", "full recompute"),
        ("recompute_selective", "selective recompute"),
        ("zero1", "ZeRO stage >= 1"),
        ("zero2", "ZeRO stage >= 2"),
        ("zero3", "ZeRO stage 3"),
        ("gpipe", "GPipe schedule"),
        ("interleaved", "interleaved 1F1B schedule"),
        ("zero_bubble", "a zero-bubble schedule (zb or zbv)"),
        ("zbv", "the V-shape zero-bubble schedule"),
        ("flash", "fused (flash) attention"),
        ("overlap_grad_sync", "the gradient sync overlaps backward"),
        ("gated", "gated (SwiGLU) MLP"),
        ("bias", "linear layers have biases"),
        ("qkv_bias", "the QKV projection has a bias"),
        ("layernorm", "LayerNorm (0: RMSNorm)"),
        ("tied", "tied input/output embeddings"),
        ("learned_positions", "learned position embeddings"),
        ("tp2d", "tensor parallelism on a 2d grid (SUMMA; 2.5d with depth)"),
        ("tp3d", "tensor parallelism on a 3d cube"),
        ("sync_bn", "synchronized batch norm (layer graphs)"),
        ("split_collectives", "Gather+Bcast / Reduce+Bcast instead of Allgather / Allreduce"),
        ("contributors_specialised", "a layer split over fewer ranks than Pr gathers/reduces "
                                     "among its holders, then copies to the others"),
        ("contributors_auto", "the cheaper of the standard and specialised collectives, per call"),
        *[(f"{axis}_{scope}", f"the {axis} group is {scope}-node")
          for axis in ("tp", "dp", "pp", "tpa", "tpb", "tpc") for scope in ("intra", "inter", "mixed")],
    ]
}

GEMM: dict[str, sp.Symbol] = {
    fld.name: _sym(f"gemm_{fld.name}", f"gemm_{fld.name}", f"GEMM efficiency parameter {fld.name}")
    for fld in dataclasses.fields(GemmEfficiency)
}


def fit_symbols(op: str, scope: str) -> tuple[sp.Symbol, ...]:
    """alpha and bus bandwidth of a calibrated collective fit, for messages from the breakpoint on
    and below it, and the breakpoint (registered on first use)."""
    names = [(f"fit_{op}_{scope}_{part}", latex, meaning) for part, latex, meaning in (
        ("alpha_s", f"alpha_{{{op},{scope}}}", f"fitted latency per step of {op} ({scope}) [s]"),
        ("busbw", f"beta_{{{op},{scope}}}", f"fitted bus bandwidth of {op} ({scope}) [B/s]"),
        ("alpha_s_small", f"alpha^small_{{{op},{scope}}}",
         f"fitted latency per step of small {op} ({scope}) [s]"),
        ("busbw_small", f"beta^small_{{{op},{scope}}}",
         f"fitted bus bandwidth of small {op} ({scope}) [B/s]"),
        ("breakpoint_bytes", f"S^break_{{{op},{scope}}}",
         f"message size where {op} ({scope}) changes regime [B]"))]
    for name, latex, meaning in names:
        if name not in _TABLE:
            _sym(name, latex, meaning)
    return tuple(_TABLE[name][0] for name, _, _ in names)


LAYER_COST_FIELDS = ("forward_overhead_s", "backward_overhead_s", "compute_scale")


def layer_cost_names(part: str, style: str, tp: int) -> tuple[str, ...]:
    """The table names of one LayerCost's symbols, in the order of LAYER_COST_FIELDS."""
    return tuple(f"lc_{part}_{style}_{tp}_{name}" for name in LAYER_COST_FIELDS)


def layer_cost_symbols(part: str, style: str, tp: int) -> tuple[sp.Symbol, sp.Symbol, sp.Symbol]:
    """The measured forward and backward overheads [s] and compute scale of one part in one
    tensor-parallel style and degree (HardwareSpec.layer_costs), registered on first use."""
    fwd, bwd, scale = layer_cost_names(part, style, tp)
    names = [(fwd, f"c^fwd_{{{part},{style},{tp}}}",
              f"measured fixed cost of the forward of one {part} ({style}, tp {tp}) [s]"),
             (bwd, f"c^bwd_{{{part},{style},{tp}}}",
              f"measured fixed cost of the backward of one {part} ({style}, tp {tp}) [s]"),
             (scale, f"s_{{{part},{style},{tp}}}",
              f"measured compute time of one {part} ({style}, tp {tp}) over its roofline")]
    for name, latex, meaning in names:
        if name not in _TABLE:
            _sym(name, latex, meaning)
    return tuple(_TABLE[name][0] for name, _, _ in names)  # type: ignore[return-value]


def table() -> dict[str, tuple[sp.Symbol, str]]:
    return dict(_TABLE)


def by_symbol() -> dict[sp.Symbol, tuple[str, str]]:
    return {sym: (name, meaning) for name, (sym, meaning) in _TABLE.items()}
