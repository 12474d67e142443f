"""Fits recover known parameters from synthetic measurements (calibration.fit)."""

import numpy as np
import pandas as pd
import pytest
import sympy as sp

from calibration.fit import CollectiveModel, GemmModel, holdout_error
from perfmodel.costs.collectives import bus_factor, steps
from perfmodel.costs.gemm_efficiency import gemm_efficiency, gemm_time_s
from perfmodel.specs.hardware import CollectiveFit
from perfmodel.specs.profile import fit_values, fitted_collective_expr, fitted_collective_time

SIZES = 2.0 ** np.arange(3, 34)  # 8 B .. 8 GiB, as nccl-tests -b 8 -e 8G -f 2


def synthetic(op, alpha, busbw, ranks, algorithm="ring", noise=0.02, seed=0):
    """Times from the alpha-beta formula itself, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in ranks:
        st = float(steps(op, n, algorithm))
        bf = float(bus_factor(op, n))
        t = (st * alpha + bf * SIZES / busbw) * (1 + noise * rng.standard_normal(len(SIZES)))
        rows.append(pd.DataFrame({"nbytes": SIZES, "ranks": n, "time_s": t}))
    return pd.concat(rows, ignore_index=True)


@pytest.mark.parametrize(
    "op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
)
def test_recovers_alpha_and_bus_bandwidth(op):
    # 5 us per step and 150 GB/s busbw: an 8-GPU NVLink-class node
    data = synthetic(op, 5e-6, 150e9, ranks=[2, 4, 8])
    model = CollectiveModel(op, "intra").fit(data)
    assert model.alpha_s_ == pytest.approx(5e-6, rel=0.05)
    assert model.bus_bandwidth_bytes_per_s_ == pytest.approx(150e9, rel=0.03)
    assert model.breakpoint_bytes_ == 0  # one regime explains one-regime data
    assert model.residuals_["median_rel_error"] < 0.03
    assert model.size_range_ == (8.0, 2.0**33)


def test_recovers_tree_alpha_per_step():
    data = synthetic("all_reduce", 3e-6, 80e9, ranks=[16], algorithm="tree")
    model = CollectiveModel("all_reduce", "inter", "tree").fit(data)
    assert model.alpha_s_ == pytest.approx(3e-6, rel=0.05)  # 2 log2(16) = 8 steps


def test_two_regimes_when_one_pair_cannot_fit():
    """NCCL takes the faster protocol: LL (1 us/step, 4 GB/s) or Simple (10 us/step, 400 GB/s).

    8 ranks, ring all_reduce: 14 steps, bus factor 1.75. They cross where
    14 * 1e-6 + 1.75 N / 4e9 = 14 * 10e-6 + 1.75 N / 400e9, N = 126e-6 / (1.75/4e9 - 1.75/400e9)
    = 291 kB. One pair misses these times by 7.6% (median), so a second regime is fitted.
    """
    n = 8
    st, bf = float(steps("all_reduce", n, "ring")), float(bus_factor("all_reduce", n))
    t = np.minimum(st * 1e-6 + bf * SIZES / 4e9, st * 10e-6 + bf * SIZES / 400e9)
    data = pd.DataFrame({"nbytes": SIZES, "ranks": n, "time_s": t})
    single = CollectiveModel("all_reduce", "intra", split_above=1.0).fit(data)
    assert single.residuals_["median_rel_error"] > 0.05
    model = CollectiveModel("all_reduce", "intra").fit(data)
    crossover = 126e-6 / (1.75 / 4e9 - 1.75 / 400e9)
    assert crossover / 2 < model.breakpoint_bytes_ < crossover * 2
    assert model.bus_bandwidth_bytes_per_s_ == pytest.approx(400e9, rel=0.05)  # Simple
    assert model.alpha_s_ == pytest.approx(10e-6, rel=0.05)
    assert model.alpha_s_small_ == pytest.approx(1e-6, rel=0.05)  # LL
    assert model.bus_bandwidth_bytes_per_s_small_ == pytest.approx(4e9, rel=0.05)
    assert model.residuals_["median_rel_error"] < 0.01


def test_fitted_time_numeric_matches_symbolic():
    fit = CollectiveFit(
        op="all_gather",
        scope="intra",
        algorithm="ring",
        alpha_s=8e-6,
        bus_bandwidth_bytes_per_s=350e9,
        breakpoint_bytes=1e6,
        alpha_s_small=4e-6,
        bus_bandwidth_bytes_per_s_small=300e9,
    )
    nbytes, n = sp.symbols("nbytes n", positive=True)
    expr = fitted_collective_time(fit, "all_gather", nbytes, n)
    f = sp.lambdify((nbytes, n), expr, "numpy")
    sizes = np.array([1e3, 1e5, 1e6, 1e9])
    numeric = fitted_collective_time(fit, "all_gather", sizes, 8)
    assert np.allclose([float(f(s, 8)) for s in sizes], numeric)
    # by hand: 1 GB over 8 ranks, large regime: 7 * 8 us + 7/8 * 1e9 / 350e9
    assert numeric[-1] == pytest.approx(7 * 8e-6 + 7 / 8 * 1e9 / 350e9)
    # 1 kB, small regime: 7 * 4 us + 7/8 * 1e3 / 300e9
    assert numeric[0] == pytest.approx(7 * 4e-6 + 7 / 8 * 1e3 / 300e9)
    assert fitted_collective_time(fit, "all_gather", 1e9, 1) == 0


@pytest.mark.parametrize("two_regimes", [False, True])
def test_symbolic_fit_expression_matches_the_fit(two_regimes):
    """fitted_collective_expr with fit_values bound equals fitted_collective_time."""
    extra = dict(breakpoint_bytes=1e6, alpha_s_small=8e-6, bus_bandwidth_bytes_per_s_small=350e9)
    fit = CollectiveFit(
        op="all_reduce",
        scope="inter",
        algorithm="ring",
        alpha_s=4e-6,
        bus_bandwidth_bytes_per_s=300e9,
        **(extra if two_regimes else {}),
    )
    names = [
        "alpha_s",
        "bus_bandwidth_bytes_per_s",
        "breakpoint_bytes",
        "alpha_s_small",
        "bus_bandwidth_bytes_per_s_small",
    ]
    syms = sp.symbols(names, positive=True)
    nbytes, n = sp.symbols("nbytes n", positive=True)
    expr = fitted_collective_expr("all_reduce", "ring", nbytes, n, *syms)
    f = sp.lambdify((nbytes, n, *syms), expr, "numpy")
    sizes = np.array([1e3, 1e5, 2e6, 1e9])
    values = fit_values(fit)
    got = f(sizes, 16, *(values[k] for k in names))
    assert np.allclose(got, fitted_collective_time(fit, "all_reduce", sizes, 16))


GEMM_TRUTH = {
    "max_fraction": 0.8,
    "m_half_dim": 40.0,
    "n_half_dim": 60.0,
    "k_half_dim": 150.0,
    "parallel_half": 3e5,
    "min_time_s": 5e-6,
    "split_k_ratio": 256.0,
    "split_k_chunk": 600.0,
}


def gemm_sweep(noise=0.02, seed=1, truth=GEMM_TRUTH):
    rng = np.random.default_rng(seed)
    dims = [256, 512, 1024, 2048, 4096]
    b, m, n, k = (
        np.array(v, dtype=float)
        for v in zip(
            *[(b, m, n, k) for b in (1, 2, 4) for m in dims for n in dims for k in dims],
            strict=True,
        )
    )
    s = sp.symbols("m n k b", positive=True)
    f = sp.lambdify(
        s,
        gemm_time_s(s[0], s[1], s[2], s[3], 2, 989e12, 3.35e12, half_dim=0, **truth),
        "numpy",
    )
    t = f(m, n, k, b) * (1 + noise * rng.standard_normal(len(m)))
    return pd.DataFrame({"b": b, "m": m, "n": n, "k": k, "time_s": t})


def test_gemm_fit_recovers_parameters():
    sweep = gemm_sweep()
    model = GemmModel(989e12, 3.35e12, 2).fit(sweep)
    for name in ("max_fraction", "min_time_s", "k_half_dim", "split_k_chunk", "parallel_half"):
        assert model.params_[name] == pytest.approx(GEMM_TRUTH[name], rel=0.1), name
    # the sweep's b*m*n/k are powers of 2: any threshold in (128, 256] splits the same shapes
    ratio = sweep.b * sweep.m * sweep.n / sweep.k
    fitted = ratio < model.params_["split_k_ratio"]
    assert (fitted == (ratio < GEMM_TRUTH["split_k_ratio"])).all()
    assert fitted.sum() > 20  # the sweep does exercise split-K
    assert model.residuals_["median_rel_error"] < 0.02


def test_gemm_fit_without_split_k_when_the_data_has_none():
    truth = {**GEMM_TRUTH, "split_k_ratio": 0.0}
    model = GemmModel(989e12, 3.35e12, 2).fit(gemm_sweep(truth=truth))
    assert model.residuals_["median_rel_error"] < 0.02
    sweep = gemm_sweep(noise=0.0, truth=truth)
    # whatever threshold it picked, its predictions are those of a model without split-K
    assert np.allclose(model.predict(sweep), sweep.time_s, rtol=0.05)


def test_split_k_halves_the_pipeline_and_multiplies_the_work():
    """One shape by hand: b m n = 2^18 < 256 k = 2^20 splits k = 4096 into s = 8 chunks of 512."""
    m = n = 512
    k, chunk, ratio = 4096, 512, 256
    s = k / chunk
    eff = gemm_efficiency(m, n, k, 1, 0, 1, k_half_dim=512, parallel_half=2**20,
                          split_k_ratio=ratio, split_k_chunk=chunk)
    expected = (k / s) / (k / s + 512) * (m * n * s) / (m * n * s + 2**20)
    assert float(eff) == pytest.approx(expected)  # 0.5 * 2/3
    unsplit = gemm_efficiency(m, n, k, 1, 0, 1, k_half_dim=512, parallel_half=2**20)
    assert float(unsplit) == pytest.approx(k / (k + 512) * m * n / (m * n + 2**20))
    # at the threshold itself (b m n = ratio k) it does not split
    at = gemm_efficiency(m, n, 1024, 1, 0, 1, k_half_dim=512, parallel_half=2**20,
                         split_k_ratio=256, split_k_chunk=chunk)
    assert float(at) == pytest.approx(1024 / (1024 + 512) * m * n / (m * n + 2**20))


def test_large_tile_kernel_switches_at_its_flops_and_epilogue_adds_per_output_element():
    """By hand: m = n = k = 1024 is 2^31 FLOPs; peak 1e15 FLOP/s, infinite memory bandwidth."""
    m = n = k = 1024
    flops = 2.0**31
    small, large, epi = 0.4, 0.8, 1e-12
    kw = dict(max_fraction=small, half_dim=0, large_max_fraction=large, epilogue_s=epi)

    def t(large_flops):
        return float(gemm_time_s(m, n, k, 1, 2, 1e15, sp.oo, **kw, large_flops=large_flops))

    assert t(2.0**31) == pytest.approx(flops / (1e15 * large) + epi * m * n)  # at the switch
    assert t(2.0**31 + 1) == pytest.approx(flops / (1e15 * small) + epi * m * n)  # below it
    assert t(0) == pytest.approx(flops / (1e15 * small) + epi * m * n)  # 0: one kernel
    # regression: 0.0 from a profile is 0 too (sympy's Float(0.0) != Integer(0))
    assert t(0.0) == pytest.approx(flops / (1e15 * small) + epi * m * n)
    # the large kernel's own parallel half: 2^20 output elements at a half of 2^20 halve it
    eff = gemm_efficiency(m, n, k, small, 0, 1, parallel_half=1.0, large_flops=2.0**30,
                          large_max_fraction=large, large_parallel_half=2.0**20)
    assert float(eff) == pytest.approx(large / 2)


def test_gemm_fit_recovers_a_large_tile_kernel_and_the_epilogue():
    truth = {**GEMM_TRUTH, "large_flops": 2.0**33, "large_max_fraction": 0.9,
             "large_parallel_half": 1e6, "max_fraction": 0.5, "epilogue_s": 2e-12}
    sweep = gemm_sweep(truth=truth)
    model = GemmModel(989e12, 3.35e12, 2).fit(sweep)
    p = model.params_
    flops = 2 * sweep.b * sweep.m * sweep.n * sweep.k
    # the sweep's FLOPs are powers of 2: the fitted switch takes the same shapes as the true one
    assert ((flops >= p["large_flops"]) == (flops >= truth["large_flops"])).all()
    for name in ("max_fraction", "large_max_fraction", "large_parallel_half", "epilogue_s"):
        assert p[name] == pytest.approx(truth[name], rel=0.15), name
    assert model.residuals_["median_rel_error"] < 0.02
    # and the profile's GemmEfficiency carries it to perfmodel
    assert model.efficiency().has_large_kernel and model.efficiency().has_epilogue
    # a sweep too small to see the switch from both sides with enough shapes gets one kernel
    # (calibrate run --quick measures 14 CPU shapes)
    small = GemmModel(989e12, 3.35e12, 2).fit(sweep.sample(14, random_state=0))
    assert small.params_["large_flops"] == 0 and not small.efficiency().has_large_kernel


def test_gemm_holdout_on_synthetic_sweep_is_at_noise_level():
    err = holdout_error(gemm_sweep(), lambda: GemmModel(989e12, 3.35e12, 2))
    assert err["median_rel_error"] < 0.02


@pytest.mark.parametrize(("world", "per_node"), [(2, 2), (4, 4), (8, 8), (8, 4), (16, 8)])
def test_benchmark_groups_partition_the_ranks(world, per_node):
    """Every sub-group family (rows, columns, axes, intra/inter node) covers each rank once."""
    from calibration.bench import groups_for

    families = groups_for(world, per_node)
    assert families[0][0] == "world"
    for label, scope, parts in families:
        members = sorted(r for part in parts for r in part)
        assert members == list(range(world)), label
        if label == "intra-node":
            assert all(len({r // per_node for r in part}) == 1 for part in parts)
        if label == "inter-node":
            assert scope == "inter" and all(len(part) == world // per_node for part in parts)
    labels = {label for label, _, _ in families}
    assert ("intra-node" in labels) == (world > per_node)


@pytest.mark.parametrize(("device", "quick", "max_bytes"),
                         [("cpu", True, 65536), ("cpu", False, None), ("cuda", True, None)])
def test_a_sweep_reaches_the_ranks_unchanged(device, quick, max_bytes):
    """calibrate run hands the sweep to its ranks as JSON (calibration.bench.main reads it)."""
    import json

    from calibration.bench import sweep_for, sweep_from_dict, sweep_to_dict

    sweep = sweep_for(device, quick, max_bytes)
    assert sweep.layer_sizes and sweep.gemm_shapes
    assert sweep_from_dict(json.loads(json.dumps(sweep_to_dict(sweep)))) == sweep


def test_a_latency_bound_sweep_gives_the_link_the_best_bandwidth_measured():
    """Regression: under load, `calibrate run --max-bytes 65536` fitted an intra-node bandwidth
    of 3e17-7e21 B/s (the bus term is noise when every size is latency-bound), which the
    profile's own reader then refused."""
    import numpy as np
    import pandas as pd

    from calibration.fit import CollectiveModel
    from calibration.run import _link_bandwidth

    rng = np.random.default_rng(0)
    sizes = np.repeat(2.0 ** np.arange(3, 17), 5)  # 8 B .. 64 KiB
    flat = pd.DataFrame({"nbytes": sizes, "ranks": 2,
                         "time_s": 50e-6 * (1 + 0.05 * rng.standard_normal(len(sizes)))})
    model = CollectiveModel("all_reduce", "intra", "ring").fit(flat)
    notes: list[str] = []
    bw = _link_bandwidth(model, "intra", notes)
    assert bw == model.measured_bus_bandwidth_bytes_per_s_ < 2e9 and "latency-bound" in notes[0]
    # a sweep that reaches the bandwidth keeps the fitted value
    big = 2.0 ** np.arange(10, 27)
    resolved = pd.DataFrame({"nbytes": big, "ranks": 2, "time_s": 20e-6 + big / 10e9})
    model = CollectiveModel("all_reduce", "intra", "ring").fit(resolved)
    assert _link_bandwidth(model, "intra", notes) == pytest.approx(10e9, rel=0.05)
    assert len(notes) == 1


