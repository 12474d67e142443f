"""A mixture-of-experts layer on one rank: its tokens, its experts' GEMMs, its parameters and the
activations it keeps.

Shapes follow Megatron-Core's MoE layer (megatron/core/transformer/moe: TopKRouter, the all-to-all
token dispatcher, GroupedMLP) and GShard (Lepikhin et al. 2020) for the capacity. On one rank:
    T_r  = the rank's tokens of a micro-batch entering the layer: b s / (cp tp) (with sequence
           parallelism each tp rank routes its own s / tp of the cp rank's s / cp)
    E/ep experts on the rank, each token sent to k of the E; with expert tensor parallelism
           (etp > 1) a 1 / etp slice of each (f / etp of its FFN width), and the tokens the etp
           ranks received all-gathered among them: each expert slice computes the rows of its
           etp x ep ranks (Megatron-Core's MoEAlltoAllTokenDispatcher, dispatch_postprocess)
Dropless (capacity_factor None; Megatron-Core's default, Mixtral, DeepSeek-V3): every assignment is
computed. Balanced, each expert takes m = etp ep T_r k / E tokens from its etp x ep ranks (T_r k / E
from each rank); under a routing imbalance rho (the busiest expert's tokens over the mean) the
slowest rank holds the busiest expert, rho m tokens, and E/ep - 1 others, each at what the
E - 1 experts other than the busiest share, (E - rho) / (E - 1) m:
    A_r  = T_r k ep / E (rho + (E/ep - 1) (E - rho) / (E - 1))   tokens the rank receives
and its experts compute etp A_r rows (A_r with etp 1). With a capacity factor c an expert takes at
most C = ceil(c T_r k / E) of each rank's assignments (the rest dropped), in buffers padded to C:
every expert computes etp ep C rows, A_r = E C, and the imbalance costs nothing (its tokens are
dropped).
"""

from __future__ import annotations

import sympy as sp

from perfmodel.costs.compute import Flag, Gemm, as_flag
from perfmodel.costs.lattice import applied

ROUTER_PROB_BYTES = 4  # Megatron-Core keeps the router's scores in fp32 (moe_router_dtype)
COUNT_BYTES = 8  # dropless: the tokens per expert exchanged as int64 (the validation job's)


def capacity(T_r: sp.Expr, k: sp.Expr, E: sp.Expr, cf: sp.Expr) -> sp.Expr:
    """Rows one expert takes from one rank: C = ceil(c T_r k / E) (GShard, Sec. 2.2; the
    validation job's workload.moe)."""
    return applied(sp.ceiling, cf * T_r * k / E)


def expert_tokens(T_r: sp.Expr, k: sp.Expr, E: sp.Expr, ep: sp.Expr, rho: sp.Expr, *,
                  capacity_factor: sp.Expr | None,
                  etp: sp.Expr | int = 1) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """(m, m_busy, A_r): the tokens of an expert (slice) at the mean, of the busiest expert on
    the slowest rank (both after the expert-tensor-parallel all-gather: etp ranks' rows), and the
    tokens that rank receives by all-to-all (module doc)."""
    if capacity_factor is not None:
        C = capacity(T_r, k, E, capacity_factor)
        return etp * ep * C, etp * ep * C, E * C
    mean = etp * ep * T_r * k / E
    # the busiest expert takes rho m; the E - 1 others share what is left of the E m
    # assignments, each (E - rho) / (E - 1) m at the mean, so that a rank never holds more
    # rows than its ep group routes (ep 1: exactly its own T_r k, whatever rho)
    rest = rest_share(E, rho)
    return mean, rho * mean, T_r * k * ep / E * (rho + (E / ep - 1) * rest)


def rest_share(E: sp.Expr, rho: sp.Expr) -> sp.Expr:
    """An expert other than the busiest one, over the mean: (E - rho) / (E - 1) (1 where E is
    1, whose rho is 1)."""
    return (E - rho) / sp.Max(1, E - 1)


def spread(bins: sp.Expr, k: sp.Expr, E: sp.Expr, *, round_robin: bool,
           groups: sp.Expr | int = 1, group_topk: sp.Expr | int = 1) -> sp.Expr:
    """The distinct bins (nodes, or ranks) a token's k experts lie in, in expectation, the E
    experts split over the bins in equal blocks of consecutive experts (Megatron-Core's expert
    placement: rank r holds experts r E/ep .. (r + 1) E/ep - 1):
        learned      bins (1 - (1 - (E / bins) / (E - (k - 1) / 2))^k)
                                                 (k distinct experts drawn at random: a bin is
                                                 missed by all k with the probability
                                                 prod_i (1 - (E / bins) / (E - i)), i < k, its
                                                 factors taken at their middle i = (k - 1) / 2)
                     at most group_topk max(1, bins / groups) under node-limited routing (its k
                     from group_topk groups of E / groups consecutive experts: a group spans
                     bins / groups bins, or shares one; DeepSeek-V3, Sec. 2.1.2)
        round_robin  max(1, k bins / E)           (experts t k .. t k + k - 1 of token t: one
                                                  block of k consecutive experts, k / (E / bins)
                                                  bins where a bin holds fewer than k)
    groups = group_topk = 1: no limit (the cap is bins)."""
    if round_robin:
        return sp.Max(1, k * bins / E)
    missed = sp.Max(0, 1 - (E / bins) / (E - (k - 1) / 2))
    learned = bins * (1 - missed ** k)
    return sp.Min(learned, group_topk * sp.Max(1, bins / groups))


