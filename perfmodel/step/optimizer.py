"""The optimizer step: memory-bound passes over the local parameters, and its fixed costs.

    T_opt = e_step x P_local / W_opt + n_kernels t_kernel + t_opt0                           [s]
    P_local = P_gpu / (1 + zero1 (dp - 1))       (ZeRO 1-3 shard the optimizer over dp)
e_step: the bytes the step reads and writes per parameter (perfmodel.costs.precision); W_opt: the
bandwidth the optimizer reaches; t_opt0: its fixed cost beyond (`calibrate run` measures it).
The launches of the per-step collectives are charged here too (perfmodel.step.compose).

DeepSpeed's BF16_Optimizer (Plan.bf16_optimizer) also works after every micro-batch's backward:
update_hp_grads adds each parameter's bf16 gradient into its whole fp32 one,
hp_grad.add_(lp.grad.to(fp32)) (deepspeed/runtime/bf16_optimizer.py; its pipeline engine calls it
from _exec_backward_pass, its engine from backward): a cast (read 2, write 4) and an add (read 4
and 4, write 4), 18 bytes a parameter, m times a step on the stage's parameters:
    T_bf16opt = m x 18 x P_gpu / W_opt                                                      [s]
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
HP_GRAD_ADD_BYTES = 2 + 4 + 4 + 4 + 4  # BF16_Optimizer's per-micro-batch cast and add (module doc)


def optimizer_phase(c: Context, params: Parameters) -> Phase:
    local = params.per_gpu / (1 + c.zero1 * (S.dp - 1))
    hp_grads = c.m * HP_GRAD_ADD_BYTES * params.per_gpu / S.W_opt if c.fam.bf16_optimizer else 0
    return Phase(name="optimizer/step", per_step=True,
                 device={"optimizer/step": S.stepbytes * local / S.W_opt + hp_grads},
                 host={"optimizer/step": OPTIMIZER_KERNELS * S.t_k + S.t_opt0})
