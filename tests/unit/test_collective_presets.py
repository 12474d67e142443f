"""The GPU presets' collectives: NCCL's tuning model (protocols, NVLS, NCCL's algorithms), its
constants as the presets carry them, and each preset held to the shared nccl-tests logs of its GPU.

The logs are microbenchmarks (tests/data/nccl-tests, a copy of ../shared/data/nccl-tests; see its
SOURCES.md). One parameter is fitted on one of them (dgx-h100's NVLS latency, recomputed here);
every other link parameter is NCCL's constant or a datasheet bandwidth times a measured efficiency.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from benchmarks import bench_accuracy as B
from calibration.nccl_tests import parse_nccl_tests
from perfmodel import load_hardware
from perfmodel.collective import predict_collective
from perfmodel.costs import collectives as C
from perfmodel.errors import PlanError, SpecError
from perfmodel.specs import list_presets
from perfmodel.specs.hardware import hardware_from_dict, load_hardware_dict
from tests.conftest import ROOT

LOGS = ROOT / "tests" / "data" / "nccl-tests"
NVLS_LOG = LOGS / "h100x8-allreduce-nvls-together-nccl-tests.txt"

# NCCL's tuning constants: NVIDIA/nccl src/graph/tuning.cc, the same from v2.26.2 (the NVLS log's
# NCCL) to v2.30 (ncclTunerConstantsDefaults). Ring: baseLat per call; hwLat per step, NVLink and
# network (NET); llMaxBws for one node by GPU generation and for more than two nodes by CPU vendor
# [GB/s of bus bandwidth]; LL128 = 120/128 of Simple ("0.92"); nvlsEfficiency by generation.
BASE_LAT = {"simple": 8.4e-6, "ll": 6.6e-6, "ll128": 14.0e-6}
HW_LAT = {"nvlink": {"simple": 3.4e-6, "ll": 0.6e-6, "ll128": 1.9e-6},
          "pci": {"simple": 5.7e-6, "ll": 1.0e-6, "ll128": 2.5e-6},
          "net": {"simple": 14.0e-6, "ll": 2.7e-6, "ll128": 4.0e-6}}
NVLS_LATENCY = 25.0e-6  # hwLat, NVLink, NVLS: presets without a shared NVLS log of their GPU
LL_MAX_BW_ONE_NODE = {"volta": 39.0e9, "ampere": 87.7e9, "hopper": 141.0e9, "blackwell": 282.0e9}
LL_MAX_BW_NET = {"intel": 20.4e9, "amd": 19.0e9}  # > 2 nodes
LL128_FRACTION = 0.92
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
# The generation of a preset's GPU (by its name) and its host CPU where not Intel (DGX A100:
# 2x AMD EPYC 7742, DGX A100 datasheet); a new NVIDIA preset adds its own here.
GENERATIONS = {"V100": "volta", "A100": "ampere", "H100": "hopper", "H200": "hopper",
               "B200": "blackwell", "GB200": "blackwell", "B300": "blackwell"}
AMD_CPU = {"dgx-a100-80gb", "dgx-a100-40gb"}
# GPUs joined over PCIe inside the node (NCCL's PCI latencies; LL128 is on by default over NVLink
# only, tuning.cc)
PCIE = {"h100-pcie"}


def _nccl_presets() -> list[str]:
    return [name for name in list_presets()["hardware"]
            if load_hardware(name).collective_library == "nccl"]


def _generation(gpu_name: str) -> str:
    found = [gen for key, gen in GENERATIONS.items() if key in gpu_name.split()
             or f"{key}-" in gpu_name or gpu_name.endswith(key)]
    assert found, f"{gpu_name}: add its generation to GENERATIONS (NCCL's constants differ)"
    return found[0]


@pytest.mark.parametrize("name", _nccl_presets())
def test_nccl_presets_carry_nccls_tuning_constants(name):
    """The rule of docs/model.md, recomputed: per call and per step NCCL's latencies; LL's
    bandwidth min(0.5, llMaxBw / Simple's), LL128's 0.92; NVLS's nvlsEfficiency."""
    hw = load_hardware(name)
    gen = _generation(hw.gpu_name)
    cpu = "amd" if name in AMD_CPU else "intel"
    intra = "pci" if name in PCIE else "nvlink"
    for link, kind in ((hw.intra_node, intra), (hw.inter_node, "net")):
        assert link.latency_s == pytest.approx(HW_LAT[kind]["simple"])
        assert link.call_latency_s == pytest.approx(BASE_LAT["simple"])
        simple = link.effective_bandwidth_bytes_per_s
        ll_max = (LL_MAX_BW_NET[cpu] * hw.gpus_per_node if kind == "net"  # per rank -> per node
                  else LL_MAX_BW_ONE_NODE[gen])
        protocols = [("ll", min(0.5, ll_max / simple)), ("ll128", LL128_FRACTION)]
        if kind == "pci":
            assert link.protocol("ll128") is None, f"{name}: LL128 over PCIe"
            protocols = protocols[:1]
        for proto, fraction in protocols:
            p = link.protocol(proto)
            assert p is not None, f"{name}: {kind} has no {proto}"
            assert p.call_latency_s == pytest.approx(BASE_LAT[proto])
            assert p.latency_s == pytest.approx(HW_LAT[kind][proto])
            assert p.bandwidth_fraction == pytest.approx(fraction, abs=0.001), (kind, proto)
    if hw.intra_node.has_nvls:
        assert hw.intra_node.nvls_bandwidth_fraction == NVLS_EFFICIENCY[gen]
        # Hopper: the latency fitted on the shared H100 NVLS log (below); others: NCCL's
        fitted = load_hardware("dgx-h100").intra_node.nvls_latency_s
        want = fitted if gen == "hopper" else NVLS_LATENCY
        assert hw.intra_node.nvls_latency_s == pytest.approx(want)
    assert not (name in PCIE and hw.intra_node.has_nvls), f"{name}: NVLS needs an NVSwitch"


def test_hgx_h200_has_the_h100_links():
    """HGX H200 is the H100 baseboard (NVLink4, NVSwitch gen3) with other memory: the H100 logs
    below hold it too."""
    h100, h200 = load_hardware("dgx-h100"), load_hardware("hgx-h200")
    assert (h200.intra_node, h200.inter_node) == (h100.intra_node, h100.inter_node)


def _nvls_fit() -> float:
    """dgx-h100's NVLS latency fitted on the NVLS log: the value minimising the squared log
    error of the predicted time over the log's sizes from 1 MiB, every other parameter the
    preset's (the rule of docs/model.md)."""
    from scipy.optimize import minimize_scalar

    hw = load_hardware("dgx-h100")
    run = parse_nccl_tests(NVLS_LOG)[0]
    rows = run.records[run.records.nbytes >= B.NCCL_MIN_BYTES]

    def loss(latency_us: float) -> float:
        link = dataclasses.replace(hw.intra_node, nvls_latency_s=latency_us * 1e-6)
        trial = hw.replace(intra_node=link)
        return sum(math.log(B.nccl_predicted_s(run, float(r.nbytes), trial) / r.time_s) ** 2
                   for r in rows.itertuples())

    return minimize_scalar(loss, bounds=(1.0, 500.0), method="bounded").x * 1e-6


def test_dgx_h100_nvls_latency_is_the_fit_of_the_shared_log():
    assert load_hardware("dgx-h100").intra_node.nvls_latency_s == pytest.approx(_nvls_fit(),
                                                                                 rel=0.03)


def test_nvls_bandwidth_matches_the_shared_log():
    """Independent of the fit: NCCL's 0.85 x the Simple bandwidth against the log's slope from
    1 GiB on (the largest sizes, where the latency is < 1% of the time)."""
    hw = load_hardware("dgx-h100")
    run = parse_nccl_tests(NVLS_LOG)[0]
    big = run.records[run.records.nbytes >= 2**30]
    slope = np.polyfit(big.nbytes, big.time_s, 1)[0]  # s per byte
    measured = 9 / 8 / slope  # (n + 1)/n bytes per link per byte of buffer, n = 8
    link = hw.intra_node
    predicted = link.effective_bandwidth_bytes_per_s * link.nvls_bandwidth_fraction
    assert predicted == pytest.approx(measured, rel=0.02)


ROWS = B.nccl_rows(LOGS)


def test_every_shared_log_is_compared_and_every_excluded_one_says_why():
    names = {p.name for p in LOGS.glob("*.txt")}
    assert {r["log"] for r in ROWS} == names
    held = [r for r in ROWS if r["held"]]
    assert len(held) >= 8  # the eight one-node H100 logs
    for r in ROWS:
        assert r["held"] or len(r["why_not_held"]) > 20, r["log"]


@pytest.mark.parametrize("row", [r for r in ROWS if r["held"]], ids=lambda r: r["log"])
def test_each_preset_is_within_15_percent_of_the_logs_of_its_gpu(row):
    """Median |predicted / measured - 1| over the sizes from 1 MiB (`python
    benchmarks/bench_accuracy.py` prints every log, held or not)."""
    assert row["median_abs_1mib_up"] <= 0.15, row


def test_the_eight_gpu_all_reduce_is_no_longer_predicted_a_third_slow():
    """Before issue 16 dgx-h100 ran every all-reduce as a ring at 0.80 of NVLink: +28% median
    (+34% worst) on the 8x H100 all_reduce log (32 MiB - 16 GiB), whose NCCL chose NVLS."""
    row = next(r for r in ROWS if r["log"] == "h100x8-allreduce-nccl-tests-cluster-cluster01.txt")
    assert abs(row["median_1mib_up"]) < 0.05 and abs(row["worst"]) < 0.15


# --- the model's parts, by hand -----------------------------------------------------------------
H100 = load_hardware("dgx-h100")
SIMPLE_I = 450e9 * 0.80  # dgx-h100's NVLink Simple bandwidth per GPU


def test_nvls_all_reduce_by_hand():
    # each link carries (n + 1)/n of the buffer each way: 1.125 x at n = 8
    got = float(C.nvls_all_reduce_time(1e9, 8, 80e-6, 306e9))
    assert got == pytest.approx(80e-6 + 1.125e9 / 306e9)
    assert C.nvls_all_reduce_time(1e9, 1, 80e-6, 306e9) == 0


def test_small_all_reduce_runs_ll_mid_ll128_large_nvls_on_dgx_h100():
    small = predict_collective("all_reduce", 1024, 8, H100)
    assert (small["algorithm"], small["protocol"]) == ("ring", "ll")
    # LL: baseLat 6.6 us + 14 steps x 0.6 us + 1.75 x 1 KiB at 0.392 of Simple
    assert small["time_s"] == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 1.75 * 1024 / (0.392 * SIMPLE_I))
    mid = predict_collective("all_reduce", 4 * 2**20, 8, H100)
    assert mid["protocol"] == "ll128"
    large = predict_collective("all_reduce", 2**30, 8, H100)
    assert large["algorithm"] == "nvls"
    assert large["time_s"] == pytest.approx(80.7e-6 + 1.125 * 2**30 / (0.85 * SIMPLE_I))
    assert large["busbw_bytes_per_s"] > 450e9  # beyond the link: the switch reduces


