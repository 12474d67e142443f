"""End-to-end iteration times of Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", Table 5), measured on DGX A100 80GB (Selene): 2048-token sequences,
vocabulary 51,200, data parallel 1.

A prediction, not a fit: no preset value is chosen to match these runs (until issue 16 the A100
GEMM ceiling was; it now follows the rule every GPU follows, docs/model.md "GEMM ceiling"). The
tolerance is the model's documented expectation for any published run (issue 16: no row beyond
12%); the errors themselves are reported by `python benchmarks/bench_accuracy.py` and in
docs/accuracy.md (mean absolute 2.4% before issue 16, with the fitted ceiling). Until
2026-12-02 GPT-3 175B with sequence parallelism was 13.1% fast, a known failure here, the GEMMs
at MAMF's burst rate: the A100's sustained rate under its 400 W cap (0.948 of it) put it back.
"""

import pytest

from perfmodel import Plan, load_model, predict

# model, tp, pp, global batch, micro-batch, schedule, virtual stages,
# seconds with full recompute, seconds with sequence parallel + selective recompute (Table 5)
TABLE5 = [
    ("gpt-22b", 8, 1, 4, 4, "1f1b", 1, 1.42, 1.10),
    ("gpt3-175b", 8, 8, 64, 1, "interleaved", 3, 18.13, 13.75),
    ("gpt-530b", 8, 35, 280, 1, "interleaved", 3, 49.05, 37.83),
    ("gpt-1t", 8, 64, 512, 1, "1f1b", 1, 94.42, 71.49),
]


def _runs():
    for name, tp, pp, batch, micro, schedule, v, full, selective in TABLE5:
        # Megatron-LM in 2022 ran the attention unfused: two GEMMs around its fused
        # scale-mask-softmax kernel (FlashAttention came out the same month, May 2022)
        plan = dict(gpus=tp * pp, tp=tp, pp=pp, global_batch=batch, micro_batch=micro,
                    schedule=schedule, virtual_stages=v, flash_attention=False)
        # and split its pipeline sends over tp without sequence parallelism (its default then,
        # scatter_gather_tensors_in_pipeline)
        yield name, Plan(**plan, recompute="full", pp_scatter_gather=pp > 1), full
        yield name, Plan(**plan, recompute="selective", sequence_parallel=True), selective


@pytest.mark.parametrize("name,plan,measured", list(_runs()))
def test_each_run_within_12_percent(name, plan, measured):
    predicted = predict(load_model(name), "dgx-a100-80gb", plan).step_time_s
    assert abs(predicted - measured) / measured <= 0.12, f"{predicted:.3f} s vs {measured} s"


def test_selective_recompute_with_sequence_parallel_is_faster_as_measured():
    # Table 5: every model trains 23-30% faster with SP + selective recompute than with full
    # recompute
    for name, full_plan, _ in list(_runs())[::2]:
        sel_plan = full_plan.replace(recompute="selective", sequence_parallel=True,
                                     pp_scatter_gather=False)
        full = predict(load_model(name), "dgx-a100-80gb", full_plan).step_time_s
        sel = predict(load_model(name), "dgx-a100-80gb", sel_plan).step_time_s
        assert 0.15 < 1 - sel / full < 0.40, name
