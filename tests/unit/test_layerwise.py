"""Layer graphs (CNNs, MLPs) on a Pr x Pc grid: seeds 000, 002 and 003."""

import json

import pytest
import sympy as sp

from perfmodel import PlanError, load_hardware, load_model
from perfmodel.layerwise import (
    GridPlan,
    best_grid,
    communication_in_pr,
    exact_minimiser,
    predict_grid,
    sweep,
)
from perfmodel.specs.cnn import alexnet, mlp, resnet50, vgg16

V100 = load_hardware("dgx-v100")


@pytest.mark.parametrize("builder,params,gflops", [
    (alexnet, 61.10e6, 1.43),   # torchvision AlexNet: 61,100,840 parameters, 0.71 GMACs
    (vgg16, 138.36e6, 30.96),   # Simonyan & Zisserman 2015, Table 2: 138M; 15.5 GMACs
    # He et al. 2016, Table 1: 3.8e9 FLOPs (multiply-adds 4.1 GMACs in torchvision)
    (resnet50, 25.56e6, 8.24),
])
def test_classic_networks_match_their_published_sizes(builder, params, gflops):
    g = builder()
    assert g.parameters == pytest.approx(params, rel=0.002)
    assert g.flops_per_sample / 1e9 == pytest.approx(gflops, rel=0.02)


def test_pure_data_and_pure_model_parallel_limits():
    g = alexnet()
    data = predict_grid(g, V100, GridPlan(pr=1, pc=16, global_batch=256))
    model = predict_grid(g, V100, GridPlan(pr=16, pc=1, global_batch=256))
    mp, dp = "comm/model_parallel", "comm/data_parallel"
    assert data.breakdown_s[mp] == 0 and data.breakdown_s[dp] > 0
    assert model.breakdown_s[dp] == 0 and model.breakdown_s[mp] > 0
    single = predict_grid(g, V100, GridPlan(pr=1, pc=1, global_batch=256))
    assert sum(v for k, v in single.breakdown_s.items() if k.startswith("comm/")) == 0


def test_communication_by_hand_for_a_two_layer_mlp():
    # fc1: 8 -> 4 (36 parameters), fc2: 4 -> 2 (10 parameters); batch 4, P = 2, fp32
    g = mlp(widths=(4, 2), inputs=8)
    comm = communication_in_pr(g, 2, 4)
    pr, a, b = comm["pr"], comm["alpha"], comm["beta"]
    pc = 2 / pr
    expected = (
        (pr - 1) * a + (pr - 1) / pr * 4 * 4 * 4 / pc / b            # fc1 all-gather of 4 outputs
        + 2 * (pc - 1) * a + 2 * (pc - 1) / pc * 4 * 36 / pr / b      # fc1 weights along Pc
        + (pr - 1) * a + (pr - 1) / pr * 4 * 2 * 4 / pc / b           # fc2 all-gather of 2 outputs
        + 2 * (pr - 1) * a + 2 * (pr - 1) / pr * 4 * 4 * 4 / pc / b   # fc2 input gradient along Pr
        + 2 * (pc - 1) * a + 2 * (pc - 1) / pc * 4 * 10 / pr / b      # fc2 weights along Pc
    )
    assert sp.simplify(comm["total"] - expected) == 0


def test_seed_000_the_cheapest_grid_for_alexnet_is_hybrid():
    # Gholami et al. 2018: for a fixed batch the lowest communication is neither pure model
    # (Pc = 1) nor pure data parallelism (Pr = 1)
    comm = communication_in_pr(alexnet(), 16, 256)
    best, _ = exact_minimiser(comm, 16, 1.2e-5, 5.6e9)
    assert 1 < best < 16
    closed = float(comm["closed_form"].subs({comm["alpha"]: 1.2e-5, comm["beta"]: 5.6e9}))
    f = sp.lambdify(comm["pr"], comm["total"].subs({comm["alpha"]: 1.2e-5, comm["beta"]: 5.6e9}))
    assert f(closed) <= min(f(closed * 0.9), f(closed * 1.1))  # a true minimum
    fastest = best_grid(alexnet(), V100, 16, 256)[0]
    assert 1 < fastest.plan.pr < 16


def test_conv_heavy_networks_prefer_data_parallelism():
    assert best_grid(vgg16(), V100, 16, 256)[0].plan.pr == 1
    assert best_grid(resnet50(), V100, 16, 256)[0].plan.pr == 1


