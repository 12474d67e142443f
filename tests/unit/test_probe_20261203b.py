"""Regressions from the second 2026-12-03 probe of predict and recommend: flash attention asked
for where no measured kernel runs the plan's dtype is said to be costed at the GEMM efficiency;
recommend --emit-config searches what each framework runs and says what it passed over; a
ranked plan carries no option predict refuses as idle."""

from __future__ import annotations

import json

import pytest

from perfmodel.cli import main

PLAN = ("predict", "--model", "llama3-8b", "--gpus", "8")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out, out.err


@pytest.mark.parametrize("hardware, dtype, runs", [
    ("dgx-h100", "fp32", "its kernels run bf16, fp16"),
    ("dgx-h100", "tf32", "its kernels run bf16, fp16"),
    ("mi325x", "bf16", "its spec has no flash kernel")])
def test_flash_without_a_measured_kernel_for_the_dtype_is_said(capsys, hardware, dtype, runs):
    """Regression: H100 in fp32 or tf32 with --attention flash (no measured kernel runs either)
    was costed at the GEMM efficiency without a word, while naming H100's default kernel
    (--attention-kernel cudnn) refused the same plan."""
    code, _, err = _run(capsys, *PLAN, "--hardware", hardware, "--dtype", dtype,
                        "--attention", "flash")
    assert code == 0
    assert (f"note: flash attention in {dtype}: no flash kernel of {hardware} is measured for "
            f"{dtype} ({runs}): costed as the fused kernel's FLOPs at {hardware}'s {dtype} GEMM "
            "efficiency") in err
    code, out, _ = _run(capsys, *PLAN, "--hardware", hardware, "--dtype", dtype,
                        "--attention", "flash", "--json")
    assert any("no flash kernel" in note for note in json.loads(out)["extrapolations"])


def test_a_measured_kernel_and_the_unfused_path_say_nothing(capsys):
    for attention in ("flash", "unfused"):
        code, _, err = _run(capsys, *PLAN, "--hardware", "dgx-h100", "--attention", attention)
        assert code == 0 and "no flash kernel" not in err


@pytest.mark.parametrize("hardware, dtype, refused", [
    ("dgx-h100", "bf16", True), ("dgx-h100", "fp32", False), ("mi325x", "bf16", False)])
def test_a_head_size_beyond_the_measured_kernels_is_refused_or_said(capsys, tmp_path, hardware,
                                                                   dtype, refused):
    """head_dim 512 with --attention flash: refused where a measured kernel runs the dtype (they
    stop at 256); where none is measured (fp32 runs PyTorch's memory-efficient kernel, a CPU's
    SDPA any head size) costed at the GEMM efficiency, and said."""
    spec = tmp_path / "hd512.yaml"
    spec.write_text("base: llama3-8b\nhead_dim: 512\n")
    code, _, err = _run(capsys, "predict", "--model", str(spec), "--gpus", "8", "--hardware",
                        hardware, "--dtype", dtype, "--attention", "flash")
    if refused:
        assert code == 4
        assert err.strip() == ("error: flash_attention: head_dim 512 is above the 256 flash "
                               "kernels run; use --attention unfused")
    else:
        assert code == 0 and f"no flash kernel of {hardware} is measured for {dtype}" in err


# ---- recommend (the same probe) ----

def _recommend(capsys, tmp_path, *args: str) -> tuple[int, dict, str]:
    code, out, err = _run(capsys, "recommend", "--hardware", "dgx-h100", *args, "--json")
    return code, (json.loads(out) if out.strip() else {}), err