def test_the_host_link_is_the_slower_direction_of_the_pinned_copies():
    """calibrate run on a GPU times copies to and from pinned host memory (bench_host_link):
    each direction's bandwidth is fitted, the slower is the profile's host_link_bytes_per_s;
    a CPU's run has no such rows and leaves the field out (offloading is refused there)."""
    import pandas as pd

    from calibration.run import _fit_memory

    rows = [{"kind": "host_link", "direction": d, "nbytes": n, "time_s": 5e-6 + n / bw}
            for d, bw in (("d2h", 52e9), ("h2d", 55e9)) for n in (2**26, 2**28)]
    fits: dict = {}
    hardware: dict = {}
    _fit_memory(pd.DataFrame(rows), {"local_world": 8, "last_level_cache_bytes": 2**25}, fits,
                hardware, [])
    assert hardware["host_link_bytes_per_s"] == pytest.approx(52e9, rel=1e-6)
    assert fits["host_link/h2d"]["params"]["bandwidth_bytes_per_s"] == pytest.approx(55e9, rel=1e-6)
    cpu: dict = {}
    memory = [{"kind": "memory", "kernel": "copy", "nbytes": n, "time_s": n / 1e10}
              for n in (2**26, 2**27, 2**28)]
    _fit_memory(pd.DataFrame(memory), {"local_world": 2, "last_level_cache_bytes": 2**20}, {},
                cpu, [])
    assert "host_link_bytes_per_s" not in cpu and cpu["memory_bandwidth_bytes_per_s"] > 0


