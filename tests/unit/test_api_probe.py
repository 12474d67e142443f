"""The Python API as a researcher calls it, where a probe found it apart from the command line
(2026-12-02): the sensitivities against the what-ifs they stand for, a factor on a field that is
0, options that change nothing, and plans of the wrong type. Each test fails before its fix."""

from __future__ import annotations

import pytest

import perfmodel
from perfmodel.predict import predict, resolve_inputs
from perfmodel.recommend import apply_what_if, sensitivities

# sensitivities' names and the --what-if fields that move them
WHAT_IF = {"memory_bandwidth_bytes_per_s": "memory_bandwidth_bytes_per_s",
           "kernel_overhead_s": "kernel_overhead_s", "peak_flops_per_s": "peak_flops_per_s",
           "intra_node.latency_s": "intra_node.latency_s",
           "inter_node.latency_s": "inter_node.latency_s",
           "intra_node.bandwidth_bytes_per_s": "intra_node.bandwidth_bytes_per_s",
           "inter_node.bandwidth_bytes_per_s": "inter_node.bandwidth_bytes_per_s"}


@pytest.mark.parametrize("model, hardware, plan", [
    # host-bound: host_op_overhead_s unset (0), so kernel_overhead_s times the host's ops
    ("tiny-gpt", "dgx-h100", dict(gpus=1, global_batch=8)),
    # the optimizer step's bandwidth is a share of the memory bandwidth
    ("llama3-8b", "dgx-h100", dict(gpus=8, tp=8, global_batch=1)),
    # mi300x's links give no low-latency protocol of their own: theirs is the link's latency
    ("llama3-8b", "mi300x", dict(gpus=16, dp=2, tp=8, global_batch=16)),
])
def test_each_sensitivity_is_the_what_if_it_names(model, hardware, plan):
    m, h, p = resolve_inputs(model, hardware, plan)
    elasticity = sensitivities(m, h, p)
    base = predict(m, h, p).step_time_s
    for name, field in WHAT_IF.items():
        up, down = (predict(m, apply_what_if(h, f"{field}={x}x"), p).step_time_s
                    for x in (1.001, 0.999))
        assert elasticity[name] == pytest.approx((up - down) / 0.002 / base, abs=2e-3), name
    if not h.host_op_overhead_s:  # unset: no sensitivity of its own (kernel_overhead_s's)
        assert "host_op_overhead_s" not in elasticity


def test_a_fabric_of_levels_names_each_levels_what_if():
    """On a fabric of levels --what-if refuses intra_node and inter_node (levels.N.FIELD moves
    them): sensitivities named those (an API probe's finding, 2026-12-07); now each level's,
    each the what-if it names."""
    m, h, p = resolve_inputs("llama3-8b", "dgx-h100-superpod", dict(
        gpus=512, dp=32, tp=8, pp=2, micro_batch=4, global_batch=512, sequence_parallel=True,
        zero=2, overlap_grad_sync=True, overlap_param_gather=True))
    elasticity = sensitivities(m, h, p)
    assert not any(k.startswith(("intra_node", "inter_node")) for k in elasticity)
    base = predict(m, h, p).step_time_s
    fields = [k for k in elasticity if k.startswith("levels.")]
    assert {f.split(".")[1] for f in fields} == {"0", "1", "2"}
    for field in fields:
        up, down = (predict(m, apply_what_if(h, f"{field}={x}x"), p).step_time_s
                    for x in (1.001, 0.999))
        assert elasticity[field] == pytest.approx((up - down) / 0.002 / base, abs=2e-3), field


def test_a_factor_on_a_field_that_is_0_is_refused():
    h = perfmodel.load_hardware("mi300x")  # no host cost per op measured for a ROCm host
    assert h.host_op_overhead_s == 0
    with pytest.raises(perfmodel.PlanError, match="host_op_overhead_s is 0 .* give a value"):
        apply_what_if(h, "host_op_overhead_s=2x")
    assert apply_what_if(h, "host_op_overhead_s=5e-6").host_op_overhead_s == 5e-6


@pytest.mark.parametrize("extra, says", [
    (dict(zero=3), "zero 3 shards over the data-parallel ranks"),
    (dict(zero=1), "zero 1 shards"),
    (dict(overlap_grad_sync=True), "overlaps the data-parallel gradient sync"),
    (dict(cp_comm="allgather"), "cp_comm allgather applies to context parallelism"),
    (dict(schedule="gpipe"), "schedule gpipe orders a pipeline's micro-batches"),
])
def test_the_api_refuses_what_the_command_line_refuses(extra, says):
    for plan in (perfmodel.Plan(gpus=8, tp=8, **extra), dict(gpus=8, tp=8, **extra)):
        with pytest.raises(perfmodel.PlanError, match=says):
            perfmodel.predict("llama3-8b", "dgx-h100", plan)
    # perfmodel's own callers (a config's plan, a search's) pass refuse_idle=False
    perfmodel.predict("llama3-8b", "dgx-h100", perfmodel.Plan(gpus=8, tp=8, **extra),
                      refuse_idle=False)


def test_the_command_line_refuses_a_schedule_without_a_pipeline():
    from tests.unit.test_bad_input import run_main

    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--tp", "8", "--schedule", "gpipe"])
    assert code == 4 and "schedule gpipe orders a pipeline's micro-batches" in err


@pytest.mark.parametrize("plan", [None, [1, 2], 3])
def test_a_plan_of_the_wrong_type_is_refused_in_words(plan):
    with pytest.raises(perfmodel.PlanError, match="a plan is a perfmodel.Plan or a mapping"):
        perfmodel.predict("llama3-8b", "dgx-h100", plan)


def test_plan_replace_names_an_unknown_field():
    plan = perfmodel.Plan(gpus=8, dp=8, global_batch=8)
    with pytest.raises(perfmodel.PlanError, match="micro_bach .did you mean 'micro_batch'"):
        plan.replace(micro_bach=2)


def test_a_spec_takes_a_digit_string_as_its_number():
    spec = perfmodel.TransformerSpec(name="w", layers="2", hidden=64, heads=4, seq_len=8,
                                     vocab=10)
    assert spec.layers == 2 and isinstance(spec.layers, int)
    with pytest.raises(perfmodel.SpecError, match="layers must be a number"):
        perfmodel.TransformerSpec(name="w", layers="x", hidden=64, heads=4, seq_len=8, vocab=10)