def test_the_call_start_up_is_paid_once_per_call():
    # Simple ring all_gather of 8 ranks: 8.4 us per call + 7 steps x 3.4 us + 7/8 of the output
    ring = predict_collective("all_gather", 2**30, 8, H100, algorithm="ring", protocol="simple")
    assert ring["time_s"] == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 0.875 * 2**30 / SIMPLE_I)


def test_nccls_tree_is_a_chain_inside_a_node():
    # NCCL tuning.cc: 2 ((k - 1) intraLat + log2(nodes) interLat); one node of 8: 14 steps
    got = float(C.nccl_tree_all_reduce_time(8, 8, 8, 0, 1e-6, 5e-6, 1e12))
    assert got == pytest.approx(14e-6 + 16 / 1e12)
    over_nodes = float(C.nccl_tree_all_reduce_time(8, 64, 8, 0, 1e-6, 5e-6, 1e12))
    assert over_nodes == pytest.approx(2 * (7e-6 + 3 * 5e-6) + 16 / 1e12)


def test_a_flat_ring_over_nodes_pays_the_network_latency_where_it_crosses():
    # all_gather over 80 ranks in 10 nodes: 79 steps, 9 of them between nodes
    got = float(C.mixed_flat_time("all_gather", 0, 80, 10, 0, 1e-6, 10e-6, 1e9, "ring"))
    assert got == pytest.approx(9 * 10e-6 + 70 * 1e-6)
    ar = float(C.mixed_flat_time("all_reduce", 0, 80, 10, 0, 1e-6, 10e-6, 1e9, "ring"))
    assert ar == pytest.approx(18 * 10e-6 + 140 * 1e-6)


