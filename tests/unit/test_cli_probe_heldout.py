"""Regressions a held-out probe of the command line found (FP8, context and expert parallelism,
fabric levels, recommend's pins): each named after what broke, each failing before its fix."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from perfmodel import load_model, predict
from perfmodel.search import SearchRequest
from tests.unit.test_bad_input import run_main


def _run(*args: str) -> tuple[int, str, str]:
    """perfmodel ARGS in this process, as the `perfmodel` script runs it: (exit code, out, err)."""
    return run_main(list(args))


def test_recommend_gpus_listed_twice_searches_each_count_once() -> None:
    # `--gpus 8,8` searched the 8-GPU plans twice: twice the plans counted, each plan ranked
    # twice in the table (the best plan and its copy one after the other)
    assert SearchRequest(gpus=(8, 8, 16, 8), global_batch=8).gpus == (8, 16)
    args = ("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--global-batch", "8",
            "--top", "3", "--json")
    code, once, _ = _run(*args, "--gpus", "8")
    code_twice, twice, _ = _run(*args, "--gpus", "8,8")
    assert code == code_twice == 0
    a, b = json.loads(once), json.loads(twice)
    assert b["enumerated"] == a["enumerated"]
    labels = [json.dumps(p["plan"], sort_keys=True) for p in b["plans"]]
    assert len(set(labels)) == len(labels)


def test_per_op_recompute_buffer_under_fp8_is_never_negative() -> None:
    # per-op recompute at a high tp: the whole layer's count fell below per-op's kept bytes
    # (some whole on every tp rank; bf16 ones under FP8), and the recompute buffer came out
    # negative (-16 MiB here, -9 GB in the golden corpus), a memory term printed by predict
    # and summed into the total
    plan = {"gpus": 8, "tp": 8, "sequence_parallel": True, "dtype": "fp8", "recompute": "op",
            "global_batch": 8}
    p = predict("llama3-8b", "dgx-h100", plan)
    assert p.memory_breakdown_bytes["activations/recompute_buffer"] >= 0
    assert all(v >= 0 for v in p.memory_breakdown_bytes.values())
    code, out, err = _run("predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                          "--gpus", "8", "--tp", "8", "--sequence-parallel", "--dtype", "fp8",
                          "--recompute", "op", "--global-batch", "8")
    assert code == 0, err
    assert not re.search(r"│\s*-\d", out)  # no negative cell in the tables


def test_per_op_recompute_buffer_in_bf16_is_never_negative() -> None:
    # not FP8 alone: Llama 2 7B in bf16 at tp 8 with sequence parallelism, and on the 2d and 3d
    # grids (the golden corpus held dozens of such plans with a negative buffer, to -9 GB)
    for layout, tp, sp in (("1d", 8, True), ("2d", 16, False), ("3d", 64, False)):
        p = predict("llama2-7b", "dgx-a100-80gb", {
            "gpus": tp, "tp": tp, "tp_layout": layout, "sequence_parallel": sp,
            "recompute": "op", "micro_batch": 16, "global_batch": 16, "dtype": "bf16"})
        assert p.memory_breakdown_bytes["activations/recompute_buffer"] >= 0, layout


def test_a_model_file_out_of_range_names_the_fields_own_range(tmp_path: Path) -> None:
    # a whole-number field of a model file was checked against one range for all (> 0 and
    # <= 1e10) before its own: mtp_layers -1 said "> 0" where 0 is allowed (and 100 the most),
    # layers -3 said "<= 1e+10" where 1e5 is the most, as did --seq-len -5 (1e8)
    cases = {"moe_first_dense: -1": ("mixtral-8x7b", "moe_first_dense must be >= 0 and <= 31"),
             "mtp_layers: -1": ("deepseek-v3", "mtp_layers must be >= 0 and <= 100"),
             "shared_experts: -1": ("mixtral-8x7b", "shared_experts must be >= 0"),
             "full_attention_every: -2": ("mistral-7b", "full_attention_every must be >= 0"),
             "layers: -3": ("llama3-8b", "layers must be > 0 and <= 100000,")}
    for line, (base, needle) in cases.items():
        spec = tmp_path / "m.yaml"
        spec.write_text(f"base: {base}\n{line}\n")
        code, _, err = _run("predict", "--model", str(spec), "--hardware", "dgx-h100")
        assert code == 3, err
        assert needle in err, (line, err)
        assert "1e+10" not in err
    code, _, err = _run("predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                        "--seq-len", "-5")
    assert code == 3 and "seq_len must be > 0 and <= 1e+08, got -5" in err, err
    assert load_model("llama3-8b", seq_len=4096).seq_len == 4096


def test_a_link_changed_in_part_beside_levels_is_refused_as_a_disagreement(
        tmp_path: Path) -> None:
    # a file over gb200-nvl72 (a fabric of levels) that changed inter_node's bandwidth alone was
    # told "missing required field 'inter_node.latency_s'": the latency is there, in levels[1];
    # what it changes is refused as every other disagreement with levels is
    spec = tmp_path / "gb.yaml"
    spec.write_text("base: gb200-nvl72\ninter_node:\n  bandwidth_bytes_per_s: 1.0e12\n")
    code, _, err = _run("predict", "--model", "llama3-8b", "--hardware", str(spec), "--gpus", "8")
    assert code == 3, err
    assert "inter_node must agree with levels" in err and "missing" not in err, err
    spec.write_text("base: dgx-h100\nlevels:\n"
                    "  - {name: nvlink, gpus: 8, bandwidth_bytes_per_s: 450.0e9,"
                    " latency_s: 3.4e-6}\n"
                    "  - {name: net, bandwidth_bytes_per_s: 50.0e9, latency_s: 1.4e-5}\n"
                    "intra_node:\n  bandwidth_bytes_per_s: 100.0e9\n")
    code, _, err = _run("predict", "--model", "llama3-8b", "--hardware", str(spec), "--gpus", "8")
    assert code == 3 and "intra_node must agree with levels" in err, err
    # a field given as levels gives it agrees, and is taken
    spec.write_text("base: gb200-nvl72\ninter_node:\n  call_latency_s: 8.4e-6\n")
    code, _, err = _run("predict", "--model", "llama3-8b", "--hardware", str(spec), "--gpus", "8")
    assert code == 0, err


def test_nearest_plans_that_do_not_fit_name_their_cp_and_ep() -> None:
    # when no plan fits, the nearest were named 'dp=4 tp=1 pp=1 zero3' on 8 GPUs (its cp=2 left
    # out: a plan of 4 GPUs), and DeepSeek-V3's three nearest by the same label (ep 1, 2, 4)
    code, out, err = _run("recommend", "--model", "llama3-70b", "--hardware", "dgx-h100",
                          "--gpus", "8", "--global-batch", "8", "--json")
    assert code == 4, err
    nearest = json.loads(out)["explanation"]["infeasible"]["nearest"]
    assert nearest
    for row in nearest:
        degrees = dict(re.findall(r"\b(dp|tp|pp|cp)=(\d+)", row["plan"]))
        product = 1
        for value in degrees.values():
            product *= int(value)
        assert product == 8, row["plan"]


def test_a_cp_or_ep_flag_the_plan_has_no_use_for_is_refused_not_ignored() -> None:
    # --cp-comm a2a with cp 1, --ep-dispatcher deepep with ep 1 or a dense model and
    # --expert-weighting output on a dense model were predicted as if not given (the last even
    # printed "routing weights on the experts' outputs" for Llama 3 8B)
    base = ("predict", "--model", "llama3-8b", "--hardware", "dgx-h100")
    moe = ("predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--seq-len", "4096",
           "--gpus", "8")
    for args, needle in (((*base, "--cp-comm", "a2a"), "cp_comm a2a applies to context"),
                         ((*base, "--ep-dispatcher", "deepep"), "the model has no experts"),
                         ((*moe, "--ep-dispatcher", "deepep"), "the plan has ep 1"),
                         ((*base, "--expert-weighting", "output"), "expert_weighting output")):
        code, out, err = _run(*args)
        assert code == 4, (args, err)
        assert needle in err and len(err.strip().splitlines()) == 1, err
        assert out == ""
    for args in ((*base, "--cp", "2", "--cp-comm", "a2a"),
                 (*moe, "--ep", "8", "--ep-dispatcher", "deepep"),
                 (*moe, "--expert-weighting", "output"),
                 (*base, "--ep-dispatcher", "alltoall")):
        code, _, err = _run(*args, "--json")
        assert code == 0, (args, err)


def test_recommend_names_the_option_pins_that_leave_a_degree_pin_no_plan() -> None:
    # --tp 1 --tp-comm-overlap: no plan (the overlap needs sequence parallelism, which needs
    # tp > 1), and the refusal blamed "the pins {'tp': 1}" beside the divisibility rules, none
    # of which tp 1 breaks, without naming tp_comm_overlap
    code, _, err = _run("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--gpus",
                        "8", "--global-batch", "8", "--tp", "1", "--tp-comm-overlap")
    assert code == 4, err
    first = err.strip().splitlines()[0]
    assert "the pins tp 1 and the options tp_comm_overlap true" in first, first


def test_the_batch_json_output_is_one_document_as_the_spec_page_says(tmp_path: Path) -> None:
    # docs/specs.md said "JSON lines with --json"; predict --batch --json prints one JSON
    # document (perfmodel.predict.batch/1) whose rows are the plans, which a JSON-lines reader
    # cannot read line by line
    plans = tmp_path / "plans.csv"
    plans.write_text("model,gpus,global_batch\ntiny-gpt,1,1\ntiny-gpt,2,2\n")
    code, out, err = _run("predict", "--hardware", "dgx-h100", "--batch", str(plans), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "perfmodel.predict.batch/1" and len(doc["rows"]) == 2
    text = " ".join((Path(__file__).parents[2] / "docs/specs.md").read_text().split())
    assert "JSON lines" not in text
    assert "`perfmodel.predict.batch/1`, whose `rows` are one object per plan" in text


def test_an_fp8_plans_sensitivity_to_peak_flops_moves_its_fp8_peak_too() -> None:
    # recommend --sensitivities moved the bf16 peak alone: an fp8 plan's linear GEMMs run at the
    # FP8 peak, so Mixtral in fp8 read -0.096 where 1% more peak FLOP/s of every dtype (what
    # --what-if peak_flops_per_s=1.01x does) takes 0.66% off its step
    from perfmodel import load_hardware
    from perfmodel.recommend import sensitivities
    from perfmodel.strategy import plan_from_dict

    hw, model = load_hardware("dgx-h100"), load_model("mixtral-8x7b", seq_len=4096)
    plan = {"gpus": 32, "dp": 16, "pp": 2, "ep": 8, "schedule": "zbv", "virtual_stages": 2,
            "zero": 2, "dtype": "fp8", "global_batch": 64}
    base = predict(model, hw, plan).step_time_s
    faster = hw.replace(peak_flops_per_s={k: v * 1.01 for k, v in hw.peak_flops_per_s.items()})
    measured = (predict(model, faster, plan).step_time_s / base - 1) / 0.01
    elasticity = sensitivities(model, hw, plan_from_dict(plan))["peak_flops_per_s"]
    assert elasticity < -0.5
    assert abs(elasticity - measured) < 0.02, (elasticity, measured)


def test_the_network_sensitivity_on_a_fabric_of_levels_moves_each_axis_link() -> None:
    # on a fabric of more than two levels each axis is priced on its own level (the symbols
    # AXIS_outer_bandwidth, ...): --sensitivities moved inter_bandwidth alone and read 0.000 for
    # Llama 3 70B on the 2:1 spine of docs/specs.md, whose gradient all-reduce over the spine is
    # 26% of the step; every level beyond the node 1% faster takes 0.26% off it
    from perfmodel.recommend import sensitivities
    from perfmodel.specs.hardware import hardware_from_dict, load_hardware_dict
    from perfmodel.strategy import plan_from_dict

    spine = Path(__file__).parents[2] / "docs/examples/h100-spine-2to1.yaml"
    data = load_hardware_dict(spine)
    hw, model = hardware_from_dict(data, "spine"), load_model("llama3-70b")
    plan = plan_from_dict({"gpus": 512, "tp": 8, "dp": 64, "global_batch": 512})
    faster = dict(data, levels=[dict(lv, bandwidth_bytes_per_s=float(
        lv["bandwidth_bytes_per_s"]) * 1.01) if i else lv for i, lv in enumerate(data["levels"])])
    measured = (predict(model, hardware_from_dict(faster, "faster"), plan).step_time_s
                / predict(model, hw, plan).step_time_s - 1) / 0.01
    # each level's, as --what-if levels.N.FIELD moves it (since 2026-12-07; inter_node, which
    # --what-if refuses on levels, before): the levels beyond the node together
    found = sensitivities(model, hw, plan)
    elasticity = sum(found[f"levels.{i}.bandwidth_bytes_per_s"]
                     for i in range(1, len(data["levels"])))
    assert "inter_node.bandwidth_bytes_per_s" not in found
    assert measured < -0.2
    assert abs(elasticity - measured) < 0.01, (elasticity, measured)


def test_a_profiles_levels_replace_its_bases_node_links(tmp_path: Path) -> None:
    # a hardware file's levels replace its base's intra_node and inter_node; a profile's did
    # not: its levels over dgx-h100 were refused, "intra_node must agree with levels", the
    # base's own intra_node (which the profile never gave) named as the disagreement
    profile = tmp_path / "prof.json"
    profile.write_text(json.dumps({
        "format": "perfmodel-profile", "version": 1, "complete": True, "fits": {},
        "hardware": {"base": "dgx-h100", "levels": [
            {"name": "nvlink", "gpus": 8, "bandwidth_bytes_per_s": 4.5e11, "latency_s": 3.4e-6},
            {"name": "net", "bandwidth_bytes_per_s": 5e10, "latency_s": 1.4e-5}]}}))
    for hardware in ((), ("--hardware", "dgx-h100")):
        code, _, err = _run("predict", "--model", "llama3-8b", "--profile", str(profile),
                            *hardware, "--gpus", "16", "--global-batch", "16", "--json")
        assert code == 0, err


def test_a_gpu_count_out_of_range_is_refused_as_gpus_not_as_a_derived_dp() -> None:
    # predict --gpus 0 (or -8, or 1e11) derived dp from it and was refused as "dp must be
    # between 1 and 1e+07, got 0": dp was never given; the count given is gpus
    for gpus in ("0", "-8", "99999999999"):
        code, _, err = _run("predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                            "--gpus", gpus)
        assert code == 4, err
        assert err.startswith(f"error: gpus must be between 1 and 1e+07, got {gpus}"), err


def test_recommend_keeps_a_pinned_cp_within_max_cp_as_it_keeps_tp_and_pp() -> None:
    # --cp 64 --max-cp 2 recommended cp=64 (the bound silently ignored), where --tp 8 --max-tp 2
    # and --pp 4 --max-pp 2 are refused as pins no plan satisfies
    req = SearchRequest(gpus=(16,), global_batch=16, cp=2, max_cp=1)
    from perfmodel.search import count_plans

    assert count_plans(load_model("llama3-8b"), req) == 0
    code, _, err = _run("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus",
                        "16", "--global-batch", "16", "--cp", "2", "--max-cp", "1")
    # a cap beside a pin of its axis is refused before the search (2026-12-02: the pin decides)
    assert code == 4, err
    assert "--max-cp caps a searched cp, and cp is pinned at 2" in err, err
    code, _, err = _run("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--gpus",
                        "8", "--global-batch", "8", "--dp", "2", "--micro-batch", "4",
                        "--max-micro-batch", "2")
    assert code == 4 and "micro_batch is pinned at 4" in err, err


def test_ulysses_refusal_says_replicated_only_where_tp_exceeds_the_kv_heads():
    """Llama 3 70B (8 kv heads) at tp 4: a rank holds 2 kv heads, which cp 4 does not divide; the
    refusal said '(2: one, replicated, where tp exceeds kv_heads)' though tp does not exceed them.
    At tp 16 the kv heads do not divide over tp, which is refused first."""
    base = ("predict", "--model", "llama3-70b", "--hardware", "dgx-h100", "--seq-len", "32768",
            "--cp", "4", "--cp-comm", "a2a", "--sequence-parallel", "--global-batch", "1")
    code, _, err = _run(*base, "--tp", "4", "--gpus", "16")
    assert code == 4 and "holds (2) divisible by cp (4)" in err and "replicated" not in err
    code, _, err = _run(*base, "--tp", "16", "--gpus", "64")
    assert code == 4 and "kv_heads (8) must be divisible by tp (16)" in err


def test_a_recompute_sub_option_the_policy_has_no_use_for_is_refused_not_ignored() -> None:
    # --recompute none --recompute-modules core_attn (the default module, which the plan reads
    # as none given) was predicted as if not given, as were --recompute-method uniform,
    # --recompute-num-layers 1 and --recompute-every 1 beside a policy that does not use them
    base = ("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8")
    for policy, option, value, needle in (
            ("none", "--recompute-modules", "core_attn", "applies to recompute selective"),
            ("full", "--recompute-modules", "core_attn", "applies to recompute selective"),
            ("selective", "--recompute-num-layers", "1", "applies to recompute full"),
            ("op", "--recompute-method", "uniform", "applies to recompute full"),
            ("none", "--recompute-every", "1", "applies to recompute selective, full or op")):
        for command in ("predict", "explain"):
            code, out, err = _run(command, *base[1:], "--recompute", policy, option, value)
            assert code == 4, (policy, option, err)
            assert f"{option} {needle}" in err and len(err.strip().splitlines()) == 1, err
            assert out == ""
    for args in (("--recompute", "selective", "--recompute-modules", "core_attn"),
                 ("--recompute", "full", "--recompute-method", "block",
                  "--recompute-num-layers", "2"),
                 ("--recompute", "op", "--recompute-every", "2")):
        code, _, err = _run(*base, *args, "--json")
        assert code == 0, (args, err)
    # recommend: where --recompute pins a policy that does not use the option; unpinned, the
    # option is every searched plan's that uses it
    search = ("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--gpus", "8",
              "--global-batch", "8", "--top", "1", "--json")
    code, out, err = _run(*search, "--recompute", "selective", "--recompute-num-layers", "1")
    assert code == 4 and "--recompute-num-layers applies to recompute full" in err, err
    assert out == ""
    code, _, err = _run(*search, "--recompute-num-layers", "1")
    assert code == 0, err


def test_an_overlap_of_a_sync_the_plan_has_none_of_is_refused_and_never_printed(
        tmp_path: Path) -> None:
    # dp 1: --overlap-grad-sync was taken and the summary printed "overlapped: grad", though the
    # plan reduces no gradient over any group (comm/dp 0); so --overlap-param-gather with ZeRO
    base = ("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--global-batch", "8")
    moe = ("predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--seq-len", "4096",
           "--gpus", "8", "--tp", "8", "--sequence-parallel", "--etp", "1")
    for args, flag in (((*base, "--gpus", "1", "--overlap-grad-sync"), "--overlap-grad-sync"),
                       ((*base, "--gpus", "8", "--tp", "8", "--zero", "1",
                         "--overlap-param-gather"), "--overlap-param-gather"),
                       ((*moe, "--ep", "8", "--overlap-grad-sync"), "--overlap-grad-sync")):
        code, out, err = _run(*args)
        assert code == 4, (args, err)
        assert err.startswith(f"error: {flag} overlaps the data-parallel"), err
        assert len(err.strip().splitlines()) == 1 and out == ""
    # a gradient sync over cp, or over the experts' own group (tp 8, ep 1: each expert's
    # gradients reduced over the 8 tp ranks), is there to overlap
    for args in ((*base, "--gpus", "2", "--cp", "2", "--overlap-grad-sync"),
                 (*moe, "--ep", "1", "--overlap-grad-sync")):
        code, out, err = _run(*args)
        assert code == 0 and "overlapped: grad" in out, (args, err)
    # a config's overlap is its framework's setting, read without refusal; the summary names
    # no overlap of a sync the plan does not run
    args_file = tmp_path / "args.txt"
    args_file.write_text("--num-layers 4 --hidden-size 256 --num-attention-heads 8 "
                         "--seq-length 512 --max-position-embeddings 512 --vocab-size 1000 "
                         "--micro-batch-size 2 --global-batch-size 8 --bf16 "
                         "--use-distributed-optimizer --overlap-grad-reduce "
                         "--overlap-param-gather")
    config = ("predict", "--from-config", str(args_file), "--hardware", "dgx-h100")
    code, out, err = _run(*config, "--gpus", "1")
    assert code == 0, err
    assert "overlapped" not in out, out
    code, out, err = _run(*config, "--gpus", "2")
    assert code == 0 and "overlapped: grad+param" in out, err


def test_a_tiny_rate_is_printed_with_its_digits_not_as_zero() -> None:
    # Llama 3 405B on one GPU at a million-token sequence: 3.33e-05 samples/s was printed
    # "0.00 samples/s", and a term of 0.02% of the step "0.0%"
    from perfmodel.output import fmt_bytes, fmt_fixed
    from perfmodel.render import fmt_seconds, fmt_share

    assert fmt_fixed(3.33e-5, ",.2f") == "3.33e-05"
    assert fmt_fixed(2.21e-4, ".1%") == "0.0221%"
    assert fmt_fixed(-4e-4, "+.3f") == "-0.0004" and fmt_fixed(4e-4, "+.3f") == "+0.0004"
    assert fmt_fixed(0.0, ",.2f") == "0.00" and fmt_fixed(1234.5, ",.2f") == "1,234.50"
    assert fmt_fixed(0.004, ",.2f") == "0.004" and fmt_fixed(0.005, ",.2f") == "0.01"
    assert fmt_seconds(2e-8) == "0.02 us" and fmt_seconds(2e-3) == "2.00 ms"
    # below a nanosecond a time is a smooth max's residue of a hidden host time, printed as 0
    # (render.NEGLIGIBLE_S), and so is its share
    assert fmt_seconds(2e-11) == "0.0 us" and fmt_share(2e-11, 1.0) == "0.0%"
    assert fmt_share(2.21e-4, 1.0) == "0.0221%"
    assert fmt_bytes(0.25) == "0.25 B" and fmt_bytes(512) == "512 B"
    code, out, err = _run("predict", "--model", "llama3-405b", "--hardware", "dgx-h100",
                          "--gpus", "1", "--global-batch", "64", "--micro-batch", "64",
                          "--seq-len", "1000000")
    assert code == 0, err
    assert "3.33e-05 samples/s" in out, out
    shown = [line for line in out.splitlines() if not line.lstrip("│ ").startswith("overhead/")]
    assert not re.search(r"(?<![\d.])0\.0+(%| samples| us| B\b)", "\n".join(shown)), out


def test_an_output_path_that_cannot_be_written_is_refused_before_any_computation(
        tmp_path: Path, monkeypatch: Any) -> None:
    # predict --batch PLANS --out /nonexistent/dir/x.csv predicted every row and only then
    # failed to write; so predict's --plot, --trace, --timeline and --html, sweep's --csv and
    # --plot: each is refused (exit 7, one line) before anything is computed
    def computed(*args: Any, **kw: Any) -> None:
        raise AssertionError("computed before the output path was checked")

    monkeypatch.setattr("perfmodel.batch.run_batch", computed)
    monkeypatch.setattr(sys.modules["perfmodel.predict"], "predict", computed)
    monkeypatch.setattr("perfmodel.layerwise.sweep", computed)
    plans = tmp_path / "plans.csv"
    plans.write_text("model,gpus,global_batch\ntiny-gpt,1,1\n")
    one = ("predict", "--model", "tiny-gpt", "--hardware", "dgx-h100")
    for args, needle in (
            (("predict", "--hardware", "dgx-h100", "--batch", str(plans), "--out",
              "/nonexistent/dir/x.csv"), "output directory does not exist: /nonexistent/dir"),
            ((*one, "--plot", str(tmp_path)), "it is a directory"),
            ((*one, "--html", "/dev/null"), "it is a character device"),
            ((*one, "--trace", "/nonexistent/t.json"), "output directory does not exist"),
            ((*one, "--timeline", str(tmp_path)), "it is a directory"),
            (("sweep", "--model", "alexnet", "--hardware", "dgx-h100",
              "--global-batch", "64", "--vary", "gpus=8,16", "--csv", "/nonexistent/s.csv"),
             "output directory does not exist")):
        code, out, err = _run(*args)
        assert code == 7, (args, err)
        assert needle in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "file").write_text("")
    code, _, err = _run("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--gpus",
                        "8", "--global-batch", "8", "--emit-config", "megatron",
                        str(tmp_path / "file" / "sub"))
    assert code == 7 and "is not a directory" in err, err


def test_an_infinite_or_nan_number_is_refused_as_not_finite() -> None:
    # collective --bytes 1e400 said "--bytes must be positive, got '1e400'" (read as inf), nan
    # "must be a size like 1e9"; --what-if peak_flops_per_s=1e400x blamed the hardware's fp32
    # peak ("peak_flops_per_s.fp32 must be a finite number, got inf"), =nanx was not a change;
    # sweep --vary inf said "finite and > 0": each says the value must be a finite number
    coll = ("collective", "--op", "all_reduce", "--ranks", "8", "--hardware", "dgx-h100")
    for value in ("1e400", "nan", "inf"):
        code, _, err = _run(*coll, "--bytes", value)
        assert code == 2, err  # not a size: the option's form, a usage error (docs/cli.md)
        assert err.strip() == f"error: --bytes must be a finite number, got '{value}'", err
    search = ("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--gpus", "8",
              "--global-batch", "8")
    for change, given in (("peak_flops_per_s=1e400x", "1e400"),
                          ("memory_bandwidth_bytes_per_s=nanx", "nan"),
                          ("memory_bandwidth_bytes_per_s=-inf", "-inf")):
        code, _, err = _run(*search, "--what-if", change)
        assert code == 2, err  # a malformed flag value: usage (docs/cli.md)
        assert err.strip() == f"error: --what-if: '{given}' in '{change}' must be a finite " \
                              "number (see 'perfmodel recommend --help')", err
    for option in ("--tokens", "--gpu-hour-price", "--memory-margin"):
        code, _, err = _run(*search, option, "inf")
        assert code == 2 and "must be a finite number, got 'inf'" in err, err
    code, _, err = _run("sweep", "--model", "alexnet", "--hardware", "dgx-h100", "--gpus", "8",
                        "--global-batch", "64", "--vary", "peak_flops_per_s=1e400")
    assert code == 2 and "--vary peak_flops_per_s: values must be finite numbers, got inf" in err


def test_a_tensor_layout_without_tensor_parallelism_is_refused_not_ignored() -> None:
    # --tp-layout 2d (or 2.5d, 3d) with tp 1 was predicted as 1d (the same step time and memory)
    # while the header said "tensor layout 2d"
    base = ("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8")
    for layout in ("2d", "2.5d", "3d"):
        code, out, err = _run(*base, "--tp-layout", layout)
        assert code == 4 and out == "", err
        assert err.strip() == f"error: tp_layout {layout} lays out tensor parallelism (tp > 1), " \
                              "and the plan has tp 1: give --tp, or leave --tp-layout out", err
    for args in (("--tp-layout", "1d"), ("--tp", "4", "--tp-layout", "2d", "--micro-batch", "2")):
        code, _, err = _run(*base, *args, "--json")
        assert code == 0, (args, err)


def test_recommend_refuses_pins_no_plan_it_searches_could_use() -> None:
    # recommend --gpus 1 --overlap-grad-sync and --cp 1 --cp-comm a2a searched and ranked plans
    # that have no data-parallel sync and no context parallelism, the pins changing nothing;
    # refused as predict refuses the same flags (exit 4, one line)
    base = ("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--global-batch", "8")
    for extra, flag in ((("--gpus", "1", "--overlap-grad-sync"), "--overlap-grad-sync"),
                        (("--gpus", "1", "--overlap-param-gather"), "--overlap-param-gather"),
                        (("--gpus", "8", "--cp", "1", "--cp-comm", "a2a"), "cp_comm a2a")):
        code, _, err = _run(*base, *extra)
        assert code == 4 and len(err.strip().splitlines()) == 1, err
        assert flag in err, err
    # cp left to the search, or more than one GPU: the pins have plans to apply to
    code, out, err = _run(*base, "--gpus", "8", "--cp-comm", "a2a", "--top", "1")
    assert code == 0, err
    code, out, err = _run(*base, "--gpus", "8", "--overlap-grad-sync", "--top", "1")
    assert code == 0, err


def test_recommend_sensitivities_table_reads_as_its_json() -> None:
    # the table printed every elasticity to three decimals: 0.000586 read +0.001 (70% off its
    # --json) beside 0.000172's +0.000172 (a fuzz, 2026-12-07); three significant digits now
    args = ("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
            "--global-batch", "64", "--top", "1", "--sensitivities")
    code, text, _ = _run(*args)
    code_json, out, _ = _run(*args, "--json")
    assert code == code_json == 0
    shown = dict(re.findall(r"│ ([\w.]+) +│ +([-+][0-9.e+-]+) │", text))
    data = json.loads(out)["sensitivities"]
    assert shown.keys() == data.keys()
    for name, value in data.items():
        assert float(shown[name]) == pytest.approx(value, rel=5e-3, abs=1e-12), name
