"""Outputs that would replace an input or each other, and the exit codes of a CLI probe.

A probe of the command line (2026-12-07, about 1,700 invocations) found no traceback and no NaN,
but outputs that replaced what the user still needed, without a word (exit 0): an nccl-tests log
replaced by the profile fitted to it (`calibrate import-nccl-tests ar.txt --out ar.txt`), a plans
file by its results (`predict --batch p.csv --out p.csv`), one output by another of the same
command (`--plot same.png --timeline same.png`, `--trace same.json --html same.json`);
`recommend --emit-config` and `validate --emit` that wrote some of their files before refusing
another (new arguments beside an old launch script); an empty directory name taken as the current
directory; and a few exit codes of another class than the same mistake's elsewhere. Each case
here failed before.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

USAGE, SPEC, PLAN, OUTPUT = 2, 3, 4, 7
LOG = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
TINY = ["--model", "tiny-gpt", "--hardware", "dgx-h100"]
RECOMMEND = ["recommend", *TINY, "--gpus", "8", "--global-batch", "8", "--top", "1"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_two_outputs_of_one_command_on_one_path_are_refused(here):
    code, out, err = run_main(["predict", *TINY, "--gpus", "8", "--plot", "same.png",
                               "--timeline", "same.png"])
    assert (code, out) == (OUTPUT, "")
    assert "refusing to write timeline same.png: it is also the path of the plot" in err
    code, _, err = run_main(["predict", *TINY, "--gpus", "8", "--trace", "t.json",
                             "--html", "./t.json"])
    assert code == OUTPUT and "it is also the path of the trace t.json" in err
    assert not any(here.iterdir())  # refused before anything was written


def test_an_output_on_an_input_is_refused_and_the_input_kept(here):
    plans = here / "plans.csv"
    plans.write_text("tp,dp\n1,8\n")
    (here / "link.csv").symlink_to("plans.csv")  # a write through the link would replace it
    for target in ("plans.csv", "link.csv"):
        code, _, err = run_main(["predict", *TINY, "--batch", "plans.csv", "--out", target])
        assert code == OUTPUT and "it is the input plans file" in err, err
    assert plans.read_text() == "tp,dp\n1,8\n"
    log = here / "ar.txt"
    log.write_bytes(LOG.read_bytes())
    code, _, err = run_main(["calibrate", "import-nccl-tests", "ar.txt", "--out", "ar.txt",
                             "--base", "dgx-h100"])
    assert code == OUTPUT and "refusing to write profile ar.txt: it is the input nccl-tests " \
                              "log" in err
    assert log.read_bytes() == LOG.read_bytes()
    os.link(log, here / "hard.txt")  # another name of the same file
    code, _, err = run_main(["calibrate", "import-nccl-tests", "ar.txt", "--out", "x.json",
                             "--base", "dgx-h100"])
    assert code == 0, err  # a profile of its own path is written
    code, _, err = run_main(["calibrate", "import-nccl-tests", "hard.txt", "--out", "ar.txt",
                             "--base", "dgx-h100"])
    assert code == OUTPUT and "it is the input nccl-tests log hard.txt" in err


def test_emit_config_refuses_every_file_before_writing_one(here):
    (here / "job" / "launch.sh").mkdir(parents=True)
    code, _, err = run_main([*RECOMMEND, "--emit-config", "megatron", "job"])
    assert code == OUTPUT and "launch.sh: it is a directory" in err
    assert sorted(p.name for p in (here / "job").iterdir()) == ["launch.sh"]  # no arguments file
    code, _, err = run_main([*RECOMMEND, "--emit-config", "megatron", ""])
    assert code == OUTPUT and "the directory name is empty" in err
    assert sorted(p.name for p in here.iterdir()) == ["job"]


def test_validate_emit_writes_no_half_job(here):
    pytest.importorskip("torch")
    (here / "job" / "run.sh").mkdir(parents=True)
    code, _, err = run_main(["validate", *TINY, "--gpus", "2", "--dp", "2", "--emit", "job"])
    assert code == OUTPUT and "run.sh" in err and "is a directory" in err
    assert sorted(p.name for p in (here / "job").iterdir()) == ["run.sh"]  # no job.py, config


def test_an_empty_output_path_is_refused_by_name(here):
    code, _, err = run_main(["predict", *TINY, "--gpus", "8", "--trace", ""])
    assert code == OUTPUT and "cannot write trace: its path is empty" in err


def test_what_if_mistakes_are_usage_errors_whatever_their_digits(here):
    for change in ("memory_bytes=２x", "memory_bytes=x2"):  # a full-width digit, a typo
        code, _, err = run_main([*RECOMMEND, "--what-if", change])
        assert code == USAGE and "--what-if must look like FIELD=VALUE" in err
    code, _, err = run_main([*RECOMMEND, "--what-if", "memory_bytes=2x", "--what-if",
                             "memory_bytes=3x"])  # compounded to 6x, unsaid, before
    assert code == USAGE and "--what-if memory_bytes is given twice" in err


def test_a_negative_gpu_count_is_out_of_range_as_zero_is(here):
    for gpus in ("0", "-8", "8,-16"):
        code, _, err = run_main(["recommend", *TINY, "--gpus", gpus, "--global-batch", "8"])
        assert code == PLAN and "--gpus must be between 1 and" in err, (gpus, err)


def test_validate_run_dir_that_is_a_file_is_an_output_error(here):
    pytest.importorskip("torch")
    (here / "afile").write_text("")
    code, _, err = run_main(["validate", *TINY, "--run-dir", "afile"])
    assert code == OUTPUT and "--run-dir: afile is not a directory" in err


@pytest.mark.parametrize("option", ["0", "-1"])
def test_torchtitan_selective_option_says_what_it_must_be(here, option):
    (here / "job.toml").write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 8192\n'
        f'local_batch_size = 1\n[activation_checkpoint]\nmode = "selective"\n'
        f'selective_ac_option = "{option}"\n')
    code, _, err = run_main(["predict", "--from-config", "job.toml", "--hardware", "dgx-h100",
                             "--gpus", "8"])
    assert code == PLAN
    assert f"selective_ac_option {option}: selective layer AC wraps every N-th block, N a " \
           "whole number >= 1" in err


@pytest.mark.parametrize("degree", ["0", "-2"])
def test_torchtitan_shard_degree_says_minus_one_or_a_degree(here, degree):
    (here / "job.toml").write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 8192\n'
        f'local_batch_size = 1\n[parallelism]\ndata_parallel_shard_degree = {degree}\n')
    code, _, err = run_main(["predict", "--from-config", "job.toml", "--hardware", "dgx-h100",
                             "--gpus", "8"])
    assert code == SPEC and "data_parallel_shard_degree must be -1 (the ranks the other " \
                            f"degrees leave) or a whole number from 1 to 1e10, got {degree}" in err


def test_sweep_at_the_peak_bound_is_the_bound(here):
    # 1e6 FLOP/s is the spec's lower bound: 1e6 x (1e6 / fp32's peak) / ... rounded below it
    code, out, err = run_main(["sweep", "--model", "alexnet", "--hardware", "dgx-v100",
                               "--gpus", "8", "--global-batch", "256",
                               "--vary", "peak_flops_per_s=1e6", "--json"])
    assert code == 0, err