def test_all_to_all_over_nodes_sends_through_every_ranks_nic_share():
    # 80 ranks, 8 per node: 72/80 of each rank's buffer leaves the node over its NIC share
    # (400 GB/s x 0.90 / 8 GPUs), in 79 steps at the network's latency; the 10-node log measures
    # 50 GB/s busbw (the preset: 44)
    n, nbytes = 80, 16 * 2**30
    got = predict_collective("all_to_all", nbytes, n, H100, 8)["time_s"]
    nic = 400e9 * 0.90 / 8
    assert got == pytest.approx(8.4e-6 + 79 * 14e-6 + 72 / 80 * nbytes / nic)


def test_send_recv_between_nodes_uses_one_nic():
    one_nic = 400e9 * 0.90 / 8
    for per_node in (1, 8):
        got = predict_collective("send_recv", 2**30, 16, H100, per_node)["time_s"]
        assert got == pytest.approx(2**30 / one_nic, rel=0.001)


def test_nccl_has_no_recursive_doubling_a_generic_library_has():
    with pytest.raises(PlanError, match="recursive"):
        predict_collective("all_gather", 2**20, 64, H100, algorithm="recursive")
    mi300x = load_hardware("mi300x")  # generic: RCCL's tuner is not modelled (docs/model.md)
    assert mi300x.collective_library == "generic"
    assert "recursive" in predict_collective("all_gather", 2**20, 64, mi300x)["by_algorithm_s"]


