"""The symbols of the step model, with their meaning and unit (shown by `perfmodel explain`).

Their names, typeset names and meanings live in perfmodel.names (free of sympy, so that a cached
prediction never imports sympy); this module makes a positive sympy Symbol of each and re-exports
the name tables (LAYER_COST_FIELDS, layer_cost_names).
"""

from __future__ import annotations

import functools

import sympy as sp

from perfmodel import names as N
from perfmodel.names import LAYER_COST_FIELDS, layer_cost_names

__all__ = ["FLAGS", "FP8_GEMM", "GEMM", "LAYER_COST_FIELDS", "by_symbol", "fit_symbols",
           "layer_cost_names", "layer_cost_symbols", "outer_link_symbols", "outer_protocol_symbols",
           "protocol_symbols", "table"]

_P = {"positive": True}

# name -> (symbol, meaning)
_TABLE: dict[str, tuple[sp.Symbol, str]] = {}


def _sym(name: str, latex: str, meaning: str) -> sp.Symbol:
    symbol = sp.Symbol(latex, **_P)
    _TABLE[name] = (symbol, meaning)
    return symbol


for _name, (_latex, _meaning) in N.NAMES.items():
    _sym(_name, _latex, _meaning)


def _of(name: str) -> sp.Symbol:
    return _TABLE[name][0]


# model
L, h, a, kv, f, d, s, V = (_of(n) for n in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                                            "head_dim", "seq_len", "vocab"))
# plan
dp, tp, pp, b, B, v, e = (_of(n) for n in ("dp", "tp", "pp", "micro_batch", "global_batch",
                                           "virtual_stages", "bytes_per_element"))
L_first, L_last = _of("first_stage_layers"), _of("last_stage_layers")
N_rc = _of("recompute_every")
N_rl, I_block = _of("recompute_num_layers"), _of("recompute_block")
N_off = _of("cpu_offload_layers")
N_bkt, I_bkt = _of("dp_bucket_size"), _of("dp_bucket_all")
F_pp = _of("pipeline_flushes")
k_tp, k_dp, k_pp = (_of(n) for n in ("tp_per_node", "dp_per_node", "pp_per_node"))
# context and expert parallelism, and the groups they make (perfmodel.names.AXES)
cp, ep, etp = _of("cp"), _of("ep"), _of("etp")
k_cp, k_ep, k_dpcp, k_edp = (_of(n) for n in ("cp_per_node", "ep_per_node", "dp_cp_per_node",
                                              "edp_per_node"))
k_tdc = _of("tp_dp_cp_per_node")
k_etp, k_etpep = _of("etp_per_node"), _of("etp_ep_per_node")
# a mixture of experts, multi-head latent attention, multi-token prediction
E, k_E, f_E, f_sh, c_E, rho_E = (_of(n) for n in ("experts", "top_k", "expert_ffn_hidden",
                                                   "shared_ffn_hidden", "capacity_factor",
                                                   "routing_imbalance"))
r_q, r_kv, d_nope, d_rope, d_v = (_of(n) for n in ("q_lora_rank", "kv_lora_rank",
                                                    "qk_nope_head_dim", "qk_rope_head_dim",
                                                    "v_head_dim"))
g_E, M_E = _of("expert_groups"), _of("group_topk")
D_mtp = _of("mtp_layers")
# the tensor-parallel grid of the 2d / 2.5d / 3d layouts: sub-axes a (innermost), b, c
q_a, q_b, q_c = (_of(n) for n in ("tpa", "tpb", "tpc"))
k_a, k_b, k_c = (_of(n) for n in ("tpa_per_node", "tpb_per_node", "tpc_per_node"))
# hardware
F = _of("peak_flops_per_s")
W = _of("memory_bandwidth_bytes_per_s")
W_opt = _of("optimizer_bandwidth_bytes_per_s")
W_host = _of("host_link_bytes_per_s")
t_k = _of("kernel_overhead_s")
t_ktp = _of("kernel_overhead_tp_s")
t_opt0 = _of("optimizer_overhead_s")
t_fsdp_f = _of("fsdp_forward_overhead_s")
t_fsdp_b = _of("fsdp_backward_overhead_s")
t_fsdp_r = _of("fsdp_reduce_overhead_s")
t_coll = _of("collective_overhead_s")
t_op = _of("host_op_overhead_s")
t_opb = _of("host_op_backward_overhead_s")
G = _of("gpus_per_node")
rho = _of("ranks_per_device")
s_ovl = _of("overlap_compute_slowdown")
alpha_i, beta_i = _of("intra_latency_s"), _of("intra_bandwidth")
alpha_o, beta_o = _of("inter_latency_s"), _of("inter_bandwidth")
call_i, call_o = _of("intra_call_latency_s"), _of("inter_call_latency_s")
t_nvls, f_nvls = _of("intra_nvls_latency_s"), _of("intra_nvls_bandwidth_fraction")
M_nccl, f_frag = _of("nccl_buffer_bytes"), _of("memory_fragmentation")
# the flash-attention kernel (perfmodel.costs.compute.flash_attention_s)
I_fa = _of("flash_measured")
E_fa_fwd, s_fa_fwd = _of("flash_forward_max_fraction"), _of("flash_forward_half_seq")
E_fa_bwd, s_fa_bwd = _of("flash_backward_max_fraction"), _of("flash_backward_half_seq")
# FP8 training (perfmodel.costs.fp8)
F8 = _of("fp8_peak_flops_per_s")
e8, q8, cw8, s8, M_scale8 = (_of(n) for n in ("fp8_operand_bytes", "fp8_quantize_bytes",
                                              "fp8_weight_copy_bytes", "fp8_saved_bytes",
                                              "fp8_scaling_state_bytes"))
