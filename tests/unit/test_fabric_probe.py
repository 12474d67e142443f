"""Regressions from probing fabrics of more than two levels and the placement of groups made of
several axes' ranks (2026-12-02)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli


def _explain(*args: str) -> str:
    res = CliRunner().invoke(cli, ["explain", *args], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


# Ranks are numbered tp fastest, then cp, dp, pp (perfmodel.encode.axis_ranks_per_node, Megatron-
# Core's order); a GB200 NVL72 job of 144 GPUs takes 72 of each rack (job_domain). A group whose
# block of ranks fits in a rack but does not divide 72 straddles two racks for some groups (ranks
# 64-79 of a block of 16: 8 in each), as a group of one axis does.
@pytest.mark.parametrize("args, line", [
    # ep 16 over cp 2 x dp 8 (tp 1): blocks of 16 consecutive ranks
    (["--model", "qwen3-30b-a3b", "--gpus", "144", "--tp", "1", "--cp", "2", "--ep", "16",
      "--global-batch", "576", "--micro-batch", "8", "--zero", "2", "--term", "comm/ep"],
     "ep: 16 ranks, 8 per node (mixed)"),
    # ep 16 over tp 2 x dp 8 (etp 1: the tp ranks first)
    (["--model", "qwen3-30b-a3b", "--gpus", "144", "--tp", "2", "--sequence-parallel",
      "--ep", "16", "--global-batch", "576", "--micro-batch", "8", "--zero", "2",
      "--term", "comm/ep"], "ep: 16 ranks, 8 per node (mixed)"),
    # dp x cp of a 48-GPU stage (pp 3): ranks 48-95 cross the rack boundary at 72
    (["--model", "gpt-22b", "--gpus", "144", "--pp", "3", "--cp", "2", "--global-batch", "288",
      "--term", "comm/dp"], "dp_cp: 48 ranks, 24 per node (mixed)"),
    # etp = tp 4, 4 ranks apart (placement pp inside tp): the tp group's ranks, priced as tp's
    (["--model", "qwen3-30b-a3b", "--gpus", "288", "--tp", "4", "--pp", "4", "--ep", "2",
      "--etp", "4", "--sequence-parallel", "--placement", "pp,tp,dp", "--global-batch", "576",
      "--term", "comm/ep"], "etp: 4 ranks, 2 per node (mixed)"),
])
def test_a_group_of_several_axes_straddles_a_domain_boundary_as_one_axis_does(args, line):
    """Regression: these groups were priced inside one NVLink domain ('16 per node (intra)',
    '48 per node', '4 per node'), an all-to-all 7x faster than across racks."""
    out = _explain("--hardware", "gb200-nvl72", *args)
    assert line in out, out[:3000]


def test_a_group_whose_block_divides_the_domain_stays_inside_it():
    out = _explain("--hardware", "gb200-nvl72", "--model", "qwen3-30b-a3b", "--gpus", "144",
                   "--tp", "1", "--cp", "2", "--ep", "8", "--global-batch", "576",
                   "--micro-batch", "8", "--zero", "2", "--term", "comm/ep")
    assert "ep: 8 ranks, 8 per node (intra)" in out


@pytest.mark.parametrize("hardware, gpus, unit", [("dgx-h100", 12, "nodes of 8 GPUs"),
                                                  ("gb200-nvl72", 90, "hosts of 4 GPUs")])
def test_a_job_whose_last_node_is_partly_filled_is_refused(hardware, gpus, unit):
    """Regression: 12 GPUs on DGX H100s were priced as full nodes (comm/dp 122.8 ms, against
    245.5 ms on 4-GPU nodes: the second node's 4 NICs), 90 on GB200 NVL72 1.6x faster than 100."""
    from perfmodel import Plan, predict
    from perfmodel.errors import PlanError
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest
    from perfmodel.specs import load_hardware, load_model

    with pytest.raises(PlanError, match=f"gpus {gpus} is not whole {unit}"):
        predict("llama3-8b", hardware, Plan(gpus=gpus, dp=gpus, global_batch=gpus * 2))
    with pytest.raises(PlanError, match=f"gpus {gpus} is not whole {unit}"):
        recommend(load_model("llama3-8b"), load_hardware(hardware),
                  SearchRequest(gpus=(gpus,), global_batch=gpus * 2))


def test_one_partly_filled_node_and_whole_domains_of_hosts_are_priced():
    from perfmodel import Plan, predict

    assert predict("llama3-8b", "dgx-h100", Plan(gpus=4, dp=4, global_batch=8)).step_time_s > 0
    # 100 GPUs on GB200: 25 trays, 5 racks of 5 (job_domain)
    assert predict("llama3-8b", "gb200-nvl72",
                   Plan(gpus=100, dp=50, tp=2, global_batch=100)).step_time_s > 0


def test_a_collective_beyond_a_two_level_node_names_the_network():
    """Regression: --json said fabric_level 'node' for a group over two DGX H100 nodes."""
    from perfmodel.collective import predict_collective
    from perfmodel.specs import load_hardware

    res = predict_collective("all_reduce", 1e9, 16, load_hardware("dgx-h100"))
    assert (res["scope"], res["fabric_level"], res["priced_on"]) == ("mixed", "network",
                                                                     "network")
    inside = predict_collective("all_reduce", 1e9, 8, load_hardware("dgx-h100"))
    assert (inside["scope"], inside["fabric_level"]) == ("intra", "node")
