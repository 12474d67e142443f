"""The CLI as a user runs it: python -m perfmodel ... in a subprocess."""

import json

import pytest

PREDICT = ["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--gpus", "16", "--dp", "2",
           "--tp", "8", "--micro-batch", "2", "--global-batch", "32"]
REQUIRED_JSON = {"step_time_s", "samples_per_s", "tokens_per_s", "model_flops_per_step",
                 "tflops_per_gpu", "mfu", "memory_per_gpu_bytes", "fits_in_memory", "breakdown_s",
                 "memory_breakdown_bytes", "plan"}


def test_predict_table(run_cli):
    out = run_cli(*PREDICT)
    assert out.returncode == 0, out.stderr
    assert "step time" in out.stdout and "comm/tp" in out.stdout and "memory per GPU" in out.stdout


def test_predict_json(run_cli):
    out = run_cli(*PREDICT, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert REQUIRED_JSON <= set(data)
    assert data["plan"]["tp"] == 8 and data["plan"]["dp"] == 2
    assert sum(data["breakdown_s"].values()) == pytest.approx(data["step_time_s"])
    assert data["tokens_per_s"] == pytest.approx(32 * 4096 / data["step_time_s"])


def test_explain_plain_and_latex(run_cli):
    out = run_cli("explain", *PREDICT[1:])
    assert out.returncode == 0, out.stderr
    assert "T_step" in out.stdout and "comm/dp" in out.stdout and "intra-node latency" in out.stdout
    latex = run_cli("explain", *PREDICT[1:], "--latex", "--term", "comm/tp")
    assert latex.returncode == 0, latex.stderr
    assert "\\frac" in latex.stdout and "compute/forward" not in latex.stdout


def test_collective_command(run_cli):
    out = run_cli("collective", "--op", "all_reduce", "--bytes", "1GiB", "--ranks", "16",
                  "--hardware", "dgx-h100", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["scope"] == "mixed" and data["time_s"] > 0
    assert data["busbw_bytes_per_s"] == pytest.approx(data["algbw_bytes_per_s"] * 2 * 15 / 16)
    table = run_cli("collective", "--op", "send_recv", "--bytes", "64MB", "--ranks", "2",
                    "--ranks-per-node", "1", "--hardware", "dgx-h100")
    assert table.returncode == 0 and "busbw" in table.stdout


def test_presets(run_cli):
    out = run_cli("presets", "--json")
    data = json.loads(out.stdout)
    assert "dgx-a100-80gb" in data["hardware"] and "llama3-70b" in data["models"]
    counts = data["model_parameters"]
    assert set(counts) == set(data["models"])
    # a dense model: every parameter active; Mixtral 8x7B: 46.7B, 12.9B per token
    # (mistral.ai/news/mixtral-of-experts)
    assert counts["llama3-8b"]["active_parameters"] == counts["llama3-8b"]["parameters"]
    assert counts["mixtral-8x7b"]["parameters"] == pytest.approx(46.7e9, rel=0.005)
    assert counts["mixtral-8x7b"]["active_parameters"] == pytest.approx(12.9e9, rel=0.005)
    table = run_cli("presets").stdout
    assert "46.70B (12.88B active)" in table and "gb200-nvl72" in table
    # DeepSeek-V3's multi-token-prediction module apart: its README (deepseek-ai/DeepSeek-V3,
    # README.md, "685B ... 671B of the Main Model weights and 14B of the Multi-Token Prediction
    # (MTP) Module weights"); the checkpoint stores the module with its own copies of the
    # embedding table and output head, which perfmodel counts as the model's
    deepseek = counts["deepseek-v3"]
    assert deepseek["parameters"] == pytest.approx(671e9, rel=0.005)
    assert deepseek["mtp_parameters"] + 2 * 129280 * 7168 == pytest.approx(14e9, rel=0.05)
    assert counts["mixtral-8x7b"]["mtp_parameters"] == counts["llama3-8b"]["mtp_parameters"] == 0
    assert "671.03B (36.63B active*) + 11.61B MTP" in table


def test_predict_and_recommend_json_give_active_parameters(run_cli):
    predicted = json.loads(run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-b200",
                                   "--tp", "8", "--json").stdout)
    assert predicted["active_parameters"] == predicted["parameters"] == 8030261248
    recommended = json.loads(run_cli("recommend", "--model", "tiny-gpt", "--hardware",
                                     "gb200-nvl72", "--gpus", "8", "--global-batch", "8",
                                     "--json").stdout)
    assert recommended["active_parameters"] == recommended["parameters"] > 0


def test_batch_with_a_bad_row(run_cli, tmp_path):
    plans = tmp_path / "plans.csv"
    plans.write_text(
        "gpus,dp,tp,pp,micro_batch,global_batch,recompute,layers\n"
        "8,8,1,1,1,8,none,\n"
        "8,1,8,1,1,4,full,\n"
        "8,2,4,1,1,7,none,\n"  # line 4: 7 is not divisible by dp x micro_batch
        "8,1,1,8,1,8,selective,16\n"
    )
    out = run_cli("predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--batch", plans,
                  "--out", tmp_path / "results.csv")
    assert out.returncode == 5
    assert "plans.csv:4" in out.stderr and "global_batch" in out.stderr
    import csv

    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 4
    assert rows[2]["error"] and not rows[2]["step_time_s"]
    assert all(float(rows[i]["step_time_s"]) > 0 for i in (0, 1, 3))
    # the model column override (16 layers) makes row 5 cheaper than the same plan with 32 layers
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args,code,needle", [
    (["predict", "--model", "llama9", "--hardware", "dgx-h100"], 3, "unknown model preset"),
    (["predict", "--model", "llama2-7b", "--hardware", "nope.yaml"], 3, "not found"),
    (["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--tp", "3", "--gpus", "3"], 4,
     "divisible by tp"),
    (["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--dp", "0"], 4, "dp"),
    (["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--dp", "2", "--gpus", "4"], 4,
     "must equal gpus"),
    (["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--dtype", "int3"], 2, "int3"),
    (["predict", "--model", "llama2-7b"], 2, "--hardware"),
    (["collective", "--op", "all_reduce", "--bytes", "lots", "--ranks", "8", "--hardware",
      "dgx-h100"], 2, "--bytes"),
    (["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--batch", "missing.csv"], 5,
     "not found"),
])
def test_bad_input_is_one_line_without_traceback(run_cli, args, code, needle):
    out = run_cli(*args)
    assert out.returncode == code, (out.returncode, out.stderr)
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3


