"""torchtitan's older job configs (2024-04 to 2025-04: training.* and experimental.* names, a
count of pipeline micro-batches, split points) read under today's names, never left unread:
torchtitan/config_manager.py and the pipeline code of pytorch/torchtitan at the commits named."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.torchtitan import _legacy_split
from perfmodel.errors import PlanError, SpecError

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"
OLD = tomllib.loads((DATA / "torchtitan_2024_llama3_8b.toml").read_text())


def plan_of(path: Path, gpus: int) -> tuple[object, dict]:
    job = read_config(path)
    spec = resolve_model(job, None, None)
    _, plan = resolve_plan(job, spec, {"gpus": gpus})
    return job, plan


def write(tmp_path: Path, **sections: dict) -> Path:
    """The 2024 config with sections' fields changed (None: removed); a pipeline degree given in
    [experimental] (its name from 2024-05) replaces [training]'s (before)."""
    data = json.loads(json.dumps(OLD))
    if "pipeline_parallel_degree" in sections.get("experimental", {}):
        del data["training"]["pipeline_parallel_degree"]
    for section, fields in sections.items():
        data.setdefault(section, {}).update(fields)
        for key in [k for k, v in fields.items() if v is None]:
            del data[section][key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    return path


def test_the_published_2024_config_reads_every_field():
    job, plan = plan_of(DATA / "torchtitan_2024_llama3_8b.toml", gpus=64)
    assert not job.unknown  # data_parallel_degree, tensor_parallel_degree, ... were unread
    assert (plan["dp"], plan["tp"], plan["pp"], plan["zero"]) == (64, 1, 1, 3)
    read = {s.key: s.note for s in job.read}
    assert "parallelism.tensor_parallel_degree" in read["training.tensor_parallel_degree"]


def test_older_tensor_and_pipeline_degrees_are_the_plans(tmp_path):
    # 8 layers a stage would be 32 / 4; the micro-batches default to pp (4) per local batch of 8
    path = write(tmp_path, training=dict(tensor_parallel_degree=2, batch_size=8),
                 experimental=dict(pipeline_parallel_degree=4))
    job, plan = plan_of(path, gpus=64)
    assert (plan["tp"], plan["pp"], plan["dp"], plan["micro_batch"]) == (2, 4, 8, 2)
    assert "first_stage_layers" not in plan and "pipeline_layout" not in plan
    # a count given: 8 micro-batches of 1
    path = write(tmp_path, training=dict(batch_size=8),
                 experimental=dict(pipeline_parallel_degree=4, pipeline_parallel_microbatches=8))
    assert plan_of(path, gpus=32)[1]["micro_batch"] == 1


def test_older_default_split_gives_the_remainder_to_the_stages_after_the_first():
    # generate_split_points (torchtitan/parallelisms/pipelining_utils.py at 7c3a1fac2): stage 0
    # layers // stages, the next ones one more while the remainder lasts, the last the rest
    assert _legacy_split(80, 3) == [26, 27, 27]
    assert _legacy_split(32, 4) == [8, 8, 8, 8]
    assert _legacy_split(30, 4) == [7, 8, 8, 7]
    assert _legacy_split(7, 4) == [1, 2, 2, 2]


def test_older_interleaved_split_and_its_micro_batch_count(tmp_path):
    # the 8B's 32 layers over 3 ranks x 2 stages: 32 // 6 = 5 each, 2 more to stages 1 and 2
    path = write(tmp_path, training=dict(batch_size=12),
                 experimental=dict(pipeline_parallel_degree=3,
                                   pipeline_parallel_schedule="Interleaved1F1B",
                                   pipeline_parallel_microbatches=6))
    _, plan = plan_of(path, gpus=24)
    assert plan["virtual_stages"] == 2 and plan["micro_batch"] == 2
    assert plan["pipeline_layout"] == "E" + "|".join("t" * n for n in (5, 6, 6, 5, 5, 5)) + "L"
    # unset, the count was pp until 2024-12 and pp x stages after: refused, naming the field
    path = write(tmp_path, training=dict(batch_size=12),
                 experimental=dict(pipeline_parallel_degree=3,
                                   pipeline_parallel_schedule="Interleaved1F1B"))
    with pytest.raises(PlanError, match="experimental.pipeline_parallel_microbatches unset"):
        plan_of(path, gpus=24)


def test_split_points_give_the_stages(tmp_path):
    path = write(tmp_path, training=dict(batch_size=4),
                 experimental=dict(pipeline_parallel_degree=2, pipeline_parallel_microbatches=4,
                                   pipeline_parallel_split_points=["layers.15"]))
    _, plan = plan_of(path, gpus=16)
    assert (plan["first_stage_layers"], plan["last_stage_layers"]) == (15, 17)
    for points, why in ((["layers.15", "layers.9"], "increasing"), (["norm"], "names a layer"),
                        (["layers.40"], "32 layers"), (["layers.8", "layers.16"], "divide")):
        path = write(tmp_path, training=dict(batch_size=4),
                     experimental=dict(pipeline_parallel_degree=2,
                                       pipeline_parallel_microbatches=4,
                                       pipeline_parallel_split_points=points))
        with pytest.raises(PlanError, match=why):
            plan_of(path, gpus=16)


def test_module_lists_give_the_stages(tmp_path):
    data = tomllib.loads((DATA / "torchtitan_llama3_8b.toml").read_text())
    parts = [["tok_embeddings", *(f"layers.{i}" for i in range(10))],
             [f"layers.{i}" for i in range(10, 21)],
             [f"layers.{i}" for i in range(21, 32)] + ["norm", "output"]]
    data["parallelism"].update(pipeline_parallel_degree=3, module_fqns_per_model_part=parts,
                               data_parallel_shard_degree=-1)
    data["training"]["local_batch_size"] = 3
    path = tmp_path / "parts.json"
    path.write_text(json.dumps(data))
    job, plan = plan_of(path, gpus=24)
    assert plan["first_stage_layers"] == 10 and "last_stage_layers" not in plan  # as the middle
    assert "torchtitan's stages (3 x 1): 10/11/11 layers" in job.notes
    data["parallelism"]["module_fqns_per_model_part"] = [parts[1], parts[0], parts[2]]
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="embedding on the first"):
        plan_of(path, gpus=24)


