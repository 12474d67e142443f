"""Options given that would change nothing for the plan they are given with: refused in one
line, naming the option, rather than predicted as if it were not given. The command line asks
with `given` which options the user gave as flags (click's parameter sources); `predict --batch`
which cells a row of the plans file sets: the same rules for both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmodel.errors import PlanError
from perfmodel.strategy import ep_overlap_pairs, sync_ranks


def refuse_idle_flags(plan: Any, model: Any, given: Callable[[str], bool]) -> None:
    """A flag given for context or expert parallelism that the plan has none of would change
    nothing: refused, naming it, rather than predicted as if it were not given (a plan read from
    a config may carry its framework's setting; the flag is the user's, and so is a plans file's
    cell: `given(field)` says which the user set)."""
    if plan.cp == 1 and given("cp_comm"):
        raise PlanError(f"cp_comm {plan.cp_comm.value} applies to context parallelism (cp > 1), "
                        "and the plan has cp 1: give --cp, or leave --cp-comm out")
    experts = getattr(model, "experts", 0)
    if plan.ep == 1 and given("ep_dispatcher") and plan.ep_dispatcher.value != "alltoall":
        why = "the model has no experts" if not experts else "the plan has ep 1"
        raise PlanError(f"ep_dispatcher {plan.ep_dispatcher.value} exchanges a mixture of "
                        f"experts' tokens over expert parallelism (ep > 1), and {why}: "
                        + ("leave --ep-dispatcher out" if not experts
                           else "give --ep, or leave --ep-dispatcher out"))
    if not experts and given("expert_weighting") \
            and plan.expert_weighting.value != "activation":
        raise PlanError(f"expert_weighting {plan.expert_weighting.value} applies to a mixture of "
                        "experts, and the model has no experts: leave --expert-weighting out")
    if plan.tp_backward is not None and given("tp_backward") \
            and not (plan.tp > 1 and plan.tp_layout.value == "1d"):
        raise PlanError(f"tp_backward {plan.tp_backward.value} applies to tensor parallelism "
                        "(tp > 1, tp_layout 1d), which the plan has not: leave --tp-backward out")
    if plan.tp == 1 and given("tp_layout") and plan.tp_layout.value != "1d":
        raise PlanError(f"tp_layout {plan.tp_layout.value} lays out tensor parallelism (tp > 1), "
                        "and the plan has tp 1: give --tp, or leave --tp-layout out")
    for name in ("overlap_grad_sync", "overlap_param_gather"):
        if given(name) and getattr(plan, name) and sync_ranks(plan, model) == 1:
            flag = "--" + name.replace("_", "-")
            what = "gradient sync" if name == "overlap_grad_sync" else "parameter gather"
            raise PlanError(f"{flag} overlaps the data-parallel {what}, and the plan has none "
                            f"(dp {plan.dp}, cp {plan.cp}"
                            + (", the experts' tp dp cp / (ep etp) 1" if experts else "")
                            + f"): give --dp (or --gpus) above 1, or leave {flag} out")
    for name in ("dp_bucket_size", "dp_bucketing"):
        # buckets split a gradient sync overlapped with the backward (Megatron-Core builds one
        # bucket without overlap)
        if given(name) and not (plan.overlap_grad_sync and sync_ranks(plan, model) > 1):
            flag = "--" + name.replace("_", "-")
            why = ("the plan's gradient sync is not overlapped" if not plan.overlap_grad_sync
                   else f"the plan has no data-parallel sync (dp {plan.dp}, cp {plan.cp})")
            raise PlanError(f"{flag} buckets a gradient sync overlapped with the backward, and "
                            f"{why}: give --overlap-grad-sync (and --dp above 1), or leave "
                            f"{flag} out")
    if given("ep_comm_overlap") and plan.ep_comm_overlap and plan.ep > 1:
        # combined 1F1B pairs one micro-batch's chunk with another's: the pairs a schedule leaves
        # are none where its warm-up and cool-down take every chunk (perfmodel.step.moe.
        # ep_overlaps: the floor 1 + 2 (pp - 1) + (v - 1) pp of its m v chunks)
        interleaved = plan.schedule.value == "interleaved"
        v = plan.virtual_stages if interleaved else 1
        per = plan.pipeline_micro_batches or plan.num_micro_batches
        if not ep_overlap_pairs(plan.pp, v, interleaved, per):
            raise PlanError(f"ep_comm_overlap pairs one micro-batch's chunks with another's, and "
                            f"this schedule leaves none paired ({per} micro-batch(es) of "
                            f"{v} chunk(s) on {plan.pp} stage(s)): give more micro-batches, or "
                            "leave --ep-comm-overlap out")
    if given("schedule") and plan.pp == 1 and plan.schedule.value != "1f1b":
        # one stage runs its micro-batches one after another whatever the order (Megatron-Core's
        # forward_backward_no_pipelining); the pipelined schedules' rules refuse the others
        raise PlanError(f"schedule {plan.schedule.value} orders a pipeline's micro-batches "
                        "(pp > 1), and the plan has pp 1: give --pp, or leave --schedule out")
    if given("zero") and plan.zero > 0 and sync_ranks(plan, model) == 1:
        raise PlanError(f"zero {plan.zero} shards over the data-parallel ranks, and the plan has "
                        f"none (dp {plan.dp}, cp {plan.cp}): give --dp (or --gpus) above 1, or "
                        "leave --zero out")
    refuse_idle_recompute(given, plan.recompute.value)


# the recompute sub-options and the policies that use them (perfmodel.strategy.Plan)
_RECOMPUTE_SUBOPTIONS = {"recompute_modules": ("selective",),
                         "recompute_method": ("full",), "recompute_num_layers": ("full",),
                         "recompute_every": ("selective", "full", "op")}


def refuse_idle_recompute(given: Callable[[str], bool], recompute: str | None) -> None:
    """A recompute sub-option given with a policy that does not use it (--recompute-modules with
    --recompute none, --recompute-num-layers 1 with selective) would change nothing: refused,
    naming it and the policies that use it. recompute None: not pinned (recommend searches
    the policies), nothing refused."""
    if recompute is None:
        return
    for name, policies in _RECOMPUTE_SUBOPTIONS.items():
        if given(name) and recompute not in policies:
            flag = "--" + name.replace("_", "-")
            allowed = " or ".join(filter(None, (", ".join(policies[:-1]), policies[-1])))
            raise PlanError(f"{flag} applies to recompute {allowed}, and the plan recomputes "
                            f"{recompute}: give --recompute {allowed}, or leave {flag} out")
