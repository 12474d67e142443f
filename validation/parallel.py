"""The job with context parallelism, expert parallelism or a mixture of experts, on its own:
its runs, its equivalence check with one process and its dry run (`perfmodel validate --cp / --ep`
runs it against perfmodel's prediction and ledger):

    python -m validation.parallel --model tiny-gpt --cp 2 --nprocs 2
    python -m validation.parallel --model mixtral-8x7b --layers 2 --hidden 64 --heads 4 \\
        --seq-len 32 --vocab 128 --dp 2 --ep 2 --check
    python -m validation.parallel --model mixtral-8x7b --layers 2 --hidden 64 --heads 8 \\
        --seq-len 32 --vocab 128 --dp 2 --tp 2 --ep 2 --etp 2 --sequence-parallel --check
    python -m validation.parallel --model mixtral-8x7b --dp 64 --cp 8 --ep 64 --dry-run

A run trains the plan on local gloo ranks (workload.job) and prints its step times, losses and
rank 0's collectives per step (axis, op, bytes per call, calls: the ledger's format); --check runs
one step against one process (workload.equivalence: loss and every gradient, fp32); --dry-run
counts rank 0's collectives on a fake process group of the full world (validation.dryrun). The
world is dp x cp x tp x pp ranks; ep is carved out of a stage's tp x cp x dp ranks, tp innermost,
after the etp ranks that split each expert (Megatron-Core's expert rank order,
workload.parallelize).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import click

from perfmodel.cli import EXIT_INTERRUPTED, EXIT_USAGE
from perfmodel.errors import PerfmodelError, PlanError
from perfmodel.files import write_atomic
from perfmodel.output import json_text
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan
from validation.jobspec import (
    JobParallel,
    RunSettings,
    job_config,
    job_model,
    job_parallel,
    world_size,
)
from workload.settings import CPComm, MoERouting

EQUIVALENCE_MODULE = "workload.equivalence"


def check_equivalence(
    model: TransformerSpec, plan: Plan, parallel: JobParallel, run_dir: Path,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """One step of the job on local gloo ranks against one process (workload.equivalence); the
    ranks' results and whether all agree. JobFailed if a rank fails."""
    from validation.run import JobFailed
    from workload.launcher import launch

    if plan.pp > 1:
        raise PlanError("the equivalence check runs pp = 1 plans")
    if model.capacity_factor is not None and (plan.tp > 1 or job_parallel(plan, parallel).cp > 1):
        raise PlanError("capacity_factor with tp or cp > 1 cannot be checked against one process: "
                        "each rank drops by its own share of the sequence (check it with tp = "
                        "cp = 1; --dry-run counts its exchanges)")
    world = world_size(plan, parallel)
    cfg = job_config(job_model(model, plan.tp), plan, RunSettings(nprocs=world), parallel)
    cfg["timeout_s"] = timeout_s
    run_dir.mkdir(parents=True, exist_ok=True)
    config, out = run_dir / "config.json", run_dir / "equivalence"

    def prepare() -> None:
        for stale in run_dir.glob("equivalence.rank*.json"):
            stale.unlink()
        write_atomic(config, json.dumps(cfg, indent=1), what="job config")

    # forked from one process that imported torch once (2-3 s of CPU a rank saved)
    result = launch(EQUIVALENCE_MODULE, [str(config), str(out)], world, run_dir,
                    timeout_s=timeout_s + 60, prepare=prepare, fork=True,
                    preload=("torch", "torch.distributed"))
    if not result.ok:
        bad = result.failed_rank()
        raise JobFailed(f"the equivalence check failed: rank {bad.rank if bad else '?'}: "
                        f"{bad.error if bad else result.reason} (logs: {run_dir})")
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]
    return {"world_size": world, "plan": cfg["plan"], "ok": all(r["ok"] for r in ranks),
            "ranks": ranks}