def test_older_data_parallel_type_and_fields_that_disagree(tmp_path):
    path = write(tmp_path, training=dict(data_parallel_degree=8, data_parallel_type="ddp"))
    _, plan = plan_of(path, gpus=8)
    assert (plan["dp"], plan["zero"]) == (8, 0)
    path = write(tmp_path, training=dict(tensor_parallel_degree=2),
                 parallelism=dict(tensor_parallel_degree=4))
    with pytest.raises(PlanError, match="training.tensor_parallel_degree 2: disagrees"):
        read_config(path)


@pytest.mark.parametrize("section, fields, error, text", [
    ("training", dict(fp8_linear="dynamic"), PlanError, "training.fp8_linear dynamic"),
    ("float8", dict(enable_float8_linear=True), PlanError, "float8.enable_float8_linear"),
    ("model", dict(use_flex_attn=True), SpecError, "model.use_flex_attn"),
    ("model", dict(attn_mask_type="block_causal"), SpecError, "block_causal"),
    # a refusal of a renamed field names it as the config writes it
    ("experimental", dict(pipeline_parallel_schedule="LoopedBFS", pipeline_parallel_degree=2),
     PlanError, "experimental.pipeline_parallel_schedule LoopedBFS"),
])
def test_older_fields_perfmodel_cannot_model_are_refused(tmp_path, section, fields, error, text):
    with pytest.raises(error, match=text):
        plan_of(write(tmp_path, **{section: fields}), gpus=8)


def test_older_async_tp_without_compile_is_refused_where_tp_runs_it(tmp_path):
    # (at tp 1 torchtitan never reads it: parallelize.py's tp_enabled branch)
    with pytest.raises(PlanError, match="experimental.enable_async_tensor_parallel: torchtitan's "
                                        "async TP needs torch.compile"):
        plan_of(write(tmp_path, experimental=dict(enable_async_tensor_parallel=True),
                      training=dict(tensor_parallel_degree=2)), gpus=8)
