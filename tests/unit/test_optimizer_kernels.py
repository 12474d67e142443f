"""How the AdamW step runs (Plan.optimizer_kernels): the foreach passes' bytes, counted again on
torch's own step; what a plan, a profile and calibrate run make of them; the validation job's."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from calibration.run import _fit_framework
from perfmodel import Plan, PlanError, load_hardware, load_model, predict
from perfmodel.costs.precision import optimizer_step_bytes_per_param
from perfmodel.encode import optimizer_step_bytes, values_of
from perfmodel.specs.profile import profile_from_dict
from perfmodel.strategy import OptimizerKernels
from validation.jobspec import as_run

MODEL = "llama2-7b"


def _foreach_bytes_per_element(torch, dtype):
    """The bytes torch's foreach AdamW moves per parameter element in one step (after the first,
    which creates the states), counted op by op under the dispatcher: each foreach op reads its
    distinct tensor arguments and writes its first (in place) or its result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x]
        if isinstance(x, (list, tuple)):
            return [t for item in x for t in tensors(item)]
        return []

    class Bytes(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if "_foreach_" in func.__name__:
                read = {t.data_ptr(): t for t in tensors(args) if t.dim() > 0}
                written = tensors(args[0]) if func.__name__.split(".")[0].endswith("_") \
                    else tensors(out)
                Bytes.moved += sum(t.numel() * t.element_size() for t in read.values())
                Bytes.moved += sum(t.numel() * t.element_size() for t in written if t.dim() > 0)
            return out

    params = [torch.nn.Parameter(torch.randn(n, dtype=dtype)) for n in (64, 48, 32)]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    with Bytes():
        opt.step()
    return Bytes.moved / sum(p.numel() for p in params)


@pytest.mark.parametrize("dtype_name, precision, extra", [
    ("float32", "fp32", {}),
    ("bfloat16", "bf16", dict(grad_dtype="bf16", optimizer_dtype="bf16", master_weights="none")),
])
def test_foreach_adamw_moves_what_torch_s_step_moves(dtype_name, precision, extra):
    """torch's foreach AdamW, its bytes counted on its own ops: 4w + 2g + 14o a parameter, the
    fused kernel's 2w + g + 4o plus FOREACH_EXTRA (the clip and zeroing passes are the same for
    both and not torch.optim's)."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    counted = _foreach_bytes_per_element(torch, dtype)
    b = torch.tensor([], dtype=dtype).element_size()
    assert counted == 20 * b  # 4w + 2g + 14o, each b bytes
    fused = optimizer_step_bytes_per_param(precision, **extra)
    foreach = optimizer_step_bytes_per_param(precision, **extra, kernels="foreach")
    assert foreach - fused == counted - 7 * b  # the fused kernel's core: 2w + g + 4o


def test_a_foreach_plan_costs_its_passes_on_a_preset():
    """On a preset (no optimizer rate measured: one fused pass) the step's bytes go from the
    fused count to the foreach count: bf16 with fp32 master and states, 42 -> 94 a parameter;
    the step's device time with them (its host part, 8 launches, is the same)."""
    model, hw = load_model(MODEL), load_hardware("dgx-h100")
    plans = [Plan(gpus=1, global_batch=1), Plan(gpus=1, global_batch=1,
                                                optimizer_kernels="foreach")]
    assert [values_of(model, hw, p)["optimizer_step_bytes_per_param"] for p in plans] == [42, 94]
    fused, foreach = (predict(model, hw, p) for p in plans)
    assert foreach.breakdown_s["optimizer/step"] == pytest.approx(
        fused.breakdown_s["optimizer/step"] * 94 / 42, rel=1e-3)
    assert foreach.plan.to_dict()["optimizer_kernels"] == "foreach"
    assert "optimizer_kernels" not in fused.plan.to_dict()  # the default, as plans were written


def test_a_measured_rate_is_of_the_kernels_it_was_measured_on():
    """A profile's optimizer efficiency is over the fused count for the kernels it stepped: the
    same kernels cost the fused count at it; other kernels scale by what each moves."""
    hw = dataclasses.replace(load_hardware("dgx-h100"), optimizer_bandwidth_efficiency=0.5,
                             optimizer_kernels="foreach")
    args = ("bf16", None, None, None)
    assert optimizer_step_bytes(hw, *args, OptimizerKernels.FOREACH) == 42
    assert optimizer_step_bytes(hw, *args, OptimizerKernels.FUSED) == pytest.approx(42 * 42 / 94)
    preset = load_hardware("dgx-h100")  # nothing measured: a fused pass whatever it names
    assert optimizer_step_bytes(preset, *args, OptimizerKernels.FUSED) == 42
    assert optimizer_step_bytes(preset, *args, OptimizerKernels.FOREACH) == 94


def test_a_foreach_step_has_no_remainders():
    with pytest.raises(PlanError, match="remainders are Transformer Engine's FusedAdam's"):
        Plan(gpus=1, master_weights="remainders", optimizer_kernels="foreach")


def test_an_older_profile_names_its_kernels_by_its_fit():
    """A profile written before optimizer_kernels: memory/adamw_fused (a GPU's since 81c5a51)
    is fused, any other optimizer rate foreach; a profile without a rate names none."""
    def profile(fits, efficiency=0.5):
        hardware = {"name": "x", "optimizer_bandwidth_efficiency": efficiency} if efficiency \
            else {"name": "x"}
        return profile_from_dict({"format": "perfmodel-profile", "version": 1, "complete": True,
                                  "hardware": hardware, "fits": fits}, "p.json").hardware

    fit = {"kind": "memory_bandwidth", "kernel": "", "params": {
        "alpha_s": 1e-3, "bandwidth_bytes_per_s": 1e9, "bytes_per_param": 36},
        "median_rel_error": 0.0, "worst_rel_error": 0.0, "size_range": [1, 2], "n_points": 2}
    assert profile({"memory/adamw_fused": fit})["optimizer_kernels"] == "fused"
    assert profile({"memory/adamw_foreach": fit})["optimizer_kernels"] == "foreach"
    assert profile({})["optimizer_kernels"] == "foreach"
    assert "optimizer_kernels" not in profile({}, efficiency=0)


def test_calibrate_names_the_kernels_of_its_rate_and_refuses_an_unresolved_one():
    params = np.array([2e5, 8e5, 3.2e6])
    opt = pd.DataFrame({"kind": "optimizer", "params": params, "optimizer": "adamw_fused",
                        "time_s": 36 * params / 2e9})
    fits, hardware, notes = {}, {"memory_bandwidth_bytes_per_s": 8e9}, []
    _fit_framework(opt, fits, hardware, notes)
    assert hardware["optimizer_kernels"] == "fused"
    assert hardware["optimizer_bandwidth_efficiency"] == pytest.approx(0.25, rel=1e-3)
    # launch-bound steps: the time does not grow with the bytes (an H200's 0.2M-7M parameters)
    flat = opt.assign(time_s=0.86e-3 + 1e-15 * params)
    fits, hardware, notes = {}, {"memory_bandwidth_bytes_per_s": 8e9}, []
    _fit_framework(flat, fits, hardware, notes)
    assert "optimizer_bandwidth_efficiency" not in hardware
    assert "optimizer_kernels" not in hardware
    assert hardware["optimizer_overhead_s"] == pytest.approx(0.86e-3, rel=1e-3)
    assert any("did not grow with their bytes" in n for n in notes)


@pytest.mark.parametrize("backend, kernels", [("gloo", "foreach"), ("nccl", "fused")])
def test_the_validation_job_is_predicted_with_the_kernels_it_steps(backend, kernels):
    model = load_model("tiny-gpt")
    _, plan, note = as_run(model, Plan(gpus=1, global_batch=1, dtype="fp32"), backend)
    assert plan.optimizer_kernels.value == kernels
    assert ("AdamW foreach on CPU ranks" in note) == (backend == "gloo")
    _, plan, note = as_run(model, Plan(gpus=1, global_batch=1, dtype="fp32",
                                       optimizer_kernels="foreach"), backend)
    assert plan.optimizer_kernels.value == kernels
    assert ("AdamW fused on a GPU" in note) == (backend == "nccl")


def test_recommend_and_predict_take_the_kernels_from_the_command_line():
    """--optimizer-kernels reaches every ranked plan and the prediction, as the job's (not
    searched); a kernel name torch.optim does not have is a usage error."""
    from tests.unit.test_bad_input import run_main

    code, out, err = run_main(["recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100",
                               "--gpus", "8", "--global-batch", "16", "--optimizer-kernels",
                               "foreach", "--json"])
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert plans and all(p["plan"]["optimizer_kernels"] == "foreach" for p in plans)
    code, out, err = run_main(["predict", "--model", "tiny-gpt", "--hardware", "dgx-h100",
                               "--optimizer-kernels", "for-loop"])
    assert code == 2 and "for-loop" in err
