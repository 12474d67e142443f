"""Invariants of the cost models, on random inputs (hypothesis)."""

import functools
import math

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel import Plan, load_hardware, load_model
from perfmodel import predict as _predict
from perfmodel import symbols as S
from perfmodel.costs.collectives import ALGORITHMS, Op, collective_time
from perfmodel.costs.gemm_efficiency import gemm_time_s
from perfmodel.evaluate import family_of, values_of
from perfmodel.step import build

# these tests predict plans as they stand (generated, or read from configs), options that
# change nothing included: perfmodel.predict refuses those by default (refuse_idle)
predict = functools.partial(_predict, refuse_idle=False)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
H100 = load_hardware("dgx-h100")
MODEL = load_model("llama2-7b")


@SETTINGS
@given(op=st.sampled_from(list(Op)), n=st.integers(2, 4096), nbytes=st.floats(1, 1e11),
       factor=st.floats(1.0, 100.0))
def test_collective_time_never_falls_when_bytes_grow(op, n, nbytes, factor):
    for alg in ALGORITHMS[op]:
        small = float(collective_time(op, nbytes, n, 5e-6, 1e11, alg))
        large = float(collective_time(op, nbytes * factor, n, 5e-6, 1e11, alg))
        assert large >= small > 0


@SETTINGS
@given(m=st.integers(1, 65536), n=st.integers(1, 65536), k=st.integers(1, 65536),
       grow=st.sampled_from(["m", "n", "k"]), factor=st.integers(2, 8))
def test_gemm_time_never_falls_when_flops_grow(m, n, k, grow, factor):
    params = {"max_fraction": 0.8, "half_dim": 0, "m_half_dim": 33, "n_half_dim": 33,
              "k_half_dim": 160, "batch_half": 0.02, "min_time_s": 5e-6}

    def t(**dims):
        d = {"m": m, "n": n, "k": k, **dims}
        return float(gemm_time_s(d["m"], d["n"], d["k"], 1, 2, 989e12, 3.35e12, **params))

    assert t(**{grow: {"m": m, "n": n, "k": k}[grow] * factor}) >= t()


def plans(max_tp: int = 8):
    """A valid plan of llama2-7b (32 layers, 32 heads, 4096 hidden): any schedule (zero bubble
    included), 1D or 2D tensor layout, recompute, ZeRO, precision, placement, the overlaps and
    the software stack."""

    @st.composite
    def build_plan(draw):
        layout = draw(st.sampled_from(["1d", "1d", "2d"]))
        tp = draw(st.sampled_from([1, 2, 4, 8][: [1, 2, 4, 8].index(max_tp) + 1]
                                  if layout == "1d" else [1, 4]))
        pp = draw(st.sampled_from([1, 2, 4]))
        dp = draw(st.sampled_from([1, 2, 4]))
        mb = draw(st.sampled_from([1, 2, 4])) * (2 if layout == "2d" and tp == 4 else 1)
        schedules = ["gpipe", "1f1b"] + (["interleaved", "zb", "zbv"] if pp > 1 else [])
        schedule = draw(st.sampled_from(schedules))
        v = {"interleaved": 2, "zbv": 2, "zb": draw(st.sampled_from([1, 2]))}.get(schedule, 1)
        m = draw(st.sampled_from([1, 2, 4, 8]))
        if schedule in ("interleaved", "zb", "zbv"):
            m = max(m - m % pp, pp)
        sequence_parallel = draw(st.booleans()) and tp > 1 and layout == "1d"
        zero = draw(st.sampled_from([0, 1, 2, 3])) if dp > 1 else 0
        return Plan(gpus=dp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batch=mb,
                    global_batch=dp * mb * m, schedule=schedule, virtual_stages=v,
                    tp_layout=layout, sequence_parallel=sequence_parallel,
                    recompute=draw(st.sampled_from(["none", "selective", "full"])),
                    zero=zero,
                    dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
                    flash_attention=draw(st.booleans()),
                    overlap_grad_sync=draw(st.booleans()),
                    overlap_param_gather=draw(st.booleans()) and dp > 1 and zero > 0,
                    tp_comm_overlap=sequence_parallel and draw(st.booleans()),
                    stack=draw(st.sampled_from(["eager", "compiled", "cuda-graphs"])),
                    placement=draw(st.sampled_from(["tp,dp,pp", "dp,tp,pp", "pp,dp,tp"])))

    return build_plan()


