"""Collectives with fewer contributors than receivers (Castelló et al., EuroMPI 2019).

A layer of u output units on Pr > u model-parallel processes is split over c = min(Pr, u) of them;
its output all-gather and its input-gradient all-reduce then have c contributors and Pr receivers.
Worked by hand with a ring on one alpha-beta link (n bytes: the gathered output, the reduced
vector):

  64 contributors, 128 receivers          latency       bandwidth
  all-gather  standard (padded, over 128) 127 alpha     127/64 n / beta   (127 steps of n/64)
              specialised (64, then copy)  64 alpha     127/64 n / beta   (63 + 1; 63/64 + 1)
  all-reduce  standard (zeros, over 128)  254 alpha     127/64 n / beta   (2 * 127/128)
              specialised (64, then copy) 127 alpha      95/32 n / beta   (126 + 1; 126/64 + 1)
"""

import json

import numpy as np
import pytest
import sympy as sp

from perfmodel import PlanError, load_hardware
from perfmodel.analysis import contributors_crossover_bytes
from perfmodel.costs.collectives import (
    all_gather_padded_time,
    all_gather_specialised_time,
    all_reduce_padded_time,
    all_reduce_specialised_time,
    collective_time,
    contributed_time,
    spread_rounds,
    spread_time,
)
from perfmodel.layerwise import (
    GridPlan,
    communication_in_pr,
    exact_minimiser,
    layer_degrees,
    predict_grid,
)
from perfmodel.specs.cnn import alexnet, mlp, vgg16

a, b, n = sp.symbols("alpha beta n", positive=True)
c, r = sp.symbols("c r", positive=True, integer=True)


def _alpha_beta(hw):
    """The hardware with its links as plain alpha-beta links (one protocol, no call start-up, every
    algorithm): the papers' network model, which these tests check the layer graphs against (the
    preset's NCCL protocols are tests/unit/test_collective_presets.py's)."""
    import dataclasses

    plain = {link: dataclasses.replace(getattr(hw, link), call_latency_s=0.0, protocols=(),
                                       nvls_bandwidth_fraction=0.0)
             for link in ("intra_node", "inter_node")}
    return hw.replace(**plain, collective_library="generic")


V100 = _alpha_beta(load_hardware("dgx-v100"))
RING_V100 = V100.replace(collective_algorithm="ring")


def coefficients(expr):
    """(latency steps, bandwidth factor) of steps * alpha + factor * n / beta."""
    e = sp.expand(expr)
    return e.coeff(a), sp.expand(e.coeff(n) * b)


@pytest.mark.parametrize("op,how,steps,factor", [
    ("all_gather", "standard", 127, sp.Rational(127, 64)),
    ("all_gather", "specialised", 64, sp.Rational(127, 64)),
    ("all_reduce", "standard", 254, sp.Rational(127, 64)),
    ("all_reduce", "specialised", 127, sp.Rational(95, 32)),
])
def test_64_filters_on_128_processes_by_hand(op, how, steps, factor):
    t = contributed_time(op, n, 64, 128, a, b, how)
    assert coefficients(t) == (steps, factor)
    assert sp.expand(t - (steps * a + factor * n / b)) == 0


@pytest.mark.parametrize("fn,op", [
    (all_gather_padded_time, "all_gather"), (all_gather_specialised_time, "all_gather"),
    (all_reduce_padded_time, "all_reduce"), (all_reduce_specialised_time, "all_reduce"),
])
@pytest.mark.parametrize("algorithm", ["ring", "recursive"])
def test_every_contributor_is_the_ordinary_collective(fn, op, algorithm):
    # c = r: symbolically, for any r
    for c in (r, 16):
        assert sp.simplify(fn(n, c, c, a, b, algorithm) - collective_time(op, n, c, a, b,
                                                                          algorithm)) == 0


def test_the_copy_to_the_non_contributors_takes_doubling_rounds():
    assert spread_rounds(r, r) == 0 and spread_rounds(128, 128) == 0
    assert spread_rounds(64, 128) == 1 and spread_rounds(96, 128) == 1  # r - c <= c: one round
    assert spread_rounds(3, 10) == 2  # 3 -> 6 -> 12 holders
    assert spread_rounds(1, 128) == 7  # a binomial broadcast
    assert spread_time(n, 64, 128, a, b) == a + n / b  # holder i sends to 64 + i, in parallel


