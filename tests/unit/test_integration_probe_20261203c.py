"""The probe of 2026-12-03 (c), where its fixes met: perfmodel's own outputs read back as plans,
numbers too long for a float, and --emit-config's search keeping to what the writer writes."""

from __future__ import annotations

import csv

from tests.unit.test_bad_input import run_main

LLAMA = ["--model", "llama3-8b", "--hardware", "dgx-h100"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_recommend_csv_reads_back_as_plans_its_results_predicted_again(tmp_path):
    # recommend --csv writes its search's evaluated and objective and each plan's results beside
    # the plan; --batch refused them as unknown columns
    plans = tmp_path / "plans.csv"
    code, _, err = run_main(["recommend", *LLAMA, "--gpus", "8", "--global-batch", "16",
                             "--tp", "2", "--pp", "1", "--csv", str(plans)])
    assert code == 0, err
    written = _rows(plans)[:3]
    with open(plans, "w", newline="") as f:  # three rows, one with a stale result
        writer = csv.DictWriter(f, fieldnames=list(written[0]))
        writer.writeheader()
        writer.writerows(written)
    out = tmp_path / "out.csv"
    code, _, err = run_main(["predict", "--batch", str(plans), *LLAMA, "--out", str(out)])
    assert code == 0, err
    again = _rows(out)
    assert "evaluated" not in again[0] and "objective" not in again[0]
    for before, after in zip(written, again, strict=True):
        assert float(after["step_time_s"]) == float(before["step_time_s"]) \
            or abs(float(after["step_time_s"]) / float(before["step_time_s"]) - 1) < 1e-12


def test_a_failed_row_keeps_no_result_it_was_given(tmp_path):
    plans = tmp_path / "plans.csv"
    plans.write_text("tp,gpus,global_batch,step_time_s,memory_per_gpu_bytes\n"
                     "3,3,3,1.5,1e9\n")  # 32 heads over tp 3: refused
    out = tmp_path / "out.csv"
    code, _, _ = run_main(["predict", "--batch", str(plans), *LLAMA, "--out", str(out)])
    assert code != 0
    row = _rows(out)[0]
    assert row["error"] and row["step_time_s"] == "" and row["memory_per_gpu_bytes"] == ""


def test_a_degree_of_hundreds_of_digits_is_refused_naming_its_range():
    # before: internal error: OverflowError: int too large to convert to float
    code, _, err = run_main(["predict", *LLAMA, "--dp", "1" + "0" * 400])
    assert code == 4 and "dp must be between 1 and 1e+07" in err and "401 digits" in err, err


def test_emit_torchtitan_searches_its_mesh_and_megatron_its_overlaps(tmp_path):
    # torchtitan's mesh orders the ranks tp, dp, pp: --top 1 wrote nothing ("the plan's the
    # layout cannot be written") where the best plan had another placement
    code, out, err = run_main(["recommend", *LLAMA, "--gpus", "16", "--global-batch", "64",
                               "--pp", "2", "--top", "1", "--emit-config", "torchtitan",
                               str(tmp_path / "tt")])
    assert code == 0, err
    assert "placement tp,dp,pp" in err and (tmp_path / "tt/job.toml").exists()
    # Megatron-LM asserts the parameter gather's overlap beside the gradient reduce's: searched
    # around, not refused after the search
    code, out, err = run_main(["recommend", *LLAMA, "--gpus", "16", "--global-batch", "64",
                               "--no-overlap-grad-sync", "--top", "1", "--emit-config",
                               "megatron", str(tmp_path / "mg")])
    assert code == 0, err
    args = (tmp_path / "mg/megatron_args.txt").read_text()
    assert "--overlap-param-gather" not in args and "--overlap-grad-reduce" not in args


def test_an_emit_refusal_of_a_whole_names_it_once():
    from perfmodel.configs.job import refuse_emit

    assert str(refuse_emit("megatron", "the model", "why")) == \
        "--emit-config megatron: the model cannot be written: why"
    assert str(refuse_emit("megatron", "tp 3", "why")) == \
        "--emit-config megatron: the plan's tp 3 cannot be written: why"


def test_a_measured_bf16_peak_holds_for_its_datasheet_twin_fp16():
    # a GPU's calibrate run measures bf16; dgx-h100's datasheet rates bf16 and fp16 alike
    # (989 TFLOP/s dense), so the preset's fp16 kept its datasheet rate beside the measured bf16
    # and, faster, became the default dtype
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.profile import apply_profile, profile_from_dict

    prof = profile_from_dict({"format": "perfmodel-profile", "version": 1, "complete": True,
                              "hardware": {"base": "dgx-h100",
                                           "peak_flops_per_s": {"bf16": 7.0e14}},
                              "fits": {}},
                             "profile p.json")
    hw = apply_profile(load_hardware("dgx-h100"), prof)
    assert hw.peak_flops_per_s["fp16"] == hw.peak_flops_per_s["bf16"] == 7.0e14
    assert hw.default_dtype() == "bf16"