@SETTINGS
@given(plan=plans())
def test_step_time_is_never_below_model_flops_at_peak(plan):
    r = predict(MODEL, H100, plan)
    assert r.step_time_s >= r.model_flops_per_step / (plan.gpus * H100.peak(plan.dtype.value))
    assert all(v >= 0 for v in r.breakdown_s.values())
    assert all(v >= 0 for v in r.memory_breakdown_bytes.values())


@SETTINGS
@given(plan=plans())
def test_degree_one_axes_do_not_communicate(plan):
    r = predict(MODEL, H100, plan)
    assert (r.breakdown_s["comm/tp"] == 0) == (plan.tp == 1)
    assert (r.breakdown_s["comm/dp"] == 0) == (plan.dp == 1) or plan.overlap_grad_sync
    assert (r.breakdown_s["pipeline/p2p"] == 0) == (plan.pp == 1)


@SETTINGS
@given(plan=plans())
def test_more_sharding_never_needs_more_memory(plan):
    """ZeRO 1 to 3 each need no more memory than the stage before, but for ZeRO 3 under a
    pipeline: there FSDP keeps the stage's weights gathered and its gradients unsharded through
    the step (torch.distributed.pipelining; perfmodel.step.data_parallel, stage_resident), more
    than ZeRO 2's sharded gradients hold, and still no more than ZeRO 0's whole states."""
    base = predict(MODEL, H100, plan).memory_per_gpu_bytes
    if plan.dp > 1 and plan.zero < 3:
        more = predict(MODEL, H100, plan.replace(zero=plan.zero + 1)).memory_per_gpu_bytes
        if plan.zero == 2 and plan.pp > 1:
            base = predict(MODEL, H100, plan.replace(zero=0, overlap_param_gather=False)
                           ).memory_per_gpu_bytes
        assert more <= base
    if plan.recompute.value != "full":
        full = predict(MODEL, H100, plan.replace(recompute="full")).memory_per_gpu_bytes
        assert full <= base * (1 + 1e-12)


def _replaced(expr, numbers, memo):
    """expr.xreplace(numbers), each shared node rebuilt once: the built step time is a graph
    whose nodes many terms share, which xreplace walks as a tree (25 million visits, 4 minutes
    for this test's 8 plans)."""
    if expr in numbers:
        return numbers[expr]
    if expr.is_Atom:
        return expr
    hit = memo.get(id(expr))
    if hit is None:
        hit = memo[id(expr)] = (expr, expr.func(*(_replaced(a, numbers, memo)
                                                  for a in expr.args)))
    return hit[1]


@settings(max_examples=8, deadline=None)
@given(plan=plans())
def test_symbolic_and_lambdified_forms_agree(plan):
    """The plan's own (specialised) sympy formula, evaluated exactly, equals the compiled universal
    expression that predict uses."""
    family = family_of(MODEL, H100, plan, specialise=True)
    expr = build(family).step_time
    values = values_of(MODEL, H100, plan)
    numbers = {sym: values[name] for name, (sym, _) in S.table().items() if name in values}
    exact = float(_replaced(expr, numbers, {}))
    assert predict(MODEL, H100, plan).step_time_s == pytest.approx(exact, rel=1e-9)
    assert math.isfinite(exact)
    assert not isinstance(expr, sp.Number)


# --- issue 8: more invariants, on plans of every schedule and layout and on random models ------
def _time(plan, model=MODEL, hardware=H100):
    return predict(model, hardware, plan).step_time_s


def _memory(plan, model=MODEL, hardware=H100):
    return predict(model, hardware, plan).memory_per_gpu_bytes


NOT_LESS = 1 - 1e-12  # rounding: a larger quantity may come out equal, never smaller


@SETTINGS
@given(plan=plans(), grow=st.sampled_from(["global_batch", "layers", "seq_len"]))
def test_step_time_never_falls_when_the_work_grows(plan, grow):
    """Twice the samples, the layers or the sequence: more FLOPs and more bytes, never less time."""
    base = _time(plan)
    if grow == "global_batch":
        bigger = _time(plan.replace(global_batch=2 * plan.global_batch))
    else:
        model = MODEL.replace(**{grow: 2 * getattr(MODEL, grow)})
        bigger = _time(plan, model=model)
    assert bigger >= base * NOT_LESS


