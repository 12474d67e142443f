"""Pipeline layouts (perfmodel.pipeline_layout, Plan.pipeline_layout): Megatron-Core's
--pipeline-model-parallel-layout read as Megatron reads it, refused in one line where perfmodel
does not model it, and predicted as the per-rank split it makes (issue 16 item 5: uneven
splits; issue 17: DeepSeek-V3's 61 layers under virtual stages)."""

from __future__ import annotations

import pytest

from perfmodel import Plan, PlanError, load_hardware, load_model, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.megatron import megatron_arguments
from perfmodel.evaluate import family_of
from perfmodel.pipeline_layout import MAX_PIECES, PipelineLayout, _expand, accounted_layout
from perfmodel.strategy import plan_from_dict

# DeepSeek-V3 as Megatron-Bridge's performance recipes run it on H100 and GB200: pp 8, 4 virtual
# stages, "Et|(tt|)*30mL" (NVIDIA/Megatron-Bridge scripts/performance/configs/deepseek,
# deepseek_llm_pretrain.py: layout="Et|(tt|)*30mL")
DSV3_LAYOUT = "Et|(tt|)*30mL"


def test_the_strings_expand_as_megatron_expands_them():
    # Megatron-Core's docs (pipeline_parallel_layout.md): "Et*3|(tt|)*29,m|L" on PP16 x VPP2:
    # stage 0 embedding + 3 decoders, 29 stages of 2, then mtp, then loss (32 stages)
    stages = _expand("Et*3|(tt|)*29,m|L").split("|")
    assert len(stages) == 32
    assert stages[0] == "Ettt" and stages[1:30] == ["tt"] * 29 and stages[30:] == ["m", "L"]
    # parse_str_to_list's docstring: "Ettt|(tt|)*29,m|L" -> [E,t,t,t] + [t,t] * 29 + [m], [L]
    assert _expand("Ettt|(tt|)*29,m|L") == _expand("Et*3|(tt|)*29,m|L")
    assert _expand("(|ab)*2,cd".replace("a", "t").replace("b", "t")
                   .replace("c", "t").replace("d", "L")) == "|tt|tttL"


def test_deepseek_v3_layout_gives_each_rank_its_layers():
    layout = PipelineLayout.parse(DSV3_LAYOUT, 8)
    assert layout.virtual_stages == 4 and layout.layers == 61 and layout.mtp_modules == 1
    # rank 0: E+1, 2, 2, 2; ranks 1-6: 2 x 4; rank 7: 2, 2, 2 and mtp + loss
    assert layout.decoder_layers == (7, 8, 8, 8, 8, 8, 8, 6)
    # layers 0 (stage 0, rank 0) and 1-2 (stage 1, rank 1): DeepSeek-V3's 3 dense layers; the
    # last, 60, in stage 30 (rank 6; stage 31, rank 7's last, holds the MTP module and the loss)
    assert [layout.rank_of_layer(i) for i in (0, 1, 2, 3, 60)] == [0, 1, 1, 2, 6]
    assert layout.dense_split((0, 1, 2)) == (1, 0, 2)


@pytest.mark.parametrize("text, pp, why", [
    ("Et|tx|tL", 3, "unknown character 'x'"),
    ("E(tt|*3L", 2, "has no '\\)'"),
    ("E(tt|)L", 2, "followed by '\\*n'"),
    ("E((t)*2|)*2L", 2, "no other group"),
    ("Et*|tL", 2, "whole number"),
    ("Ett|tt|tL", 2, "not a multiple of pp"),
    ("tE|tL", 2, "begin with the embedding"),
    ("Et|tL|L", 3, "end with the loss"),
    ("Et|mt|tL", 3, "after every decoder layer"),
    ("Et|tt|m|L", 2, "standalone MTP"),
    ("E|tt|ttL", 3, "first and the last pipeline rank must hold a decoder layer"),
    ("Et|(t)*100000000|L", 3, f"more than {MAX_PIECES:,} pieces"),
    ("Et|tL", 1, "needs pp >= 2"),
])
def test_a_layout_perfmodel_cannot_take_is_refused_in_one_line(text, pp, why):
    with pytest.raises(PlanError, match=why) as err:
        PipelineLayout.parse(text, pp)
    assert "\n" not in str(err.value) and str(err.value).startswith("pipeline_layout '")


