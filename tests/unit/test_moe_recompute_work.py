"""Full recompute of a stage that mixes dense and MoE layers repeats whole layers: the forward of
each dense layer it recomputes and of each MoE layer, and the tensor-parallel collectives of the
dense layers' MLPs a whole number of times. The model took the recomputed share of all the
stage's layers times their blended work (4 layers, layer 0 dense, one in 2 recomputed: half of
one dense and three MoE layers, where the job recomputes layers 1 and 3, both MoE) and the share
times the dense layers' MLP collectives (half a layer's). Each test fails before the fix
(perfmodel.step.layer.full_recomputed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel import load_model, predict
from tests.unit.test_bad_input import run_main
from tests.unit.test_moe_recompute_counts import _spec as counts_spec

# mixtral's layers, 4 of them: every one MoE, or the first dense (an MLP f wide)
ALL_MOE = load_model("mixtral-8x7b").replace(layers=4, seq_len=4096)
MIXED = ALL_MOE.replace(moe_first_dense=1)
PLAN = dict(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8, zero=1)


def _recompute_s(model, **plan) -> float:
    """compute/recompute of one step [s] (one stage: its only one)."""
    return predict(model, "dgx-h100", dict(PLAN, **plan)).breakdown_s["compute/recompute"]


def _layer_s() -> tuple[float, float]:
    """(a dense layer's, an MoE layer's) recompute per step [s], from full recompute of every
    layer: 4 MoE layers, and 1 dense + 3 MoE."""
    moe = _recompute_s(ALL_MOE, recompute="full") / 4
    dense = _recompute_s(MIXED, recompute="full") - 3 * moe
    return dense, moe


def test_every_second_layer_recomputes_two_whole_moe_layers() -> None:
    """One in 2 of layers 0 (dense) .. 3: layers 1 and 3, both MoE, 2 t_moe; the model charged
    (t_dense + 3 t_moe) / 2, 10.01 ms where the job's is 11.20 ms."""
    dense, moe = _layer_s()
    assert dense < 0.9 * moe  # the two kinds differ: the share would not pass
    got = _recompute_s(MIXED, recompute="full", recompute_every=2)
    assert got == pytest.approx(2 * moe, rel=1e-9)
    assert got != pytest.approx((dense + 3 * moe) / 2, rel=1e-3)


def test_megatron_block_recomputes_the_dense_and_the_first_moe_layer() -> None:
    """Block, 2 layers: layers 0 (dense) and 1 (MoE), t_dense + t_moe (8.83 ms; the model's
    share, 10.01 ms)."""
    dense, moe = _layer_s()
    got = _recompute_s(MIXED, recompute="full", recompute_method="block",
                       recompute_num_layers=2)
    assert got == pytest.approx(dense + moe, rel=1e-9)


def test_every_layer_and_a_model_of_moe_layers_keep_their_work() -> None:
    """Every layer recomputed: the stage's whole forward; all MoE, one in 2: half of it."""
    dense, moe = _layer_s()
    assert _recompute_s(ALL_MOE, recompute="full", recompute_every=2) == \
        pytest.approx(2 * moe, rel=1e-9)
    assert _recompute_s(MIXED, recompute="full") == pytest.approx(dense + 3 * moe, rel=1e-12)


def _spec(tmp_path: Path, name: str, layers: int = 4, dense: str = "") -> str:
    """test_moe_recompute_counts' small MoE model without shared experts (its dense layers' MLPs
    alone issue MLP collectives with tp > 1), its first layer dense (and, with layers: 8, layer
    5 too)."""
    return counts_spec(tmp_path, name, layers=layers, dense=dense, shared=False)


def _agrees(args: list[str]) -> None:
    code, out, err = run_main(["validate", "--dry-run", *args])
    assert code == 0 and "agree: yes" in out, out + err


def test_dense_mlp_collectives_without_shared_experts(tmp_path: Path) -> None:
    """4 layers, layer 0 dense, one in 2 recomputed (layers 1 and 3, MoE): the dense MLP's
    sequence-parallel pair is not repeated. The ledger had 14.5 tp all-gathers (job 14) and
    13.5 reduce-scatters (job 13)."""
    _agrees(["--model", _spec(tmp_path, "moe-ns"), "--dp", "4", "--tp", "2", "--ep", "4",
             "--sequence-parallel", "--recompute", "full", "--recompute-every", "2"])


def test_dense_mlp_collectives_of_a_megatron_block(tmp_path: Path) -> None:
    """Block, 1 layer: layer 0, the dense one, recomputed, its MLP's sequence-parallel pair
    again: once, not a quarter (the ledger had 13.25 tp all-gathers, job 14)."""
    _agrees(["--model", _spec(tmp_path, "moe-ns"), "--dp", "4", "--tp", "2", "--ep", "4",
             "--sequence-parallel", "--recompute", "full", "--recompute-method", "block",
             "--recompute-num-layers", "1"])


def test_dense_mlp_collectives_on_pipeline_stages(tmp_path: Path) -> None:
    """8 layers, 0 and 5 dense, pp 2, one in 2: rank 0 recomputes 1 and 3 (MoE: layer 0's MLP
    pair not again; the ledger, rank 0's, had 27 tp all-gathers, job 26), rank 1 5 and 7 (5
    dense: its pair once, not 1/2 of it)."""
    path = _spec(tmp_path, "moe8", layers=8, dense="moe_dense_layers: [5]\n")
    _agrees(["--model", path, "--global-batch", "4", "--dp", "2", "--tp", "2", "--ep", "2",
             "--pp", "2", "--sequence-parallel", "--recompute", "full",
             "--recompute-every", "2"])