def test_the_attention_a_gpu_ran_is_fitted_as_the_presets_kernels_are():
    """calibrate run on a GPU times PyTorch SDPA's causal attention (bench_attention): the
    profile's default flash kernel, named sdpa, in the presets' form, per head dim."""
    import pandas as pd

    from calibration.run import _fit_attention
    from perfmodel.specs.hardware import FlashAttention, FlashAttentionPoint

    peak = 989.4e12
    truth = {64: (0.40, 390.0, 0.45, 340.0), 128: (0.57, 387.0, 0.55, 376.0)}
    rows = []
    for d, (ff, fh, bf, bh) in truth.items():
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            batch, heads = 16384 // s, 2048 // d
            flops = 2.0 * s * s * d * heads * batch
            rows.append({"kind": "attention", "dtype": "bf16", "seq": s, "head_dim": d,
                         "batch": batch, "heads": heads,
                         "forward_s": flops / (peak * ff * s / (s + fh)),
                         "backward_s": 2.5 * flops / (peak * bf * s / (s + bh))})
    fits: dict = {}
    hardware: dict = {"peak_flops_per_s": {"bf16": peak}}
    _fit_attention(pd.DataFrame(rows), {"torch_version": "2.13.0"}, fits, hardware, [])
    kernel = hardware["flash_attention"]
    assert kernel["name"] == "sdpa" and kernel["dtypes"] == ["bf16"]
    made = FlashAttention(kernel=kernel["kernel"], dtypes=("bf16",), name="sdpa",
                          by_head_dim=tuple(FlashAttentionPoint(**p)
                                            for p in kernel["by_head_dim"]))
    for d, (ff, fh, bf, bh) in truth.items():
        point = made.at(d)
        assert (point.forward_max_fraction, point.forward_half_seq,
                point.backward_max_fraction, point.backward_half_seq) == pytest.approx(
                    (ff, fh, bf, bh), rel=1e-4)
    assert fits["attention/bf16"]["head_dims"]["d128"]["forward_max_error"] < 1e-6
    notes: list = []
    _fit_attention(pd.DataFrame(rows), {"torch_version": "2.13.0"}, {}, {}, notes)
    assert notes and "no bf16 GEMM peak" in notes[0]