def expert_gemms(m: sp.Expr, h: sp.Expr, f_e: sp.Expr, gated: Flag) -> list[Gemm]:
    """One expert's forward GEMMs over m tokens: up (with its gate) and down, as a dense MLP's."""
    return [Gemm("expert_up", m, (1 + as_flag(gated)) * f_e, h), Gemm("expert_down", m, h, f_e)]


def router_gemm(T_r: sp.Expr, h: sp.Expr, E: sp.Expr) -> Gemm:
    """The router's scores: T_r x h @ h x E."""
    return Gemm("router", T_r, E, h)


def shared_gemms(T: sp.Expr, h: sp.Expr, f_sh: sp.Expr, tp: sp.Expr, gated: Flag) -> list[Gemm]:
    """The shared experts (one MLP f_sh wide: DeepSeekMoE's, Qwen2-MoE's), tensor-parallel as a
    dense MLP (Megatron-Core's SharedExpertMLP): column- then row-parallel over T tokens."""
    return [Gemm("shared_up", T, (1 + as_flag(gated)) * f_sh / tp, h),
            Gemm("shared_down", T, h, f_sh / tp)]


def expert_params(h: sp.Expr, f_e: sp.Expr, *, gated: Flag, bias: Flag,
                  etp: sp.Expr | int = 1) -> sp.Expr:
    """One routed expert, or its slice on one of etp ranks: ((1 + gated) f h + f h) / etp + bias
    ((1 + gated) f / etp + h) (perfmodel.params; the up projection column-parallel, its bias
    split, the down projection row-parallel, its bias whole: Megatron-Core's TEGroupedMLP,
    megatron/core/transformer/moe/experts.py at d98e8a64ddf34856e74b24714e3bedb2f5a39553)."""
    up = (1 + as_flag(gated)) * f_e
    return (up * h + f_e * h) / etp + as_flag(bias) * (up / etp + h)


def router_params(h: sp.Expr, E: sp.Expr, *, bias: Flag) -> sp.Expr:
    """The router: h x E, and a bias of E with biases."""
    return h * E + as_flag(bias) * E


def moe_activation_bytes(T_r: sp.Expr, A_r: sp.Expr, h: sp.Expr, E: sp.Expr, f_e: sp.Expr,
                         e: sp.Expr, *, gated: Flag, etp: sp.Expr | int = 1,
                         weighted_activation: Flag = 0) -> sp.Expr:
    """Bytes the routed part of one MoE layer keeps for the backward, per micro-batch, on one
    rank (each tensor a backward reads, as Korthikanti et al. 2022, Sec. 4.1 count a dense
    MLP's): the router's scores 4 T_r E (fp32), the permuted expert inputs e etp A_r h (with
    expert tensor parallelism the all-gathered rows the up projection reads), each expert's
    activation input (2 + gated) e (etp A_r) (f / etp) (its up/gate outputs and the down
    projection's input, as a dense MLP's), and where the routing weights multiply:
    - at the combine (weighted_activation 0: torchtitan's token dispatcher, the validation job):
      the experts' outputs e A_r h (reduce-scattered back), which the product's backward reads;
    - in the experts' activation (weighted_activation 1: Megatron-Core from 0.13, TEGroupedMLP's
      bias_act_func through weighted_bias_swiglu_impl; NeMo AutoModel's experts likewise): the
      fused kernel saves its input and the permuted weights, 4 etp A_r (fp32, gathered over etp
      with the rows), and the experts' outputs are only summed back (no saved tensor)."""
    w = as_flag(weighted_activation)
    return ROUTER_PROB_BYTES * T_r * E + e * A_r * h * (1 - w + etp) \
        + (2 + as_flag(gated)) * e * A_r * f_e + w * ROUTER_PROB_BYTES * etp * A_r


def moe_elementwise_bytes(T_r: sp.Expr, A_r: sp.Expr, h: sp.Expr, E: sp.Expr, f_e: sp.Expr,
                          e: sp.Expr, *, gated: Flag) -> sp.Expr:
    """Bytes the memory-bound kernels of the routed part move in one forward on one rank: the
    router's softmax and top-k (read and write 4 T_r E), the permutation of the tokens to their
    experts and back (read and write e A_r h each), the experts' activation (SwiGLU reads two
    inputs: (2 + gated) e A_r f, as a dense MLP's)."""
    return 2 * ROUTER_PROB_BYTES * T_r * E + 2 * 2 * e * A_r * h \
        + (2 + as_flag(gated)) * e * A_r * f_e


def moe_fp8_saved_bytes(A_r: sp.Expr, h: sp.Expr, f_e: sp.Expr, e: sp.Expr, saved: sp.Expr, *,
                        etp: sp.Expr | int = 1) -> sp.Expr:
    """What an fp8 plan's routed experts keep beyond moe_activation_bytes' on one rank, per
    micro-batch: Transformer Engine's GroupedLinear saves each expert GEMM's input for the weight
    gradient as its FP8 copy (`saved` bytes per element) instead of bf16, the permuted inputs of
    the up projections (etp A_r h, the gathered rows) and the inputs of the down projections
    (etp A_r f / etp):   (saved - e) (etp A_r h + A_r f)."""
    return (saved - e) * (etp * A_r * h + A_r * f_e)
