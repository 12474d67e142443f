"""The step model: a training step's time and per-GPU memory as named sympy terms.

`build(family)` returns the named terms of a Family (perfmodel.family): options left open are 0/1
indicator symbols, so the universal family is one expression for every plan; perfmodel.evaluate
lambdifies it once and evaluates arrays of plans. A fixed family gives the same formulas
specialised (what `perfmodel explain` prints).

Read it in this order:
1. recipe.py           build: the work of a micro-batch, its communication, its phases on each
                       stage, its memory, then the step (schedule, gradient sync, optimizer)
2. compose.py          a Phase (device time, host time, the collectives it issues, what they may
                       hide behind) and the one rule that composes phases into a stage and a step
3. collective.py       a Collective, declared once: its time and its ledger entry come from it
4. the phases and what they need:
   context.py          the plan's derived symbols and the family's options as 0/1
   layer.py            a layer's GEMMs, attention and element-wise work; forward/backward/recompute
   embedding_head.py   the embedding and the output layer with its loss
   framework.py        what the framework adds to each part (measured, or per kernel launch)
   tensor_parallel.py  the tensor-parallel collectives (Megatron 1D, grids, embedding, output)
   pipeline.py         stages, sends and receives, the bubble
   data_parallel.py    the gradient sync (DDP, distributed optimizer, FSDP) and its copies
   optimizer.py        the optimizer step
   parameters.py, memory.py, quantities.py   parameters, memory per stage, FLOPs and part times

The step (per optimizer step, slowest pipeline stage; nothing overlaps but what a Phase's Overlap
names; see compose.py):
    T_step = m t_mb + T_bubble + T_dp + T_dp_framework + T_tp_grads + T_opt
    t_mb   = max(t_first, t_last),  t_stage = the sum of one micro-batch's terms on that stage
with m = B / (dp b) micro-batches (Narayanan et al. SC21, Sec. 2.2).
"""

from perfmodel.family import Family
from perfmodel.step.collective import Collective, CommOp, group_time
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context, active, device, flag
from perfmodel.step.recipe import Model, build

__all__ = ["Collective", "CommOp", "Context", "Family", "Model", "Overlap", "Phase", "active",
           "build", "device", "flag", "group_time"]
