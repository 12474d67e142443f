"""ZeRO 3 (FSDP2) under a pipeline, as torch.distributed.pipelining runs it and torchtitan sets it
up: each stage's units stay gathered from the first micro-batch's forward to the step's end and
its gradients accumulate unsharded (torch/distributed/pipelining/stage.py:
backward_maybe_with_nosync, perform_reduce_grad; torchtitan/distributed/fsdp.py:
get_fsdp_reshard_after_forward_policy, "default" off with pp > 1). The job's own collectives are
held against the ledger in tests/distributed/test_validation_e2e.py."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest

from perfmodel import Plan, load_hardware, load_model
from perfmodel import predict as _predict
from perfmodel.errors import PerfmodelError, PlanError
from perfmodel.predict import comm_ledger
from tests.unit.test_configs import DATA, job_plan

# these tests predict plans as they stand (generated, or read from configs), options that
# change nothing included: perfmodel.predict refuses those by default (refuse_idle)
predict = functools.partial(_predict, refuse_idle=False)

HW = load_hardware("dgx-h100")
MODEL = load_model("llama3-8b")  # 32 layers, untied output layer


def _plan(pp: int, **kw: object) -> Plan:
    dp = 8
    return Plan(**{"gpus": dp * pp, "dp": dp, "pp": pp, "zero": 3, "micro_batch": 1,
                   "global_batch": dp * 4, "schedule": "1f1b", **kw})


def test_a_stage_keeps_its_weights_gathered_and_its_gradients_unsharded():
    """bf16 with fp32 gradients: the shard is the fp32 master (4 bytes over dp), the gathered
    stage 2 bytes a parameter and its gradients 4, whole; without a pipeline two layers and the
    root are gathered and the gradients are sharded as the weights are."""
    piped = predict(MODEL, HW, _plan(2)).memory_breakdown_bytes
    assert piped["gradients"] == pytest.approx(8 * piped["weights"], rel=1e-3)
    assert piped["buffers/zero3_gather"] == pytest.approx(8 * piped["weights"] / 2, rel=1e-3)
    flat = predict(MODEL, HW, _plan(1)).memory_breakdown_bytes
    assert flat["gradients"] == pytest.approx(flat["weights"], rel=1e-9)
    # two layers and the root (embedding, final norm, output layer) of 8.03B parameters: 32
    # layers of 218M, 2 x 525M outside them (Llama 3 8B's shapes)
    layer, outside = 218_112_000, 525_336_576
    assert flat["buffers/zero3_gather"] == pytest.approx(2 * (2 * layer + 2 * outside + 4096),
                                                         rel=1e-3)


def test_each_unit_is_gathered_once_a_step_and_reduced_after_the_last_backward():
    """The ledger: per step, a pipeline's units gathered once (all_gather_once) where without one
    each is gathered for every forward and backward (2 m); under the pipeline reduce-scattered
    once, after the stage's last backward, without it in every micro-batch's backward (m: as
    torchtitan's trainer, Megatron-LM's torch FSDP2 and DeepSpeed's ZeRO-3 run it). The
    pipeline's reduce-scatter has nothing left to hide behind, so overlap_grad_sync hides none of
    it."""
    def calls(plan: Plan) -> dict[str, float]:
        return {r["name"]: r["calls"] for r in comm_ledger(MODEL, plan, HW)
                if "fsdp" in r["name"]}
    piped, flat = calls(_plan(2)), calls(_plan(1))
    assert piped["dp/fsdp_layer/all_gather_once"] == 16 and piped["dp/fsdp_root/all_gather_once"] \
        == 1
    assert piped.get("dp/fsdp_layer/all_gather", 0) == 0
    assert flat["dp/fsdp_layer/all_gather"] == 2 * 4 * 32 and \
        flat.get("dp/fsdp_layer/all_gather_once", 0) == 0
    assert piped["dp/fsdp_layer/reduce_scatter"] == 16 and flat["dp/fsdp_layer/reduce_scatter"] \
        == 4 * 32
    on, off = (predict(MODEL, HW, _plan(2, overlap_grad_sync=v)) for v in (True, False))
    flat_on, flat_off = (predict(MODEL, HW, _plan(1, overlap_grad_sync=v)) for v in (True, False))
    assert flat_on.breakdown_s["comm/dp"] < flat_off.breakdown_s["comm/dp"]
    assert on.breakdown_s["comm/dp"] == pytest.approx(off.breakdown_s["comm/dp"], rel=1e-9)


def test_each_pipeline_schedule_gathers_and_reduces_once():
    """Several pipeline schedules a step (torchtitan's gradient accumulation with pp): each
    schedule's first forward gathers the stage and its last backward reduce-scatters it."""
    def calls(plan: Plan) -> dict[str, float]:
        return {r["name"]: r["calls"] for r in comm_ledger(MODEL, plan, HW)
                if r["name"].startswith("dp/fsdp_layer")}
    two = calls(_plan(2, pipeline_micro_batches=2))  # 4 micro-batches: 2 schedules
    assert two["dp/fsdp_layer/all_gather_once"] == 2 * 16
    assert two["dp/fsdp_layer/reduce_scatter"] == 2 * 16


def test_each_schedule_hides_its_gathers_behind_its_first_forward_and_keeps_a_shard():
    """4 schedules of 2 micro-batches (dp 32 over nodes): each schedule's gathers hide behind
    its own first forward, 4 times one schedule's; and its reduction leaves the sharded
    gradients (fp32, as the shard: the weights term's size) beside the next's unsharded ones."""
    kw = dict(gpus=64, dp=32, pp=2, zero=3, micro_batch=1, global_batch=256,
              schedule="1f1b", overlap_param_gather=True)
    one = predict(MODEL, HW, Plan(**kw))
    four = predict(MODEL, HW, Plan(**kw, pipeline_micro_batches=2))
    assert one.hidden_s["comm/dp"] > 0
    assert four.hidden_s["comm/dp"] == pytest.approx(4 * one.hidden_s["comm/dp"], rel=1e-9)
    grads = {n: p.memory_breakdown_bytes["gradients"] for n, p in (("one", one), ("four", four))}
    assert grads["four"] - grads["one"] == pytest.approx(
        one.memory_breakdown_bytes["weights"], rel=1e-9)


def test_the_ledger_counts_rank_0s_root():
    """Rank 0's root unit under a pipeline is the embedding alone (Llama 3 8B: 128,256 x 4,096,
    bf16): the final norm and the output layer are the last stage's; its time is the larger."""
    ledger = {r["name"]: r for r in comm_ledger(MODEL, _plan(2), HW)}
    assert ledger["dp/fsdp_root/all_gather_once"]["nbytes"] == 128256 * 4096 * 2
    one = {r["name"]: r for r in comm_ledger(MODEL, _plan(1), HW)}
    assert one["dp/fsdp_root/all_gather"]["nbytes"] == (2 * 128256 * 4096 + 4096) * 2


def _torchtitan(tmp_path, policy: str | None, pp: int):
    import tomllib

    data = tomllib.loads((DATA / "torchtitan_llama3_8b.toml").read_text())
    par = data.setdefault("parallelism", {})
    par["pipeline_parallel_degree"] = pp
    par.pop("fsdp_reshard_after_forward", None)
    if policy is not None:
        par["fsdp_reshard_after_forward"] = policy
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("policy, pp, reshard", [(None, 1, None), ("default", 2, None),
                                                 ("never", 2, None), ("always", 1, None),
                                                 ("never", 1, "backward")])
def test_torchtitan_reads_the_policy_it_resolves(tmp_path, policy, pp, reshard):
    """Without a pipeline "never" keeps each unit's forward gather for its backward
    (fsdp_reshard backward); with one the stage's units stay gathered anyway."""
    _, spec, plan = job_plan(_torchtitan(tmp_path, policy, pp), gpus=8 * pp)
    assert (plan["pp"], plan["zero"], plan.get("fsdp_reshard")) == (pp, 3, reshard)


@pytest.mark.parametrize("policy, pp, why", [
    ("always", 2, "gathering them again for every micro-batch is not modelled"),
    ("sometimes", 1, "torchtitan takes default, always or never"),
])
def test_torchtitan_refuses_the_policy_it_cannot_cost(tmp_path, policy, pp, why):
    with pytest.raises(PerfmodelError, match="parallelism.fsdp_reshard_after_forward") as err:
        job_plan(_torchtitan(tmp_path, policy, pp), gpus=8 * pp)
    assert why in str(err.value)


@pytest.mark.parametrize("extra, why", [
    ("--pipeline-model-parallel-size 2", "without pipeline-model-parallel-size > 1, got 2"),
    ("--num-experts 4 --moe-token-dispatcher-type alltoall --expert-model-parallel-size 2",
     "without expert-model-parallel-size > 1, got 2"),
])
def test_megatron_refuses_torch_fsdp2_where_megatron_does(tmp_path, extra, why):
    """megatron/training/arguments.py (NVIDIA/Megatron-LM d98e8a64): --use-torch-fsdp2 asserts
    pipeline and expert parallelism of 1; without them recommend keeps both at 1."""
    from perfmodel.configs import read_config

    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
            "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--vocab-size 1024 --use-torch-fsdp2 --untie-embeddings-and-output-weights "
            "--no-gradient-accumulation-fusion ")
    path = tmp_path / "args.txt"
    path.write_text(base + extra + "\n")
    with pytest.raises(PerfmodelError, match="--use-torch-fsdp2") as err:
        read_config(path)
    assert why in str(err.value)
    path.write_text(base + "\n")
    job = read_config(path)
    assert {"pp", "ep"} <= job.pins and (job.plan["pp"], job.plan["ep"]) == (1, 1)


def test_torchtitan_always_keeps_one_stage_in_a_search(tmp_path):
    """"always" without a pipeline degree: recommend keeps pp 1 (with more stages FSDP would keep
    the weights gathered, which is not what the config asks for)."""
    path = _torchtitan(tmp_path, "always", 1)
    data = json.loads(path.read_text())
    del data["parallelism"]["pipeline_parallel_degree"]
    path.write_text(json.dumps(data))
    job, _, plan = job_plan(path, gpus=8)
    assert "pp" in job.pins and plan["pp"] == 1
    job, _, plan = job_plan(_torchtitan(tmp_path, "default", 1), gpus=8)
    assert plan["pp"] == 1


@pytest.mark.parametrize("degrees, gpus", [
    # (DDP beside a pipeline torchtitan refuses: "DDP has not supported > 1D parallelism",
    # tests/unit/test_torchtitan_probe2.py)
    (dict(data_parallel_shard_degree=-1), 2),  # -1: what the world leaves, one rank
])
def test_torchtitan_without_fsdp_has_no_policy_to_refuse(tmp_path, degrees, gpus):
    """No FSDP (dp_shard x cp = 1): the policy is moot, even "always" with a pipeline; nothing is
    gathered, and the plan predicts."""
    path = _torchtitan(tmp_path, "always", 2)
    data = json.loads(path.read_text())
    data["parallelism"].update(degrees)
    path.write_text(json.dumps(data))
    job, spec, plan = job_plan(path, gpus=gpus)
    assert (plan["pp"], plan["zero"], plan["overlap_param_gather"]) == (2, 0, False)
    assert "parallelism.fsdp_reshard_after_forward" in {s.key for s in job.ignored}
    assert predict(spec, HW, Plan(**plan)).step_time_s > 0


def test_torchtitan_fsdp_over_cp_alone_is_still_fsdp(tmp_path):
    """dp_shard 1 with cp 2: torchtitan's FSDP spans dp_shard x cp, so the policy applies."""
    path = _torchtitan(tmp_path, "always", 2)
    data = json.loads(path.read_text())
    data["parallelism"].update(data_parallel_shard_degree=1, context_parallel_degree=2)
    path.write_text(json.dumps(data))
    with pytest.raises(PerfmodelError, match="parallelism.fsdp_reshard_after_forward always"):
        job_plan(path, gpus=4)


def test_torchtitan_replicas_with_the_rest_sharded_are_ddp_where_the_rest_is_one(tmp_path):
    """data_parallel_shard_degree -1 beside replicas: DDP where the world leaves one shard rank,
    HSDP (refused) where it leaves more."""
    path = _torchtitan(tmp_path, None, 1)
    data = json.loads(path.read_text())
    data["parallelism"].update(data_parallel_replicate_degree=2, data_parallel_shard_degree=-1)
    path.write_text(json.dumps(data))
    _, _, plan = job_plan(path, gpus=2)
    assert (plan["dp"], plan["zero"]) == (2, 0)
    with pytest.raises(PerfmodelError, match="HSDP"):
        job_plan(path, gpus=4)


def test_a_deferred_reduction_reduces_once_and_holds_the_gradients_unsharded():
    """defer_grad_sync (NeMo AutoModel's defer_fsdp_grad_sync): without a pipeline, four
    micro-batches reduce-scatter each unit once a step, in the last backward, where they would
    four times; the gradients accumulate unsharded in fp32 (FSDP2's reduce dtype) until then. One
    micro-batch defers nothing: the option is refused there, as an option without effect is."""
    def calls(plan: Plan) -> float:
        return {r["name"]: r["calls"] for r in comm_ledger(MODEL, plan, HW)}[
            "dp/fsdp_layer/reduce_scatter"]
    every, deferred = _plan(1), _plan(1, defer_grad_sync=True)
    assert calls(every) == 4 * 32 and calls(deferred) == 32
    grads = {name: predict(MODEL, HW, plan).memory_breakdown_bytes["gradients"]
             for name, plan in (("every", every), ("deferred", deferred))}
    assert grads["deferred"] == pytest.approx(8 * grads["every"], rel=1e-3)  # 4 B whole, 4 B / 8
    assert grads["deferred"] == pytest.approx(4 * 8.03e9, rel=0.01)
    with pytest.raises(PlanError, match="the step has one"):
        _plan(1, defer_grad_sync=True, global_batch=8)


@pytest.mark.parametrize("kw", [dict(zero=1), dict(pp=2)])
def test_a_deferred_reduction_needs_zero_3_without_a_pipeline(kw):
    plan = dict(dp=8, pp=1, zero=3, micro_batch=1, global_batch=32, defer_grad_sync=True)
    plan.update(kw)
    plan["gpus"] = plan["dp"] * plan["pp"]
    with pytest.raises(PlanError, match="defer_grad_sync"):
        Plan(**plan)


def test_deferred_experts_left_whole_keep_their_gradient_dtype():
    """Experts over ep = dp (an expert-data-parallel group of one rank) are no FSDP unit: their
    gradients accumulate in the gradient dtype whether FSDP defers or not, so what deferring
    adds (the other parameters' unsharded fp32 gradients) does not grow with the experts a rank
    holds (Mixtral's 8 experts against 16, one or two a rank; only the router, E h a layer and
    in the deferred fp32, grows with them)."""
    def added(experts: int) -> float:
        model = load_model("mixtral-8x7b").scaled(experts=experts)
        plan = dict(gpus=8, dp=8, ep=8, zero=3, micro_batch=1, global_batch=32, grad_dtype="bf16")
        grads = [predict(model, HW, Plan(**plan, defer_grad_sync=d)).memory_breakdown_bytes[
            "gradients"] for d in (False, True)]
        return grads[1] - grads[0]
    assert added(8) > 0
    router = 32 * 8 * 4096 * (4 - 2 / 8)  # 8 more experts' router rows, 32 layers
    assert added(16) == pytest.approx(added(8) + router, rel=1e-6)



def _torch_unshards(schedule: str, pp: int, v: int, m: int) -> list[int]:
    """Rank 0's gathers of each of its v stages in one schedule, as torch 2.13 lowers it
    (torch/distributed/pipelining/schedules.py: the schedule's own action list of rank 0, then
    _add_unshard_reshard, max_active_stages 3): no process group or model is needed."""
    from collections import Counter
    from types import SimpleNamespace

    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = {"interleaved": schedules.ScheduleInterleaved1F1B,
           "zb": schedules.ScheduleInterleavedZeroBubble}[schedule]
    rounds = max(1, m // pp)
    state = SimpleNamespace(n_local_stages=v, pp_group_size=pp, _n_microbatches=m, rank=0,
                            number_of_rounds=rounds, microbatches_per_round=m // rounds)
    actions = schedules._add_unshard_reshard(cls._calculate_single_rank_operations(state, 0))
    gathered = Counter(a.stage_index for a in actions
                       if a.computation_type == schedules.UNSHARD)
    return [gathered[k * pp] for k in range(v)]  # rank 0's stages: 0, pp, 2 pp, ...


@pytest.mark.parametrize("schedule, pp, v, m", [
    ("interleaved", 2, 2, 4), ("interleaved", 2, 3, 6), ("interleaved", 2, 4, 2),
    ("interleaved", 2, 4, 8), ("interleaved", 4, 5, 12), ("interleaved", 2, 7, 16),
    ("interleaved", 4, 8, 4), ("zb", 2, 4, 2), ("zb", 2, 4, 6), ("zb", 4, 5, 8),
    ("zb", 2, 6, 10), ("zb", 3, 8, 9),
])
def test_a_rank_of_more_than_3_stages_gathers_them_as_torch_does(schedule, pp, v, m):
    """torch's pipelining keeps at most 3 of a rank's FSDP stages gathered and gathers the
    others again (perfmodel.step.data_parallel.schedule_gathers): rank 0's ledger against the
    gathers torch's own lowering issues, one layer a stage (each layer unit gathered as often
    as its stage) and the root unit with rank 0's first stage."""
    model = replace(load_model("tiny-gpt"), layers=pp * v)
    plan = Plan(gpus=2 * pp, dp=2, pp=pp, zero=3, micro_batch=1, global_batch=2 * m,
                schedule=schedule, virtual_stages=v)
    ledger = {r["name"]: r["calls"] for r in comm_ledger(model, plan, HW)}
    torch_counts = _torch_unshards(schedule, pp, v, m)
    layer = ledger["dp/fsdp_layer/all_gather_once"] \
        + ledger.get("dp/fsdp_layer/all_gather_again", 0)
    root = ledger["dp/fsdp_root/all_gather_once"] + ledger.get("dp/fsdp_root/all_gather_again", 0)
    assert layer == pytest.approx(sum(torch_counts), abs=1e-9)
    assert root == pytest.approx(torch_counts[0], abs=1e-9)
    assert (v > 3) == (sum(torch_counts) > v)


def test_a_rank_of_more_than_3_stages_holds_3_of_them_gathered():
    """Llama 3 8B on pp 4 with 8 stages a rank: 3 of the rank's 8 stages' layers gathered at a
    time, and the root (rank 0's embedding) with them; its gradients stay unsharded (fp32)
    whole; the gathers again are behind every micro-batch's forward and backward
    (overlap_param_gather), so they cost less hidden than exposed."""
    def plan(v: int, **kw: object) -> Plan:
        return Plan(gpus=32, dp=8, pp=4, zero=3, micro_batch=1, global_batch=64,
                    schedule="interleaved", virtual_stages=v, **kw)

    two, eight = (predict(MODEL, HW, plan(v)).memory_breakdown_bytes for v in (2, 8))
    embedding = 128256 * 4096 * 2
    assert eight["buffers/zero3_gather"] - embedding == pytest.approx(
        3 / 8 * (two["buffers/zero3_gather"] - embedding), rel=1e-3)
    assert eight["gradients"] == pytest.approx(two["gradients"], rel=1e-3)
    on, off = (predict(MODEL, HW, plan(8, overlap_param_gather=flag)) for flag in (True, False))
    assert on.hidden_s["comm/dp"] > 0 and on.step_time_s < off.step_time_s


@pytest.mark.parametrize("schedule, v, m, per_stage", [
    ("interleaved", 4, 16, 4), ("interleaved", 8, 8, 2), ("zb", 8, 8, 4), ("zb", 5, 12, 2)])
def test_a_mixture_of_experts_first_dense_layers_are_gathered_as_torch_does(schedule, v, m,
                                                                            per_stage):
    """DeepSeek-V3's first 3 layers are dense: on pp 4 they are rank 0's first stage (with the
    embedding), which torch gathers more often than the others (2 + R times a schedule), so
    rank 0's dense units are gathered that often and its MoE layers' units the rest."""
    model = replace(load_model("deepseek-v3"), layers=4 * v * per_stage, mtp_layers=0)
    plan = Plan(gpus=256, dp=64, pp=4, ep=64, zero=3, micro_batch=1, global_batch=64 * m,
                schedule=schedule, virtual_stages=v)
    ledger = {r["name"]: r["calls"] for r in comm_ledger(model, plan, HW)}
    counts = _torch_unshards(schedule, 4, v, m)
    # rank 0's stages k hold layers 4 k per_stage ..: the first 3 dense
    dense = [min(per_stage, max(0, 3 - k * 4 * per_stage)) for k in range(v)]
    moe = [per_stage - d for d in dense]

    def total(kind: str) -> float:
        return sum(ledger.get(f"dp/fsdp_{kind}/all_gather_{w}", 0) for w in ("once", "again"))

    pairs = list(zip(counts, dense, moe, strict=True))
    assert total("layer") == pytest.approx(sum(c * d for c, d, _ in pairs), abs=1e-9)
    assert total("moe_layer") == pytest.approx(sum(c * n for c, _, n in pairs), abs=1e-9)