def test_malformed_yaml_model(run_cli, tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("layers: [4\n")
    out = run_cli("predict", "--model", bad, "--hardware", "dgx-h100")
    assert out.returncode == 3 and "not valid YAML" in out.stderr and "Traceback" not in out.stderr


def test_predict_with_a_profile_flags_extrapolated_collectives(run_cli, tmp_path):
    from tests.conftest import ROOT

    log = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
    made = run_cli("calibrate", "import-nccl-tests", log, "--out", tmp_path / "p.json")
    assert made.returncode == 0, made.stderr
    # that log measured all-reduces of 32 MB to 16 GB inside one node: tiny-gpt's are far smaller
    out = run_cli("predict", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--profile",
                  tmp_path / "p.json", "--gpus", "8", "--tp", "8", "--global-batch", "8", "--json")
    assert out.returncode == 0, out.stderr
    notes = json.loads(out.stdout)["extrapolations"]
    assert any("tp/cross_entropy/all_reduce" in n and "extrapolated" in n for n in notes)
    assert "note:" in out.stderr


def _h100_gemm_profile_predict(run_cli, tmp_path, model):
    """import-gemm of the H100 sweep, then predict --json of `model` on 8 ranks (tp 8) with it."""
    from tests.conftest import ROOT

    table = ROOT / "tests/data/gemm/xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"
    made = run_cli("calibrate", "import-gemm", table, "--out", tmp_path / "g.json",
                   "--base", "dgx-h100")
    assert made.returncode == 0, made.stderr
    out = run_cli("predict", "--model", model, "--hardware", "dgx-h100", "--profile",
                  tmp_path / "g.json", "--gpus", "8", "--tp", "8", "--global-batch", "8", "--json")
    assert out.returncode == 0, out.stderr
    return out


def test_a_gemm_only_profile_flags_no_collective_as_extrapolated(run_cli, tmp_path):
    # regression: a profile without collective fits (import-gemm) noted every collective of the
    # plan as "extrapolated", although the collectives are simply the preset's links
    out = _h100_gemm_profile_predict(run_cli, tmp_path, "llama2-7b")
    # llama2-7b's GEMMs on 8 ranks (1.7e10-1.3e11 FLOP) lie inside the sweep's (3.4e7-5.5e11)
    assert json.loads(out.stdout)["extrapolations"] == []
    assert "extrapolated" not in out.stderr


def test_gemms_outside_the_profiles_gemm_fit_are_flagged(run_cli, tmp_path):
    """tiny-gpt's GEMMs on 8 ranks (qkv: 2 x 128 x 96 x 256 = 6.3e6 FLOP) are smaller than the
    smallest shape of the H100 sweep (2 x 256^3 = 3.4e7 FLOP): extrapolated, and said so."""
    out = _h100_gemm_profile_predict(run_cli, tmp_path, "tiny-gpt")
    notes = json.loads(out.stdout)["extrapolations"]
    gemms = [n for n in notes if n.startswith("gemm ")]
    assert gemms and all("bf16 GEMM fit" in n for n in gemms)
    assert any(n.startswith("gemm qkv (1 x 128 x 96 x 256, 6.29e+06 FLOP)") for n in gemms)
    assert "extrapolated" in out.stderr
    # and its 32-wide heads beside H100's flash kernel, measured at head dims 64, 128, 256
    assert [n for n in notes if not n.startswith("gemm ")] == [
        "flash attention at head dim 32: dgx-h100's kernel (cuDNN fused flash attention "
        "(Transformer Engine / cuDNN 9, sm90)) was measured at head dims 64, 128, 256: head dim "
        "64's speed taken"]


def test_framework_costs_outside_what_calibrate_run_measured_are_flagged(run_cli):
    """docs/examples/cpu.json measured the layer under 1D tensor parallelism at tp 2, 128-512
    tokens per micro-batch and hidden 128-384; tiny-gpt is hidden 256, 128 tokens per sample."""
    from tests.conftest import ROOT

    def notes(*plan):
        out = run_cli("predict", "--model", "tiny-gpt", "--profile",
                      ROOT / "docs/examples/cpu.json", *plan, "--global-batch", "8", "--json")
        assert out.returncode == 0, out.stderr
        return [n for n in json.loads(out.stdout)["extrapolations"] if "framework cost" in n]

    assert notes("--gpus", "2", "--tp", "2") == []  # 128 tokens, hidden 256, tp 2: inside
    assert notes("--gpus", "2", "--tp", "2", "--micro-batch", "8") == [
        "framework cost of the layer (tp) at 1024 tokens per micro-batch (measured 128-512): "
        "extrapolated"]
    assert notes("--gpus", "4", "--tp", "4") == [
        "framework cost of the layer (tp) at tp 4 (measured 2): extrapolated"]
    assert notes("--gpus", "2", "--dp", "2") == []  # plain: no measurement, nothing to flag


def test_dtype_defaults_to_the_hardware_fastest_16_bit_type(run_cli):
    """V100 has no bf16: its default is fp16 (predict refused it before); H100 ties bf16 and fp16
    and takes bf16. The same default in predict, explain, recommend and --batch."""
    from perfmodel import load_hardware

    assert load_hardware("dgx-v100").default_dtype() == "fp16"
    assert load_hardware("dgx-h100").default_dtype() == "bf16"
    assert load_hardware("dgx-h100").replace(peak_flops_per_s={"fp32": 1e13}).default_dtype() \
        == "fp32"
    v100 = ["--model", "gpt2-small", "--hardware", "dgx-v100"]
    out = run_cli("predict", *v100, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["dtype"] == "fp16"
    assert run_cli("explain", *v100).returncode == 0
    rec = run_cli("recommend", *v100, "--gpus", "8", "--global-batch", "8", "--json", "--top", "1")
    assert rec.returncode == 0, rec.stderr
    data = json.loads(rec.stdout)
    assert data["plans"][0]["plan"]["dtype"] == "fp16"
    assert data["parameters"] == pytest.approx(124.4e6, rel=1e-3)  # GPT-2 small: 124M
    assert data["seq_len"] == 1024 and data["seq_len_from"] == "preset gpt2-small"
    for command in ("predict", "recommend", "validate"):
        help_text = " ".join(run_cli(command, "--help").stdout.split())  # unwrapped
        assert "default: the hardware's fastest 16-bit type, bf16 on a tie" in help_text, command
        assert "Required for a Hugging Face config.json" in help_text, command


def test_batch_rows_take_the_defaults_and_report_the_resolved_model(run_cli, tmp_path):
    plans = tmp_path / "plans.csv"
    plans.write_text("gpus,dp,hidden,heads\n1,1,,\n1,1,1024,16\n")
    out = run_cli("predict", "--model", "tiny-gpt", "--hardware", "dgx-v100", "--batch", plans,
                  "--seq-len", "64", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]  # perfmodel.predict.batch: {"schema", "rows"}
    assert [(r["ffn_hidden"], r["kv_heads"]) for r in rows] == [(1024, 8), (4096, 16)]
    assert rows[1]["parameters"] > rows[0]["parameters"] > 0
    assert rows[0]["tokens_per_s"] == pytest.approx(64 / rows[0]["step_time_s"])  # --seq-len


def test_batch_rows_take_context_and_expert_parallelism(run_cli, tmp_path):
    """The cp, cp_comm and ep columns reach the plan: each row's time is predict's for the same
    flags, and an empty gpus is dp x tp x pp x cp."""
    plans = tmp_path / "plans.csv"
    plans.write_text("model,dp,tp,cp,cp_comm,ep,sequence_parallel,global_batch\n"
                     "mixtral-8x7b,8,4,2,a2a,8,true,64\nmixtral-8x7b,8,4,1,,1,true,64\n")
    out = run_cli("predict", "--hardware", "dgx-h100", "--batch", plans, "--seq-len", "8192",
                  "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    for row, flags in zip(rows, (("--gpus", "64", "--cp", "2", "--cp-comm", "a2a", "--ep", "8"),
                                 ("--gpus", "32")), strict=True):
        one = run_cli("predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--dp", "8",
                      "--tp", "4", "--sequence-parallel", "--global-batch", "64", "--seq-len",
                      "8192", *flags, "--json")
        assert one.returncode == 0, one.stderr
        assert row["step_time_s"] == pytest.approx(json.loads(one.stdout)["step_time_s"],
                                                   rel=1e-12)
    assert rows[0]["step_time_s"] != rows[1]["step_time_s"]


def _choices(command: str, option: str) -> list[str]:
    from perfmodel.cli import cli

    params = {p.name: p for p in cli.commands[command].params}
    return list(params[option].type.choices)


def test_the_options_choices_are_the_enums_of_the_model():
    """One vocabulary from the command line to the formulas: every option's choices are its enum's
    values (the layer graphs' norm, variant and contributors too, though cli.py lists them so as
    not to import sympy to parse)."""
    from perfmodel.costs.collectives import Op
    from perfmodel.layerwise import Contributors, Norm, Variant
    from perfmodel.strategy import Dtype, Objective, Placement, Recompute, Schedule, TPLayout

    def values(enum):
        return [m.value for m in enum]

    for command in ("predict", "explain"):
        assert _choices(command, "schedule") == values(Schedule)
        assert _choices(command, "recompute") == values(Recompute)
        assert _choices(command, "dtype") == values(Dtype)
        assert _choices(command, "tp_layout") == values(TPLayout)
        assert _choices(command, "placement") == values(Placement)
        assert _choices(command, "norm") == values(Norm)
        assert _choices(command, "collective_variant") == values(Variant)
        assert _choices(command, "contributors") == values(Contributors)
    for option, enum in (("schedule", Schedule), ("recompute", Recompute), ("dtype", Dtype),
                         ("tp_layout", TPLayout), ("placement", Placement),
                         ("objective", Objective), ("norm", Norm),
                         ("contributors", Contributors)):
        assert _choices("recommend", option) == values(enum), option
    assert _choices("collective", "op") == values(Op)
    from perfmodel.layerwise import GRID_DTYPES

    # a layer graph's dtypes: Dtype's but FP8 (its recipes are the transformers')
    assert _choices("sweep", "dtype") == list(GRID_DTYPES)
    assert set(GRID_DTYPES) == set(values(Dtype)) - {"fp8"}


def test_recommend_takes_any_placement_as_a_pin(run_cli):
    """The search tries three placements; a pinned one may be any order of the axes."""
    out = run_cli("recommend", "--model", "gpt2-small", "--hardware", "dgx-v100", "--gpus", "16",
                  "--global-batch", "64", "--placement", "pp,tp,dp", "--top", "1", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plans"][0]["plan"]["placement"] == "pp,tp,dp"


def test_gpus_without_dp_leave_dp_to_the_other_degrees(run_cli):
    """--gpus and no --dp: dp = gpus / (tp x pp x cp), as Megatron-LM derives it from the world
    size; a GPU count the other degrees do not divide is refused in one line; --dp wins."""
    base = ["predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--pp", "4", "--ep",
            "8", "--global-batch", "256", "--seq-len", "4096", "--json"]
    out = run_cli(*base, "--gpus", "64")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["dp"] == 16  # 64 / (1 x 4 x 1)
    out = run_cli(*base, "--gpus", "62")
    assert out.returncode == 4  # a plan error: the degrees do not divide the GPUs
    assert "--gpus (62) must be a multiple of tp x pp x cp (1 x 4 x 1 = 4)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run_cli(*base, "--gpus", "64", "--dp", "4")  # given: the plan rule says what is wrong
    assert out.returncode == 4
    assert "must equal gpus" in out.stderr


def test_batch_rows_with_gpus_and_no_dp_leave_dp_to_the_other_degrees(run_cli, tmp_path):
    """A batch row's empty dp is gpus / (tp x pp x cp), as predict's --gpus without --dp; a row
    whose gpus the degrees do not divide fails alone, naming the rule."""
    plans = tmp_path / "plans.csv"
    plans.write_text("model,gpus,pp,ep,global_batch\nmixtral-8x7b,64,4,8,256\n"
                     "mixtral-8x7b,62,4,8,256\n")
    out = run_cli("predict", "--hardware", "dgx-h100", "--batch", plans, "--seq-len", "4096",
                  "--json")
    assert out.returncode == 5  # one row failed
    rows = json.loads(out.stdout)["rows"]
    one = run_cli("predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--dp", "16",
                  "--pp", "4", "--ep", "8", "--global-batch", "256", "--seq-len", "4096", "--json")
    assert one.returncode == 0, one.stderr
    assert rows[0]["step_time_s"] == pytest.approx(json.loads(one.stdout)["step_time_s"],
                                                   rel=1e-12)
    assert "gpus (62) must be a multiple of tp x pp x cp (4)" in rows[1]["error"]


@pytest.mark.parametrize("args", [["presets"], ["predict", "--model", "llama3-8b", "--hardware",
                                                "dgx-h100", "--gpus", "8", "--global-batch", "8"]])
def test_a_closed_output_pipe_ends_quietly_as_sigpipe_would(args):
    """`perfmodel presets | head`: the reader gone, perfmodel stops without a word and with the
    status SIGPIPE gives cat or grep (141), not 1 (its internal error; click's and rich's own
    status for EPIPE). The pipe's read end is closed before perfmodel writes: EPIPE for sure."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "perfmodel", *args], stdout=write,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == b""


def test_recommend_validate_profile_needs_validate(run_cli, tmp_path):
    """--validate-profile alone used to be read and then ignored: the search ran without the
    validation the profile was for. Refused as a usage error, before the search."""
    out = run_cli("recommend", "--model", "llama2-7b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "16", "--validate-profile", str(tmp_path / "cpu.json"))
    assert out.returncode == 2, out.stderr
    assert "--validate-profile" in out.stderr and "--validate" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_recommend_validate_on_a_layer_graph_is_refused(run_cli, tmp_path):
    """A layer graph's search returned before --validate and --validate-profile were looked
    at: both were ignored, a missing profile too."""
    for extra in (["--validate"], ["--validate-profile", str(tmp_path / "none.json")]):
        out = run_cli("recommend", "--model", "resnet50", "--hardware", "dgx-a100-80gb",
                      "--gpus", "8", "--global-batch", "256", *extra)
        assert out.returncode == 2, out.stderr
        assert "layer graph" in out.stderr and "perfmodel validate" in out.stderr


@pytest.mark.parametrize("given, expected", [(None, "10000"), ("500", "500")])
def test_the_command_sizes_sympys_caches_unless_the_user_did(given, expected):
    """perfmodel.cli.main sets SYMPY_CACHE_SIZE before sympy is imported (its step-model builds
    overflow sympy's default 1,000 entries); a value in the environment is kept."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k != "SYMPY_CACHE_SIZE"}
    if given is not None:
        env["SYMPY_CACHE_SIZE"] = given
    env["PYTHONPATH"] = str(ROOT)
    code = ("from perfmodel.cli import main\n"
            "try:\n    main(['explain', '--model', 'llama3-8b', '--hardware', 'dgx-h100'])\n"
            "except SystemExit:\n    pass\n"
            "import sympy.core.cache\nprint('size', sympy.core.cache.SYMPY_CACHE_SIZE)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.strip().splitlines()[-1] == f"size {expected}", out.stderr[-2000:]
