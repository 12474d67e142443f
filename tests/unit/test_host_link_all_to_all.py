"""All-to-all over nodes where the node's GPU-to-GPU link is each GPU's host link (PCIe).

Regression: on h100-pcie an all-to-all of 256 MiB over 16 ranks (two nodes) was priced at 3.20 ms,
faster than the 4.64 ms of the same collective over the 8 GPUs of one node: the NIC share
((n - k)/n of the buffer) and the node's share ((k - 1)/n) were costed as two links running at
once. On a PCIe server the GPU's network traffic leaves it over the same PCIe x16 link as its
traffic to the other GPUs (GPUDirect RDMA through the PCIe switch), so (n - 1)/n of the buffer
crosses that one link (`intra_node.shares_host_link`, perfmodel.costs.collectives
.all_to_all_mixed_time). NVSwitch nodes keep the separate-links form.
"""

from __future__ import annotations

import dataclasses

import pytest

from perfmodel import comm_ledger, load_hardware, predict
from perfmodel.collective import predict_collective
from perfmodel.costs import collectives as C
from perfmodel.encode import link_features
from perfmodel.errors import SpecError
from perfmodel.specs.hardware import hardware_from_dict

PCIE = load_hardware("h100-pcie")
H100 = load_hardware("dgx-h100")
S = 256 * 2**20  # the probe's buffer: --bytes 256MiB


def _unshared(hw):
    """The same hardware with its node links and NICs costed as separate links (the old form)."""
    return dataclasses.replace(hw, intra_node=dataclasses.replace(hw.intra_node,
                                                                  shares_host_link=False))


def _a2a_by_hand(hw, nbytes, n, k, protocol="simple", shared=None):
    """call + (n - 1) step + max((n - k)/n S / nic_beta, share S / intra_beta) from the spec's
    numbers: the step and call of the network in the protocol, each link's bandwidth in it (a
    protocol a link does not list is its Simple one there), share (n - 1)/n where the node's link
    is the host link, (k - 1)/n otherwise."""
    shared = hw.intra_node.shares_host_link if shared is None else shared
    intra, inter = hw.intra_node, hw.inter_node
    p_inter, p_intra = inter.protocol(protocol), intra.protocol(protocol)
    call = p_inter.call_latency_s if p_inter else inter.call_latency_s
    step = p_inter.latency_s if p_inter else inter.latency_s
    nic = (inter.effective_bandwidth_bytes_per_s / hw.gpus_per_node
           * (p_inter.bandwidth_fraction if p_inter else 1.0))
    node = intra.effective_bandwidth_bytes_per_s * (p_intra.bandwidth_fraction if p_intra else 1.0)
    share = (n - 1) / n if shared else (k - 1) / n
    return call + (n - 1) * step + max((n - k) / n * nbytes / nic, share * nbytes / node)


def test_h100_pcie_marks_its_pcie_node_link_as_the_host_link_and_nvswitch_nodes_do_not():
    assert PCIE.intra_node.shares_host_link
    assert "intra:host_link" in link_features(PCIE)
    for name in ("dgx-h100", "dgx-b200", "dgx-a100-80gb", "hgx-h200", "gb200-nvl72", "mi300x"):
        hw = load_hardware(name)
        assert not hw.intra_node.shares_host_link, name
        assert "intra:host_link" not in link_features(hw), name


def test_all_to_all_over_two_pcie_nodes_is_not_faster_than_over_one():
    one_node = predict_collective("all_to_all", S, 8, PCIE)["time_s"]
    two_nodes = predict_collective("all_to_all", S, 16, PCIE)["time_s"]
    assert one_node == pytest.approx(4.64e-3, abs=0.005e-3)  # the probe's, unchanged
    assert two_nodes > one_node  # was 3.20 ms
    # by hand, Simple: 8.4 us + 15 x 14 us + max(8/16 S / (400 GB/s x 0.9 / 8),
    # 15/16 S / (64 GB/s x 0.8)) = 0.2184 ms + 4.9152 ms (the PCIe link binds)
    simple = predict_collective("all_to_all", S, 16, PCIE, protocol="simple")["time_s"]
    assert simple == pytest.approx(8.4e-6 + 15 * 14e-6 + 15 / 16 * S / (64e9 * 0.8))
    assert simple == pytest.approx(_a2a_by_hand(PCIE, S, 16, 8))
    # the cheapest protocol, each by hand from the preset: NCCL turns LL128 on only where the
    # node's paths are NVLink (tuning.cc: typeIntra <= PATH_NVB), so Simple and LL compete
    by_hand = min(_a2a_by_hand(PCIE, S, 16, 8, p) for p in ("simple", "ll"))
    assert two_nodes == pytest.approx(by_hand) == pytest.approx(simple)


