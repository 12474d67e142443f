"""`perfmodel validate --dry-run`: the job's collectives at full scale, without GPUs.

The job's model is built for rank 0 of a world of the plan's full size on torch's fake process
group (every collective returns at once, in one process) on the meta device (shapes without
storage: any model size fits; FSDP (zero 3) plans run on the CPU, as FSDP2 refuses meta
parameters) and
one training step is run. Every
collective is counted twice: by torch's CommDebugMode (counts per op) and by the job's own
CollectiveCounter (counts per axis, op and bytes per call, nccl-tests' size convention). The counts
are then checked against the communication ledger of perfmodel's step model for the same plan:
exactly, call by call.

The ledger is taken for the model as the job builds it (validation.jobspec.job_model): untied
embeddings and a learned position table, also for rotary models (the report says so).
Pipeline plans (pp > 1): the fake group cannot carry tensors between stages, so rank 0's chunks
run forward and backward one by one (their tp and dp collectives counted as above) and the
pipeline's point-to-point messages are derived from the chunks' inputs and outputs.

Context and expert parallelism (validation.jobspec.JobParallel): the world is dp x cp x tp x pp
fake ranks; the ring's send/recv, the K/V all-gathers, the Ulysses and expert all-to-alls are
counted like every collective (axes "cp", "ep", "dp_cp", "edp"). The meta tensors hold no values
to route tokens by, so a mixture of experts is counted under balanced routing (assignment n to
expert n mod E: every rank sends T k / ep rows to each, perfmodel's routing_imbalance = 1). Where
perfmodel's step model does not cost what the job does (uncosted, below), there is
no ledger to compare with: the counts are shown alone and the result says why.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from typing import Any

from perfmodel.errors import PlanError
from perfmodel.output import fmt_bytes, json_text, schema_id
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan
from validation.jobspec import (
    FP8_NOTE,
    TP_BACKWARD_NOTE,
    JobParallel,
    RunSettings,
    check_layout,
    job_config,
    job_model,
    job_model_note,
    job_parallel,
    megatron_backward,
    without_fp8,
    world_size,
)
from validation.ledger import compare, model_ledger, totals

# activation offloading copies over the host link, no collective: the ledger is the same
OFFLOAD_DRY_RUN_NOTE = ("cpu_offload_layers: the job offloads no activations; the copies to and "
                        "from host memory are no collectives, so the counts compare as they are")
FP8_DRY_RUN_NOTE = (f"{FP8_NOTE}: counted and compared in bf16; in fp8 perfmodel's ledger "
                    "carries the sequence-parallel all-gathers (the forward's inputs, the "
                    "backward's grad outputs) at 1 byte per element (Transformer Engine casts "
                    "before gathering), the rest as here")


class _NoModuleTracker:
    """Stands in for CommDebugMode's module tracker, whose hooks fail on modules with
    PrepareModuleOutput hooks (IndexError in _fw_set_module_hook, torch 2.13); counts need no
    modules."""

    name = "Global"
    is_bw = False
    activation_checkpointing = False

    def __getattr__(self, name: str) -> Any:  # any table it records into: accept and forget
        table: defaultdict[Any, Any] = defaultdict(dict)
        object.__setattr__(self, name, table)
        return table

    def __enter__(self) -> _NoModuleTracker:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


def _forget_meshes() -> None:
    """Drop DTensor's caches of sharding decisions and redistribute plans: torch 2.13 keys them by
    specs whose meshes compare equal to an earlier run's of the same ranks and dim names, so a
    second dry run in one process would reuse the first run's process groups, and their
    collectives would be counted on no axis of this run."""
    with contextlib.suppress(ImportError, AttributeError):
        import torch
        from torch.distributed.tensor import DTensor, _redistribute

        torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ fast path's
        DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
        _redistribute.clear_redistribute_planner_cache()
        _redistribute._gen_transform_infos.cache_clear()


def _check_cpu_memory(model: TransformerSpec, plan: Plan) -> None:
    """PlanError (one line) where a zero-3 dry run cannot build its model: FSDP2 refuses meta
    parameters, so rank 0 builds its whole model on the CPU before sharding it (a mixture of
    experts every expert first), then holds its gradients: twice the parameters' bytes in the
    plan's dtype, against the memory the system has free (rather than the kernel killing the
    run without a word)."""
    import os

    from perfmodel.params import parameter_counts
    from workload.model import DTYPES

    per_element = DTYPES[plan.dtype.value].itemsize
    needed = 2 * parameter_counts(model).total * per_element
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # a system without these: not checked
        return
    if needed > free:
        raise PlanError(
            f"--dry-run of a zero 3 plan builds {model.name} whole on the CPU (FSDP2 refuses "
            f"meta parameters): about {needed / 2**30:.0f} GiB, and {free / 2**30:.0f} GiB are "
            "free; shrink it (--layers, --hidden) or count zero 0, 1 or 2")


def _check_balanced(model: TransformerSpec, plan: Plan, par: JobParallel) -> None:
    """Balanced routing (workload.moe: assignment n of a rank to expert n mod E, from 0 on every
    rank) receives on each rank what it sends, T_r k rows (the model's ledger, routing_imbalance
    1), only where E divides T_r k: otherwise every rank's first experts take one row more from
    each source, and rank 0 receives more than it sends. Such a dropless plan is refused here."""
    # with ep 1 no token crosses ranks to its expert (etp's ranks all hold every expert's shard)
    if par.ep == 1 or model.capacity_factor is not None or not model.top_k:
        return
    tokens = plan.micro_batch * model.seq_len // par.cp
    if plan.sequence_parallel:
        tokens //= plan.tp
    rows = tokens * model.top_k
    if rows % model.experts:
        raise PlanError(
            f"--dry-run routes each rank's {tokens} tokens x top_k {model.top_k} = {rows} "
            f"assignments round robin over the {model.experts} experts, which leaves the first "
            f"experts one more row from every rank unless the experts divide them: give a "
            f"micro-batch or sequence length that makes {rows} a multiple of {model.experts}")


def count_collectives(
    model: TransformerSpec, plan: Plan, parallel: JobParallel | None = None
) -> dict[str, Any]:
    """Run one step of rank 0 on a fake process group of the job's world (dp x cp x tp x pp
    ranks); count its collectives. A mixture of experts routes in balance (module docstring)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from workload.model import DTYPES
    from workload.parallelize import make_mesh
    from workload.timers import CollectiveCounter
    from workload.trainer import Trainer

    fsdp = plan.zero == 3 and plan.dp > 1
    if plan.pp > 1 and fsdp:
        raise PlanError("--dry-run does not count pipeline plans with FSDP (zero 3) yet: "
                        "use zero 0, 1 or 2")
    if fsdp:
        _check_cpu_memory(model, plan)
    if dist.is_initialized():
        dist.destroy_process_group()
    _forget_meshes()
    par = job_parallel(plan, parallel)
    if model.experts:
        _check_balanced(model, plan, par)
        par = JobParallel(**{**par.plan_keys(), "moe_routing": "balanced"})
    world = world_size(plan, par)
    cfg = job_config(model, plan, RunSettings(nprocs=world, steps=1, warmup=0), par)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = make_mesh(cfg["plan"], "cpu")
        # On the meta device: shapes without storage, so a rank of a 175B model fits anywhere.
        # FSDP2 refuses meta parameters: zero-3 plans run on the CPU (small models only).
        device = torch.device("cpu" if fsdp else "meta")
        torch.manual_seed(0)
        with device:
            trainer = Trainer(cfg, mesh, device, DTYPES[plan.dtype.value], pipeline=False)
        # AdamW issues no collective here (gradients already carry their parameters' placements);
        # the distributed optimizer's (zero 1, 2) parameter all-gather around it is counted.
        adamw = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        adamw.step = lambda *a, **k: None
        counter = CollectiveCounter(trainer.axis_names())
        trainer.counter = counter
        debug = CommDebugMode()
        # a tracker that tracks nothing, in place of torch's (private) one
        debug.advanced_module_tracker = _NoModuleTracker()  # type: ignore[assignment]
        with debug, counter, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations inside FSDP2 and DTensor, not ours
            if plan.pp > 1:
                p2p = trainer.chunks_step()
            else:
                trainer.step()
                p2p = []
        debug_counts = {str(k).split(".")[-1]: v for k, v in debug.get_comm_counts().items()}
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    records = [r for r in counter.table() if r["op"] != "barrier"]
    # point-to-point calls the job issued itself (ring attention): CommDebugMode counts
    # collectives only
    issued_p2p = sum(r["count"] for r in records if r["op"] == "send_recv")
    derived: dict[tuple[str, str, str, int], int] = {}
    for msg in p2p:
        key = (msg["axis"], msg["op"], msg["phase"], msg["bytes"])
        derived[key] = derived.get(key, 0) + 1
    # Pipeline messages are derived from the chunks (the fake group cannot carry them).
    records += [
        {"axis": a, "op": o, "phase": f"{ph} (derived)", "bytes": b, "count": c}
        for (a, o, ph, b), c in sorted(derived.items())
    ]
    return {
        "records": records,
        "comm_debug_mode": debug_counts,
        "comm_debug_mode_total": sum(debug_counts.values()) - debug_counts.get("barrier", 0),
        "derived_total": sum(derived.values()),
        "p2p_total": issued_p2p,
    }