qw8 = _of("fp8_weight_cast_bytes")
g8 = _of("fp8_gather_bytes")
t8 = _of("fp8_gathered_transpose_bytes")
# sliding-window attention
w, rho_w = _of("window"), _of("windowed_share")
# partial rotary embeddings
r_rot = _of("rotary_fraction")
# bytes per parameter, by precision (see perfmodel.costs.memory)
wbytes = _of("weight_bytes_per_param")
gbytes = _of("grad_bytes_per_param")
obytes = _of("optimizer_bytes_per_param")
wbytes3 = _of("sharded_weight_bytes_per_param")
obytes3 = _of("sharded_optimizer_bytes_per_param")
stepbytes = _of("optimizer_step_bytes_per_param")

# options as 0/1 indicators, so that one expression covers every plan
FLAGS: dict[str, sp.Symbol] = {option: _of(name) for option, name in N.FLAGS.items()}

GEMM: dict[str, sp.Symbol] = {field: _of(name) for field, name in N.GEMM.items()}
FP8_GEMM: dict[str, sp.Symbol] = {field: _of(name) for field, name in N.FP8_GEMM.items()}


def _registered(entries: tuple[tuple[str, str, str], ...]) -> tuple[sp.Symbol, ...]:
    for name, latex, meaning in entries:
        if name not in _TABLE:
            _sym(name, latex, meaning)
    return tuple(_TABLE[name][0] for name, _, _ in entries)


def fit_symbols(op: str, scope: str) -> tuple[sp.Symbol, ...]:
    """alpha and bus bandwidth of a calibrated collective fit, for messages from the breakpoint on
    and below it, and the breakpoint (registered on first use; see perfmodel.names.fit_names)."""
    return _registered(N.fit_names(op, scope))


def protocol_symbols(link: str, protocol: str) -> tuple[sp.Symbol, sp.Symbol, sp.Symbol]:
    """Start-up of a call [s], latency per step [s] and bandwidth fraction of a low-latency
    protocol (ll, ll128) on a link (intra, inter)."""
    return (_of(f"{link}_{protocol}_call_latency_s"), _of(f"{link}_{protocol}_latency_s"),
            _of(f"{link}_{protocol}_bandwidth_fraction"))


def outer_link_symbols(axis: str) -> tuple[sp.Symbol, sp.Symbol, sp.Symbol]:
    """Latency per step [s], bandwidth per node [B/s] and call start-up [s] of the link an
    axis's group crosses beyond its node, on a fabric of more than two levels."""
    return (_of(f"{axis}_outer_latency_s"), _of(f"{axis}_outer_bandwidth"),
            _of(f"{axis}_outer_call_latency_s"))


def outer_protocol_symbols(axis: str, protocol: str) -> tuple[sp.Symbol, sp.Symbol, sp.Symbol]:
    """protocol_symbols of the link an axis's group crosses beyond its node (outer_link_symbols)."""
    return (_of(f"{axis}_outer_{protocol}_call_latency_s"),
            _of(f"{axis}_outer_{protocol}_latency_s"),
            _of(f"{axis}_outer_{protocol}_bandwidth_fraction"))


def layer_cost_symbols(part: str, style: str, tp: int) -> tuple[sp.Symbol, sp.Symbol, sp.Symbol]:
    """The measured forward and backward overheads [s] and compute scale of one part in one
    tensor-parallel style and degree (HardwareSpec.layer_costs), registered on first use."""
    return _registered(N.layer_cost_entries(part, style, tp))


def table() -> dict[str, tuple[sp.Symbol, str]]:
    return dict(_TABLE)


def by_symbol() -> dict[sp.Symbol, tuple[str, str]]:
    return {sym: (name, meaning) for name, (sym, meaning) in _TABLE.items()}


# `perfmodel explain` prints a formula as text that sympy reads back (perfmodel.symbols.parse):
# a typeset name's '^', ',' and braces are not Python (sympify read 'alpha_intra^ll' as a power,
# 'alpha_inter,tp' as a tuple, 'N_{bkt}' not at all), and 'E' is Euler's number to sympify
_PLAIN_RESERVED = {"E": "n_E"}


def plain_name(name: str) -> str:
    """The name a symbol prints as in explain's text: its typeset name made an identifier
    ('alpha_intra^ll' -> 'alpha_intra_ll', 'N_{bkt}' -> 'N_bkt', 'E' -> 'n_E')."""
    out = name.replace("^", "_").replace(",", "_").replace("{", "").replace("}", "")
    return _PLAIN_RESERVED.get(out, out)


def plain_str(expr: sp.Expr, **settings: object) -> str:
    """sympy's str of expr, each symbol by its plain_name: text that parse() reads back."""
    return str(_plain_printer()(settings).doprint(expr))


@functools.cache
def _plain_printer() -> type:
    """sympy's StrPrinter naming each symbol by its plain_name (built once, on first use)."""
    from sympy.printing.str import StrPrinter

    class _Plain(StrPrinter):  # type: ignore[misc]
        def _print_Symbol(self, symbol: sp.Symbol) -> str:
            return plain_name(symbol.name)

        _print_Dummy = _print_Symbol

    return _Plain


def parse(text: str) -> sp.Expr:
    """A formula as `perfmodel explain` prints it, back to the sympy expression: each plain name
    the symbol of the table (positive), floor_log2 and ceil_log2 perfmodel's integer logs."""
    from perfmodel.costs.collectives import ceil_log2, floor_log2

    local: dict[str, object] = {plain_name(sym.name): sym for sym, _ in _TABLE.values()}
    local.update(floor_log2=floor_log2, ceil_log2=ceil_log2)
    return sp.sympify(text, locals=local)