@pytest.mark.parametrize("n", [16, 32, 128])
def test_pcie_all_to_all_grows_with_the_group_it_never_shrinks(n):
    times = [predict_collective("all_to_all", S, m, PCIE)["time_s"] for m in (8, n)]
    assert times[1] >= times[0]
    assert _a2a_by_hand(PCIE, S, n, 8) >= _a2a_by_hand(PCIE, S, 8, 8)


def test_the_separate_links_form_had_two_pcie_nodes_beat_one():
    # 16 ranks: max(8/16 S / 45 GB/s, 7/16 S / 51.2 GB/s) = 2.98 ms of link time, under one
    # node's 7/8 S / 51.2 GB/s = 4.59 ms
    assert (_a2a_by_hand(PCIE, S, 16, 8, shared=False)
            < _a2a_by_hand(PCIE, S, 8, 8, shared=True))


def test_nvswitch_node_keeps_separate_links_for_all_to_all():
    # dgx-h100: NVLink does not cross the host link: max(8/16 S / 45 GB/s, 7/16 S / 360 GB/s)
    got = predict_collective("all_to_all", S, 16, H100, protocol="simple")["time_s"]
    nic, nvlink = 400e9 * 0.9 / 8, 450e9 * 0.8
    want = 8.4e-6 + 15 * 14e-6 + max(8 / 16 * S / nic, 7 / 16 * S / nvlink)
    assert got == pytest.approx(want)
    assert got == pytest.approx(_a2a_by_hand(H100, S, 16, 8, shared=False))
    assert predict_collective("all_to_all", S, 16, H100)["time_s"] == pytest.approx(3.20e-3,
                                                                                   abs=0.005e-3)


def test_all_to_all_mixed_time_shared_form_by_hand():
    # n = 16, k = 8, 1 GB, NIC share 45 GB/s, node link 51.2 GB/s
    args = (1e9, 16, 8, 1e-5, 1e-6, 51.2e9, 45e9)
    separate = float(C.all_to_all_mixed_time(*args))
    shared = float(C.all_to_all_mixed_time(*args, shares_host_link=True))
    assert separate == pytest.approx(1e-5 + 15e-6 + max(8 / 16 * 1e9 / 45e9, 7 / 16 * 1e9 / 51.2e9))
    assert shared == pytest.approx(1e-5 + 15e-6 + 15 / 16 * 1e9 / 51.2e9)
    # a slow NIC still binds: the NIC's share over the NIC
    slow_nic = float(C.all_to_all_mixed_time(1e9, 16, 8, 0, 0, 51.2e9, 5e9, shares_host_link=True))
    assert slow_nic == pytest.approx(8 / 16 * 1e9 / 5e9)
    assert C.all_to_all_mixed_time(1e9, 1, 1, 1, 1, 1, 1, shares_host_link=True) == 0


def test_a_flat_ring_over_pcie_nodes_is_unchanged():
    # a ring sends to one neighbour a step, over one link: min(node link, k x NIC share) already
    for op in ("all_gather", "reduce_scatter"):
        assert (predict_collective(op, S, 16, PCIE)["time_s"]
                == pytest.approx(predict_collective(op, S, 16, _unshared(PCIE))["time_s"]))


def _file(tmp_path, text):
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    return path


def test_shares_host_link_reads_true_from_yaml(tmp_path):
    hw = load_hardware(_file(tmp_path, "base: dgx-h100\nintra_node:\n  shares_host_link: true\n"))
    assert hw.intra_node.shares_host_link and "intra:host_link" in link_features(hw)
    off = load_hardware(_file(tmp_path,
                              "base: h100-pcie\nintra_node:\n  shares_host_link: false\n"))
    assert not off.intra_node.shares_host_link
    assert hardware_from_dict(PCIE.to_dict(), "h100-pcie") == PCIE  # round trip


@pytest.mark.parametrize("value", ["1", "'true'", "0.5", "[true]"])
def test_shares_host_link_refuses_what_is_not_true_or_false(tmp_path, value):
    path = _file(tmp_path, f"base: dgx-h100\nintra_node:\n  shares_host_link: {value}\n")
    with pytest.raises(SpecError) as err:
        load_hardware(path)
    assert "\n" not in str(err.value)
    assert "intra_node.shares_host_link must be true or false" in str(err.value)


def test_shares_host_link_is_refused_between_nodes(tmp_path):
    path = _file(tmp_path, "base: dgx-h100\ninter_node:\n  shares_host_link: true\n")
    with pytest.raises(SpecError, match=r"inter_node\.shares_host_link must be false") as err:
        load_hardware(path)
    assert "\n" not in str(err.value)