def uncosted(model: TransformerSpec, plan: Plan, parallel: JobParallel) -> str:
    """Why perfmodel's ledger cannot describe this job ('' when it can): never the ledger of a
    dense model, or of a plan without cp / ep, compared as if it were this one."""
    why = [f"{k} = {getattr(parallel, k)}" for k in ("cp", "ep")
           if getattr(parallel, k) > 1 and not hasattr(plan, k)]
    why += model.uncosted()
    if not why:
        return ""
    return f"perfmodel's step model does not cost {'; '.join(why)} yet: the job's counts alone"


def dry_run(
    model: TransformerSpec, plan: Plan, parallel: JobParallel | None = None
) -> dict[str, Any]:
    check_layout(plan)  # the 1D job's collectives, never compared with a grid's ledger
    plan.check(model)  # as the command line's plan is (a PlanError naming the field, not the
    # job's own ValueError where the layers do not split over pp)
    as_job = job_model(model, plan.tp)
    fp8 = plan.dtype.value == "fp8"
    if fp8:  # the job runs bf16 (no Transformer Engine): counted and compared so
        plan = without_fp8(plan)
    if plan.flash_attention is None:  # --attention auto: the job attends with fused SDPA
        plan = plan.replace(flash_attention=True)  # (jobspec.as_run)
    # the job weights its experts' outputs at the combine, and runs tensor parallelism's
    # backward as torch DTensor does (jobspec.as_run)
    backward_note = TP_BACKWARD_NOTE if megatron_backward(plan) else ""
    # ... and syncs its gradients after the backward, one collective a buffer (jobspec.as_run:
    # no overlap, so no buckets: perfmodel.step.data_parallel.sync_buckets)
    plan = plan.replace(expert_weighting="output", tp_backward="dtensor",
                        overlap_grad_sync=False, overlap_param_gather=False,
                        dp_bucket_size=None, dp_bucketing="megatron")
    par = job_parallel(plan, parallel)
    counted = count_collectives(as_job, plan, par)
    missing = uncosted(as_job, plan, par)
    ledger = None if missing else model_ledger(as_job, plan)
    rows = compare(counted["records"], ledger or [])
    summed = totals(rows)
    if ledger is None:  # no model count to compare with (the document's agree is null)
        for row in rows:
            row.update(model_count=None, agree=False)
    job_total = sum(r["count"] for r in counted["records"])
    plan_dict = plan.to_dict()
    if par != JobParallel():
        plan_dict.update(par.plan_keys())
    if model.experts:
        plan_dict["moe_routing"] = "balanced"
    return {
        "schema": schema_id("validate.dry-run"),
        "model": model.name,
        "plan": plan_dict,
        "world_size": world_size(plan, par),
        "rows": rows,
        "totals": summed,
        "comm_debug_mode": counted["comm_debug_mode"],
        "comm_debug_mode_agrees": abs(
            counted["comm_debug_mode_total"] + counted["derived_total"] + counted["p2p_total"]
            - job_total
        )
        < 1e-9,
        "ledger_available": ledger is not None,
        "agree": None if ledger is None else all(r["agree"] for r in rows),
        "notes": [n for n in (job_model_note(model, plan.tp), missing,
                              FP8_DRY_RUN_NOTE if fp8 else "", backward_note,
                              OFFLOAD_DRY_RUN_NOTE if plan.cpu_offload_layers else "") if n],
    }