SLOWER = ["peak_flops_per_s", "memory_bandwidth_bytes_per_s", "intra_node.bandwidth_bytes_per_s",
          "inter_node.bandwidth_bytes_per_s", "intra_node.efficiency", "inter_node.efficiency",
          "memory_bandwidth_efficiency"]


@SETTINGS
@given(plan=plans(), field=st.sampled_from([*SLOWER, "intra_node.latency_s",
                                               "inter_node.latency_s", "kernel_overhead_s"]),
       factor=st.floats(1.01, 100.0))
def test_slower_hardware_never_makes_a_step_faster(plan, field, factor):
    """A rate divided, or a latency multiplied, by factor > 1: the bytes and FLOPs of the step
    stay, so its time does not fall (the cheapest collective algorithm is re-chosen, still
    never faster than before)."""
    from perfmodel.recommend import apply_what_if

    change = 1 / factor if field in SLOWER else factor
    slower = apply_what_if(H100, f"{field}={change!r}x")
    assert _time(plan, hardware=slower) >= _time(plan) * NOT_LESS


@SETTINGS
@given(plan=plans(max_tp=4), axis=st.sampled_from(["tp", "pp", "dp", "sp", "flash"]))
def test_more_sharding_of_any_kind_never_needs_more_memory(plan, axis):
    """Per-GPU memory falls or stays when an axis doubles (the others fixed) or sequence
    parallelism or fused attention is switched on. Interleaved and zero-bubble schedules are left
    out of the pipeline case: their first stage holds pp (1 + (pp - 1)/(pp v)) micro-batches of
    activations (Narayanan et al. 2021, sec. 2.2.2), which grows with pp, so more stages can
    need more memory there, in the model as on the machine. The data case needs ZeRO >= 1 (else
    every replica holds everything) and keeps the global batch, so each replica has fewer
    micro-batches. ZeRO 3 from one stage to two is left out: under a pipeline FSDP keeps the
    stage's weights gathered and its gradients unsharded (torch.distributed.pipelining), which
    can hold more than one stage's two gathered layers and sharded gradients."""
    from hypothesis import assume

    base = _memory(plan)
    if axis == "tp":
        assume(plan.tp_layout.value == "1d")
        other = plan.replace(tp=2 * plan.tp, gpus=2 * plan.gpus)
    elif axis == "pp":
        # one stage runs no schedule (one micro-batch at a time); GPipe over two holds all m
        assume(plan.schedule.value == "1f1b" or (plan.schedule.value == "gpipe" and plan.pp > 1))
        assume(plan.zero < 3 or plan.pp > 1)
        other = plan.replace(pp=2 * plan.pp, gpus=2 * plan.gpus)
    elif axis == "dp":
        assume(plan.zero >= 1 and plan.num_micro_batches % 2 == 0)
        assume(plan.schedule.value in ("gpipe", "1f1b") or plan.num_micro_batches >= 2 * plan.pp)
        other = plan.replace(dp=2 * plan.dp, gpus=2 * plan.gpus)
    elif axis == "sp":
        assume(plan.tp > 1 and plan.tp_layout.value == "1d" and not plan.sequence_parallel)
        other = plan.replace(sequence_parallel=True)
    else:
        assume(not plan.flash_attention)
        other = plan.replace(flash_attention=True)
    assert _memory(other.check(MODEL)) <= base * (1 + 1e-12)


@SETTINGS
@given(plan=plans())
def test_an_axis_of_degree_one_issues_no_collective(plan):
    """The ledger (every collective one rank issues) has no call on an axis of degree 1, and
    every axis of degree > 1 that the plan shards communicates."""
    from perfmodel import comm_ledger

    # a 2D/3D grid's sub-axes (tpa, tpb, tpc) belong to the tensor-parallel axis
    axes = {r["axis"][:2] for r in comm_ledger(MODEL, plan, H100) if r["calls"] > 0}
    degrees = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
    assert all(degrees[a] > 1 for a in axes), (axes, degrees)
    assert ("tp" in axes) == (plan.tp > 1)
    assert ("pp" in axes) == (plan.pp > 1)