def _levels(**level_changes):
    """dgx-h100-superpod's mapping with fields of its levels changed ({i: {field: value}})."""
    data = load_hardware("dgx-h100-superpod").to_dict()
    for key in ("gpus_per_node", "intra_node", "inter_node"):
        data.pop(key)
    data["levels"] = [dict(lv) for lv in data["levels"]]
    for i, changes in level_changes.items():
        data["levels"][int(i[1:])].update(changes)
    return data


def test_a_fabric_levels_spec_says_it_on_level_0():
    hw = hardware_from_dict(_levels(l0={"shares_host_link": True}), "pcie-pod")
    assert hw.levels[0].shares_host_link and hw.intra_node.shares_host_link
    assert "intra:host_link" in link_features(hw)
    assert hardware_from_dict(hw.to_dict(), "pcie-pod") == hw
    with pytest.raises(SpecError, match=r"levels\[1\]\.shares_host_link must be false"):
        hardware_from_dict(_levels(l1={"shares_host_link": True}), "pcie-pod")
    with pytest.raises(SpecError, match=r"levels\[0\]\.shares_host_link must be true or false"):
        hardware_from_dict(_levels(l0={"shares_host_link": "yes"}), "pcie-pod")


# Mixtral 8x7B on 16 H100 PCIe: pp 2 inside each node (pp innermost), dp 8 and ep 8 over the
# other ranks, 4 in each node: every expert all-to-all crosses the PCIe link with its NIC traffic.
MOE_PLAN = dict(gpus=16, pp=2, dp=8, ep=8, placement="pp,dp,tp", global_batch=64,
                recompute="full", zero=1)


def test_expert_parallel_all_to_all_over_pcie_nodes_pays_the_shared_host_link():
    shared = predict("mixtral-8x7b", PCIE, MOE_PLAN)
    separate = predict("mixtral-8x7b", _unshared(PCIE), MOE_PLAN)
    # comm/ep is the ep group's collectives, each at the collective's own time (8 ranks, 4 a node)
    for hw, pred in ((PCIE, shared), (_unshared(PCIE), separate)):
        want = sum(r["calls"] * predict_collective(r["op"], r["nbytes"], 8, hw, 4)["time_s"]
                   for r in comm_ledger("mixtral-8x7b", MOE_PLAN, hw)
                   if r["axis"] == "ep" and r["stage"] == pred.bottleneck_stage)
        assert pred.breakdown_s["comm/ep"] == pytest.approx(want)
    # the dispatch/combine all-to-all (512 MiB a call): 7/8 of it over the PCIe link (51.2 GB/s),
    # against the NIC's 4/8 over 45 GB/s before: ~1.54 x the bandwidth term
    big = 512 * 2**20
    t = predict_collective("all_to_all", big, 8, PCIE, 4)["time_s"]
    assert t == pytest.approx(min(_a2a_by_hand(PCIE, big, 8, 4, p) for p in ("simple", "ll")))
    simple = [predict_collective("all_to_all", big, 8, PCIE, per_node, protocol="simple")
              ["time_s"] for per_node in (8, 4)]
    assert simple[1] > simple[0]  # over two nodes, slower than in one
    # was 4.679 s; 7.096 s while LL128 was offered to PCIe nodes' groups over nodes
    assert shared.breakdown_s["comm/ep"] == pytest.approx(7.145, abs=0.005)
    assert separate.breakdown_s["comm/ep"] == pytest.approx(4.679, abs=0.005)
    # the step grows by that and more: the pipeline's bubble is micro-batches of the stage too
    grown = shared.breakdown_s["comm/ep"] - separate.breakdown_s["comm/ep"]
    assert shared.step_time_s - separate.step_time_s >= grown


def test_deepep_is_refused_where_the_gpus_of_a_node_share_no_nvlink():
    """DeepEP's intranode kernels need NVLink (deepseek-ai/DeepEP README, requirements): on
    h100-pcie it was priced with the NVLink nodes' separate-links exchange."""
    from perfmodel import PlanError, load_hardware, load_model, predict
    from perfmodel.search import SearchRequest, search
    from perfmodel.strategy import Plan

    model, hardware = load_model("mixtral-8x7b"), load_hardware("h100-pcie")
    plan = Plan(gpus=16, pp=2, dp=8, ep=8, placement="pp,dp,tp", zero=1, recompute="full",
                global_batch=64, ep_dispatcher="deepep")
    with pytest.raises(PlanError, match="DeepEP exchanges inside a node over NVLink"):
        predict(model, hardware, plan)
    with pytest.raises(PlanError, match="DeepEP exchanges inside a node over NVLink"):
        search(model, hardware, SearchRequest(gpus=(16,), global_batch=64,
                                              ep_dispatcher="deepep"), top=1, prune=True)
    assert predict(model, load_hardware("dgx-h100"), plan).step_time_s > 0