def test_nvls_needs_an_nvswitch_node_that_has_it():
    a100 = load_hardware("dgx-a100-80gb")
    with pytest.raises(PlanError, match="NVLS"):
        predict_collective("all_reduce", 2**30, 8, a100, algorithm="nvls")
    with pytest.raises(PlanError, match="simple protocol only"):
        predict_collective("all_reduce", 2**30, 8, H100, algorithm="nvls", protocol="ll")
    with pytest.raises(PlanError, match="protocol 'll'"):
        predict_collective("all_reduce", 2**30, 8, load_hardware("mi300x"), protocol="ll")


# --- the spec fields ------------------------------------------------------------------------------
def _h100_with(**changes):
    data = load_hardware_dict("dgx-h100")
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split("__")
        for key in path:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return hardware_from_dict(data, "test")


@pytest.mark.parametrize("changes,message", [
    ({"intra_node__protocols__0__name": "ll64"}, "protocols.name must be one of ll, ll128"),
    ({"intra_node__protocols__1__name": "ll"}, "'ll' is given twice"),
    ({"intra_node__protocols__0__bandwidth_fraction": 1.5}, "protocols.bandwidth_fraction"),
    ({"inter_node__nvls_bandwidth_fraction": 0.85}, "NVLS is the NVSwitch's"),
    ({"collective_library": "ncl"}, "did you mean 'nccl'"),
    ({"collective_algorithm": "recursive"}, "not one of NCCL's"),
])
def test_bad_link_fields_are_refused_naming_the_field(changes, message):
    with pytest.raises(SpecError, match=message):
        _h100_with(**changes)


def test_nvls_as_the_fixed_algorithm_needs_nvls():
    with pytest.raises(SpecError, match="needs NVLink SHARP"):
        load_hardware("dgx-a100-80gb").replace(collective_algorithm="nvls")


def test_a_what_if_sets_a_yes_or_no_field():
    # --what-if asynchronous_device=false: the host's time then adds to the device's, as on CPU
    # ranks (perfmodel.step.compose); true or false, any case, never a factor
    from perfmodel import predict
    from perfmodel.recommend import apply_what_if

    synchronous = apply_what_if(H100, "asynchronous_device=False")
    assert synchronous.asynchronous_device is False and H100.asynchronous_device is True
    assert apply_what_if(synchronous, "asynchronous_device=true") == H100
    plan = {"gpus": 8, "tp": 8, "global_batch": 8}
    assert predict("llama3-8b", synchronous, plan).step_time_s > \
        predict("llama3-8b", H100, plan).step_time_s
    # a field the spec leaves unset takes a value (and refuses a factor: bad-input table)
    assert H100.gpus_per_host is None
    assert apply_what_if(H100, "gpus_per_host=4").gpus_per_host == 4


def test_the_link_model_survives_a_round_trip_and_a_what_if():
    from perfmodel.recommend import apply_what_if

    assert hardware_from_dict(H100.to_dict(), "dgx-h100") == H100
    faster = apply_what_if(H100, "intra_node.bandwidth_bytes_per_s=2x")
    assert faster.intra_node.protocols == H100.intra_node.protocols
    assert faster.intra_node.nvls_latency_s == H100.intra_node.nvls_latency_s