def models():
    """Random transformer shapes (grouped-query attention, gated MLP, tied embeddings)."""

    @st.composite
    def build(draw):
        heads = draw(st.sampled_from([4, 8, 16]))
        return MODEL.replace(
            name="random", layers=draw(st.sampled_from([2, 4, 8, 12])),
            hidden=heads * draw(st.sampled_from([32, 64, 128])), heads=heads,
            kv_heads=heads // draw(st.sampled_from([1, 2, 4])), ffn_hidden=0,
            seq_len=draw(st.sampled_from([128, 512, 2048])),
            vocab=draw(st.sampled_from([1000, 32000, 50257])),
            gated_mlp=draw(st.booleans()), tied_embeddings=draw(st.booleans()))

    return build()


def search_models():
    """Random transformer shapes whose heads allow tensor-parallel degrees of 3, 5 and 6, and
    sequence lengths that do not divide by them (sequence parallelism's rule)."""

    @st.composite
    def build(draw):
        heads = draw(st.sampled_from([4, 6, 8, 12, 20, 24, 40, 48]))
        return MODEL.replace(
            name="random", layers=draw(st.sampled_from([2, 4, 6, 12, 24])),
            hidden=heads * draw(st.sampled_from([32, 64, 128])), heads=heads,
            kv_heads=draw(st.sampled_from([heads, heads // 2, 1])), ffn_hidden=0,
            seq_len=draw(st.sampled_from([128, 1000, 2048])),
            vocab=draw(st.sampled_from([1000, 32000, 50257])),
            gated_mlp=draw(st.booleans()), tied_embeddings=draw(st.booleans()))

    return build()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=search_models(),
       hardware=st.sampled_from(["dgx-h100", "dgx-a100-80gb", "dgx-a100-40gb", "dgx-v100",
                                 "hgx-h200", "mi300x"]),
       gpus=st.sampled_from([1, 2, 3, 6, 8, 12, 16, 24, 40, 48, 96, 640]),
       batch=st.one_of(st.sampled_from([1, 2, 4, 8]).map(lambda k: ("x", k)),
                       st.integers(1, 512).map(lambda b: ("=", b))),
       data=st.data())
def test_every_plan_the_search_ranks_or_evaluates_passes_predict_with_its_numbers(
        model, hardware, gpus, batch, data):
    """Issue 14: recommend ranks only plans that predict accepts. The top list and a random
    sample of the evaluated plans each pass predict (Plan.check included) with the search's step
    time and memory; the top list fits in the search's memory limit."""
    from perfmodel.errors import PlanError
    from perfmodel.search import SearchRequest, search

    hw = load_hardware(hardware)
    dtype = "bf16" if "bf16" in hw.peak_flops_per_s else "fp16"
    global_batch = gpus * batch[1] if batch[0] == "x" else batch[1]
    req = SearchRequest(gpus=(gpus,), global_batch=global_batch, dtype=dtype)
    if gpus > hw.gpus_per_node and gpus % hw.gpus_per_node:  # a partly filled last node
        with pytest.raises(PlanError, match="is not whole nodes"):
            search(model, hw, req, top=10)
        return
    result = search(model, hw, req, top=10)
    picks = []
    if len(result.sample):
        picks = data.draw(st.lists(st.integers(0, len(result.sample) - 1), max_size=12,
                                   unique=True))
    for rows, indices in ((result.best, range(len(result.best))), (result.sample, picks)):
        for i in indices:
            scalar = predict(model, hw, result.plan(rows, i))  # raises PlanError if not allowed
            assert rows.step_time_s[i] == pytest.approx(scalar.step_time_s, rel=1e-9)
            assert rows.memory_bytes[i] == pytest.approx(scalar.memory_per_gpu_bytes, rel=1e-9)
    assert (result.best.memory_bytes <= result.capacity_bytes).all()


@pytest.mark.parametrize("name,gpus", [("gpt-1t", 640), ("gpt3-175b", 48), ("gpt3-175b", 96)])
def test_the_recommended_plans_of_issue_14_pass_predict(name, gpus):
    """Regression: the best plan used sequence parallelism with tp 5, 6 or 3 and seq_len 2048,
    which Plan.check refuses; recommend exited 4."""
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest

    model = load_model(name)
    rec = recommend(model, H100, SearchRequest(gpus=(gpus,), global_batch=gpus))
    assert rec.top and all(model.seq_len % p.plan.tp == 0 or not p.plan.sequence_parallel
                           for p in rec.top)
    for p in rec.top:
        p.plan.check(model)  # raises a PlanError where the rules refuse it
