"""validate --dry-run where a probe of context- and expert-parallel plans found the job and the
model's ledger apart, or a plan accepted or refused wrongly (2026-12-02). Each test fails before
its fix."""

from __future__ import annotations

from tests.unit.test_bad_input import run_main

TINY = ["validate", "--model", "tiny-gpt", "--dry-run"]


def test_ulysses_selective_recompute_runs_the_core_again_whole():
    """The job's selective recompute stopped once q, k and v were back (torch's non-reentrant
    checkpoint stops early by default), so Ulysses' output all-to-all ran 44 times, not 48."""
    code, out, err = run_main([*TINY, "--dp", "8", "--cp", "4", "--cp-comm", "a2a",
                               "--recompute", "selective"])
    assert code == 0 and "agree: yes" in out, out + err


def test_op_recompute_with_cp_or_ep_is_refused_in_one_line():
    """The per-op policy saves attention and the tensor-parallel reductions only: the job ran
    the context-parallel sends again (64 against the ledger's 40)."""
    code, _, err = run_main([*TINY, "--dp", "8", "--cp", "4", "--recompute", "op"])
    assert code == 4 and "recompute op with context or expert parallelism" in err, err
    code, _, err = run_main([*TINY, "--dp", "8", "--recompute", "op"])
    assert code == 0, err


def test_gradient_dtypes_the_job_does_not_reduce_in_are_refused():
    """The job reduces fp32 gradients for 16-bit weights: grad_dtype bf16 was counted at half
    the job's bytes, and fp16 at zero 1 likewise."""
    code, _, err = run_main([*TINY, "--dp", "8", "--hardware", "dgx-h100", "--grad-dtype",
                             "bf16"])
    assert code == 4 and "grad_dtype bf16: the validation job keeps and reduces fp32" in err, err
    code, _, err = run_main([*TINY, "--dp", "8", "--hardware", "dgx-v100", "--dtype", "fp16",
                             "--zero", "1"])
    assert code == 4 and "dtype fp16 with zero 1" in err, err
    code, out, err = run_main([*TINY, "--dp", "8", "--hardware", "dgx-v100", "--dtype", "fp16"])
    assert code == 0 and "agree: yes" in out, out + err


def test_the_plan_is_checked_against_the_scaled_down_model():
    """--layers 6 with pp 3 was refused against mixtral-8x7b's 32 layers."""
    code, out, err = run_main(["validate", "--model", "mixtral-8x7b", "--layers", "6",
                               "--hidden", "64", "--heads", "8", "--seq-len", "64", "--vocab",
                               "128", "--dry-run", "--dp", "8", "--pp", "3", "--ep", "8",
                               "--global-batch", "24"])
    assert code == 0 and "agree: yes" in out, out + err


def test_context_parallelism_with_unfused_attention_is_refused_as_predict_refuses_it():
    code, _, err = run_main([*TINY, "--dp", "2", "--cp", "2", "--attention", "unfused"])
    assert code == 4 and "cp 2 needs fused (flash) attention" in err, err


def test_a_dropless_plan_without_expert_parallelism_is_not_refused_for_its_routing():
    """With ep 1 no token crosses ranks to its expert, so round-robin routing cannot leave one
    rank receiving more than it sends: etp 2 was refused."""
    code, out, err = run_main(["validate", "--model", "mixtral-8x7b", "--layers", "2",
                               "--hidden", "128", "--heads", "32", "--vocab", "128", "--dry-run",
                               "--seq-len", "36", "--dp", "4", "--tp", "2", "--etp", "2",
                               "--sequence-parallel"])
    assert code == 0 and "agree: yes" in out, out + err