def test_seed_002_normalization_costs():
    g = resnet50()
    kw = dict(pr=1, pc=16, global_batch=256)
    local = predict_grid(g, V100, GridPlan(**kw, norm="local"))
    sync = predict_grid(g, V100, GridPlan(**kw, norm="sync"))
    group = predict_grid(g, V100, GridPlan(**kw, norm="group"))
    assert local.breakdown_s["comm/norm"] == group.breakdown_s["comm/norm"] == 0
    assert sync.breakdown_s["comm/norm"] > 0 and sync.step_time_s > local.step_time_s


def test_seed_003_split_collectives_cost_more_than_fused():
    g = vgg16()
    kw = dict(pr=16, pc=1, global_batch=64)
    fused = predict_grid(g, V100, GridPlan(**kw, variant="fused"))
    split = predict_grid(g, V100, GridPlan(**kw, variant="split"))
    assert split.breakdown_s["comm/model_parallel"] > fused.breakdown_s["comm/model_parallel"]


def test_seed_003_sweep_trends():
    # Castello et al. 2019: faster nodes make communication a larger share; faster links a
    # smaller one
    frame = sweep(alexnet(), V100, GridPlan(pr=4, pc=4, global_batch=256),
                  {"peak_flops_per_s": [1e13, 1e14],
                   "inter_node.bandwidth_bytes_per_s": [1e10, 1e11],
                   "gpus": [16, 32]})
    assert len(frame) == 8
    for bw in (1e10, 1e11):
        for gpus in (16, 32):
            rows = frame[(frame["inter_node.bandwidth_bytes_per_s"] == bw)
                         & (frame["gpus"] == gpus)]
            shares = rows.sort_values("peak_flops_per_s")["communication_share"].tolist()
            assert shares[0] < shares[1]
    slow = frame[frame["inter_node.bandwidth_bytes_per_s"] == 1e10]["step_time_s"].to_numpy()
    fast = frame[frame["inter_node.bandwidth_bytes_per_s"] == 1e11]["step_time_s"].to_numpy()
    assert (fast < slow).all()


def test_grid_plan_rules():
    with pytest.raises(PlanError, match="divisible by pc"):
        GridPlan(pr=2, pc=3, global_batch=8)
    with pytest.raises(PlanError, match="norm must be one of"):
        GridPlan(pr=1, pc=1, global_batch=8, norm="batch")


def test_layer_graph_file_round_trip(tmp_path):
    g = mlp(widths=(16, 4), inputs=8)
    path = tmp_path / "net.json"
    data = g.to_dict()
    path.write_text(json.dumps(data))
    loaded = load_model(str(path))
    assert loaded.parameters == g.parameters and len(loaded.layers) == len(g.layers)


