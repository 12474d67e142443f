"""The optimizer step: memory-bound passes over the local parameters, and its fixed costs.

    T_opt = e_step x P_local / W_opt + n_kernels t_kernel + t_opt0                           [s]
    P_local = P_gpu / (1 + zero1 (dp - 1))       (ZeRO 1-3 shard the optimizer over dp)
e_step: the bytes the step reads and writes per parameter (perfmodel.costs.precision); W_opt: the
bandwidth the optimizer reaches; t_opt0: its fixed cost beyond (`calibrate run` measures it).
The launches of the per-step collectives are charged here too (perfmodel.step.compose).
"""

from __future__ import annotations

from perfmodel import symbols as S
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context
from perfmodel.step.parameters import Parameters

# Kernels one optimizer step launches beyond its bytes, where not measured. An unsourced estimate
# kept from the first step model (88e7cc9): a few multi-tensor kernels (gradient norm, clipping,
# the Adam update, the copy to 16-bit weights, zeroing the gradients).
OPTIMIZER_KERNELS = 8


def optimizer_phase(c: Context, params: Parameters) -> Phase:
    local = params.per_gpu / (1 + c.zero1 * (S.dp - 1))
    return Phase(name="optimizer/step", per_step=True,
                 device={"optimizer/step": S.stepbytes * local / S.W_opt},
                 host={"optimizer/step": OPTIMIZER_KERNELS * S.t_k + S.t_opt0})
