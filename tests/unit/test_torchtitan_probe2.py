"""torchtitan job configs it refuses, or reads otherwise than perfmodel did: DDP beside tp or pp,
a sequence not a multiple of tp x 2 cp, async TP at tp 1, ZBVZeroBubble's default split. The
torchtitan source cited is pytorch/torchtitan at 238fa99 (and 9810191bb~1, the same lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel import load_hardware, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.torchtitan import torchtitan_toml
from perfmodel.errors import PlanError
from perfmodel.specs.model import load_model
from perfmodel.strategy import Plan

BASE = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = {local}
seq_len = {seq}
[parallelism]
{par}
[activation_checkpoint]
mode = "full"
{extra}"""


def _config(tmp_path: Path, par: str, *, seq: int = 8192, local: int = 2,
            extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(BASE.format(par=par, seq=seq, local=local, extra=extra))
    return path


def _plan(path: Path, gpus: int) -> tuple[object, object, dict]:
    job = read_config(path)
    spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": gpus})
    return job, spec, plan


# torchtitan models/llama3/infra/parallelize.py lines 147-151 (238fa99): without FSDP, with
# dp_replicate > 1, `if parallel_dims.world_size != dp_replicate_mesh.size(): raise
# RuntimeError("DDP has not supported > 1D parallelism")`
@pytest.mark.parametrize("par, gpus, local", [
    ("data_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n"
     "tensor_parallel_degree = 2", 16, 2),
    ("data_parallel_replicate_degree = 4\ndata_parallel_shard_degree = 1\n"
     "pipeline_parallel_degree = 4", 16, 8),
    # shard -1 that the world leaves at one rank: DDP too
    ("data_parallel_replicate_degree = 8\ndata_parallel_shard_degree = -1\n"
     "tensor_parallel_degree = 2", 16, 2),
])
def test_ddp_beside_tensor_or_pipeline_parallelism_is_refused(tmp_path, par, gpus, local):
    with pytest.raises(PlanError, match=r"parallelism.data_parallel_replicate_degree \d: "
                                        "torchtitan's DDP runs alone"):
        _plan(_config(tmp_path, par, local=local), gpus)


def test_ddp_alone_still_predicts_and_is_not_written_beside_tp(tmp_path):
    _, _, plan = _plan(_config(tmp_path, "data_parallel_replicate_degree = 8\n"
                                         "data_parallel_shard_degree = 1"), 8)
    assert (plan["dp"], plan["zero"], plan["tp"]) == (8, 0, 1)
    # the writer: the same parallelize.py raise for a DDP plan with tp
    ddp_tp = Plan(gpus=16, dp=8, tp=2, zero=0, global_batch=16, sequence_parallel=True,
                  overlap_grad_sync=True, kernels="eager")
    with pytest.raises(PlanError, match="torchtitan's DDP runs alone"):
        torchtitan_toml(load_model("llama3-8b"), ddp_tp)


# torchtitan models/llama3/infra/parallelize.py lines 66-73 (238fa99): `assert
# job_config.training.seq_len % parallel_dims.seq_len_divisor == 0` before any degree is tested;
# distributed/parallel_dims.py line 372: seq_len_divisor = tp * (cp * 2)
@pytest.mark.parametrize("par, seq, divisor", [
    ("data_parallel_shard_degree = -1\ntensor_parallel_degree = 2", 8190, 4),
    ("data_parallel_shard_degree = -1\ntensor_parallel_degree = 1", 8191, 2),
    ("data_parallel_shard_degree = -1\ncontext_parallel_degree = 2", 8194, 4),
])
def test_a_sequence_torchtitan_asserts_on_is_refused(tmp_path, par, seq, divisor):
    with pytest.raises(PlanError, match=rf"training.seq_len {seq}: must be a multiple of .* = "
                                        rf"{divisor} \(torchtitan asserts"):
        _plan(_config(tmp_path, par, seq=seq), 16)
    _plan(_config(tmp_path, par, seq=seq + divisor - seq % divisor), 16)  # a multiple: read


# torchtitan models/llama3/infra/parallelize.py lines 76-96 (238fa99): maybe_enable_async_tp,
# and its compile check (distributed/tensor_parallel.py lines 16-23), run only under
# `if parallel_dims.tp_enabled:`
@pytest.mark.parametrize("compiled", [True, False])
def test_async_tp_at_tp_1_has_no_effect(tmp_path, compiled):
    path = _config(tmp_path, "data_parallel_shard_degree = -1\ntensor_parallel_degree = 1\n"
                             "enable_async_tensor_parallel = true",
                   extra=f"[compile]\nenable = {str(compiled).lower()}\n")
    job, spec, plan = _plan(path, 16)
    assert plan["tp_comm_overlap"] is False
    assert any(s.key == "parallelism.enable_async_tensor_parallel" and "no effect" in s.line()
               for s in job.ignored)
    assert predict(spec, load_hardware("dgx-h100"), Plan(**plan),
                   refuse_idle=False).step_time_s > 0
    # at tp 2 it is async TP, which needs the compiled model
    path = _config(tmp_path, "data_parallel_shard_degree = -1\ntensor_parallel_degree = 2\n"
                             "enable_async_tensor_parallel = true",
                   extra=f"[compile]\nenable = {str(compiled).lower()}\n")
    if compiled:
        assert _plan(path, 16)[2]["tp_comm_overlap"] is True
    else:
        with pytest.raises(PlanError, match="async TP needs torch.compile"):
            _plan(path, 16)


# torchtitan distributed/pipeline_parallel.py (238fa99): pipeline_llm splits the layers over
# pp x 2 stages with generate_llm_fqn_per_model_part (lines 236-344: first/last_stage_less_layers
# default 1 shorten the ends), then pipeline_module_split (lines 447-469) places stages r and
# 2 pp - 1 - r on rank r for ZBVZeroBubble and DualPipeV, asserting 2 stages a rank
ZBV = 'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "ZBVZeroBubble"\n' \
      "data_parallel_shard_degree = -1\n"


def test_zbv_is_read_where_its_split_is_even_and_refused_naming_its_keys_elsewhere(tmp_path):
    with pytest.raises(PlanError, match=r"parallelism.pipeline_parallel_first_stage_less_layers "
                                        r"1: \(last_stage_less_layers 1\) .* 4/5/4/4/4/4/4/3.* "
                                        "to 0 "):
        _plan(_config(tmp_path, ZBV, local=8), 16)
    with pytest.raises(PlanError, match="parallelism.pipeline_parallel_layers_per_stage 3: "
                                        "gives 3 stages a rank"):
        _plan(_config(tmp_path, ZBV + "pipeline_parallel_layers_per_stage = 3", local=8), 16)
    for first, last in ((0, 0), (1, 0)):  # 32 layers over 8 stages: 4 each
        path = _config(tmp_path, ZBV + f"pipeline_parallel_first_stage_less_layers = {first}\n"
                                       f"pipeline_parallel_last_stage_less_layers = {last}",
                       local=8)
        _, spec, plan = _plan(path, 16)
        assert (plan["schedule"], plan["virtual_stages"], plan.get("pipeline_layout")) == \
            ("zbv", 2, None)
        assert predict(spec, load_hardware("dgx-h100"), Plan(**plan),
                       refuse_idle=False).step_time_s > 0
    # DualPipeV splits and places its stages alike; perfmodel has no DualPipeV schedule
    with pytest.raises(PlanError, match="parallelism.pipeline_parallel_schedule DualPipeV"):
        _plan(_config(tmp_path, ZBV.replace("ZBVZeroBubble", "DualPipeV"), local=8), 16)