def test_cli_predict_explain_and_sweep(run_cli, tmp_path):
    out = run_cli("predict", "--model", "alexnet", "--hardware", "dgx-v100", "--pr", "2",
                  "--pc", "8", "--global-batch", "256", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["plan"]["pr"] == 2 and data["step_time_s"] > 0
    exp = run_cli("explain", "--model", "alexnet", "--hardware", "dgx-v100", "--gpus", "16",
                  "--global-batch", "256")
    assert exp.returncode == 0, exp.stderr
    assert "P_r*" in exp.stdout and "exact minimiser" in exp.stdout and "hybrid" in exp.stdout
    sw = run_cli("sweep", "--model", "vgg16", "--hardware", "dgx-v100", "--gpus", "16",
                 "--vary", "global_batch=64,256", "--vary",
                 "memory_bandwidth_bytes_per_s=4.5e11,9e11", "--csv", tmp_path / "s.csv",
                 "--plot", tmp_path / "s.png")
    assert sw.returncode == 0, sw.stderr
    assert len((tmp_path / "s.csv").read_text().splitlines()) == 5
    assert (tmp_path / "s.png").stat().st_size > 1000
    bad = run_cli("predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--pr", "2")
    assert bad.returncode == 2 and "layer-graph" in bad.stderr


def test_a_traced_graph_reads_with_shapes_instead_of_gemm_sizes():
    # the format validation.cnn_graph writes: shapes with the batch first, no GEMM view
    from perfmodel.specs.layers import layer_graph_from_dict

    layers = [
        {"name": "c1", "kind": "conv", "input_shape": [1, 3, 8, 8], "output_shape": [1, 4, 8, 8],
         "out_channels": 4, "params": 112, "flops": 2 * 8 * 8 * 27 * 4},
        {"name": "bn", "kind": "norm", "input_shape": [1, 4, 8, 8], "output_shape": [1, 4, 8, 8],
         "params": 8, "flops": 100},
        {"name": "fc", "kind": "linear", "input_shape": [1, 256], "output_shape": [1, 10],
         "out_features": 10, "params": 2570, "flops": 2 * 256 * 10}]
    g = layer_graph_from_dict({"kind": "layers", "name": "t", "input_shape": [1, 3, 8, 8],
                               "layers": layers}, "t")
    conv, bn, fc = g.layers
    assert (conv.gemm_m, conv.gemm_n, conv.gemm_k) == (64, 4, 27)  # 8x8 pixels, 4 filters, 3x3x3
    assert bn.channels == 4 and (fc.gemm_m, fc.gemm_n, fc.gemm_k) == (1, 10, 256)
    from perfmodel import SpecError

    with pytest.raises(SpecError, match="unknown field 'colour'"):
        layer_graph_from_dict({"kind": "layers", "layers": [
            {"name": "x", "kind": "linear", "colour": 1, "flops": 2, "out_features": 1}]}, "t")


def test_recommend_a_layer_graph(run_cli):
    out = run_cli("recommend", "--model", "alexnet", "--hardware", "dgx-v100", "--gpus", "16",
                  "--global-batch", "256", "--json", "--top", "3")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    # 5 splits x 2 collective variants, but the split variant of Pr 1 (no model-parallel
    # collective to split: the same plan as fused)
    assert data["evaluated"] == 9
    times = [p["step_time_s"] for p in data["plans"]]
    assert times == sorted(times) and 1 < data["plans"][0]["plan"]["pr"] < 16


@pytest.mark.parametrize("name", ["alexnet", "vgg16", "resnet50"])
def test_graphs_traced_from_torch_agree_with_the_builders(name):
    # tests/data/cnn/*.json: written by validation.cnn_graph from plain-torch models on the meta
    # device
    from tests.conftest import ROOT

    traced = load_model(str(ROOT / "tests/data/cnn" / f"{name}.json"))
    built = {"alexnet": alexnet, "vgg16": vgg16, "resnet50": resnet50}[name]()
    assert traced.parameters == built.parameters
    assert traced.flops_per_sample == pytest.approx(built.flops_per_sample, rel=0.005)
    if name == "alexnet":  # the predictions agree too (one network: each compile takes seconds)
        a = predict_grid(traced, V100, GridPlan(pr=2, pc=8, global_batch=64))
        b = predict_grid(built, V100, GridPlan(pr=2, pc=8, global_batch=64))
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=0.05)


@pytest.mark.parametrize(("command", "flag"), [
    ("predict", ["--cp", "2"]), ("predict", ["--ep", "2"]), ("predict", ["--tp", "2"]),
    ("predict", ["--ep-dispatcher", "alltoall"]), ("recommend", ["--ep", "2"]),
    ("recommend", ["--cp-comm", "p2p"]),
])
def test_a_layer_graph_refuses_a_transformers_degrees(run_cli, command, flag):
    """A layer graph splits over Pr x Pc: --cp, --ep, --tp and their options were ignored (the
    plain grid printed, exit 0)."""
    out = run_cli(command, "--model", "vgg16", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "64", *flag)
    assert out.returncode == 2 and flag[0] in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1


def test_explain_takes_a_batch_some_split_runs_and_prints_no_negative_time():
    """A layer graph's explain refused a batch of 8 on 16 GPUs (its plan took Pc = 16), which the
    splits of Pc 1 to 8 run; on one GPU it printed T_comm = -4.3e-18 s, the float terms'
    rounding residue; a P_r* outside 1..P was given without saying no split has it (a probe's
    findings, 2026-12-07)."""
    from tests.unit.test_bad_input import run_main

    code, out, err = run_main(["explain", "--model", "vgg16", "--hardware", "dgx-v100", "--gpus",
                               "16", "--global-batch", "8"])
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.strip().startswith("Pr =")]
    assert [r.split("Pc =")[1].split(":")[0].strip() for r in rows] == ["8", "4", "2", "1"]
    code, out, err = run_main(["explain", "--model", "alexnet", "--hardware", "dgx-v100",
                               "--gpus", "1"])
    assert code == 0, err
    assert "T_comm = 0 s" in out and "e-18" not in out and "outside 1..1" in out
    comm = communication_in_pr(alexnet(), 1, 1)
    assert exact_minimiser(comm, 1, 3.4e-6, 1.3e11) == (1, 0.0)