def _plan(**kw):
    base = dict(gpus=8, pp=8, global_batch=32, virtual_stages=4, schedule="interleaved")
    return Plan(**{**base, **kw})


def test_the_plan_takes_the_virtual_stages_and_the_model_from_the_layout():
    with pytest.raises(PlanError, match="give virtual_stages 4 \\(got 2\\)"):
        _plan(virtual_stages=2, pipeline_layout=DSV3_LAYOUT)
    with pytest.raises(PlanError, match="leave first_stage_layers and last_stage_layers"):
        _plan(pipeline_layout=DSV3_LAYOUT, first_stage_layers=7)
    with pytest.raises(PlanError, match="schedule zbv"):
        Plan(gpus=8, pp=8, global_batch=32, virtual_stages=2, schedule="zbv",
             pipeline_layout="Et|(t|)*14L")
    plan = _plan(pipeline_layout=f"  {DSV3_LAYOUT} ")
    assert plan.pipeline_layout == DSV3_LAYOUT
    assert plan.to_dict()["pipeline_layout"] == DSV3_LAYOUT
    assert "pipeline_layout" not in _plan(virtual_stages=1, schedule="1f1b").to_dict()
    columns = plan.columns()
    assert (columns.first_stage_layers, columns.last_stage_layers) == (7, 6)
    model = load_model("deepseek-v3")
    assert plan.check(model) is plan  # 7 and 6 layers: no multiple of the 4 chunks, yet valid
    with pytest.raises(PlanError, match="the model has 60"):
        plan.check(model.replace(layers=60, moe_first_dense=3))
    with pytest.raises(PlanError, match="places 0 MTP modules m, the model has 1"):
        _plan(pipeline_layout="Et|(tt|)*30L").check(model)
    assert family_of(model, load_hardware("dgx-h100"), plan).stage_dense == (1, 0, 2)


def test_a_layout_predicts_what_the_same_split_given_otherwise_predicts():
    """The layout is only a way to write the split: Llama 3 405B's 126 layers over 16 stages,
    7, 8 x 14, 7 (Dubey et al. 2024, Sec. 3.3.2), as a layout and as
    first/last_stage_layers; and an even split written out as a layout."""
    h100 = load_hardware("dgx-h100")
    model = load_model("llama3-405b")
    kw = dict(gpus=128, tp=8, pp=16, global_batch=32, sequence_parallel=True)
    given = predict(model, h100, Plan(**kw, first_stage_layers=7, last_stage_layers=7))
    laid = predict(model, h100, Plan(**kw, pipeline_layout="Et*7|(t*8|)*14t*7L"))
    assert laid.step_time_s == pytest.approx(given.step_time_s, rel=1e-12)
    assert laid.memory_per_gpu_bytes == pytest.approx(given.memory_per_gpu_bytes, rel=1e-12)
    assert laid.breakdown_s == pytest.approx(given.breakdown_s, rel=1e-12, abs=1e-15)
    small = load_model("llama3-8b")
    kw = dict(gpus=8, pp=4, dp=2, global_batch=16, schedule="interleaved", virtual_stages=2)
    even = predict(small, h100, Plan(**kw))
    written = predict(small, h100, Plan(**kw, pipeline_layout="Etttt|(tttt|)*6ttttL"))
    assert written.step_time_s == pytest.approx(even.step_time_s, rel=1e-12)
    assert written.memory_per_gpu_bytes == pytest.approx(even.memory_per_gpu_bytes, rel=1e-12)