def run(model: TransformerSpec, plan: Plan, parallel: JobParallel, settings: RunSettings,
        run_dir: Path) -> dict[str, Any]:
    """Train the plan on local ranks (workload.job); step times, losses, rank 0's collectives."""
    from validation.run import JobFailed, run_job

    cfg = job_config(job_model(model, plan.tp), plan, settings, parallel)
    result, records = run_job(cfg, run_dir, settings)
    if not result.ok:
        bad = result.failed_rank()
        raise JobFailed(f"the job failed: rank {bad.rank if bad else '?'}: "
                        f"{bad.error if bad else result.reason} (logs: {run_dir})")
    by_rank = sorted(records, key=lambda r: r["rank"])
    steps = [s["step"] for s in by_rank[0]["steps"]]
    return {
        "world_size": settings.nprocs,
        "plan": cfg["plan"],
        "step_s_median": statistics.median(steps) if steps else None,
        "losses": {r["rank"]: r.get("losses", []) for r in by_rank},
        "collectives": (by_rank[0].get("probe") or {}).get("collectives", []),
        "run_dir": str(run_dir),
    }


def _table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("axis", "op", "phase", "bytes/call", "calls"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["axis"], r["op"], r["phase"], f"{int(r['bytes']):,}", f"{r['count']:g}")
    Console().print(table)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", required=True, help="A preset, spec file or Hugging Face config.json.")
@click.option("--seq-len", type=click.IntRange(1), default=None, help="Tokens per sequence.")
@click.option("--layers", type=click.IntRange(1), default=None, help="Override the layers.")
@click.option("--hidden", type=click.IntRange(1), default=None, help="Override the hidden size.")
@click.option("--heads", type=click.IntRange(1), default=None, help="Override the heads.")
@click.option("--vocab", type=click.IntRange(1), default=None, help="Override the vocabulary.")
@click.option("--ffn-hidden", type=click.IntRange(1), default=None, help="Override the MLP width.")
@click.option("--dp", type=click.IntRange(1), default=1, show_default=True)
@click.option("--tp", type=click.IntRange(1), default=1, show_default=True)
@click.option("--pp", type=click.IntRange(1), default=1, show_default=True)
@click.option("--cp", type=click.IntRange(1), default=1, show_default=True,
              help="Context-parallel degree.")
@click.option("--cp-comm", type=click.Choice([e.value for e in CPComm]), default="p2p",
              show_default=True, help="p2p: ring attention; allgather: K/V all-gathered; "
              "a2a: Ulysses.")
@click.option("--ep", type=click.IntRange(1), default=1, show_default=True,
              help="Expert-parallel degree (ep x etp divides tp x dp x cp).")
@click.option("--etp", type=click.IntRange(1), default=1, show_default=True,
              help="Expert tensor parallelism: each routed expert split over etp of the tp "
              "ranks (divides tp).")
@click.option("--moe-routing", type=click.Choice([e.value for e in MoERouting]),
              default="learned", show_default=True,
              help="balanced: assignment n to expert n mod E (exchange sizes known in advance).")
@click.option("--micro-batch", type=click.IntRange(1), default=1, show_default=True)
@click.option("--global-batch", type=click.IntRange(1), default=None,
              help="Samples per step (default dp x micro-batch).")
@click.option("--schedule", default=None, help="Pipeline schedule (as perfmodel predict).")
@click.option("--recompute", default=None, help="none, selective or full.")
@click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (tp > 1).")
@click.option("--dtype", default="fp32", show_default=True)
@click.option("--nprocs", type=click.IntRange(1), default=None,
              help="Local ranks (must be dp x cp x tp x pp).")
@click.option("--dry-run", is_flag=True, help="Count rank 0's collectives on a fake process "
              "group of the full world; no job runs.")
