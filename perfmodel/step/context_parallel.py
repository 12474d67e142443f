"""Context parallelism: how the attention of each layer crosses the cp ranks, per micro-batch.

Each sequence is cut into 2 cp chunks; cp rank i holds chunks i and 2 cp - 1 - i (load-balanced
causal chunks: every rank does 1/cp of the causal attention; Megatron-Core's context parallelism,
Transformer Engine's context-parallel attention). Everything but the attention core runs on the
rank's s / cp tokens. With C_k = b (s/cp) (n_kv/tp) d_qk and C_v = b (s/cp) (n_kv/tp) d_v elements
(K and V of the local chunks; n_kv = kv heads, all heads with MLA), per layer and micro-batch
(cp_comm, Megatron-Core's cp_comm_type):

  p2p (ring attention): the attention runs in cp steps, each over the K/V chunk of one rank,
      while the next chunk travels round the ring by send/recv (each exchange a send and a recv,
      one transfer on the critical path, as a pipeline's):
        forward   cp - 1 exchanges of e (C_k + C_v), each behind one step's attention
        backward  1 of e (C_k + C_v) behind the first step, cp - 2 of 2 e (C_k + C_v) (K, V, dK,
                  dV) behind the others, and the last dK, dV (e (C_k + C_v)) after the last step
      each overlapped exchange exposed by max(0, t_exchange - t_step) (Transformer Engine's
      AttnFuncWithCPAndKVP2P: the next step's K/V on another stream during this step's kernel),
      t_step = the layer's attention forward (backward) / cp;
  allgather: K and V all-gathered before the attention (cp e C each, nccl-tests' size: the
      gathered output), again in the backward, dK and dV reduce-scattered; not overlapped;
  a2a (Ulysses; Jacobs et al. 2023): all-to-alls swap the rank's s / cp tokens of all heads for
      all s tokens of a / cp heads: Q, K, V before the attention and its output after (e b (s/cp)
      (heads/tp) d each), the four gradients in the backward; not overlapped.
Recompute repeats the forward's exchanges where it repeats the attention core (full and
selective recompute). The attention's FLOPs (1/cp each) and its kernel launches are
perfmodel.step.layer.flash_attention's.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.lattice import lmax
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context
from perfmodel.step.layer import LayerWork

ZERO, ONE = sp.Integer(0), sp.Integer(1)
# the phases of a stage's cp collectives (<prefix>/<name>), each ending in the pass it runs in
PHASES = ("ring/forward", "ring_first/backward", "ring_steps/backward", "ring_last/backward",
          "ring/recompute", "exposed/forward", "exposed/backward")
RECORDS_PER_EXCHANGE = 2  # a send and a receive


def kv_elements(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(C_k, C_v): K and V of the rank's chunks, elements per micro-batch on one rank: its
    kv_heads / tp heads, one (replicated) where tp exceeds kv_heads."""
    local = c.T * lmax(1, c.kv_heads / S.tp)
    return local * c.d_qk, local * c.d_v


def cp_collectives(c: Context, layers: sp.Expr | None = None, prefix: str = "cp",
                   stage: str = "every", recomputed: bool = True) -> list[Collective]:
    """The context-parallel collectives of `layers` layers (default: the first stage's, which the
    ledger counts; the other stages' phases scale them) per micro-batch, in the phases
    <prefix>/<PHASES>, on `stage`."""
    n = c.layers_per_stage if layers is None else layers
    e, cp = S.e, S.cp
    ck, cv = kv_elements(c)
    kv = e * (ck + cv)
    recompute = c.full + c.core if recomputed else 0

    def x(name: str, op: str, nbytes: sp.Expr, calls: sp.Expr, phase: str, in_phase: str,
          transfers: sp.Expr | None = None) -> Collective:
        return Collective(name=name, op=op, axis="cp", nbytes=nbytes, calls=calls, phase=phase,
                          in_phase=f"{prefix}/{in_phase}", term="comm/cp", fam=c.fam,
                          transfers=transfers, stage=stage)

    def ring(name: str, nbytes: sp.Expr, exchanges: sp.Expr, phase: str,
             in_phase: str) -> Collective:
        count = c.cp_p2p * exchanges * n
        return x(name, "send_recv", nbytes, RECORDS_PER_EXCHANGE * count, phase, in_phase,
                 transfers=count)

    out = [ring("cp/ring/send_recv", kv, cp - 1, "fwd", "ring/forward"),
           ring("cp/ring/send_recv", kv, ONE, "bwd", "ring_first/backward"),
           ring("cp/ring/send_recv", 2 * kv, sp.Max(0, cp - 2, evaluate=False), "bwd",
                "ring_steps/backward"),
           ring("cp/ring/send_recv", kv, ONE, "bwd", "ring_last/backward")]
    if recomputed:
        out.append(ring("cp/ring/send_recv", kv, recompute * (cp - 1), "bwd", "ring/recompute"))
    gathered = {"k": e * cp * ck, "v": e * cp * cv}
    for part, nbytes in gathered.items():
        calls = c.cp_allgather * n
        out += [x(f"cp/all_gather_{part}/all_gather", "all_gather", nbytes, calls, "fwd",
                  "exposed/forward"),
                x(f"cp/all_gather_{part}/all_gather", "all_gather", nbytes, (1 + recompute) * calls,
                  "bwd", "exposed/backward"),
                x(f"cp/all_gather_{part}/reduce_scatter", "reduce_scatter", nbytes, calls, "bwd",
                  "exposed/backward")]
    heads = c.T / S.tp
    swapped = {"q": e * heads * S.a * c.d_qk, "k": e * heads * c.kv_heads * c.d_qk,
               "v": e * heads * c.kv_heads * c.d_v, "out": e * heads * S.a * c.d_v}
    for part, nbytes in swapped.items():
        calls = c.cp_a2a * n
        out += [x(f"cp/ulysses_{part}/all_to_all", "all_to_all", nbytes, calls, "fwd",
                  "exposed/forward"),
                x(f"cp/ulysses_{part}/all_to_all", "all_to_all", nbytes, (1 + recompute) * calls,
                  "bwd", "exposed/backward")]
    return out


def cp_phases(c: Context, work: LayerWork, issued: Mapping[str, tuple[Collective, ...]],
              prefix: str = "cp", recomputed: bool = True,
              present: sp.Expr = ONE, comm_scale: sp.Expr = ONE) -> tuple[Phase, ...]:
    """The context-parallel collectives of a stage in one micro-batch, each behind what it may
    hide behind (module doc; perfmodel.step.compose.Overlap, the part hidden reported as such):
    `work` is the layers' (perfmodel.step.layer.stage_work); comm_scale the stage's layers over
    those the collectives are declared for (an uneven pipeline split's)."""
    cp = S.cp
    step_fwd = work.attention_s / cp  # one ring step of every layer's attention forward
    step_bwd = work.attention_backward_s / cp
    windows = {"ring/forward": (cp - 1) * step_fwd, "ring_first/backward": step_bwd,
               "ring_steps/backward": sp.Max(0, cp - 2, evaluate=False) * step_bwd,
               "ring/recompute": (c.full + c.core) * (cp - 1) * step_fwd}
    out = []
    for name in PHASES:
        if name == "ring/recompute" and not recomputed:
            continue
        window = windows.get(name)
        overlap = None if window is None else Overlap(
            "the attention of the ring's previous step", window, ONE)
        out.append(Phase(name=f"{prefix}/{name}", comms=issued.get(f"{prefix}/{name}", ()),
                         overlaps=() if overlap is None else (overlap,), present=present,
                         comm_scale=comm_scale))
    return tuple(out)
