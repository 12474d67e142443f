"""The experts' dispatcher (Plan.ep_dispatcher): DeepEP's kernels send a token once to each node
and each rank that holds one of its experts (perfmodel.step.collective.dispatch_time), the
copies spread as the router routes (perfmodel.costs.moe.spread)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import sympy as sp

from perfmodel import PlanError, SpecError, load_hardware, load_model, predict
from perfmodel.costs.moe import spread
from perfmodel.evaluate import family_of, values_of
from perfmodel.predict import comm_ledger
from perfmodel.specs.model import TransformerSpec
from perfmodel.step.collective import dispatch_time
from perfmodel.strategy import Plan
from perfmodel.symbols import by_symbol

HW = "dgx-h100"
ROOT = Path(__file__).resolve().parents[2]


def _simulated(bins: int, k: int, E: int, draw, trials: int = 20000) -> float:
    """The distinct bins a token's experts lie in, averaged over `trials` tokens routed by
    draw(rng, t) -> its k experts; bin b holds experts b E/bins .. (b + 1) E/bins - 1."""
    rng = random.Random(7)
    per_bin = E // bins
    return sum(len({e // per_bin for e in draw(rng, t)}) for t in range(trials)) / trials


@pytest.mark.parametrize("bins, k, E", [(8, 8, 256), (64, 8, 256), (2, 8, 128), (4, 2, 8),
                                         (8, 2, 8), (16, 8, 64)])
def test_learned_routing_spreads_as_k_experts_drawn_at_random(bins, k, E):
    """A learned router's k experts (no group limit), k distinct of E drawn at random, against
    a simulation of such draws (Mixtral's 2 of 8 over 8 ranks: exactly 2)."""
    simulated = _simulated(bins, k, E, lambda rng, t: rng.sample(range(E), k))
    formula = float(spread(sp.Integer(bins), k, E, round_robin=False))
    assert formula == pytest.approx(simulated, rel=0.015)


@pytest.mark.parametrize("bins, k, E", [(8, 8, 256), (64, 8, 256), (16, 8, 64), (2, 4, 8)])
def test_round_robin_routing_sends_a_token_to_one_block_of_consecutive_experts(bins, k, E):
    """NeMo AutoModel's fake balanced gate: token t's experts t k .. t k + k - 1 (mod E)."""
    simulated = _simulated(bins, k, E, lambda rng, t: [(t * k + j) % E for j in range(k)])
    assert float(spread(sp.Integer(bins), k, E, round_robin=True)) == pytest.approx(simulated)


def test_node_limited_routing_keeps_a_token_within_its_groups_nodes():
    """DeepSeek-V3's node-limited routing (8 groups of 32 experts, the top 8 from the best 4
    groups): over 8 nodes (a group a node) a token reaches at most 4; the formula's cap against
    a simulation whose chosen groups each get one expert first, the rest anywhere in them."""
    E, k, groups, top = 256, 8, 8, 4

    def draw(rng, t):
        chosen = rng.sample(range(groups), top)
        first = [g * 32 + rng.randrange(32) for g in chosen]
        pool = [g * 32 + i for g in chosen for i in range(32) if g * 32 + i not in first]
        return first + rng.sample(pool, k - top)

    simulated = _simulated(8, k, E, draw)
    formula = float(spread(sp.Integer(8), k, E, round_robin=False, groups=groups,
                           group_topk=top))
    assert formula == simulated == 4
    # over 64 ranks the cap (4 groups x 8 ranks) does not bind: the free spread
    assert float(spread(sp.Integer(64), k, E, round_robin=False, groups=groups,
                        group_topk=top)) == float(spread(sp.Integer(64), k, E,
                                                         round_robin=False)) < 8


@pytest.mark.parametrize("nodes, dispatch, combine", [(2, 90e9, 81e9), (4, 61e9, 61e9)])
def test_the_model_reproduces_deepeps_published_bandwidths(nodes, dispatch, combine):
    """deepseek-ai/DeepEP README (V2, commit dd758ca), SM90 with CX7 NICs, V3's configuration
    (8,192 tokens, hidden 7168, top 8, FP8 dispatch, BF16 combine): EP 8 x 2 dispatch 90 GB/s,
    combine 81 GB/s; EP 8 x 4 61 and 61 GB/s, as "logical" RDMA bandwidth (every token's bytes
    once per destination node, its own node's included). dgx-h100's NIC share (400 GB/s per
    node x 0.90 over 8 GPUs, from its datasheet and nccl-tests) and the node dedup predict them
    within 12%: logical / (network bytes / NIC share) = N / (N - 1) x 45 GB/s."""
    model, hw = load_model("deepseek-v3"), load_hardware(HW)
    plan = Plan(gpus=8 * nodes, dp=8 * nodes, ep=8 * nodes, global_batch=8 * nodes)
    fam = family_of(model, hw, plan, specialise=True)
    values = values_of(model, hw, plan)
    tokens, hidden, k, E = 8192, 7168, 8, 256
    for element_bytes, published in ((1, dispatch), (2, combine)):
        row_bytes = tokens * hidden * element_bytes
        t = dispatch_time(sp.Integer(row_bytes),
                          lambda bins: spread(bins, k, E, round_robin=False), "ep", fam)
        names = by_symbol()
        seconds = float(t.subs({x: values[names[x][0]] for x in t.free_symbols}))
        nodes_reached = float(spread(sp.Integer(nodes), k, E, round_robin=False))
        logical = row_bytes * nodes_reached / seconds
        assert logical == pytest.approx(published, rel=0.12)


def test_inside_one_node_the_model_is_near_deepeps_nvlink_bandwidth():
    """The same README's SM100 row inside one node: EP 8 over NVLink, 726 GB/s dispatch and 740
    combine (64 SMs), "logical" (every token once per destination rank, its own included). On
    dgx-b200 (NVLink5, 900 GB/s a direction x 0.80, the H100's measured fraction: no B200
    nccl-tests) the model predicts 8 / 7 x 720 = 823 GB/s: 11-13% fast, within 15%."""
    model, hw = load_model("deepseek-v3"), load_hardware("dgx-b200")
    plan = Plan(gpus=8, dp=8, ep=8, global_batch=8)
    fam = family_of(model, hw, plan, specialise=True)
    values, names = values_of(model, hw, plan), by_symbol()
    tokens, hidden, k, E = 8192, 7168, 8, 256
    for element_bytes, published in ((1, 726e9), (2, 740e9)):
        row_bytes = tokens * hidden * element_bytes
        t = dispatch_time(sp.Integer(row_bytes),
                          lambda bins: spread(bins, k, E, round_robin=False), "ep", fam)
        seconds = float(t.subs({x: values[names[x][0]] for x in t.free_symbols}))
        ranks = float(spread(sp.Integer(8), k, E, round_robin=False))
        assert row_bytes * ranks / seconds == pytest.approx(published, rel=0.15)


def _qwen_plan(**kw):
    base = dict(gpus=32, dp=32, ep=32, micro_batch=1, global_batch=64, zero=1)
    return Plan(**{**base, **kw})


def test_deepep_sends_less_across_nodes_than_the_all_to_all_and_the_ledger_keeps_its_calls():
    """Over 4 nodes a learned router's 8 experts reach 2.7 nodes of which 2.0 remote, where the
    all-to-all sends 6 of its 8 copies out of the node: about a third of the time; the ledger
    (what a rank issues, nccl-tests' bytes) is the same."""
    model, hw = load_model("qwen3-30b-a3b"), load_hardware(HW)
    # the tokens' exchanges alone: NCCL's without the probabilities' all-to-all, which DeepEP
    # carries in its dispatch
    nccl = predict(model, hw, _qwen_plan(expert_weighting="output"))
    deep = predict(model, hw, _qwen_plan(ep_dispatcher="deepep"))
    ratio = deep.breakdown_s["comm/ep"] / nccl.breakdown_s["comm/ep"]
    remote = 4 * (1 - 0.75 ** 8) * 3 / 4 / (8 * 3 / 4)  # node copies sent out, per top-k copy
    assert ratio == pytest.approx(remote, rel=0.1)
    assert deep.step_time_s < nccl.step_time_s
    # the same calls, but the probabilities' own all-to-all: DeepEP sends them in its dispatch
    assert comm_ledger(model, _qwen_plan(ep_dispatcher="deepep"), hw) == \
        [r for r in comm_ledger(model, _qwen_plan(), hw) if "probs" not in r["name"]]
    # the round-robin gate sends a token's 8 experts (of 128, 4 a rank) to 2 ranks of one node
    rr = dataclasses.replace(model, routing="round_robin")
    robin = predict(rr, hw, _qwen_plan(ep_dispatcher="deepep"))
    assert robin.breakdown_s["comm/ep"] < deep.breakdown_s["comm/ep"] / 2


def test_inside_one_node_deepep_sends_a_token_once_per_rank():
    model, hw = load_model("qwen3-30b-a3b"), load_hardware(HW)
    kw = dict(gpus=8, dp=8, ep=8)
    nccl = predict(model, hw, _qwen_plan(**kw))
    deep = predict(model, hw, _qwen_plan(**kw, ep_dispatcher="deepep"))
    # 8 experts of 128 over 8 ranks: 8 (1 - (7/8)^8) = 5.25 ranks, not 8 copies
    ratio = deep.breakdown_s["comm/ep"] / nccl.breakdown_s["comm/ep"]
    assert 5.25 / 8 * 0.8 < ratio < 5.25 / 8 * 1.05


def test_a_search_takes_the_dispatcher_for_every_plan_and_agrees_with_predict():
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest

    model, hw = load_model("qwen3-30b-a3b"), load_hardware(HW)
    rec = recommend(model, hw, SearchRequest(gpus=(32,), global_batch=64, ep=32, pp=1, tp=1,
                                             cp=1, ep_dispatcher="deepep"), top=1)
    best = rec.top[0]
    assert best.plan.ep_dispatcher.value == "deepep"
    assert predict(model, hw, best.plan).step_time_s == pytest.approx(best.step_time_s,
                                                                      rel=1e-6)


def test_plans_and_models_refuse_what_the_dispatcher_cannot_be():
    with pytest.raises(PlanError, match="deepep with etp 2 is not modelled"):
        Plan(gpus=8, dp=4, tp=2, ep=4, etp=2, global_batch=8, ep_dispatcher="deepep",
             sequence_parallel=True)
    with pytest.raises(PlanError, match="ep_dispatcher must be one of alltoall, deepep"):
        Plan(gpus=8, dp=8, ep=8, global_batch=8, ep_dispatcher="nvshmem")
    capped = dataclasses.replace(load_model("mixtral-8x7b"), capacity_factor=1.25)
    with pytest.raises(PlanError, match="dropless"):
        predict(capped, HW, Plan(gpus=8, dp=8, ep=8, global_batch=8, ep_dispatcher="deepep"))
    assert "ep_dispatcher" not in Plan(gpus=8, dp=8, ep=8, global_batch=8).to_dict()
    assert Plan(gpus=8, dp=8, ep=8, global_batch=8,
                ep_dispatcher="deepep").to_dict()["ep_dispatcher"] == "deepep"
    base = dict(name="m", layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, experts=8,
                top_k=2)
    for extra, needle in ((dict(expert_groups=3, group_topk=1), "must divide experts"),
                          (dict(expert_groups=4), "go together"),
                          (dict(expert_groups=4, group_topk=5), "group_topk"),
                          (dict(routing="random"), "routing must be one of")):
        with pytest.raises(SpecError, match=needle):
            TransformerSpec(**base, **extra)
    with pytest.raises(SpecError, match="mixture-of-experts"):
        TransformerSpec(**{**base, "experts": 0, "top_k": None}, routing="round_robin")


def test_hugging_face_configs_give_their_node_limited_routing():
    """DeepSeek-V3 config.json: n_group 8, topk_group 4 (noaux_tc); DeepSeek-V2.5: 8 and 3
    (group_limited_greedy); Kimi K2: n_group 1 (no limit)."""
    for name, want in (("deepseek-v3", (8, 4)), ("deepseek-v2.5", (8, 3)),
                       ("kimi-k2-instruct", (0, 0))):
        spec = load_model(ROOT / "tests/data/hf" / name, seq_len=4096)
        assert (spec.expert_groups, spec.group_topk) == want, name
    assert (load_model("deepseek-v3").expert_groups, load_model("deepseek-v3").group_topk) == \
        (8, 4)


def test_the_cli_and_the_config_readers_take_the_dispatcher(run_cli, tmp_path):
    out = run_cli("predict", "--model", "qwen3-30b-a3b", "--hardware", HW, "--gpus", "32",
                  "--dp", "32", "--ep", "32", "--global-batch", "64", "--ep-dispatcher",
                  "deepep", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["ep_dispatcher"] == "deepep"
    bad = run_cli("predict", "--model", "qwen3-30b-a3b", "--hardware", HW, "--gpus", "8",
                  "--dp", "8", "--ep", "8", "--global-batch", "8", "--ep-dispatcher", "nccl")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "alltoall" in bad.stderr and "deepep" in bad.stderr
    megatron = tmp_path / "moe.sh"
    megatron.write_text(
        "torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
        "--num-attention-heads 8 --seq-length 2048 --max-position-embeddings 2048 "
        "--micro-batch-size 1 --global-batch-size 32 --bf16 --num-experts 64 "
        "--moe-router-topk 8 --moe-ffn-hidden-size 512 --moe-token-dispatcher-type flex "
        "--moe-enable-deepep --expert-model-parallel-size 16 --moe-router-num-groups 8 "
        "--moe-router-group-topk 2 --vocab-size 32000 --swiglu --normalization RMSNorm "
        "--position-embedding-type rope --disable-bias-linear "
        "--untie-embeddings-and-output-weights --use-distributed-optimizer\n")
    read = run_cli("predict", "--from-config", megatron, "--hardware", HW, "--json")
    assert read.returncode == 0, read.stderr
    doc = json.loads(read.stdout)
    assert doc["plan"]["ep_dispatcher"] == "deepep"
    assert "expert_groups 8" in read.stderr and "group_topk 2" in read.stderr
    emitted = run_cli("recommend", "--from-config", megatron, "--hardware", HW,
                      "--emit-config", "megatron", tmp_path / "out")
    assert emitted.returncode == 0, emitted.stderr
    text = " ".join((tmp_path / "out" / "megatron_args.txt").read_text().split())
    assert "--moe-token-dispatcher-type flex" in text
    assert "--moe-flex-dispatcher-backend deepep" in text
    assert "--moe-router-num-groups 8" in text and "--moe-router-group-topk 2" in text
    contradicted = run_cli("predict", "--from-config", megatron, "--hardware", HW,
                           "--ep-dispatcher", "alltoall")
    assert contradicted.returncode != 0 and "ep_dispatcher" in contradicted.stderr


def test_automodel_reads_hybridep_and_the_fake_balanced_gate(tmp_path):
    from perfmodel.configs import read_config

    path = ROOT / "tests/data/configs/automodel_qwen3_30b_a3b.yaml"
    recipe = path.read_text()
    job = read_config(path)
    assert job.plan.get("ep_dispatcher") == "deepep"
    assert job.model.get("routing") == "round_robin"
    noisy = tmp_path / "noisy.yaml"
    noisy.write_text(recipe.replace("fake_balanced_gate: true",
                                    "fake_balanced_gate: true\n    fake_gate_noise: 0.5"))
    with pytest.raises(PlanError, match="fake_gate_noise"):
        read_config(noisy)


def test_validation_refuses_the_deepep_dispatcher():
    from validation.jobspec import check_job, job_parallel

    model = load_model(ROOT / "tests/data/hf/qwen3-30b-a3b", seq_len=4096)
    plan = Plan(gpus=4, dp=4, ep=4, global_batch=4, ep_dispatcher="deepep")
    with pytest.raises(PlanError, match="all_to_all_single"):
        check_job(model, plan, job_parallel(plan))