def test_deepspeed_is_written_its_fastest_plan_with_the_gather_overlapped_under_zero_3_only(
        capsys, tmp_path):
    """Regression: the search overlapped every ZeRO 1-2 plan's parameter gather, which DeepSpeed
    cannot run (its ZeRO 1-2 gather in the optimizer step), so --emit-config deepspeed wrote its
    second plan (ZeRO 3, 3.26 s) where a ZeRO 2 plan without that overlap (3.05 s) was writable,
    and refused outright at --top 1."""
    code, rec, err = _recommend(capsys, tmp_path, "--model", "llama3-8b", "--gpus", "16",
                                "--global-batch", "64", "--attention", "flash", "--top", "1",
                                "--emit-config", "deepspeed", str(tmp_path / "ds"))
    assert code == 0 and rec["emitted"]["plan_rank"] == 1
    best = rec["plans"][0]["plan"]
    assert best["zero"] in (1, 2) and not best["overlap_param_gather"]
    assert "parameter gather overlapped with zero 3" in rec["emitted"]["searched"]
    faster = rec["emitted"]["fastest_of_any_framework"]  # the same plan with the overlap
    assert faster["step_time_s"] < rec["plans"][0]["step_time_s"]
    assert "param-overlap" in faster["plan"]
    assert "note: --emit-config deepspeed searched the plans it writes" in err


def test_torchtitan_is_written_a_plan_its_ddp_runs(capsys, tmp_path):
    """Regression: ZeRO 0 with tp or pp > 1 (torchtitan's DDP refuses it) filled the ranking, so
    --emit-config torchtitan refused llama3-70b on 64 GPUs unless --top reached plan 15."""
    code, rec, _ = _recommend(capsys, tmp_path, "--model", "llama3-70b", "--gpus", "64",
                              "--global-batch", "128", "--top", "3",
                              "--emit-config", "torchtitan", str(tmp_path / "tt"))
    assert code == 0 and rec["emitted"]["plan_rank"] == 1
    for row in rec["plans"]:
        plan = row["plan"]
        assert plan["zero"] == 3 or plan["dp"] == 1 or plan["tp"] == plan["pp"] == 1


def test_an_emit_the_model_cannot_take_says_so_without_asking_for_more_plans(capsys, tmp_path):
    code, _, err = _recommend(capsys, tmp_path, "--model", "qwen3-30b-a3b", "--gpus", "16",
                              "--global-batch", "64", "--top", "3",
                              "--emit-config", "torchtitan", str(tmp_path / "tt"))
    assert code == 4
    assert "not one of torchtitan's llama3 flavors" in err
    assert "(and so is each of the 2 runners-up)" in err and "--top" not in err


def test_an_emit_search_with_no_plan_names_what_the_framework_keeps_to(capsys, tmp_path):
    """Regression: the refusal showed the writer's internal pins as a Python dict, without
    naming --emit-config."""
    code, _, err = _recommend(capsys, tmp_path, "--model", "llama3-8b", "--gpus", "48",
                              "--global-batch", "64", "--emit-config", "deepspeed",
                              str(tmp_path / "ds"))
    assert code == 4
    assert err.startswith("error: --emit-config deepspeed searches the plans it writes (tp 1, "
                          "pp 1, cp 1, ep 1, etp 1, tp_layout 1d")
    assert "{'" not in err


def test_a_ranked_plan_is_one_predict_takes(capsys, tmp_path):
    """Regression: a plan-wide option the best plan has no use for (the tensor-parallel
    backward at tp 1) stayed in its plan, which predict then refused."""
    code, rec, _ = _recommend(capsys, tmp_path, "--model", "llama3-8b", "--gpus", "16",
                              "--global-batch", "64", "--tp-backward", "dtensor", "--top", "2")
    assert code == 0
    idle = [row["plan"] for row in rec["plans"] if row["plan"]["tp"] == 1]
    assert idle  # the search's best plans take tp 1
    assert all(plan.get("tp_backward") is None for plan in idle)


