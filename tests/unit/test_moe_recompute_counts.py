"""Full recompute of a stage that mixes dense and MoE layers: the job recomputes whole layers (one
in N of those a rank builds, or the first N of each chunk), so the expert-parallel exchanges of
the MoE layers among them run a whole number of times. The model took the recomputed share of
all the stage's layers times its MoE layers (3 x 1/2 = 1.5 layers' exchanges where the job
recomputed layers 1 and 3, both MoE). Each dry run fails before the fix
(perfmodel.step.moe.moe_recomputed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_bad_input import run_main

# a small MoE model whose first layer is dense (and, with layers: 8, layer 5 too)
SPEC = """\
name: {name}
kind: transformer
layers: {layers}
hidden: 64
heads: 8
kv_heads: 4
ffn_hidden: 128
seq_len: 64
vocab: 128
gated_mlp: true
tied_embeddings: false
bias: false
norm: rmsnorm
position_embedding: rotary
experts: 8
top_k: 2
expert_ffn_hidden: 32
{shared}moe_first_dense: 1
capacity_factor: {capacity}
hidden_dropout: 0.0
attention_dropout: 0.0
"""


def _spec(tmp_path: Path, name: str, layers: int = 4, capacity: str = "null",
          dense: str = "", shared: bool = True) -> str:
    """The spec file (shared false: no shared expert, so that the dense layers' MLPs alone issue
    MLP collectives with tp > 1)."""
    path = tmp_path / f"{name}.yaml"
    experts = "shared_experts: 1\nshared_expert_ffn_hidden: 64\n" if shared else ""
    path.write_text(SPEC.format(name=name, layers=layers, capacity=capacity, shared=experts)
                    + dense)
    return str(path)


def _agrees(args: list[str]) -> None:
    code, out, err = run_main(["validate", "--dry-run", *args])
    assert code == 0 and "agree: yes" in out, out + err


def test_every_second_layer_recomputes_two_whole_moe_layers(tmp_path: Path) -> None:
    """4 layers, layer 0 dense, one in 2 recomputed: layers 1 and 3, both MoE. The ledger had
    4.5 count all-gathers (job 5) and 15 all-to-alls (job 16)."""
    _agrees(["--model", _spec(tmp_path, "moe-drop"), "--dp", "8", "--cp", "2", "--ep", "8",
             "--recompute", "full", "--recompute-every", "2"])


def test_megatron_block_recomputes_the_first_layers_of_the_chunk(tmp_path: Path) -> None:
    """Block, 2 layers: layers 0 (dense) and 1 (MoE), one MoE layer's exchanges again: the ledger
    had 15 all-to-alls (job 14) and 7.5 etp all-gathers and reduce-scatters (job 7)."""
    _agrees(["--model", _spec(tmp_path, "moe-cap", capacity="1.25"), "--dp", "4", "--tp", "2",
             "--ep", "4", "--etp", "2", "--sequence-parallel", "--recompute", "full",
             "--recompute-method", "block", "--recompute-num-layers", "2"])


@pytest.mark.parametrize("schedule", [["--schedule", "1f1b"],
                                      ["--virtual-stages", "2", "--schedule", "zbv"]])
def test_pipeline_stages_recompute_the_layers_their_rank_builds(tmp_path: Path,
                                                                schedule: list[str]) -> None:
    """8 layers, 0 and 5 dense, pp 2. 1f1b, one in 2: rank 0's layers 1 and 3 (MoE; the ledger
    had 1.5); zbv, one in 3: rank 0 builds 0, 1, 6, 7 and recomputes 6 (MoE; the ledger had
    0.75)."""
    every = "2" if schedule[-1] == "1f1b" else "3"
    path = _spec(tmp_path, "moe8", layers=8, dense="moe_dense_layers: [5]\n")
    _agrees(["--model", path, "--global-batch", "4", "--dp", "2", "--ep", "2", "--pp", "2",
             *schedule, "--recompute", "full", "--recompute-every", every])


def test_a_model_of_moe_layers_only_keeps_its_counts() -> None:
    """Every layer MoE: the recomputed MoE layers are the recomputed layers, as before."""
    _agrees(["--model", "mixtral-8x7b", "--layers", "4", "--dp", "2", "--ep", "2",
             "--recompute", "full", "--recompute-every", "3"])