def exact_bytes(nbytes: float) -> str:
    """A message's bytes as counted, digit for digit (the check is exact: 7.16 MiB would hide
    a difference of a few bytes), with the binary unit beside it."""
    whole = f"{int(nbytes):,}" if float(nbytes).is_integer() else f"{nbytes:,}"
    return whole if nbytes < 1024 else f"{whole} ({fmt_bytes(nbytes)})"


def render(result: dict[str, Any], as_json: bool = False) -> None:
    if as_json:
        print(json_text(result, indent=1, default=str))
        return
    from rich.table import Table

    from perfmodel.render import console as terminal

    table = Table(
        title=f"dry-run: {result['model']} on {result['world_size']} fake ranks "
        "(per rank, per step)"
    )
    for col in ("axis", "op", "bytes/call", "job", "model", "phases (job / model)", ""):
        table.add_column(col)
    for r in result["rows"]:
        table.add_row(
            r["axis"],
            r["op"],
            exact_bytes(r["bytes"]),
            f"{r['job_count']:g}",
            "-" if r["model_count"] is None else f"{r['model_count']:g}",
            f"{r['job_phases']} / {r['model_phases']}",
            "" if r["model_count"] is None else "ok" if r["agree"] else "[red]differs[/red]",
        )
    console = terminal()
    console.print(table)
    console.print(
        f"CommDebugMode total agrees with the counter: {result['comm_debug_mode_agrees']}"
    )
    for note in result.get("notes", []):
        console.print(f"note: {note}")
    if not result["ledger_available"]:
        console.print("perfmodel has no communication ledger yet: counted only")
    else:
        console.print("agree: " + ("yes" if result["agree"] else "[red]no[/red]"))