@click.option("--check", is_flag=True, help="One step against one process (loss, gradients).")
@click.option("--steps", type=click.IntRange(1, 10_000), default=3, show_default=True)
@click.option("--warmup", type=click.IntRange(0, 1000), default=1, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 86_400), default=300,
              show_default=True, help="Seconds before a hung job is stopped.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the job's config, logs and results go.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def cli(**kw: Any) -> None:
    """Run, check or dry-run the job with context / expert parallelism or a mixture of experts."""
    from perfmodel.specs.model import load_model
    from perfmodel.strategy import plan_from_dict
    from validation.jobspec import model_overrides

    if kw["dry_run"] and kw["check"]:
        raise click.UsageError("give --dry-run or --check, not both")
    model = load_model(kw["model"], seq_len=kw["seq_len"])
    if not isinstance(model, TransformerSpec):
        raise click.UsageError(f"model '{model.name}' is not a transformer")
    model = model_overrides(model, kw)
    plan_kw = {k: kw[k] for k in ("dp", "tp", "pp", "cp", "cp_comm", "ep", "etp", "micro_batch",
                                  "dtype", "schedule", "recompute") if kw[k] is not None}
    plan_kw["sequence_parallel"] = kw["sequence_parallel"]
    plan_kw["global_batch"] = kw["global_batch"] or kw["dp"] * kw["micro_batch"]
    plan = plan_from_dict(plan_kw).check(model)
    par = JobParallel(cp=plan.cp, cp_comm=CPComm(plan.cp_comm.value), ep=plan.ep,
                      moe_routing=kw["moe_routing"])
    world = world_size(plan, par)
    if kw["nprocs"] is not None and kw["nprocs"] != world:
        raise click.BadParameter(f"the plan needs dp x cp x tp x pp = {world} ranks, got "
                                 f"{kw['nprocs']}", param_hint="--nprocs")
    run_dir = kw["run_dir"] or Path("validation-runs") / (
        f"parallel-dp{plan.dp}-cp{par.cp}-tp{plan.tp}-pp{plan.pp}-ep{par.ep}"
        + (f"-etp{plan.etp}" if plan.etp > 1 else ""))
    if kw["dry_run"]:
        from validation import dryrun

        result = dryrun.dry_run(model, plan, par)
        dryrun.render(result, as_json=kw["as_json"])
        return
    if kw["check"]:
        result = check_equivalence(model, plan, par, run_dir, kw["timeout_s"])
        _say(result, kw["as_json"], _render_check)
        if not result["ok"]:
            from validation.run import JobFailed

            raise JobFailed(f"the job differs from one process (details: --json; {run_dir})")
        return
    settings = RunSettings(nprocs=world, steps=kw["steps"], warmup=kw["warmup"],
                           timeout_s=kw["timeout_s"])
    _say(run(model, plan, par, settings, run_dir), kw["as_json"], _render_run)


def _say(result: dict[str, Any], as_json: bool, render: Any) -> None:
    if as_json:
        click.echo(json_text(result, indent=1, default=str))
    else:
        render(result)


def _render_check(result: dict[str, Any]) -> None:
    for r in result["ranks"]:
        worst = max((x.get("max_abs_err", 0.0) for x in r["results"]), default=0.0)
        bad = [x["name"] for x in r["results"] if not x["ok"]]
        click.echo(f"rank {r['rank']} {r['coords']}: loss {r['loss']:.6f} (one process "
                   f"{r['reference_loss']:.6f}), {len(r['results']) - 1} gradients, max abs error "
                   f"{worst:.2e}: " + ("ok" if not bad else f"DIFFERS: {', '.join(bad[:5])}"))
    _table("rank 0's collectives, one step", result["ranks"][0]["collectives"])
    click.echo("equivalent to one process: " + ("yes" if result["ok"] else "no"))


def _render_run(result: dict[str, Any]) -> None:
    click.echo(f"{result['world_size']} ranks, plan {result['plan']}")
    if result["step_s_median"] is not None:
        click.echo(f"step time (rank 0, median): {result['step_s_median'] * 1e3:.1f} ms")
    for rank, losses in result["losses"].items():
        shown = ", ".join(f"{x:.4f}" for x in losses if x is not None)
        click.echo(f"rank {rank} losses (its tokens): {shown}")
    _table("rank 0's collectives per step (probe step)", result["collectives"])
    click.echo(f"run directory: {result['run_dir']}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors as one line and perfmodel's exit codes."""
    try:
        cli.main(args=argv, prog_name="python -m validation.parallel", standalone_mode=False)
    except PerfmodelError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