def test_compiled_rounds_are_exact_at_powers_of_two():
    # ceil(log(x) / log(2)) gives 30 at 2^29; the compiled form takes numpy.log2
    f = sp.lambdify([r, c], spread_rounds(c, r), modules="numpy")
    powers = np.array([2.0**k for k in range(40)])
    assert (f(powers, 1.0) == np.arange(40)).all()
    assert (f(powers * 3, 3.0) == np.arange(40)).all()
    assert f(129.0, 64.0) == 2 and f(128.0, 96.0) == 1


def test_crossover_of_the_two_realisations():
    # all-reduce, 64 -> 128: specialised saves 127 alpha and pays 63/64 n / beta more
    s_star = contributors_crossover_bytes("all_reduce", 64, 128, a, b)
    assert s_star == sp.Rational(127 * 64, 63) * a * b
    # in general, c < r <= 2c: (2r - 2c - 1) alpha beta / (1 - 2/c + 2/r)
    for cc, rr in ((64, 96), (5, 8), (3, 4)):
        want = (2 * rr - 2 * cc - 1) * a * b / (1 - sp.Rational(2, cc) + sp.Rational(2, rr))
        assert sp.simplify(contributors_crossover_bytes("all_reduce", cc, rr, a, b) - want) == 0
    # all-gather, 64 -> 96: specialised saves 31 alpha, pays 32/64 n / beta more
    assert contributors_crossover_bytes("all_gather", 64, 96, a, b) == 62 * a * b
    # all-gather, 64 -> 128: equal bandwidth terms, specialised always 63 alpha cheaper
    assert contributors_crossover_bytes("all_gather", 64, 128, a, b) is None
    alpha, beta = 5e-6, 12.5e9
    s = float(s_star.subs({a: alpha, b: beta}))  # 8.06 MB
    assert s == pytest.approx(127 * 64 / 63 * alpha * beta)

    def t(how, size):
        return float(contributed_time("all_reduce", size, 64, 128, alpha, beta, how))

    assert t("specialised", s / 2) < t("standard", s / 2)  # latency-bound: fewer steps win
    assert t("specialised", 2 * s) > t("standard", 2 * s)  # bandwidth-bound: fewer bytes win
    assert t("auto", 2 * s) == t("standard", 2 * s) and t("auto", s / 2) == t("specialised", s / 2)
    with pytest.raises(PlanError, match="all_gather and all_reduce"):
        contributors_crossover_bytes("broadcast", 2, 4, a, b)


def test_layer_degree_is_min_of_pr_and_units():
    g = alexnet()
    assert layer_degrees(g, 128) == {"conv1": 64, "conv2": 128, "conv3": 128, "conv4": 128,
                                     "conv5": 128, "fc6": 128, "fc7": 128, "fc8": 128}
    assert set(layer_degrees(g, 64).values()) == {64}


def test_the_link_model_is_the_formula_inside_a_node():
    # fc1 8 units (c = 4 = Pr), fc2 2 units (c = 2 < Pr = 4); Pr inside one V100 node, ring
    g = mlp(widths=(8, 2), inputs=8)
    alpha, beta = V100.intra_node.latency_s, V100.intra_node.effective_bandwidth_bytes_per_s
    batch = 1024
    for how in ("standard", "specialised", "auto"):
        got = predict_grid(g, RING_V100, GridPlan(pr=4, pc=1, global_batch=batch, contributors=how))
        # fc1's output, fc2's output, fc2's input gradient
        want = (contributed_time("all_gather", 4 * 8 * batch, 4, 4, alpha, beta, how)
                + contributed_time("all_gather", 4 * 2 * batch, 2, 4, alpha, beta, how)
                + contributed_time("all_reduce", 4 * 8 * batch, 2, 4, alpha, beta, how))
        assert got.breakdown_s["comm/model_parallel"] == pytest.approx(float(want), rel=1e-12)
        assert got.layer_degrees == {"fc1": 4, "fc2": 2}