def test_a_searched_plan_without_expert_parallelism_has_the_default_dispatcher():
    from perfmodel import load_hardware, load_model
    from perfmodel.search import SearchRequest, search

    result = search(load_model("qwen3-30b-a3b"), load_hardware("dgx-h100"),
                    SearchRequest(gpus=(16,), global_batch=64, ep=1, ep_dispatcher="deepep"),
                    top=2, prune=True)
    plans = result.best_plans()
    assert plans and all(p.ep == 1 and p.ep_dispatcher.value == "alltoall" for p in plans)


@pytest.mark.parametrize("args, says", [
    (("--model", "qwen3-30b-a3b", "--ep", "1", "--ep-dispatcher", "deepep"),
     "ep_dispatcher deepep exchanges a mixture of experts' tokens over expert parallelism "
     "(ep > 1), and --ep pins ep 1"),
    (("--model", "llama3-8b", "--tp", "1", "--tp-backward", "dtensor"),
     "tp_backward dtensor applies to tensor parallelism (tp > 1), and --tp pins tp 1")])
def test_an_option_its_pinned_degree_leaves_idle_is_refused(capsys, tmp_path, args, says):
    code, _, err = _recommend(capsys, tmp_path, *args, "--gpus", "16", "--global-batch", "64")
    assert code == 4 and says in err


# ---- collective and explain (the same day's third probe) ----

def test_ranks_that_are_not_whole_nodes_name_the_default_not_a_flag_never_given(capsys):
    """Regression: --ranks 12 on dgx-h100 blamed '--ranks-per-node ... got 8', an option the
    user never gave."""
    code, _, err = _run(capsys, "collective", "--op", "all_reduce", "--bytes", "1GiB",
                        "--ranks", "12", "--hardware", "dgx-h100")
    assert code == 4
    assert err.strip() == ("error: --ranks 12 is not whole nodes of dgx-h100's 8 GPUs (the "
                           "default --ranks-per-node): give --ranks-per-node (one that divides "
                           "12: 1, 2, 3, 4, 6), or --ranks a multiple of 8")


def test_the_largest_size_the_limit_names_is_accepted():
    from perfmodel.collective import MAX_BYTES, parse_bytes

    assert parse_bytes("1EiB") == MAX_BYTES == 2.0**60
    assert parse_bytes("1PB") == 1e15 and parse_bytes("2PiB") == 2.0**51


def test_explain_refuses_contributors_no_split_of_a_layer_graph_uses(capsys):
    """Regression: explain took --contributors specialised for AlexNet on 16 GPUs (its
    narrowest layer has 64 units: no Pr splits it over fewer ranks), where predict refuses it."""
    code, _, err = _run(capsys, "explain", "--model", "alexnet", "--hardware", "dgx-v100",
                        "--gpus", "16", "--global-batch", "256", "--contributors", "specialised")
    assert code == 2 and "alexnet has none at any Pr x Pc split of 16 GPUs" in err
    code, _, _ = _run(capsys, "explain", "--model", "alexnet", "--hardware", "dgx-v100",
                      "--gpus", "128", "--global-batch", "256", "--contributors", "specialised")
    assert code == 0  # at 128 GPUs, Pr 128 splits the 64-unit layer over fewer ranks


def test_explain_says_its_closed_form_leaves_out_sync_norm_and_split_collectives(capsys):
    """Regression: with --norm sync or --collective-variant split, T_comm(P_r) and its
    minimiser were printed unchanged, as if of the plan asked for."""
    args = ("explain", "--model", "resnet50", "--hardware", "dgx-v100", "--gpus", "16",
            "--global-batch", "256")
    _, plain, _ = _run(capsys, *args)
    assert "Gholami et al.'s case" not in plain
    _, out, _ = _run(capsys, *args, "--norm", "sync", "--collective-variant", "split")
    assert "T_comm(P_r) above is Gholami et al.'s case, the fused collectives without " \
           "synchronized statistics: synchronized batch norm's" in out
    assert "(--collective-variant split: gather or reduce, then broadcast)" in out