def test_deepseek_v3_with_its_layout_is_predicted_and_its_ranks_differ():
    model = load_model("deepseek-v3")
    h100 = load_hardware("dgx-h100")
    kw = dict(gpus=1024, dp=64, tp=2, pp=8, ep=64, global_batch=8192, virtual_stages=4,
              schedule="interleaved", sequence_parallel=True, zero=1, recompute="full")
    r = predict(model, h100, Plan(**kw, pipeline_layout=DSV3_LAYOUT))
    assert r.step_time_s > 0 and r.memory_per_gpu_bytes > 0
    # one layer moved from the first rank (7 -> 6) to the last (6 -> 7): the last rank, with
    # the output layer, the loss and the MTP module, takes longer, the first less
    t = _stage_times(model, h100, Plan(**kw, pipeline_layout=DSV3_LAYOUT))
    moved = _stage_times(model, h100, Plan(**kw, pipeline_layout="E|(tt|)*30tmL"))
    assert moved["last"] > t["last"] and moved["first"] < t["first"]
    # and all three dense layers now fall between (stages 1 and 2, ranks 1 and 2), not one on
    # rank 0: the middle ranks' average (perfmodel.step.moe.moe_layers) holds more dense layers
    assert family_of(model, h100, Plan(**kw, pipeline_layout="E|(tt|)*30tmL")).stage_dense \
        == (0, 0, 3)
    assert moved["middle"] < t["middle"]


def _stage_times(model, hw, plan):
    from perfmodel.evaluate import compile_family, values_of

    out = compile_family(family_of(model, hw, plan))(values_of(model, hw, plan))
    return {st: float(out[f"stage_time:{st}"]) for st in ("first", "middle", "last")}


def test_megatron_reads_and_writes_the_layout(tmp_path):
    text = ("--num-layers 7 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --vocab-size 1024 --micro-batch-size 1 "
            "--global-batch-size 8 --bf16 --pipeline-model-parallel-size 2 "
            "--pipeline-model-parallel-layout 'Ettt|t|tt|tL'")
    path = tmp_path / "args.txt"
    path.write_text(text)
    job = read_config(path)
    spec = resolve_model(job, None, None)
    spec, fields = resolve_plan(job, spec, {"gpus": 2})
    assert (fields["pipeline_layout"], fields["virtual_stages"], fields["schedule"]) \
        == ("Ettt|t|tt|tL", 2, "interleaved")
    plan = plan_from_dict(fields).check(spec)
    args = [a for group in megatron_arguments(spec, plan) for a in group]
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Ettt|t|tt|tL"
    assert "--num-virtual-stages-per-pipeline-rank" not in args  # Megatron takes it from there
    for extra, why in ((" --num-virtual-stages-per-pipeline-rank 4", "the config 4"),
                       (" --decoder-first-pipeline-num-layers 3", "not both"),
                       (" --recompute-granularity full --recompute-method block "
                        "--recompute-num-layers 1", "give --recompute-method uniform")):
        path.write_text(text + extra)
        with pytest.raises(PlanError, match=why):
            resolve_plan(read_config(path), spec, {"gpus": 2})


@pytest.mark.parametrize("layers, pp, v, embedding, loss, ranks", [
    # Qwen3-235B-A22B's 94 layers on pp 8 x 4 chunks as Megatron-Bridge's Qwen3 recipes split
    # them (account_for_embedding/loss_in_pipeline_split): 96 / 32 = 3 a chunk, the first and
    # the last chunk 2
    (94, 8, 4, True, True, (11,) + (12,) * 6 + (11,)),
    (94, 16, 1, True, True, (5,) + (6,) * 14 + (5,)),
    (31, 4, 1, True, False, (7, 8, 8, 8)),  # the embedding only: 32 / 4
    (30, 2, 2, False, True, (15, 15)),  # the loss only: 31 / 4 does not split
])
def test_megatrons_embedding_and_loss_accounting_is_a_layout(layers, pp, v, embedding, loss,
                                                             ranks):
    if (layers + embedding + loss) % (pp * v):
        with pytest.raises(PlanError, match="must split evenly"):
            accounted_layout(layers, pp, v, embedding=embedding, loss=loss)
        return
    layout = PipelineLayout.parse(accounted_layout(layers, pp, v, embedding=embedding,
                                                   loss=loss), pp)
    assert layout.decoder_layers == ranks and layout.layers == layers
    assert layout.virtual_stages == v