@pytest.mark.parametrize("batch,scattered", [(64, False), (1 << 14, True)])
def test_contributors_inside_one_node_of_a_group_across_two(batch, scattered):
    # Pr = 16 over two V100 nodes, fc2 of 8 units: its 8 holders share a node (intra-node ring);
    # the copy to the other node is the cheaper of 8 pairs at once through the node's NICs
    # (alpha_o + n / (beta_o / G)) and a scatter (n / 8 per pair) + all-gather inside the node
    ai, bi = V100.intra_node.latency_s, V100.intra_node.effective_bandwidth_bytes_per_s
    ao = V100.inter_node.latency_s
    bo = V100.inter_node.effective_bandwidth_bytes_per_s / V100.gpus_per_node

    def copy(nbytes):
        pairs, scatter = ao + nbytes / bo, ao + nbytes / 8 / bo + 7 * ai + 7 / 8 * nbytes / bi
        assert (scatter < pairs) is scattered
        return min(pairs, scatter)

    plan = GridPlan(pr=16, pc=1, global_batch=batch, contributors="specialised")
    both = predict_grid(mlp(widths=(16, 8), inputs=8), RING_V100, plan)
    fc1 = predict_grid(mlp(widths=(16,), inputs=8), RING_V100, plan)
    fc2 = both.breakdown_s["comm/model_parallel"] - fc1.breakdown_s["comm/model_parallel"]
    out, grad = 4 * 8 * batch, 4 * 16 * batch
    want = (7 * ai + 7 / 8 * out / bi + copy(out)            # all-gather among 8, copy
            + 14 * ai + 14 / 8 * grad / bi + copy(grad))     # all-reduce among 8, copy
    assert fc2 == pytest.approx(want, rel=1e-12)


def test_specialised_wins_when_latency_bound_standard_when_bandwidth_bound():
    # one layer of 2 units on Pr = 8 (one node): all-gather of its output, all-reduce of its
    # 64-wide input gradient. All-gather 2 -> 8: 3 alpha + 5/2 n/beta against 7 alpha + 7/2 n/beta
    # (specialised always cheaper); all-reduce 2 -> 8: 4 alpha + 3 n/beta against 14 alpha +
    # 7/4 n/beta: crossover at 8 alpha beta bytes
    g = mlp(widths=(64, 2, 64), inputs=64)
    alpha, beta = V100.intra_node.latency_s, V100.intra_node.effective_bandwidth_bytes_per_s
    crossover = float(contributors_crossover_bytes("all_reduce", 2, 8, alpha, beta))
    assert crossover == pytest.approx(8 * alpha * beta)
    small, large = 16, 1 << 16  # input-gradient all-reduce of 4 KiB (latency) and 16 MiB
    assert 4 * 64 * small < crossover < 4 * 64 * large

    def comm(batch, how):
        plan = GridPlan(pr=8, pc=1, global_batch=batch, contributors=how)
        return predict_grid(g, RING_V100, plan).breakdown_s["comm/model_parallel"]

    assert comm(small, "specialised") < comm(small, "standard")
    assert comm(large, "specialised") > comm(large, "standard")
    for batch in (small, large):
        # auto takes the cheaper form per collective: never above either (up to the rounding of
        # sums taken in another order)
        best = min(comm(batch, "standard"), comm(batch, "specialised"))
        assert comm(batch, "auto") <= best * (1 + 1e-12)


def test_alexnet_on_more_processes_than_its_narrowest_layer():
    g = alexnet()
    conv1 = next(layer for layer in g.layers if layer.name == "conv1")
    plans = {how: GridPlan(pr=128, pc=2, global_batch=256, contributors=how)
             for how in ("standard", "specialised", "auto")}
    runs = {how: predict_grid(g, V100, plan) for how, plan in plans.items()}
    std = runs["standard"]
    assert std.layer_degrees["conv1"] == 64 and std.layer_degrees["conv2"] == 128
    # conv1's weights live on 64 processes, the others' on 128
    weights = 4 * sum(layer.params / std.layer_degrees[layer.name]
                      for layer in g.layers if layer.splits)
    weights += 4 * sum(layer.params for layer in g.layers if not layer.splits)
    assert std.memory_breakdown_bytes["weights"] == pytest.approx(weights, rel=1e-12)
    assert conv1.params / 64 > conv1.params / 128
    for how in ("specialised", "auto"):  # the realisation changes the model-parallel comm only
        for term in ("compute/forward", "compute/backward", "comm/data_parallel"):
            # the same numbers, compiled from differently written expressions (to rounding)
            assert runs[how].breakdown_s[term] == pytest.approx(std.breakdown_s[term],
                                                                rel=1e-12)
    model_parallel = "comm/model_parallel"
    assert runs["specialised"].breakdown_s[model_parallel] != std.breakdown_s[model_parallel]
    assert runs["auto"].step_time_s <= min(std.step_time_s, runs["specialised"].step_time_s)