def test_explain_names_the_stage_sums_an_overlapped_step_term_holds(capsys):
    """Regression: with the data-parallel overlaps, comm/dp's formula held its window's host
    and device sums whole: 1.8 MB of output, one line of 1.8 million characters."""
    code, out, _ = _run(capsys, "explain", "--model", "llama3-8b", "--hardware", "dgx-h100",
                        "--gpus", "64", "--dp", "8", "--tp", "8", "--global-batch", "512",
                        "--zero", "1", "--overlap-grad-sync", "--overlap-param-gather",
                        "--term", "comm/dp")
    assert code == 0
    assert len(out) < 100_000 and max(map(len, out.splitlines())) < 30_000
    formula = out.split("- comm/dp (T_dp) = ", 1)[1].splitlines()[1]
    # its windows, the last stage's backward and the first's forward, named and defined (since
    # 2026-12-07: the host's share in them too, and the sum of both every micro-batch's
    # gathers hide behind)
    for name in ("B_last", "F_first", "B_last + F_first"):
        assert name in formula
    assert "  B_last = " in out and "  F_first = " in out
    # with --latex, defined as the formulas print them
    _, latex, _ = _run(capsys, "explain", "--model", "llama3-8b", "--hardware", "dgx-h100",
                       "--gpus", "64", "--dp", "8", "--tp", "8", "--global-batch", "512",
                       "--zero", "1", "--overlap-grad-sync", "--overlap-param-gather",
                       "--term", "comm/dp", "--latex")
    assert "  B_{last} = " in latex and "B_{last}" in latex.split("(T_dp) = ", 1)[1]


def test_explain_names_the_windows_a_zero3_mixture_of_experts_hides_behind(capsys):
    """Regression: explain of Mixtral 8x7B under ZeRO 3 with the parameter gather overlapped
    printed 5.1 MB (two lines of 2.5 million characters, 18 s): its comm/dp held every stage's
    forward and the host's share whole, inside sums and products sympy had merged them into."""
    code, out, _ = _run(capsys, "explain", "--model", "mixtral-8x7b", "--hardware", "dgx-h100",
                        "--gpus", "16", "--tp", "8", "--ep", "2", "--sequence-parallel",
                        "--zero", "3", "--overlap-param-gather", "--global-batch", "32",
                        "--seq-len", "4096", "--term", "comm/dp")
    assert code == 0
    assert len(out) < 100_000 and max(map(len, out.splitlines())) < 50_000
    formula = out.split("- comm/dp (T_dp) = ", 1)[1].splitlines()[1]
    for name in ("F_first", "B_last"):
        assert name in formula and f"  {name} = " in out


def test_explain_term_prints_no_empty_section(capsys):
    args = ("explain", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
            "--global-batch", "8", "--term")
    _, out, _ = _run(capsys, *args, "comm/dp")
    assert "step terms (per step):" in out and "per micro-batch terms" not in out
    _, out, _ = _run(capsys, *args, "compute/forward/gemm")
    assert "per micro-batch terms" in out and "step terms (per step):" not in out


def test_explain_names_the_share_a_pool_of_overlaps_hides_together(capsys):
    """FSDP's gathers and reductions share the backwards (a pool: perfmodel.step.compose); the
    share they hide together, written whole in each of comm/dp's exposed terms, repeated every
    collective's time: 233 KB of output, a line of 99,000 characters (a fuzz of explain's
    output, 2026-12-07). Named r_fsdp, defined once: 122 KB, as before the pool (106 KB)."""
    code, out, _ = _run(capsys, "explain", "--model", "llama3-8b", "--hardware", "dgx-h100",
                        "--dp", "16", "--zero", "3", "--overlap-grad-sync",
                        "--overlap-param-gather", "--global-batch", "64")
    assert code == 0
    assert len(out) < 150_000 and max(map(len, out.splitlines())) < 50_000
    assert "  r_fsdp = " in out and "r_fsdp" in out.split("- comm/dp (T_dp) = ", 1)[1]
