"""Full recompute by Megatron-LM's methods (Plan.recompute_method, recompute_num_layers;
megatron/core/recompute.py): block recomputes the first k layers of each model chunk, uniform
recomputes every layer with the chunk's layers checkpointed in groups of k."""

from __future__ import annotations

import math

import pytest

from perfmodel import Plan, PlanError, load_model, predict

MODEL = load_model("llama3-8b").replace(seq_len=4096)  # 32 layers, no dropout
BASE = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, zero=1)


def _run(**plan):
    p = predict(MODEL, "dgx-h100", dict(BASE, **plan))
    return p.memory_breakdown_bytes, p.breakdown_s


def test_block_recomputes_the_first_k_layers_of_the_stage():
    kept_all, t_none = _run()
    kept_full, t_full = _run(recompute="full")
    everything = kept_all["activations/layers"] / 32
    layer_input = kept_full["activations/layers"] / 32
    assert layer_input == pytest.approx(2 * 4096 * 4096)  # e T h, bf16
    for k in (1, 5, 31):
        kept, t = _run(recompute="full", recompute_method="block", recompute_num_layers=k)
        assert kept["activations/layers"] == pytest.approx(k * layer_input
                                                           + (32 - k) * everything)
        assert t["compute/recompute"] == pytest.approx(k / 32 * t_full["compute/recompute"])
        # one layer rebuilt at a time, as under full recompute
        assert kept["activations/recompute_buffer"] == \
            pytest.approx(kept_full["activations/recompute_buffer"])
    # k at or beyond a chunk's layers: every layer, as full recompute
    kept, t = _run(recompute="full", recompute_method="block", recompute_num_layers=40)
    assert kept == pytest.approx(kept_full) and t == pytest.approx(t_full)


def test_uniform_groups_keep_a_group_input_and_rebuild_a_group():
    kept_full, t_full = _run(recompute="full")
    layer_input = kept_full["activations/layers"] / 32
    for k in (2, 3, 4, 32):
        kept, t = _run(recompute="full", recompute_method="uniform", recompute_num_layers=k)
        assert kept["activations/layers"] == pytest.approx(math.ceil(32 / k) * layer_input)
        # a group of k layers rebuilt, but its input: the checkpoint, kept with the layers
        everything = kept_full["activations/recompute_buffer"] + layer_input
        assert kept["activations/recompute_buffer"] == \
            pytest.approx(k * everything - layer_input)
        assert t["compute/recompute"] == pytest.approx(t_full["compute/recompute"])


def test_a_checkpoint_input_is_counted_once():
    """The rebuilt layer holds its checkpoint's input again as its first norm's input (the same
    storage: the forward re-runs on it detached), so checkpointing one layer of 32 peaks where
    no recompute does; before 2026-12-01 the input was counted twice (one layer's input more)."""
    none, _ = _run()
    for plan in (dict(recompute="full", recompute_method="block", recompute_num_layers=1),
                 dict(recompute="full", recompute_every=32)):
        kept, _ = _run(**plan)
        assert kept["activations/layers"] + kept["activations/recompute_buffer"] == \
            pytest.approx(none["activations/layers"] + none["activations/recompute_buffer"])


def test_block_counts_k_layers_in_each_chunk():
    """Interleaved, 4 stages x 2 chunks of 4 layers: block 1 recomputes 2 of a rank's 8."""
    plan = dict(gpus=8, dp=2, pp=4, schedule="interleaved", virtual_stages=2, micro_batch=1,
                global_batch=8, zero=1)
    full = predict(MODEL, "dgx-h100", dict(plan, recompute="full")).breakdown_s
    block = predict(MODEL, "dgx-h100", dict(plan, recompute="full", recompute_method="block",
                                            recompute_num_layers=1)).breakdown_s
    assert block["compute/recompute"] == pytest.approx(full["compute/recompute"] * 2 / 8)


def test_the_methods_are_full_recompute_s():
    with pytest.raises(PlanError, match="the plan recomputes selective"):
        Plan(gpus=1, recompute="selective", recompute_method="block", recompute_num_layers=2)
    with pytest.raises(PlanError, match="not both"):
        Plan(gpus=1, recompute="full", recompute_every=2, recompute_num_layers=2)
    with pytest.raises(PlanError, match="recompute_method must be one of"):
        Plan(gpus=1, recompute="full", recompute_method="chunked")
    assert "recompute_method" not in Plan(gpus=1, recompute="full").to_dict()


def test_the_validation_job_builds_them():
    from validation.jobspec import model_keys
    from workload.model import build_chunk

    model = model_keys(load_model("tiny-gpt"))  # 4 layers
    plan = {"pp": 1, "virtual_stages": 1, "recompute": "full", "recompute_method": "block",
            "recompute_num_layers": 3}
    chunk = build_chunk(model, plan, 0)
    assert [b.full_recompute for b in chunk.layers] == [True, True, True, False]
    chunk = build_chunk(model, dict(plan, recompute_method="uniform"), 0)
    assert chunk.recompute_group == 3 and not any(b.full_recompute for b in chunk.layers)


def test_block_is_refused_with_uneven_stages_and_the_search_keeps_them_even():
    with pytest.raises(PlanError, match="uneven pipeline stages"):
        Plan(gpus=4, pp=4, global_batch=4, recompute="full", recompute_method="block",
             recompute_num_layers=2, first_stage_layers=5)
    with pytest.raises(PlanError, match="uneven pipeline stages"):  # uniform groups too
        Plan(gpus=4, pp=4, global_batch=4, recompute="full", recompute_num_layers=2,
             pipeline_layout="Et*3|t*2|t*2|t*1L")
    from perfmodel.search import SearchRequest, uneven_pp

    req = SearchRequest(gpus=(8,), global_batch=8, uneven_stages=True)
    model = MODEL.replace(layers=30)
    assert uneven_pp(model, req, 4)
    for method in ("block", "uniform"):
        megatron = SearchRequest(gpus=(8,), global_batch=8, uneven_stages=True,
                                 recompute_method=method, recompute_num_layers=2)
        assert not uneven_pp(model, megatron, 4)


def test_a_spec_file_s_quoted_rate_is_a_number():
    from perfmodel import TransformerSpec

    spec = TransformerSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=100,
                           hidden_dropout="0.1", attention_dropout="0")
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.1, 0.0)


def test_a_count_beyond_a_chunk_is_costed_and_said_as_the_chunk():
    """Megatron-Core ends a uniform group and the block at the chunk's end
    (transformer_block.py's _checkpointed_forward: chunk_end = min(layer_idx + k, layers)): a
    count of 9 or 100 on 8-layer chunks is the count of 8, and the header says so."""
    from perfmodel.render import plan_lines

    for method in ("block", "uniform"):
        at_chunk = predict(MODEL, "dgx-h100", dict(BASE, gpus=32, pp=4, recompute="full",
                                                   recompute_method=method,
                                                   recompute_num_layers=8))
        for k in (9, 100):
            p = predict(MODEL, "dgx-h100", dict(BASE, gpus=32, pp=4, recompute="full",
                                                recompute_method=method, recompute_num_layers=k))
            assert p.step_time_s == at_chunk.step_time_s
            assert p.memory_breakdown_bytes == at_chunk.memory_breakdown_bytes
            header = " ".join(plan_lines(p.plan, p.hardware, p.plan.num_micro_batches, MODEL))
            said = "every one" if method == "block" else "one group of 8"
            assert f"a chunk holds 8: {said}" in header
        header = " ".join(plan_lines(at_chunk.plan, at_chunk.hardware, 1, MODEL))
        assert "a chunk holds" not in header