@pytest.mark.parametrize("pr", [1, 8, 64])
def test_no_narrow_layer_no_difference(pr):
    # VGG-16's narrowest layers have 64 filters: up to Pr = 64 every layer splits over Pr
    runs = [predict_grid(vgg16(), V100, GridPlan(pr=pr, pc=2, global_batch=256, contributors=how))
            for how in ("standard", "specialised", "auto")]
    for other in runs[1:]:  # the same numbers, compiled from differently written expressions
        assert other.breakdown_s == pytest.approx(runs[0].breakdown_s, rel=1e-12)


def test_communication_in_pr_with_narrow_layers_takes_the_exact_minimiser():
    at16 = communication_in_pr(alexnet(), 16, 256)
    assert at16["closed_form"] is not None and not at16["total"].has(sp.Min)  # as before
    for how in ("standard", "specialised", "auto"):
        comm = communication_in_pr(alexnet(), 128, 256, 4, how)
        assert comm["total"].has(sp.Min) and comm["closed_form"] is None
        best, t_best = exact_minimiser(comm, 128, 5e-6, 12.5e9)
        assert 128 % best == 0 and t_best > 0
    std = communication_in_pr(alexnet(), 128, 256)
    spec = communication_in_pr(alexnet(), 128, 256, 4, "specialised")
    values = {std["alpha"]: 5e-6, std["beta"]: 12.5e9}
    # at Pr = 64 every layer still splits over Pr: the realisations agree; at 128 they do not
    for pr, same in ((64, True), (128, False)):
        x, y = (float(t["total"].subs(values).subs(t["pr"], pr)) for t in (std, spec))
        assert (x == pytest.approx(y, rel=1e-12)) is same


def test_grid_plan_refuses_an_unknown_realisation():
    with pytest.raises(PlanError, match="contributors must be one of standard, specialised, auto"):
        GridPlan(pr=2, pc=1, global_batch=8, contributors="specialized")
    plan = GridPlan(pr=2, pc=1, global_batch=8, contributors="auto")
    assert plan.to_dict()["contributors"] == "auto"


def test_cli_contributors_option(run_cli):
    base = ["--model", "alexnet", "--hardware", "dgx-v100", "--global-batch", "256"]
    out = run_cli("predict", *base, "--pr", "128", "--pc", "2", "--contributors", "specialised",
                  "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["plan"]["contributors"] == "specialised" and data["layer_degrees"]["conv1"] == 64
    text = run_cli("predict", *base, "--pr", "128", "--pc", "2")
    assert text.returncode == 0 and "conv1 c=64" in text.stdout and "standard" in text.stdout
    exp = run_cli("explain", *base, "--gpus", "128", "--contributors", "auto")
    assert exp.returncode == 0, exp.stderr
    assert "conv1 (64 units)" in exp.stdout and "Min(64, P_r)" in exp.stdout
    assert "exact minimiser over the divisors of 128" in exp.stdout
    for command in (["predict", *base, "--pr", "2", "--pc", "8"],
                    ["sweep", *base, "--gpus", "16", "--vary", "global_batch=256"],
                    ["recommend", *base, "--gpus", "16"]):
        bad = run_cli(*command, "--contributors", "sometimes")
        assert bad.returncode == 2, (command, bad.stderr)
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert "'--contributors'" in bad.stderr
        assert "'standard', 'specialised', 'auto'" in bad.stderr
    sw = run_cli("sweep", *base[:-2], "--gpus", "256", "--pr", "128", "--contributors", "auto",
                 "--vary", "global_batch=256,512", "--json")
    assert sw.returncode == 0, sw.stderr
    assert len(json.loads(sw.stdout)) == 2
    # on 16 GPUs no split has Pr above a layer's 64 contributors: refused there, as explain
    # refuses it; on 128 some split does
    rec = run_cli("recommend", *base, "--gpus", "128", "--contributors", "specialised", "--json",
                  "--top", "1")
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["plans"][0]["plan"]["contributors"] == "specialised"
    wrong = run_cli("recommend", "--model", "llama2-7b", "--hardware", "dgx-h100", "--gpus", "8",
                    "--global-batch", "8", "--contributors", "auto")
    assert wrong.returncode == 2 and "layer-graph" in wrong.stderr