def test_the_refusal_of_an_uneven_interleaved_split_names_the_layout():
    model = load_model("qwen3-235b-a22b")
    kw = dict(gpus=256, dp=16, tp=2, pp=8, ep=32, global_batch=1024, virtual_stages=4,
              schedule="interleaved", sequence_parallel=True)
    with pytest.raises(PlanError, match=r"pipeline_layout 'Et\*2\|\(t\*3\|\)\*30t\*2L'"):
        Plan(**kw).check(model)
    assert Plan(**kw, pipeline_layout="Et*2|(t*3|)*30t*2L").check(model)


def test_megatron_reads_the_embedding_and_loss_accounting_as_a_layout(tmp_path):
    base = ("--num-layers 14 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --vocab-size 1024 --micro-batch-size 1 "
            "--global-batch-size 8 --bf16 --account-for-embedding-in-pipeline-split "
            "--account-for-loss-in-pipeline-split ")
    path = tmp_path / "args.txt"
    path.write_text(base + "--pipeline-model-parallel-size 4 "
                           "--num-virtual-stages-per-pipeline-rank 2")
    job = read_config(path)
    spec = resolve_model(job, None, None)
    spec, fields = resolve_plan(job, spec, {"gpus": 4})
    assert fields["pipeline_layout"] == "Et*1|(t*2|)*6t*1L"  # 16 / 8 a chunk
    assert plan_from_dict(fields).check(spec).layout.decoder_layers == (3, 4, 4, 3)
    path.write_text(base)  # one stage: nothing to split
    spec, fields = resolve_plan(read_config(path), spec, {"gpus": 1})
    assert not fields.get("pipeline_layout")
    for extra, why in (("--pipeline-model-parallel-size 3", "must split evenly"),
                       ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                        "'Et*7|t*7L'", "not both")):
        path.write_text(base + extra)
        with pytest.raises(PlanError, match=why):
            resolve_plan(read_config(path), spec, {"gpus": 2})


def test_unequal_ranks_between_are_each_costed_as_the_slowest():
    """torchtitan's split of Llama 3 8B over pp 4 (32 + 1 + 1 effective: 9/9/8/8, the ends one
    short): the ranks between hold 9 and 8, each costed as 9; the middle stage is the one of
    equal ranks holding 9 each (the first and the last as given)."""
    model, h100 = load_model("llama3-8b"), load_hardware("dgx-h100")
    kw = dict(gpus=32, dp=8, pp=4, global_batch=64)
    unequal = Plan(**kw, pipeline_layout="E" + "|".join("t" * n for n in (8, 9, 8, 7)) + "L")
    assert unequal.layout.middle_layers == 9 and unequal.layout.decoder_layers == (8, 9, 8, 7)
    equal = Plan(**kw, pipeline_layout="E" + "|".join("t" * n for n in (7, 9, 9, 7)) + "L")
    assert equal.layout.middle_layers is None
    assert _stage_times(model, h100, unequal)["middle"] == pytest.approx(
        _stage_times(model, h100, equal)["middle"], rel=1e-9)
    out = predict(model, h100, unequal)
    assert out.step_time_s > 0


def test_the_validation_job_refuses_unequal_ranks_between():
    from validation.jobspec import check_job, job_parallel

    plan = Plan(gpus=32, dp=8, pp=4, global_batch=64,
                pipeline_layout="E" + "|".join("t" * n for n in (8, 9, 8, 7)) + "L")
    with pytest.raises(PlanError, match="unequal layers"):
        check_job(load_model("llama3-8b"), plan, job_parallel(plan))
