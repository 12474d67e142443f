"""Regressions of the Python API probe of 2026-12-03 (D5, D6, D7, D11, D12): what the spec
classes and the plan take from a caller, and what they refuse, in one line naming the field."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import perfmodel
from perfmodel import Plan, PlanError, SpecError, TransformerSpec
from perfmodel.idle import refuse_idle_flags
from perfmodel.specs.hardware import LinkSpec
from perfmodel.strategy import fields_given, plan_from_dict

PLAN = dict(gpus=8, tp=8, global_batch=8)
SMALL = dict(layers=24, hidden=1024, heads=16, seq_len=2048, vocab=50_000)


@pytest.fixture(scope="module")
def hw() -> perfmodel.HardwareSpec:
    return perfmodel.load_hardware("dgx-h100")


# --- D5: a hardware number given as text is stored as its number --------------------------------

@pytest.mark.parametrize("field, text, value", [
    ("memory_bandwidth_bytes_per_s", "3e12", 3e12),
    ("kernel_overhead_s", "1e-5", 1e-5),
    ("sustained_clock_fraction", "0.9", 0.9),
    ("memory_fragmentation", "0.1", 0.1),
    ("gpus_per_node", "8", 8),
])
def test_a_hardware_number_given_as_text_is_stored_as_its_number(hw, field, text, value):
    """HardwareSpec checked a numeric string and stored the string, so predict crashed with a
    TypeError inside the encoder (numpy's UFuncTypeError for gpus_per_node): the number is
    stored, of the field's type, as hardware_from_dict stores a spec file's (YAML reads 3e12 as
    text), and the prediction is the number's."""
    text_hw = hw.replace(**{field: text})
    stored = getattr(text_hw, field)
    assert stored == value and type(stored) is type(value)
    assert text_hw == hw.replace(**{field: value})
    got = perfmodel.predict("llama3-8b", text_hw, PLAN).step_time_s
    assert math.isfinite(got)
    assert got == perfmodel.predict("llama3-8b", hw.replace(**{field: value}), PLAN).step_time_s


def test_a_model_number_given_as_text_is_stored_as_its_number():
    """TransformerSpec stored the sizes it converted (layers "24") but only checked the others
    (experts "8" then crashed comparing a float with a str): every numeric field is stored as
    checked, as the hardware's are."""
    spec = TransformerSpec(**{**SMALL, "layers": "24"}, experts="8", top_k="2",
                           capacity_factor="1.25", sliding_window="512", mtp_layers="1")
    assert (spec.layers, spec.experts, spec.top_k, spec.sliding_window, spec.mtp_layers) == (
        24, 8, 2, 512, 1)
    assert type(spec.experts) is int and type(spec.capacity_factor) is float
    assert spec == TransformerSpec(**SMALL, experts=8, top_k=2, capacity_factor=1.25,
                                   sliding_window=512, mtp_layers=1)


@pytest.mark.parametrize("field, value", [
    ("intra_node", None), ("inter_node", None), ("intra_node", 3), ("inter_node", "ib"),
    ("gemm_efficiency", None), ("gemm_efficiency", "x"), ("peak_flops_per_s", None),
    ("peak_flops_per_s", 1e15), ("collectives", None), ("layer_costs", 3),
    ("flash_attention", "cudnn"), ("flash_attention_alternatives", None), ("levels", None),
])
def test_a_nested_hardware_field_of_the_wrong_type_is_refused_naming_it(hw, field, value):
    """hw.replace(intra_node=None) was built, then predict raised AttributeError 'NoneType' ...
    call_latency_s: a nested field that is not its type (nor a mapping of its fields) is refused
    when the spec is built, naming the field."""
    with pytest.raises(SpecError, match=field):
        hw.replace(**{field: value})


def test_a_link_given_as_a_mapping_is_built_as_a_spec_file_gives_it(hw):
    """A link given as a mapping of its fields (as a spec file gives it) is read into a
    LinkSpec, its numbers checked; one without its bandwidth is refused naming it."""
    link = hw.replace(intra_node={"bandwidth_bytes_per_s": "4.5e11", "latency_s": 2e-6})
    assert link.intra_node == LinkSpec(bandwidth_bytes_per_s=4.5e11, latency_s=2e-6)
    with pytest.raises(SpecError, match="intra_node is missing field 'bandwidth_bytes_per_s'"):
        hw.replace(intra_node={"latency_s": 2e-6})


# --- D6: numpy's numbers are numbers -------------------------------------------------------------

def test_numpy_numbers_are_taken_by_the_specs_and_stored_as_python_numbers(hw):
    """layers=np.int64(24) was refused as "must be a number, got int64" (it is one), as were
    np.float32 bandwidths and np.bool_ flags: numpy's scalars are taken as their Python
    equivalents and stored as those."""
    spec = TransformerSpec(**{**SMALL, "layers": np.int64(24), "hidden": np.int32(1024)},
                           gated_mlp=np.bool_(True), rotary_fraction=np.float32(1.0))
    assert spec == TransformerSpec(**SMALL, gated_mlp=True)
    assert type(spec.layers) is int and spec.gated_mlp is True
    model = perfmodel.load_model("llama3-8b", seq_len=np.int64(4096))
    assert model.seq_len == 4096 and type(model.seq_len) is int
    changed = hw.replace(gpus_per_node=np.int64(4), memory_bandwidth_bytes_per_s=np.float32(2e12),
                         asynchronous_device=np.bool_(True))
    assert type(changed.gpus_per_node) is int and changed.gpus_per_node == 4
    assert type(changed.memory_bandwidth_bytes_per_s) is float
    assert changed.asynchronous_device is True
    with pytest.raises(SpecError, match="gated_mlp must be true or false"):
        TransformerSpec(**SMALL, gated_mlp=np.int64(1))


def test_the_plan_refuses_numpy_booleans_where_it_refuses_python_ones():
    """Plan(gpus=np.bool_(True)) became gpus=1 while Plan(gpus=True) is refused: numpy's bool
    is refused as Python's is; numpy's integers are taken and stored as ints."""
    for flag in (True, np.bool_(True)):
        with pytest.raises(PlanError, match="gpus must be a whole number"):
            Plan(gpus=flag)
    plan = Plan(gpus=np.int64(8), tp=np.int32(8), global_batch=np.int64(8),
                sequence_parallel=np.bool_(True))
    assert plan == Plan(gpus=8, tp=8, global_batch=8, sequence_parallel=True)
    assert type(plan.gpus) is int and plan.sequence_parallel is True


# --- D7: a plan dict's bad degree is a PlanError -------------------------------------------------

@pytest.mark.parametrize("value", ["x", None, [2], {}, float("nan"), float("inf"),
                                   float("-inf"), 2.5, True, 10**400])
def test_a_bad_degree_in_a_plan_dict_is_refused_naming_it(value):
    """plan_from_dict multiplied int(dp) ... to derive gpus before Plan checked them: "x", None,
    [2], NaN and infinity leaked ValueError, TypeError and OverflowError. Each degree is checked
    as Plan checks it, and refused naming it."""
    with pytest.raises(PlanError, match="dp must be"):
        plan_from_dict({"dp": value, "global_batch": 8})
    with pytest.raises(PlanError, match="dp must be"):
        perfmodel.predict("llama3-8b", "dgx-h100", {"dp": value, "global_batch": 8})


def test_a_degree_written_as_a_whole_number_in_text_is_read_in_a_plan_dict():
    """dp="2.0" raised ValueError from int(): as Plan(dp="2.0") and predict --batch's cells
    take it, a whole number written as text is that number."""
    plan = plan_from_dict({"dp": "2.0", "tp": "4", "global_batch": 8})
    assert (plan.gpus, plan.dp, plan.tp) == (8, 2, 4)


# --- D11: a plan's own to_dict reads back --------------------------------------------------------

ROUND_TRIPS = [
    dict(gpus=64, dp=8, tp=8, global_batch=512, zero=1),
    dict(gpus=16, dp=2, tp=2, cp=4, cp_comm="a2a", global_batch=8, sequence_parallel=True,
         tp_comm_overlap=True),
    dict(gpus=16, dp=4, tp=2, cp=2, cp_comm="allgather", global_batch=8, sequence_parallel=True),
    dict(gpus=16, dp=4, tp=2, pp=2, ep=4, etp=2, global_batch=64, sequence_parallel=True),
    dict(gpus=16, dp=8, pp=2, ep=8, global_batch=64, schedule="interleaved", virtual_stages=2,
         ep_comm_overlap=True, ep_dispatcher="deepep"),
    dict(gpus=8, pp=8, global_batch=64, schedule="zbv", virtual_stages=2),
    dict(gpus=8, pp=8, global_batch=64, schedule="zb", virtual_stages=2),
    dict(gpus=8, pp=8, global_batch=64, schedule="gpipe"),
    dict(gpus=8, pp=4, dp=2, global_batch=64, schedule="interleaved", virtual_stages=4,
         pipeline_micro_batches=8),
    dict(gpus=8, dp=8, global_batch=64, dtype="fp8", fp8_recipe="delayed", fp8_output_layer=True,
         fp8_params=True, zero=1),
    dict(gpus=8, dp=8, global_batch=64, zero=3, overlap_param_gather=True, overlap_grad_sync=True,
         fsdp_reshard="step", defer_grad_sync=True, micro_batch=2),
    dict(gpus=8, dp=8, global_batch=64, recompute="selective", recompute_modules="core_attn,mlp",
         recompute_every=2),
    dict(gpus=8, dp=8, global_batch=64, recompute="full", recompute_method="block",
         recompute_num_layers=4),
    dict(gpus=8, dp=8, global_batch=64, recompute="op"),
    dict(gpus=8, dp=8, global_batch=64, cpu_offload_layers=4),
    dict(gpus=8, dp=8, global_batch=64, bf16_optimizer=True, zero=1),
    dict(gpus=8, dp=8, global_batch=64, grad_accumulation_fusion=False, expandable_segments=True,
         cross_entropy="te", expert_weighting="output"),
    dict(gpus=8, tp=8, global_batch=8, tp_backward="dtensor", stack="compiled",
         kernels="compiled", sequence_parallel=True),
    dict(gpus=8, tp=8, global_batch=8, stack="cuda-graphs", flash_attention=False),
    dict(gpus=8, tp=8, global_batch=8, attention_kernel="fa2"),
    dict(gpus=16, tp=2, pp=8, global_batch=64, first_stage_layers=3, last_stage_layers=3),
    dict(gpus=8, pp=4, dp=2, global_batch=64, pipeline_layout="Ettt|tttt|tttt|tttL"),
    dict(gpus=8, tp=8, global_batch=8, placement="dp,tp,pp"),
    dict(gpus=16, tp=4, cp=2, dp=2, global_batch=8, placement="tp,cp,dp,pp"),
    dict(gpus=8, tp=4, pp=2, global_batch=8, pp_scatter_gather=True),
    dict(gpus=4, tp=4, global_batch=8, tp_layout="2d", micro_batch=2),
    dict(gpus=8, tp=8, global_batch=8, tp_layout="2.5d", tp_depth=2, micro_batch=4),
    dict(gpus=8, dp=8, global_batch=64, grad_dtype="bf16", optimizer_dtype="bf16",
         master_weights="remainders", zero=1),
    dict(gpus=8, dp=8, global_batch=64, dtype="fp16"),
]


@pytest.mark.parametrize("fields", ROUND_TRIPS)
def test_a_plans_to_dict_reads_back_as_the_same_plan(fields):
    """Every field Plan.to_dict writes (cp > 1 and its cp_comm, ep and etp, the schedules, fp8,
    ZeRO 3 and FSDP's options, the recompute policies, the overlaps, layouts and placements)
    reads back through plan_from_dict as the same plan, and none of the fields it writes at
    their defaults (cp_comm p2p with cp 1, recompute_every 1 without recompute) is taken as
    asked for by perfmodel.idle (fields_given): the CLI refuses those only when given as
    flags."""
    plan = Plan(**fields)
    written = plan.to_dict()
    back = plan_from_dict(written)
    assert back == plan
    model = perfmodel.load_model("mixtral-8x7b" if plan.ep > 1 or plan.expert_weighting.value
                                 != "activation" else "llama3-8b")
    refuse_idle_flags(back, model, fields_given(back, written).__contains__)


def test_fields_given_still_names_an_option_set_to_other_than_its_default():
    """A plan dict's option other than its default where it changes nothing stays refused (the
    API refuses what the command line refuses): fields_given keeps it."""
    data = dict(gpus=8, tp=8, global_batch=8, cp_comm="a2a", recompute_every=1)
    plan = plan_from_dict(data)
    assert fields_given(plan, data) == {"gpus", "tp", "global_batch", "cp_comm"}
    with pytest.raises(PlanError, match="cp_comm a2a applies to context parallelism"):
        refuse_idle_flags(plan, perfmodel.load_model("llama3-8b"),
                          fields_given(plan, data).__contains__)


def test_predict_takes_back_its_own_plan():
    """predict(..., r.plan.to_dict()) (predict --json's "plan") was refused: cp_comm p2p
    applies to context parallelism. A plan perfmodel wrote predicts as the plan it was."""
    first = perfmodel.predict("llama3-8b", "dgx-h100",
                              dict(gpus=64, dp=8, tp=8, global_batch=512, zero=1))
    again = perfmodel.predict("llama3-8b", "dgx-h100", first.plan.to_dict())
    assert again.plan == first.plan and again.step_time_s == first.step_time_s


# --- D12: what a constructor, replace() and list_presets refuse ----------------------------------

def test_a_transformer_of_kind_layers_is_told_what_a_layer_graph_is():
    """TransformerSpec(kind="layers") said "kind must be 'transformer' or 'layers', got
    'layers'": it says a layer graph is another class, and a TransformerSpec's kind is
    'transformer'."""
    with pytest.raises(SpecError, match="kind 'layers' is a layer graph's") as err:
        TransformerSpec(**SMALL, kind="layers")
    assert "got 'layers'" not in str(err.value)


@pytest.mark.parametrize("build, error, says", [
    (lambda: Plan(), PlanError, "plan: missing required field 'gpus'"),
    (lambda: Plan(gpus=8, tpp=2), PlanError,
     "unknown plan field 'tpp' \\(did you mean 'tp'\\?\\)"),
    (lambda: Plan(8), PlanError, "plan takes its fields by name"),
    (lambda: Plan(gpus=1).replace(tpp=2), PlanError, "did you mean 'tp'"),
    (lambda: TransformerSpec(**SMALL, layer=2), SpecError,
     "unknown model field 'layer' \\(did you mean 'layers'\\?\\)"),
    (lambda: TransformerSpec(layers=2), SpecError, "model: missing required field 'hidden'"),
    (lambda: TransformerSpec(**SMALL).replace(hiden=8), SpecError, "did you mean 'hidden'"),
    (lambda: perfmodel.load_hardware("dgx-h100").replace(gpus_per_nod=4), SpecError,
     "unknown hardware field 'gpus_per_nod' \\(did you mean 'gpus_per_node'\\?\\)"),
    (lambda: LinkSpec(latency_s=1e-6), SpecError,
     "link: missing required field 'bandwidth_bytes_per_s'"),
])
def test_a_constructor_refuses_an_unknown_or_missing_field_in_words(build, error, says):
    """Plan(), Plan(tpp=2), TransformerSpec(foo=1), hw.replace(foo=1) and a missing required
    field raised a bare TypeError from the dataclass: each is the class's error, naming the
    field, with the closest name for a typo (as a plan dict's unknown field is)."""
    with pytest.raises(error, match=says):
        build()


def test_a_dataclass_replace_goes_through_the_same_checks(hw):
    """dataclasses.replace builds through the checked constructor too."""
    with pytest.raises(SpecError, match="did you mean 'gpus_per_node'"):
        dataclasses.replace(hw, gpus_per_nodes=4)


def test_list_presets_takes_a_kind():
    """list_presets("model") raised TypeError (it took no arguments): a kind gives that kind's
    names; another kind is refused naming the two; no kind is the mapping it was."""
    everything = perfmodel.list_presets()
    assert set(everything) == {"hardware", "models"}
    assert perfmodel.list_presets("model") == everything["models"]
    assert perfmodel.list_presets("models") == everything["models"]
    assert perfmodel.list_presets("hardware") == everything["hardware"]
    assert "llama3-8b" in perfmodel.list_presets("model")
    with pytest.raises(SpecError, match="kind must be 'model' or 'hardware'.*did you mean"):
        perfmodel.list_presets("modle")
