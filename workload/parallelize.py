"""How a rank's chunks are parallelised, all on one DeviceMesh with dims named after the plan's axes
("pp", "dp", "tp", outermost first by default; "pp", "dp", "cp", "tp" with context parallelism).
NCCL on GPUs, gloo on CPUs: the same code.

- data parallel, zero 0: gradients averaged by one flat all-reduce over the dp group after the last
  backward (workload.trainer; not overlapped, so that it can be timed). zero 1 and 2: Megatron-LM's
  distributed optimizer (workload.distopt: parameters whole on every rank, one flat gradient
  buffer reduce-scattered once per step, AdamW on this rank's shard, one all-gather of the
  updated weights; Megatron has no separate ZeRO-2: both keep the whole gradient buffer). zero 3:
  FSDP2 ``fully_shard`` with ``reshard_after_forward=True`` (apply_fsdp), one unit per block and
  one for the rest of each chunk, over dp only.
- tensor parallel 1D (Megatron layout) and sequence parallel with DTensor parallel styles; one
  ``PrepareModuleInput`` per sub-layer so that the backward reduces the input gradient once (the
  f / g operators); the LM head is column-parallel with a vocab-parallel cross-entropy
  (``loss_parallel``); the token embedding is row-parallel (vocab-sharded, all-reduce forward); the
  learned position embedding is replicated and, with SP, the sum is scattered along the sequence
  (all-gather backward), as Megatron does with learned positions.
- pipeline parallel: workload.trainer (``torch.distributed.pipelining``).
- bf16 gradients are reduced in fp32 (the distributed optimizer's buffer; FSDP2's reduce_dtype),
  as Megatron-LM does.
- context parallelism (plan key ``cp``, attention by ``cp_comm``: workload.context_parallel): a
  mesh dim "cp", placed right outside tp unless the placement names it (Megatron's order
  tp-cp-dp-pp, tp innermost); gradients are then averaged over the dp x cp ranks of a model replica
  (axis "dp_cp", Megatron's data-parallel group with context parallelism).
- expert parallelism (plan key ``ep``, workload.moe) and expert tensor parallelism (plan key
  ``etp``, dividing tp): the dp x cp x tp ranks of each pp stage, flattened with tp innermost and
  cp next, are cut into expert-data-parallel x ep x etp with etp innermost: groups "etp" (etp
  consecutive ranks, of the tp axis: each routed expert split over them, its up projections
  column- and its down projection row-parallel; the tokens all-gathered and reduce-scattered over
  them), "ep" (the experts' all-to-alls: the ranks of one etp index after them, the rest of the
  tp axis first, then cp, then dp), "etp_ep" (the etp x ep ranks, etp inner: the dropless token
  counts, Megatron's tp_ep group; with etp 1 that is the ep group) and "edp" (the experts'
  gradient all-reduce, tp dp cp / (ep etp) ranks, where the experts sync apart from the other
  parameters: ep > 1 or tp / etp > 1). This is Megatron-Core's expert rank order
  (parallel_state.initialize_model_parallel: the expert RankGenerator, order "tp-cp-ep-dp-pp"
  with tp = expert_tensor_parallel_size and cp 1; with etp 1 an ep group takes the attention's tp
  ranks first; with etp = tp, Megatron's default, the etp group is the tp group). With tp > 1
  each tp rank routes its own share of the sequence (sequence parallelism; Megatron-Core's
  MoELayer refuses MoE with tp and without it in training): the MoE layer takes its input and
  gives its output sequence-sharded (no tensor-parallel collective for the routed experts but the
  etp group's), its router is whole on every tp rank (gradient all-reduced over tp with the
  norms', Megatron's allreduce_layernorm_grads of the parameters marked sequence_parallel) and its
  shared experts are one tensor-parallel MLP (Megatron-Core's SharedExpertMLP: input all-gathered,
  output reduce-scattered once, for all of them).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from workload.model import Chunk
from workload.moe import MoE


def placement_of(plan: dict[str, Any]) -> list[str]:
    """The mesh's axes, innermost first: the plan's placement, with "cp" right outside "tp" when
    cp > 1 and the placement does not name it."""
    placement = plan.get("placement", "tp,dp,pp")
    inner_first = list(
        [a.strip() for a in placement.split(",")] if isinstance(placement, str) else placement
    )
    if plan.get("cp", 1) > 1 and "cp" not in inner_first:
        inner_first.insert(inner_first.index("tp") + 1, "cp")
    return inner_first


def make_mesh(plan: dict[str, Any], device_type: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(reversed(placement_of(plan)))
    return init_device_mesh(
        device_type, tuple(plan.get(a, 1) for a in names), mesh_dim_names=names
    )


def extra_groups(mesh: Any, plan: dict[str, Any],
                 experts: bool = False) -> dict[str, tuple[Any, int, int]]:
    """The groups beyond the mesh's dims, as {axis: (group, rank in it, size)}: "dp_cp" when
    cp > 1; for a mixture of experts (experts): "etp" and "etp_ep" when etp > 1, "ep" when
    ep > 1, "edp" where the experts sync apart and tp dp cp / (ep etp) > 1 (see the module
    docstring). Every rank calls this, in the same order
    (new_subgroups_by_enumeration is collective)."""
    import torch.distributed as dist

    names = list(mesh.mesh_dim_names)
    ranks = mesh.mesh
    for axis in ("pp", "dp", "cp", "tp"):  # absent dims (size 1) added, then ordered
        if axis not in names:
            ranks, names = ranks.unsqueeze(-1), [*names, axis]
    ranks = ranks.permute(*(names.index(a) for a in ("pp", "dp", "cp", "tp")))
    layouts = group_layouts(ranks, plan.get("ep", 1), experts, plan.get("etp", 1))
    me = dist.get_rank()
    out = {}
    for axis, lists in layouts.items():
        group, _ = dist.new_subgroups_by_enumeration(lists)
        mine = next(r for r in lists if me in r)
        out[axis] = (group, mine.index(me), len(mine))
    return out


def experts_apart(ep: int, tp: int, etp: int) -> bool:
    """Whether the routed experts' gradients sync apart from the other parameters' (over edp):
    ep > 1 or tp / etp > 1 (the other parameters' replicas then hold other experts or other
    slices of them; perfmodel.step.data_parallel's rule)."""
    return ep > 1 or tp // etp > 1


def group_layouts(ranks: Any, ep: int, experts: bool, etp: int = 1) -> dict[str, list[list[int]]]:
    """The rank lists of extra_groups' groups, from the ranks as a (pp, dp, cp, tp) tensor."""
    pp, dp, cp, tp = ranks.shape
    flat = ranks.reshape(pp, dp * cp, tp)  # cp inner
    layouts: dict[str, list[list[int]]] = {}
    if cp > 1:
        layouts["dp_cp"] = [flat[p, :, t].tolist() for p in range(pp) for t in range(tp)]
    if experts and (ep > 1 or tp > 1):
        # a stage's ranks, tp innermost, then cp, then dp, cut into edp x ep x etp (etp inner)
        cut = ranks.reshape(pp, dp * cp * tp // (ep * etp), ep, etp)
        edp = cut.shape[1]
        if etp > 1:
            layouts["etp"] = [cut[p, d, j, :].tolist()
                              for p in range(pp) for d in range(edp) for j in range(ep)]
            layouts["etp_ep"] = [cut[p, d].flatten().tolist() for p in range(pp)
                                 for d in range(edp)]
        if ep > 1:
            layouts["ep"] = [cut[p, d, :, t].tolist()
                             for p in range(pp) for d in range(edp) for t in range(etp)]
        if edp > 1 and experts_apart(ep, tp, etp):
            layouts["edp"] = [cut[p, :, j, t].tolist()
                              for p in range(pp) for j in range(ep) for t in range(etp)]
    return layouts


def check_parallel(m: dict[str, Any], plan: dict[str, Any]) -> None:
    """ValueError (one line naming the field) for a cp / ep setting the job cannot run."""
    from workload.settings import check_parallel as broken

    why = broken(m, plan)
    if why is not None:
        raise ValueError(why)


def apply_cp(mod: Chunk, group: Any, rank: int, size: int, comm: str, seq_len: int) -> None:
    """Context parallelism: every attention core of the chunk attends across the cp ranks; the
    embedding (first chunk) takes this rank's token positions."""
    from workload.context_parallel import CPGroup, local_positions

    cpg = CPGroup(group=group, rank=rank, size=size, comm=comm)
    block: Any  # a Block (a ModuleList yields Module to mypy)
    for block in mod.layers:
        block.attention.cp = cpg
    if mod.embedding is not None:
        device = mod.embedding.pos.weight.device
        mod.embedding.positions = local_positions(seq_len, size, rank).to(device)


def apply_ep(mod: Chunk, groups: dict[str, tuple[Any, int, int]], routing: str) -> None:
    """Expert (and expert tensor) parallelism: each MoE layer keeps this ep rank's experts, each
    of them this etp rank's slice (groups: extra_groups'); the routing mode."""
    ep_group, ep_rank, ep = groups.get("ep", (None, 0, 1))
    etp_group, etp_rank, etp = groups.get("etp", (None, 0, 1))
    for block in mod.layers:
        ffn = block.feed_forward
        if isinstance(ffn, MoE):
            ffn.routing = routing
            if ep > 1:
                ffn.shard_experts(ep_group, ep_rank, ep)
            if etp > 1:
                ffn.split_experts(etp_group, etp_rank, etp, groups["etp_ep"][0])


def expert_parameters(mods: list[Any]) -> set[int]:
    """ids of the routed experts' parameters (their gradients are reduced over edp)."""
    return {
        id(p)
        for mod in mods
        for sub in mod.modules()
        if isinstance(sub, MoE)
        for p in sub.experts.parameters()
    }



def apply_tp(mod: Chunk, tp_mesh: Any, sequence_parallel: bool) -> None:
    """Megatron 1D tensor parallelism (and sequence parallelism) with DTensor parallel styles."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    act = Shard(1) if sp else Replicate()
    if mod.embedding is not None:
        parallelize_module(
            mod.embedding,
            tp_mesh,
            {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())},
        )
        if sp:  # scatter to the sequence-parallel region: a local slice (all-gather in backward)
            parallelize_module(
                mod,
                tp_mesh,
                {
                    "embedding": PrepareModuleOutput(
                        output_layouts=Replicate(), desired_output_layouts=act
                    )
                },
            )
    block: Any  # a Block (a ModuleList yields Module to mypy)
    for block in mod.layers:
        styles: dict[str, Any] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
        }
        # One entry point per sub-layer (Megatron's f / g operators): the input becomes a replicated
        # DTensor once, so wq, wk and wv (and w1, w3) sum their Partial input gradients locally and
        # the backward reduces them in one collective (all-reduce; reduce-scatter with SP).
        styles["attention"] = PrepareModuleInput(
            input_layouts=(act,), desired_input_layouts=(Replicate(),)
        )
        if isinstance(block.feed_forward, MoE):
            styles.update(_moe_tp_styles(block.feed_forward, tp_mesh, sp))
        else:
            styles.update({
                "feed_forward": PrepareModuleInput(
                    input_layouts=(act,), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=act),
            })
            if block.feed_forward.w3 is not None:
                styles["feed_forward.w3"] = ColwiseParallel()
        if sp:
            styles["attention_norm"] = SequenceParallel()
            styles["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, styles)
    if mod.output is not None:
        styles = {
            "output": ColwiseParallel(
                input_layouts=act, output_layouts=Shard(-1), use_local_output=False
            )
        }
        if sp:
            styles["norm"] = SequenceParallel()
        parallelize_module(mod, tp_mesh, styles)


def _moe_tp_styles(moe: Any, tp_mesh: Any, sequence_parallel: bool) -> dict[str, Any]:
    """An MoE layer under tp (module docstring): its input and output stay this rank's sequence
    shard, local; the router and the routed experts are whole (the router's parameters marked
    ``sequence_parallel``: their gradients are all-reduced over tp with the norms'); each shared
    expert's up projections column-parallel and its down projection row-parallel with the output
    left Partial (MoE.forward gathers the input once and reduce-scatters the sum once)."""
    from torch.distributed.tensor import Partial, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    if not sequence_parallel:  # workload.settings.check_parallel refuses it first
        raise ValueError("a mixture of experts with tp > 1 needs sequence_parallel")
    for p in moe.router.parameters():
        p.sequence_parallel = True
    moe.tp_mesh = tp_mesh
    styles: dict[str, Any] = {
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
        )
    }
    for i, mlp in enumerate(moe.shared):
        styles[f"feed_forward.shared.{i}.w1"] = ColwiseParallel(use_local_output=False)
        if mlp.w3 is not None:
            styles[f"feed_forward.shared.{i}.w3"] = ColwiseParallel(use_local_output=False)
        styles[f"feed_forward.shared.{i}.w2"] = RowwiseParallel(
            output_layouts=Partial(), use_local_output=False
        )
    return styles


def apply_fsdp(mod: Chunk, dp_mesh: Any, zero: int, experts: Any = False,
               pipelined: bool = False, keep: bool = False) -> None:
    """FSDP2 (zero 3; zero 1 and 2 are workload.distopt's): one unit per block and one for the
    rest of the chunk; bf16 gradients are reduce-scattered in fp32, as Megatron-LM reduces them.
    Each unit is resharded after its forward, and gathered again for the backward, except in a
    pipeline (pipelined), where, as torchtitan's default policy does, the stage keeps its units
    gathered through the step (torch.distributed.pipelining neither reshards nor reduces until
    the stage's last backward; perfmodel.step.data_parallel, stage_resident), or where kept (the
    plan's fsdp_reshard backward or step: reshard_after_forward false; workload.trainer keeps
    them gathered after the backward too for step).

    experts (a mixture of experts whose routed experts sync apart, ep > 1): the
    expert-data-parallel mesh, or None where that group is one rank: each MoE layer's routed
    experts a unit of their own over that mesh, as torchtitan and NeMo AutoModel shard them
    beside expert parallelism; with a group of one rank they stay whole. FSDP2 averages their
    gradients over that mesh; their mean is over the model's replicas (the experts' tokens came
    from every replica): workload.trainer rescales them (gloo has no pre-multiplied sum for
    FSDP2's set_gradient_divide_factor)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reshard = zero == 3 and not pipelined and not keep
    bf16 = next(mod.parameters()).dtype == torch.bfloat16
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    whole: set[Any] = set()  # the routed experts of a group of one rank: not sharded
    for block in mod.layers:
        ffn = block.feed_forward
        kept: set[Any] = set()
        if experts is not False and isinstance(ffn, MoE):
            if experts is None:
                kept = set(ffn.experts.parameters())
            else:
                fully_shard(ffn.experts, mesh=experts, reshard_after_forward=reshard,
                            mp_policy=policy)
        whole |= kept
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy,
                    ignored_params=kept or None)
    fully_shard(mod, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy,
                ignored_params=whole or None)


def loss_context(tp: int) -> Any:
    """Vocabulary-parallel cross entropy (``loss_parallel``) under tensor parallelism."""
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()

