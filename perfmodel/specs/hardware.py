"""Hardware specs: one node type of a cluster, with its links and efficiencies.

Units live in the field names. A spec is read from a preset (perfmodel/specs/presets/hardware/) or a
user's YAML/JSON file, which may start from a preset with `base: <preset>` and override any field.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.costs.precision import OPTIMIZER_KERNELS
from perfmodel.errors import PlanError, SpecError
from perfmodel.specs.loading import (
    FRACTION_FLOOR,
    Bound,
    boolean,
    check_fields,
    deep_merge,
    keyword_fields,
    label,
    read_mapping,
    suggest,
)

# the dtypes a hardware spec may give peaks and GEMM efficiencies for; fp4 (NVFP4/MXFP4, Blackwell
# and MI355X) is the datasheets', not yet a plan dtype (perfmodel.strategy.Dtype)
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
# Transformer Engine's FP8 scaling recipes (perfmodel.strategy.Fp8Recipe, perfmodel.costs.fp8)
FP8_RECIPES = ("delayed", "current", "mxfp8")
COLLECTIVE_ALGORITHMS = ("auto", "ring", "tree", "recursive", "hierarchical", "nvls")
# The collective library and the algorithms it has (perfmodel.costs.collectives.LIBRARY_ALGORITHMS):
# generic: every algorithm perfmodel models (ring, tree, recursive doubling/halving and, in groups
# over nodes, the hierarchical form), as MPI libraries and gloo have; nccl: NCCL's (and RCCL's),
# ring and tree for all_reduce (NVLS inside an NVSwitch node, hierarchical across nodes), ring for
# the others (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel).
COLLECTIVE_LIBRARIES = ("generic", "nccl")
# The low-latency protocols a link may list beside its large-message (Simple) protocol: NCCL's LL
# (8-byte lines carrying 4 bytes and a flag) and LL128 (128-byte lines carrying 120 bytes).
LINK_PROTOCOLS = ("ll", "ll128")
# perfmodel.costs.collectives.Op's values (specs do not import costs; a test checks they agree)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                  "all_to_all", "send_recv")

# Defaults for a hardware file that leaves these fields out; every preset sets its own, with its
# source. The fraction of the datasheet memory bandwidth that copy (STREAM-like) kernels reach:
# 0.80-0.90 on the GPUs of the presets (MI300X 0.80, V100 and H100 0.88, A100 0.90; see their
# comments), 0.85 their middle.
DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY = 0.85
# The cost of one kernel launch with its framework dispatch: ~3-5 us for a CUDA launch (the
# presets: 4 us A100 and H100, 5 us V100, 6 us MI300X); `calibrate run` measures it.
DEFAULT_KERNEL_OVERHEAD_S = 4e-6

# The physical range of every numeric hardware field, stated once: HardwareSpec, LinkSpec,
# CollectiveFit, GemmEfficiency and LayerCost check their fields against this table, and every
# error names the field, the range and the reason. Generous on purpose: the measured CPU ranks of
# `calibrate run` (~1e9 FLOP/s, ~1e9 B/s, ~0.3 ms latency) and tomorrow's accelerators fit;
# 1e-300 B/s or 1e9 GPUs per node does not. Keys: the field, "link." for both links' fields,
# "collectives.", "gemm_efficiency." and "layer_costs." for the entries of those lists.
_SECONDS = "a fixed cost above this is a hang, not an overhead"
# a fraction of a peak divides a time: below FRACTION_FLOOR (0.1%) it is a slip, not a machine
_FLOORED = "; below 0.1% is a slip of units or a broken fit, not a machine"
_FRACTION = "a fraction of the peak" + _FLOORED
_SEQ = "a sequence length [tokens]: 1e7 is beyond any context window"
_DIM = "a GEMM dimension: 1e9 is far beyond any layer (a step's tokens are ~1e7)"
BOUNDS: dict[str, Bound] = {
    "gpus_per_host": Bound(1, 65_536, "GPUs one host drives (as gpus_per_node's bound)",
                           inclusive=True, integer=True),
    "gpus_per_node": Bound(1, 65_536, "a node: NVL576 is the largest NVLink domain, a TPU v5p pod "
                           "has 8,960 chips", inclusive=True, integer=True),
    "peak_flops_per_s": Bound(1e6, 1e17, "1 MFLOP/s is below any CPU core; 1e17 is 10x the "
                              "densest accelerator's peak, B300 fp4 at 1.5e16", inclusive=True),
    "memory_bytes": Bound(1e6, 1e15, "1 MB holds no model; 1 PB is 3,000x a 288 GB GPU",
                          inclusive=True),
    "memory_bandwidth_bytes_per_s": Bound(1e6, 1e17, "1 MB/s is below any DRAM; 1e17 B/s is 5x a "
                                          "wafer-scale engine's on-chip SRAM, 21 PB/s",
                                          inclusive=True),
    "memory_bandwidth_efficiency": Bound(FRACTION_FLOOR, 1, "a fraction of "
                                         "memory_bandwidth_bytes_per_s" + _FLOORED,
                                         inclusive=True),
    "host_link_bytes_per_s": Bound(0, 1e13, "one direction of a GPU's link to its host: PCIe Gen3 "
                                   "x16 is 16 GB/s, NVLink-C2C 450 GB/s; 10 TB/s is more than "
                                   "HBM", inclusive=True),
    "sustained_clock_fraction": Bound(FRACTION_FLOOR, 1.5, "the GEMM throughput a part sustains "
                                      "in training over that of its measured GEMM ceiling: 1.5x "
                                      "is an overclock no datasheet has" + _FLOORED,
                                      inclusive=True),
    "memory_reserved_bytes": Bound(0, 1e15, "as memory_bytes, and below it", inclusive=True),
    "nccl_buffer_bytes": Bound(0, 1e12, "one communicator's buffers: 64 channels x 3 protocols "
                               "of 4 MiB is 0.8 GB; 1 TB is no buffer", inclusive=True),
    "memory_fragmentation": Bound(0, 0.9, "a fraction of the allocator's reserved pool left "
                                  "unused: above 0.9 the allocator is broken", inclusive=True),
    "kernel_overhead_s": Bound(0, 1, _SECONDS + " (a GPU launch is ~5 us)", inclusive=True),
    "kernel_overhead_tp_s": Bound(0, 1, _SECONDS, inclusive=True),
    "host_op_overhead_s": Bound(0, 1, _SECONDS + " (an eager framework op: ~3-10 us)",
                                inclusive=True),
    "host_op_backward_overhead_s": Bound(0, 1, _SECONDS + " (an op autograd's engine runs: "
                                         "~2-10 us)", inclusive=True),
    "collective_overhead_s": Bound(0, 1, _SECONDS, inclusive=True),
    "optimizer_overhead_s": Bound(0, 10, _SECONDS, inclusive=True),
    "optimizer_bandwidth_efficiency": Bound(0, 1, "0: not measured; else a fraction of the "
                                            "memory bandwidth" + _FLOORED, inclusive=True,
                                            floor=FRACTION_FLOOR),
    "fsdp_forward_overhead_s": Bound(0, 60, _SECONDS, inclusive=True),
    "fsdp_backward_overhead_s": Bound(0, 60, _SECONDS, inclusive=True),
    "fsdp_reduce_overhead_s": Bound(0, 60, _SECONDS, inclusive=True),
    "overlap_compute_slowdown": Bound(0, 1, "compute concurrent with a collective takes 1 + this "
                                      "as long: measured 0.189 on average, 0.40 at most (arXiv "
                                      "2507.03114); 1, twice as long, is no overlap at all",
                                      inclusive=True),
    "ranks_per_device": Bound(1, 1024, "ranks time-sharing one device: 1 on GPUs, ranks x threads "
                              "/ cores on a CPU", inclusive=True),
    "link.bandwidth_bytes_per_s": Bound(1e6, 1e15, "10 Mb/s Ethernet moves 1.25e6 B/s; 1e15 is "
                                        "~1,000x NVLink5's 9e11 per GPU", inclusive=True),
    "link.latency_s": Bound(0, 1, "a start-up above 1 s is a timeout, not a link",
                            inclusive=True),
    "link.efficiency": Bound(FRACTION_FLOOR, 1, "a fraction of the link's bandwidth" + _FLOORED,
                             inclusive=True),
    "link.call_latency_s": Bound(0, 1, "a start-up above 1 s is a timeout, not a link",
                                 inclusive=True),
    "link.nvls_bandwidth_fraction": Bound(0, 1, "0: no NVLS; else a fraction of the link's "
                                          "Simple bandwidth" + _FLOORED, inclusive=True,
                                          floor=FRACTION_FLOOR),
    "link.nvls_latency_s": Bound(0, 1, "a start-up above 1 s is a timeout", inclusive=True),
    "levels.gpus": Bound(1, 10**8, "GPUs of one domain of a fabric level: 1e8 is 100x the "
                         "largest cluster built", inclusive=True, integer=True),
    "levels.oversubscription": Bound(1, 1024, "a level's downlinks over its uplinks: 1 is "
                                     "non-blocking; 1024 leaves a GPU no bandwidth",
                                     inclusive=True),
    "protocols.call_latency_s": Bound(0, 1, "a start-up above 1 s is a timeout", inclusive=True),
    "protocols.latency_s": Bound(0, 1, "a step above 1 s is a timeout", inclusive=True),
    "protocols.bandwidth_fraction": Bound(FRACTION_FLOOR, 1, "a fraction of the link's Simple "
                                          "bandwidth" + _FLOORED, inclusive=True),
    "collectives.alpha_s": Bound(0, 1, "a start-up above 1 s is a timeout", inclusive=True),
    "collectives.bus_bandwidth_bytes_per_s": Bound(
        1e3, 1e30, "fitted: a latency-bound regime leaves the bandwidth loose, and "
        "calibration.fit bounds 1/busbw below by 1e-30; below 1 kB/s is no link", inclusive=True),
    "collectives.breakpoint_bytes": Bound(0, 2**60, "a message size (--bytes stops at 1 EiB)",
                                          inclusive=True),
    "gemm_efficiency.max_fraction": Bound(FRACTION_FLOOR, 1, _FRACTION, inclusive=True),
    "gemm_efficiency.large_max_fraction": Bound(0, 1, "0: one kernel; else " + _FRACTION,
                                                inclusive=True, floor=FRACTION_FLOOR),
    "gemm_efficiency.half_dim": Bound(0, 1e9, _DIM, inclusive=True),
    "gemm_efficiency.unaligned_fraction": Bound(0, 1, "0: not measured; else " + _FRACTION,
                                                inclusive=True),
    "gemm_efficiency.m_half_dim": Bound(0, 1e9, _DIM, inclusive=True),
    "gemm_efficiency.n_half_dim": Bound(0, 1e9, _DIM, inclusive=True),
    "gemm_efficiency.k_half_dim": Bound(0, 1e9, _DIM, inclusive=True),
    "gemm_efficiency.batch_half": Bound(0, 1e9, "a GEMM batch count", inclusive=True),
    "gemm_efficiency.split_k_ratio": Bound(0, 1e18, "compared with batch m n / k, at most a GEMM's "
                                           "output elements", inclusive=True),
    "gemm_efficiency.split_k_chunk": Bound(0, 1e9, "0: no split-K; else a length of k, at least "
                                           "one element (it divides k: 1e-300 made a GEMM of "
                                           "infinite time)", inclusive=True, floor=1),
    "gemm_efficiency.parallel_half": Bound(0, 1e18, "output elements of a GEMM (1e9 x 1e9)",
                                           inclusive=True),
    "gemm_efficiency.large_parallel_half": Bound(0, 1e18, "output elements of a GEMM",
                                                 inclusive=True),
    "gemm_efficiency.large_flops": Bound(0, 1e24, "FLOPs of one GEMM: 1e24 is a frontier "
                                         "model's whole training run", inclusive=True),
    "gemm_efficiency.min_time_s": Bound(0, 1, _SECONDS + " (a GEMM kernel: ~5 us)",
                                        inclusive=True),
    "gemm_efficiency.epilogue_s": Bound(0, 1, "per output element: " + _SECONDS,
                                        inclusive=True),
    "layer_costs.tp": Bound(1, 10**7, "a tensor-parallel degree (plans stop at 1e7)",
                            inclusive=True, integer=True),
    "layer_costs.forward_overhead_s": Bound(0, 60, _SECONDS, inclusive=True),
    "layer_costs.backward_overhead_s": Bound(0, 60, _SECONDS, inclusive=True),
    "layer_costs.compute_scale": Bound(1, 100, "a framework is never faster than the "
                                       "roofline (below 1), and 100x slower is broken, not slow; "
                                       "a profile's scale below 1 is read as 1",
                                       inclusive=True),
    "flash_attention.head_dim": Bound(1, 4096, "an attention head's width (kernels stop at 256)",
                                      inclusive=True, integer=True),
    "flash_attention.forward_max_fraction": Bound(FRACTION_FLOOR, 1, _FRACTION, inclusive=True),
    "flash_attention.backward_max_fraction": Bound(FRACTION_FLOOR, 1, _FRACTION, inclusive=True),
    "flash_attention.forward_half_seq": Bound(0, 1e7, _SEQ, inclusive=True),
    "flash_attention.backward_half_seq": Bound(0, 1e7, _SEQ, inclusive=True),
    "flash_attention.max_head_dim": Bound(1, 4096, "the largest head size the kernel runs "
                                          "(FlashAttention-2: 256)", inclusive=True,
                                          integer=True),
    "flash_attention.sustained_fraction": Bound(FRACTION_FLOOR, 1.5, "the kernel's rate back to "
                                                "back at the part's power cap over its "
                                                "benchmark's (1: as benchmarked)" + _FLOORED,
                                                inclusive=True),
}


def bounded(key: str, value: Any, field: str | None = None) -> Any:
    """value checked against BOUNDS[key]; errors name `field` (default: key)."""
    return BOUNDS[key].check(value, field or key)


def strict_bool(value: Any, field: str) -> bool:
    """value if it is true or false (a YAML boolean, or numpy's), as a bool; anything else (1,
    "true") refused naming field."""
    return boolean(value, field)


@dataclass(frozen=True, kw_only=True)
class ProtocolSpec:
    """A low-latency protocol of a link (NCCL's LL or LL128), beside its large-message one.

    A collective on the link costs, in this protocol,
        T = call_latency_s + steps x latency_s + volume x nbytes / (bandwidth_fraction x B)
    with B the link's Simple bandwidth (bandwidth_bytes_per_s x efficiency); the cheapest protocol
    is taken, as NCCL's tuner does (perfmodel.costs.collectives.protocol_time).
    """

    name: str
    call_latency_s: float  # start-up of one call in this protocol [s] (NCCL's baseLat)
    latency_s: float  # per step of the algorithm [s] (NCCL's hwLat)
    bandwidth_fraction: float  # of the link's Simple bandwidth this protocol reaches

    def __post_init__(self) -> None:
        if self.name not in LINK_PROTOCOLS:
            raise SpecError(f"protocols.name must be one of {', '.join(LINK_PROTOCOLS)}, got "
                            f"{self.name!r}{suggest(str(self.name), LINK_PROTOCOLS)}")
        for name in ("call_latency_s", "latency_s", "bandwidth_fraction"):
            object.__setattr__(self, name, bounded(f"protocols.{name}", getattr(self, name),
                                                   f"protocols.{name}"))


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A link class (inside a node, or between nodes).

    bandwidth_bytes_per_s: one direction; per GPU inside a node, per node (all NICs) between nodes.
    latency_s: the per-message start-up cost (alpha) of one step of a collective on this link.
    efficiency: fraction of bandwidth_bytes_per_s that collectives reach (nccl-tests bus bandwidth).
    These three are the large-message protocol (NCCL's Simple); a GPU preset adds
    call_latency_s: the start-up of one collective call in that protocol, paid once per call;
    protocols: the low-latency protocols (ll, ll128), each with its own call and step latency and
    a fraction of the Simple bandwidth: small messages take the cheapest;
    nvls_bandwidth_fraction, nvls_latency_s: NVLink SHARP all-reduce inside an NVSwitch node (the
    switch reduces): its bandwidth as a fraction of the Simple bandwidth and its latency per call
    (0: the link has no NVLS);
    shares_host_link (intra_node only): the link is each GPU's own host link (PCIe), which its
    traffic to the NICs crosses as well (GPUDirect RDMA through the PCIe switch), so a collective
    whose ranks send inside and outside the node at once (all-to-all) shares that one link
    (perfmodel.costs.collectives.all_to_all_mixed_time). See perfmodel.costs.collectives and
    docs/model.md.
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 1.0
    call_latency_s: float = 0.0
    protocols: tuple[ProtocolSpec, ...] = ()
    nvls_bandwidth_fraction: float = 0.0
    nvls_latency_s: float = 0.0
    shares_host_link: bool = False

    def __post_init__(self) -> None:
        for name in ("bandwidth_bytes_per_s", "latency_s", "efficiency", "call_latency_s",
                     "nvls_bandwidth_fraction", "nvls_latency_s"):  # stored as floats
            object.__setattr__(self, name, bounded(f"link.{name}", getattr(self, name), name))
        object.__setattr__(self, "shares_host_link",
                           strict_bool(self.shares_host_link, "shares_host_link"))
        if not isinstance(self.protocols, (list, tuple)):
            raise SpecError(f"protocols must be a list of entries with "
                            f"{', '.join(_PROTOCOL_FIELDS)}, got {type(self.protocols).__name__}")
        protocols = tuple(p if isinstance(p, ProtocolSpec) else _protocol_from(p, i)
                          for i, p in enumerate(self.protocols))
        names = [p.name for p in protocols]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SpecError(f"protocols: '{dup}' is given twice")
        object.__setattr__(self, "protocols", protocols)

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    @property
    def has_nvls(self) -> bool:
        return self.nvls_bandwidth_fraction > 0

    def protocol(self, name: str) -> ProtocolSpec | None:
        return next((p for p in self.protocols if p.name == name), None)


_PROTOCOL_FIELDS = ("name", "call_latency_s", "latency_s", "bandwidth_fraction")


def _protocol_from(value: Any, i: int) -> ProtocolSpec:
    """protocols[i] of a link, from a mapping (a spec file) or a ProtocolSpec."""
    if not isinstance(value, Mapping):
        raise SpecError(f"protocols[{i}] must be a mapping with {', '.join(_PROTOCOL_FIELDS)}")
    check_fields(value, list(_PROTOCOL_FIELDS), f"protocols[{i}]")
    missing = [k for k in _PROTOCOL_FIELDS if k not in value]
    if missing:
        raise SpecError(f"protocols[{i}] is missing field '{missing[0]}'")
    try:
        return ProtocolSpec(**value)
    except SpecError as exc:
        raise SpecError(f"protocols[{i}]: {exc}") from None


# LinkSpec's fields: a fabric level's link fields (FabricLevel) and the node links derived from them
_LINK_ONLY = ("bandwidth_bytes_per_s", "latency_s", "efficiency", "call_latency_s", "protocols",
              "nvls_bandwidth_fraction", "nvls_latency_s", "shares_host_link")


@dataclass(frozen=True, kw_only=True)
class FabricLevel(LinkSpec):
    """One level of a fabric of several (HardwareSpec.levels), innermost first.

    name: what it is (nvlink, leaf, spine); gpus: the GPUs of one domain of this level (level 0:
    a node, the NVLink domain; level 1: e.g. the GPUs under one rail-leaf group, a scalable
    unit), a multiple of the level below's; the top level spans the cluster and has none.
    bandwidth_bytes_per_s: one direction, PER GPU at every level (inter_node gives it per node);
    latency_s, efficiency, call_latency_s, protocols: as LinkSpec's, for a collective's steps
    that cross this level; nvls_*, shares_host_link: level 0 only. oversubscription (levels
    above 0): a switch tier's downlink over uplink bandwidth; a GPU's share of this level is
    bandwidth_bytes_per_s x efficiency / oversubscription.

    A group of ranks that leaves its node is priced on the levels it crosses (from 1 up to the one
    whose domain holds it): the slowest one's bandwidth (the lowest per-GPU share: its ring's
    slowest hop sets the pace) and the most latency of any of them (crossed_link,
    perfmodel.encode.outer_link_values).
    """

    name: str
    gpus: int | None = None
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError(f"name must be a non-empty string, got {self.name!r}")
        if self.gpus is not None:
            object.__setattr__(self, "gpus", bounded("levels.gpus", self.gpus, "gpus"))
        object.__setattr__(self, "oversubscription",
                           bounded("levels.oversubscription", self.oversubscription,
                                   "oversubscription"))

    @property
    def gpu_share_bytes_per_s(self) -> float:
        """A GPU's effective share of this level: bandwidth x efficiency / oversubscription."""
        return self.effective_bandwidth_bytes_per_s / self.oversubscription

    def link(self, gpus_per_node: int | None = None) -> LinkSpec:
        """This level as a node link: level 0 as intra_node (per GPU); a level above, given
        gpus_per_node, as inter_node (per node: G x bandwidth / oversubscription)."""
        fields = {k: getattr(self, k) for k in _LINK_ONLY}
        if gpus_per_node is not None:
            fields["bandwidth_bytes_per_s"] = (self.bandwidth_bytes_per_s * gpus_per_node
                                               / self.oversubscription)
        return LinkSpec(**fields)


def crossed_link(levels: Sequence[FabricLevel], gpus_per_node: int) -> LinkSpec:
    """The link that prices a group of ranks whose ring crosses `levels` (a fabric's levels 1..J,
    those above the node up to the one whose domain holds the group), per node as inter_node:
    the slowest level's bandwidth and efficiency (the lowest per-GPU share, the outermost on a
    tie: the ring's slowest hop sets its pace), and the most latency any of them has, per step
    and per call; a protocol at the least bandwidth it reaches on any of them (its fraction of
    the slowest level's Simple share) and the most latency, where a level without it runs it as
    Simple. A level made faster never slows the group; one level is its own link."""
    if len(levels) == 1:
        return levels[0].link(gpus_per_node)
    share = [lv.gpu_share_bytes_per_s for lv in levels]
    slow = min(range(len(levels)), key=lambda i: (share[i], -i))
    link = levels[slow].link(gpus_per_node)
    names = list(dict.fromkeys(p.name for lv in levels for p in lv.protocols))

    def crossed(name: str) -> ProtocolSpec:
        ways = [(lv.protocol(name), lv, share[i] / share[slow]) for i, lv in enumerate(levels)]
        return ProtocolSpec(
            name=name,
            call_latency_s=max(p.call_latency_s if p else lv.call_latency_s for p, lv, _ in ways),
            latency_s=max(p.latency_s if p else lv.latency_s for p, lv, _ in ways),
            bandwidth_fraction=min(ratio * (p.bandwidth_fraction if p else 1.0)
                                   for p, _, ratio in ways))

    return dataclasses.replace(link, latency_s=max(lv.latency_s for lv in levels),
                               call_latency_s=max(lv.call_latency_s for lv in levels),
                               protocols=tuple(crossed(name) for name in names))


def node_links(levels: tuple[FabricLevel, ...]) -> tuple[int, LinkSpec, LinkSpec]:
    """gpus_per_node, intra_node and inter_node of a fabric: level 0 is the node, level 1 the
    network that leaves it (its per-GPU bandwidth x gpus_per_node: per node). Every level above
    the node is priced as such a link (crossed_link): a per-node bandwidth outside a link's
    range is refused, naming the level's field."""
    node = levels[0].gpus or 1  # HardwareSpec refuses a level 0 without gpus
    bound = BOUNDS["link.bandwidth_bytes_per_s"]
    for i, lv in enumerate(levels[1:], 1):
        per_node = lv.bandwidth_bytes_per_s * node / lv.oversubscription
        if not bound.minimum <= per_node <= bound.maximum:
            raise SpecError(f"levels[{i}].bandwidth_bytes_per_s ({lv.bandwidth_bytes_per_s:.4g} "
                            f"a GPU) x levels[0].gpus ({node}) / oversubscription "
                            f"({lv.oversubscription:g}) = {per_node:.4g} B/s a node must be >= "
                            f"{bound.minimum:g} and <= {bound.maximum:g}, a node's link's range")
    return node, levels[0].link(), levels[1].link(node)


@dataclass(frozen=True, kw_only=True)
class CollectiveFit:
    """A fitted alpha-beta model of one collective on one scope (from calibration).

    T(nbytes, n) = steps(n) * alpha_s + bus_factor(n) * nbytes / bus_bandwidth_bytes_per_s
    """

    op: str
    scope: str  # "intra" or "inter"
    algorithm: str
    alpha_s: float
    bus_bandwidth_bytes_per_s: float
    # Optional small-message regime (NCCL switches protocol LL/LL128/Simple or algorithm with
    # size): below breakpoint_bytes, alpha_s_small and bus_bandwidth_bytes_per_s_small apply;
    # alpha_s and bus_bandwidth_bytes_per_s hold from breakpoint_bytes on (0 = one regime), so a
    # reader that ignores these fields is still right for large messages.
    # Evaluate with perfmodel.specs.profile.fitted_collective_time (or _expr).
    breakpoint_bytes: float = 0.0
    alpha_s_small: float = 0.0
    bus_bandwidth_bytes_per_s_small: float = 0.0

    def __post_init__(self) -> None:
        if self.op not in COLLECTIVE_OPS:
            raise SpecError(f"collectives.op must be one of {', '.join(COLLECTIVE_OPS)}, got "
                            f"{self.op!r}{suggest(str(self.op), COLLECTIVE_OPS)}")
        if self.scope not in ("intra", "inter"):
            raise SpecError(f"collectives.scope must be 'intra' or 'inter', got '{self.scope}'")
        fit_algorithms = COLLECTIVE_ALGORITHMS[1:5]  # not auto, not nvls (a link's, not a fit's)
        if self.algorithm not in fit_algorithms:
            raise SpecError(f"collectives.algorithm must be one of "
                            f"{', '.join(fit_algorithms)}, got {self.algorithm!r}")
        def check(name: str, key: str) -> None:  # stored as floats (YAML reads 4.7e11 as text)
            object.__setattr__(self, name, bounded(key, getattr(self, name), f"collectives.{name}"))

        check("alpha_s", "collectives.alpha_s")
        check("bus_bandwidth_bytes_per_s", "collectives.bus_bandwidth_bytes_per_s")
        check("breakpoint_bytes", "collectives.breakpoint_bytes")
        if self.breakpoint_bytes > 0:  # the small-message regime: the same ranges
            check("alpha_s_small", "collectives.alpha_s")
            check("bus_bandwidth_bytes_per_s_small", "collectives.bus_bandwidth_bytes_per_s")


@dataclass(frozen=True, kw_only=True)
class GemmEfficiency:
    """Parameters of the GEMM efficiency model (see perfmodel.costs.gemm_efficiency)."""

    max_fraction: float  # fraction of peak that large, well-shaped GEMMs reach
    # the older harmonic-mean form: the dimension at which efficiency falls to half of
    # max_fraction (0: unused)
    half_dim: float = 0.0
    m_half_dim: float = 0.0  # rows of the output at which that dimension halves efficiency
    n_half_dim: float = 0.0  # columns of the output, likewise
    k_half_dim: float = 0.0  # contraction dimension, likewise
    batch_half: float = 0.0  # batch count, likewise
    min_time_s: float = 0.0  # shortest GEMM kernel [s], added to the roofline time
    parallel_half: float = 0.0  # output elements (times K splits) at which efficiency halves
    split_k_ratio: float = 0.0  # split-K when batch*m*n < split_k_ratio*k; 0: never
    split_k_chunk: float = 0.0  # contraction length of one split-K piece
    # the time each output element adds after the main loop (epilogue: convert, scale, write) [s]
    epilogue_s: float = 0.0
    # the large-tile kernel: from large_flops FLOPs (2 batch m n k) on, max_fraction and
    # parallel_half take these values; 0: one kernel for every size
    large_flops: float = 0.0
    large_max_fraction: float = 0.0
    large_parallel_half: float = 0.0
    # the rate (a fraction of peak) of a GEMM whose rows are not 16 bytes apart (a vocabulary
    # not a multiple of 8 in bf16): cuBLAS's alignment-1 fallback kernels; 0: not measured (such
    # GEMMs priced as aligned ones). Not scaled by sustained_clock_fraction: measured in a step.
    unaligned_fraction: float = 0.0

    def __post_init__(self) -> None:
        # validated and stored as floats (YAML reads 8.6e9 as a string)
        for f in dataclasses.fields(self):
            key = f"gemm_efficiency.{f.name}"
            object.__setattr__(self, f.name, bounded(key, getattr(self, f.name)))
        if self.large_flops > 0 and self.large_max_fraction <= 0:
            raise SpecError(
                "gemm_efficiency.large_max_fraction must be > 0 when large_flops is set "
                f"(got {self.large_max_fraction:g})"
            )
        if self.split_k_ratio > 0 and self.split_k_chunk <= 0:
            raise SpecError(
                "gemm_efficiency.split_k_chunk must be > 0 when split_k_ratio is set "
                f"(got {self.split_k_chunk})"
            )

    @property
    def splits_k(self) -> bool:
        return self.split_k_ratio > 0

    @property
    def has_large_kernel(self) -> bool:
        return self.large_flops > 0

    @property
    def has_epilogue(self) -> bool:
        return self.epilogue_s > 0

    @property
    def has_unaligned(self) -> bool:
        return self.unaligned_fraction > 0


LAYER_PARTS = ("layer", "embedding", "output")
LAYER_STYLES = ("plain", "tp", "tp_sp")


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """What the training framework adds to one part of a transformer, per micro-batch, measured
    by `calibrate run` (stage layers: the validation job's own modules, timed at several sizes).

    time = compute_scale * (the part's roofline compute) + forward_overhead_s   (forward)
    time = compute_scale * (the part's roofline compute) + backward_overhead_s  (backward)
    plus its collectives, as perfmodel models them. part: one transformer layer ("layer"), the
    token and position embedding ("embedding"), or the final norm, output layer and loss
    ("output"). style: "plain" (no tensor parallelism), "tp" (1D tensor parallel with DTensor),
    "tp_sp" (with sequence parallelism); tp: the tensor-parallel degree measured (1 for plain).
    See perfmodel.costs.framework.
    """

    part: str
    style: str
    tp: int
    forward_overhead_s: float
    backward_overhead_s: float
    compute_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.part not in LAYER_PARTS:
            raise SpecError(f"layer_costs.part must be one of {', '.join(LAYER_PARTS)}, got "
                            f"{self.part!r}{suggest(str(self.part), LAYER_PARTS)}")
        if self.style not in LAYER_STYLES:
            raise SpecError(f"layer_costs.style must be one of {', '.join(LAYER_STYLES)}, got "
                            f"{self.style!r}{suggest(str(self.style), LAYER_STYLES)}")
        object.__setattr__(self, "tp", bounded("layer_costs.tp", self.tp))
        if (self.style == "plain") != (self.tp == 1):
            raise SpecError(f"layer_costs.tp must be 1 for style 'plain' and at least 2 for "
                            f"'{self.style}' (got style '{self.style}', tp {self.tp})")
        for name in ("forward_overhead_s", "backward_overhead_s", "compute_scale"):
            object.__setattr__(self, name, bounded(f"layer_costs.{name}", getattr(self, name)))


@dataclass(frozen=True, kw_only=True)
class FlashAttentionPoint:
    """A fused (flash) attention kernel's speed at one head size, fitted to its published
    benchmark (TFLOP/s against sequence length; perfmodel.costs.compute.flash_attention_s):

        achieved FLOP/s = peak x max_fraction x s / (s + half_seq)

    for the forward and for the backward, FLOPs counted as the kernel's authors count them
    (FlashAttention-2, Dao 2023, Sec. 4.1: forward 4 s^2 d heads, halved with a causal mask;
    backward 2.5 x the forward).
    """

    head_dim: int
    forward_max_fraction: float
    forward_half_seq: float
    backward_max_fraction: float
    backward_half_seq: float

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # stored as floats (YAML reads 4.8e2 as text)
            value = bounded(f"flash_attention.{f.name}", getattr(self, f.name),
                            f"flash_attention.by_head_dim.{f.name}")
            object.__setattr__(self, f.name, int(value) if f.name == "head_dim" else value)


# The largest head size flash kernels run: FlashAttention-2 "all head dimensions up to 256"
# (github Dao-AILab/flash-attention README); cuDNN's fused attention and FlashAttention-3 likewise
# (FlashAttention.max_head_dim's default; perfmodel.encode.resolve_flash)
FLASH_MAX_HEAD_DIM = 256


@dataclass(frozen=True, kw_only=True)
class FlashAttention:
    """The hardware's fused (flash) attention kernel: which one, the dtypes it runs, and its
    speed by head size (FlashAttentionPoint). No dtypes: the GPU has no such kernel (V100:
    FlashAttention-2 needs Ampere or newer), and a plan that asks for one is refused.

    Between two measured head sizes the parameters are interpolated linearly; beyond the
    smallest or the largest, the nearest measured one's are taken (the spec says which kernel
    configurations were measured)."""

    kernel: str
    dtypes: tuple[str, ...] = ()
    by_head_dim: tuple[FlashAttentionPoint, ...] = ()
    # a short name a plan picks the kernel by (Plan.attention_kernel: cudnn, fa2, ...); "" for
    # a spec's only kernel
    name: str = ""
    # what the kernel sustains in a training step, back to back at the part's power cap, over
    # the rate its benchmark measured (a short burst): both directions' max fractions are taken
    # times it (perfmodel.encode.flash_values); 1 where no sustained measurement of the kernel
    # is published (docs/model.md, "GEMM ceiling")
    sustained_fraction: float = 1.0
    # the largest head size the kernel runs: a plan whose head_dim is above it is refused where
    # it names the kernel (--attention-kernel) or asks for flash attention, and attends unfused
    # under auto where the kernel is the default (perfmodel.encode.resolve_flash); 256 for
    # FlashAttention-2, cuDNN's and FlashAttention-3 (FLASH_MAX_HEAD_DIM), 128 for flash-attn's
    # Triton kernel (flash_attn_triton.py asserts d <= 128). Beyond its measured head sizes, up
    # to this, the nearest measured one's parameters are taken (at), with a note
    max_head_dim: int = FLASH_MAX_HEAD_DIM

    def __post_init__(self) -> None:
        label(self.kernel, "flash_attention.kernel", empty=True)
        object.__setattr__(self, "name", str(self.name).strip())
        object.__setattr__(self, "sustained_fraction",
                           bounded("flash_attention.sustained_fraction", self.sustained_fraction))
        object.__setattr__(self, "max_head_dim",
                           bounded("flash_attention.max_head_dim", self.max_head_dim))
        if self.name and not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", self.name):
            raise SpecError(f"flash_attention.name must be a short lower-case name (letters, "
                            f"digits, '-', '_', '.'), got '{self.name}'")
        if not isinstance(self.dtypes, (list, tuple)):
            raise SpecError(f"flash_attention.dtypes must be a list of dtypes "
                            f"({', '.join(DTYPES)}), got {type(self.dtypes).__name__}")
        object.__setattr__(self, "dtypes", tuple(str(d) for d in self.dtypes))
        for dtype in self.dtypes:
            if dtype not in DTYPES:
                raise SpecError(f"flash_attention.dtypes: unknown dtype '{dtype}'"
                                f"{suggest(dtype, DTYPES)}; allowed: {', '.join(DTYPES)}")
        given = _items(self.by_head_dim, "flash_attention.by_head_dim", FlashAttentionPoint,
                       _FLASH_POINT_FIELDS, _FLASH_POINT_FIELDS)
        points = tuple(sorted(given, key=lambda p: p.head_dim))
        if self.dtypes and not points:
            raise SpecError("flash_attention.by_head_dim must give at least one head size when "
                            "dtypes are listed")
        if len({p.head_dim for p in points}) != len(points):
            raise SpecError("flash_attention.by_head_dim gives a head_dim twice")
        if points and points[-1].head_dim > self.max_head_dim:
            raise SpecError(f"flash_attention.by_head_dim: head_dim {points[-1].head_dim} is "
                            f"above the kernel's max_head_dim {self.max_head_dim} (the largest "
                            "head size it runs): raise max_head_dim or drop the point")
        object.__setattr__(self, "by_head_dim", points)

    def runs(self, dtype: str) -> bool:
        return dtype in self.dtypes

    def at(self, head_dim: float) -> FlashAttentionPoint:
        """The kernel's parameters at a head size: linear in head_dim between measured points,
        the nearest point's beyond them."""
        import bisect

        points = self.by_head_dim
        dims = [p.head_dim for p in points]
        i = bisect.bisect_left(dims, head_dim)
        if i < len(points) and dims[i] == head_dim:
            return points[i]
        if i == 0 or i == len(points):
            near = points[0 if i == 0 else -1]
            return dataclasses.replace(near, head_dim=int(head_dim))
        lo, hi = points[i - 1], points[i]
        w = (head_dim - lo.head_dim) / (hi.head_dim - lo.head_dim)
        mix = {f.name: (1 - w) * getattr(lo, f.name) + w * getattr(hi, f.name)
               for f in dataclasses.fields(FlashAttentionPoint) if f.name != "head_dim"}
        return FlashAttentionPoint(head_dim=int(head_dim), **mix)


# HardwareSpec's numeric fields other than gpus_per_node and the per-dtype peaks
_SCALAR_FIELDS = ("memory_bytes", "memory_bandwidth_bytes_per_s", "memory_bandwidth_efficiency",
                  "sustained_clock_fraction", "host_link_bytes_per_s",
                  "memory_reserved_bytes", "nccl_buffer_bytes", "memory_fragmentation",
                  "kernel_overhead_s", "kernel_overhead_tp_s",
                  "collective_overhead_s", "optimizer_overhead_s",
                  "optimizer_bandwidth_efficiency", "fsdp_forward_overhead_s",
                  "fsdp_backward_overhead_s", "fsdp_reduce_overhead_s", "ranks_per_device",
                  "host_op_overhead_s", "host_op_backward_overhead_s",
                  "overlap_compute_slowdown")


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One kind of node and how many GPUs it holds."""

    name: str
    gpu_name: str
    gpus_per_node: int
    # GPUs one host (one operating system, one torchrun) drives, where a node (an NVLink domain)
    # spans several: a GB200 NVL72 rack's compute trays hold 4 each. None: gpus_per_node. Only
    # launch scripts read it (--emit-config: torchrun --nproc-per-node).
    gpus_per_host: int | None = None
    peak_flops_per_s: Mapping[str, float]
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    intra_node: LinkSpec
    inter_node: LinkSpec
    gemm_efficiency: Mapping[str, GemmEfficiency]
    memory_bandwidth_efficiency: float = DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY
    # The GEMM throughput the part sustains in training (its GEMMs back to back, at its power
    # cap) over the throughput at which its GEMM ceiling was measured: every GEMM's ceiling
    # (gemm_efficiency max_fraction, large_max_fraction) is taken times this; the fused
    # attention's measured rates, the memory-bound kernels and MFU's datasheet peak are not.
    # docs/model.md, "GEMM ceiling": dgx-h100 0.893 (a sustained against a burst measurement of
    # one H100 SXM); h100-pcie the A100 PCIe/SXM pair's 0.933; 1 where no sustained measurement
    # is shared (the ceiling as measured); `calibrate run` measures its device's.
    sustained_clock_fraction: float = 1.0
    # One direction of the link between a GPU and its host's memory (PCIe, NVLink-C2C) [B/s]: what
    # activation offloading copies over (Plan.cpu_offload_layers). 0: not given (offloading is
    # refused on this hardware).
    host_link_bytes_per_s: float = 0.0
    kernel_overhead_s: float = DEFAULT_KERNEL_OVERHEAD_S
    collective_overhead_s: float = 0.0  # fixed cost per collective call beyond alpha (dispatch)
    # Measured by `calibrate run` (framework stage):
    # the fixed cost per kernel of a tensor-parallel layer (torch: an op on DTensors), and the
    # fixed cost of one optimizer step beyond its bytes over the memory bandwidth (torch: the
    # foreach AdamW step's dispatch over its parameter tensors). 0 = not measured.
    kernel_overhead_tp_s: float = 0.0
    optimizer_overhead_s: float = 0.0
    # the fraction of memory_bandwidth_bytes_per_s the optimizer step reaches over perfmodel's
    # bytes per parameter (a framework's optimizer may make more passes than one fused kernel);
    # 0: memory_bandwidth_efficiency, as every other memory-bound kernel
    optimizer_bandwidth_efficiency: float = 0.0
    # the AdamW kernels whose steps that efficiency was measured on (OPTIMIZER_KERNELS:
    # `calibrate run` steps foreach on CPU ranks, fused on a GPU), over the fused kernel's bytes
    # per parameter: a plan whose optimizer runs other kernels scales the step's bytes by their
    # ratio (perfmodel.encode); fused where not measured (one pass at
    # memory_bandwidth_efficiency)
    optimizer_kernels: str = "fused"
    # What a GPU holds beyond the training's tensors (perfmodel.step.memory): the CUDA context and
    # libraries' workspaces (memory_reserved_bytes); each NCCL communicator's connection buffers
    # (nccl_buffer_bytes, per communicator a rank uses; 0: not measured); and the caching
    # allocator's fragmentation, the fraction of its reserved pool no tensor uses
    # (memory_fragmentation: reserved = allocated / (1 - f); 0: not measured)
    memory_reserved_bytes: float = 0.0
    nccl_buffer_bytes: float = 0.0
    memory_fragmentation: float = 0.0
    # Measured by `calibrate run` (stage layers): what FSDP2 (ZeRO 1-3) adds per unit beyond its
    # gathers, reduce-scatters and copies (hooks: unshard, reshard, post-backward), per
    # micro-batch forward and backward, and per step for the gradient reduction; 0 = not measured
    fsdp_forward_overhead_s: float = 0.0
    fsdp_backward_overhead_s: float = 0.0
    fsdp_reduce_overhead_s: float = 0.0
    # ranks that time-share one device's compute (CPU ranks on fewer cores than ranks x threads):
    # the rates above are then per rank with every rank busy, and a rank runs up to this much
    # faster while others wait (a pipeline's bubble); 1 on GPUs
    ranks_per_device: float = 1.0
    # Compute that runs while a hidden collective runs is slower than the same compute alone (the
    # two contend for SMs, memory bandwidth and power): it takes 1 + this as long
    # (perfmodel.step.compose.Overlap). The GPU presets take the measured mean of arXiv 2507.03114;
    # `calibrate run` (stage overlap) measures it; 0: compute runs at full speed beside a
    # collective (as before the field existed).
    overlap_compute_slowdown: float = 0.0
    # Whether the host only queues work for the device (a GPU: its time overlaps the device's,
    # perfmodel.step.compose) or runs it itself (CPU ranks: host and device time add). False for
    # a file that does not say (the additive model, as before issue 16); the GPU presets say true;
    # `calibrate run` writes it from the device it ran on.
    asynchronous_device: bool = False
    # Host time of one framework op (dispatch and launch) of an eager stack [s], what a GPU
    # device's queue waits on; measured by `calibrate run` (stage host). 0: kernel_overhead_s.
    host_op_overhead_s: float = 0.0
    # The same for the ops of the backward, which autograd's engine issues from C++ where the
    # forward's come through Python modules (the host stage times the two apart); 0:
    # host_op_overhead_s.
    host_op_backward_overhead_s: float = 0.0
    collective_algorithm: str = "auto"
    collective_library: str = "generic"  # the algorithms it has: generic (all) or nccl
    collectives: tuple[CollectiveFit, ...] = ()
    # Measured by `calibrate run` (stage layers); empty: the framework's cost is
    # kernel_overhead_s per kernel (see LayerCost)
    layer_costs: tuple[LayerCost, ...] = ()
    # the fused (flash) attention kernel and its measured speed; None: not measured (a plan that
    # asks for fused attention then costs its products at the GEMM efficiency)
    flash_attention: FlashAttention | None = None
    # other measured flash kernels of the GPU (each named), which a plan picks by name
    # (Plan.attention_kernel; flash_attention stays the default): H100's FlashAttention-2 beside
    # its cuDNN kernel
    flash_attention_alternatives: tuple[FlashAttention, ...] = ()
    # FP8 training (perfmodel.costs.fp8): the Transformer Engine scaling recipes the GPU runs, its
    # default first (TE's get_default_fp8_recipe: MXFP8 where the GPU has block-scaled tensor
    # cores, Blackwell, else per-tensor delayed scaling, which every FP8 GPU runs), and whether a
    # columnwise FP8 operand is a physical transpose (Hopper: TE docs, "cannot efficiently access
    # elements in columnwise fashion"; Blackwell: "no transpose is needed")
    fp8_recipes: tuple[str, ...] = ("delayed", "current")
    fp8_transpose: bool = True
    # A fabric of several levels, innermost first (FabricLevel): level 0 the node (NVLink domain,
    # gpus_per_node GPUs, intra_node), level 1 the network that leaves it (inter_node), and any
    # level above (a spine over scalable units). Empty: the two levels intra_node and inter_node
    # (what a spec without levels means). Given: intra_node, inter_node and gpus_per_node are
    # derived from it (node_links) and must agree with it.
    levels: tuple[FabricLevel, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        label(self.name, "name")
        label(self.gpu_name, "gpu_name")
        label(self.source, "source", empty=True)
        # every number stored as checked (a numeric string as its number, numpy's as Python's),
        # as hardware_from_dict stores a file's: the step model multiplies them
        object.__setattr__(self, "gpus_per_node", bounded("gpus_per_node", self.gpus_per_node))
        for name in _SCALAR_FIELDS:
            object.__setattr__(self, name, bounded(name, getattr(self, name)))
        for name in ("asynchronous_device", "fp8_transpose"):
            object.__setattr__(self, name, strict_bool(getattr(self, name), name))
        self._check_parts()
        if self.gpus_per_host is not None:
            object.__setattr__(self, "gpus_per_host", bounded("gpus_per_host",
                                                              self.gpus_per_host))
            if self.gpus_per_node % self.gpus_per_host:
                raise SpecError(f"gpus_per_host ({self.gpus_per_host}) must divide gpus_per_node "
                                f"({self.gpus_per_node}): a node's hosts are whole")
        if self.levels:  # first: a level's error names the level, not the link derived from it
            self._check_levels()
        kernels = [k for k in (self.flash_attention, *self.flash_attention_alternatives)
                   if k is not None]
        if any(not k.name for k in self.flash_attention_alternatives):
            raise SpecError("flash_attention_alternatives: every kernel needs a name")
        named = [k.name for k in kernels if k.name]
        if len(set(named)) != len(named):
            raise SpecError(f"flash attention kernels: a name is given twice: {', '.join(named)}")
        if self.flash_attention_alternatives and not (self.flash_attention
                                                      and self.flash_attention.name):
            raise SpecError("flash_attention needs a name where flash_attention_alternatives "
                            "give others (a plan picks them by name); or give "
                            "flash_attention_alternatives: [] to drop those (a base's too)")
        if self.memory_reserved_bytes >= self.memory_bytes:
            raise SpecError("memory_reserved_bytes must be below memory_bytes")
        seen = [(c.part, c.style, c.tp) for c in self.layer_costs]
        if len(set(seen)) != len(seen):
            dup = next(k for k in seen if seen.count(k) > 1)
            raise SpecError(f"layer_costs: part '{dup[0]}', style '{dup[1]}', tp {dup[2]} is "
                            "given twice")
        # the step model reads one fit per op and scope (perfmodel.step.collective): a second,
        # of another algorithm, would be mixed with the first (its parameters, the other's steps)
        fitted = [(c.op, c.scope) for c in self.collectives]
        if len(set(fitted)) != len(fitted):
            op, scope = next(k for k in fitted if fitted.count(k) > 1)
            algs = ", ".join(c.algorithm for c in self.collectives
                             if (c.op, c.scope) == (op, scope))
            raise SpecError(f"collectives: {op} {scope} has {fitted.count((op, scope))} fits "
                            f"({algs}): perfmodel uses one fit per op and scope; keep one")
        recipes = self.fp8_recipes
        if isinstance(recipes, str) or not isinstance(recipes, (list, tuple)) or not recipes:
            raise SpecError(f"fp8_recipes must be a list of some of {', '.join(FP8_RECIPES)}, "
                            f"the default first, got {recipes!r}")
        for recipe in recipes:
            if recipe not in FP8_RECIPES:
                raise SpecError(f"fp8_recipes: unknown recipe {recipe!r}"
                                f"{suggest(str(recipe), FP8_RECIPES)}; allowed: "
                                f"{', '.join(FP8_RECIPES)}")
        repeated = [r for i, r in enumerate(recipes) if r in recipes[:i]]
        if repeated:  # the default is the first: a list that names one twice is a slip
            raise SpecError(f"fp8_recipes names {repeated[0]!r} twice: give each recipe once, "
                            f"the default first, got {list(recipes)}")
        object.__setattr__(self, "fp8_recipes", tuple(str(r) for r in recipes))
        if not isinstance(self.collective_algorithm, str) \
                or self.collective_algorithm not in COLLECTIVE_ALGORITHMS:
            raise SpecError(
                f"collective_algorithm must be one of {', '.join(COLLECTIVE_ALGORITHMS)}, "
                f"got '{self.collective_algorithm}'"
            )
        if self.optimizer_kernels not in OPTIMIZER_KERNELS:
            given = str(self.optimizer_kernels)
            raise SpecError(f"optimizer_kernels must be one of {', '.join(OPTIMIZER_KERNELS)}, "
                            f"got {given!r}{suggest(given, OPTIMIZER_KERNELS)}")
        if not isinstance(self.collective_library, str) \
                or self.collective_library not in COLLECTIVE_LIBRARIES:
            lib = str(self.collective_library)
            raise SpecError(f"collective_library must be one of {', '.join(COLLECTIVE_LIBRARIES)}"
                            f", got {lib!r}{suggest(lib, COLLECTIVE_LIBRARIES)}")
        if self.collective_algorithm == "nvls" and not self.intra_node.has_nvls:
            raise SpecError("collective_algorithm 'nvls' needs NVLink SHARP: set "
                            "intra_node.nvls_bandwidth_fraction (an NVSwitch node that has it)")
        if self.collective_library == "nccl" and self.collective_algorithm == "recursive":
            raise SpecError("collective_algorithm 'recursive' is not one of NCCL's "
                            "(collective_library nccl: auto, ring, tree, hierarchical, nvls)")
        if self.inter_node.has_nvls:
            raise SpecError("inter_node.nvls_bandwidth_fraction must be 0: NVLS is the NVSwitch's "
                            "all-reduce inside a node (give it on intra_node)")
        if self.inter_node.shares_host_link:
            raise SpecError("inter_node.shares_host_link must be false: it says a node's "
                            "GPU-to-GPU link is the GPU's host (PCIe) link, which its NIC traffic "
                            "crosses too (give it on intra_node)")

    def _check_parts(self) -> None:
        """The nested fields of the right types, each stored as checked: the peaks as floats by
        dtype; the links a LinkSpec (or a mapping of its fields); gemm_efficiency GemmEfficiency
        by dtype (or mappings of its fields, as a spec file gives them); the lists of fits, layer
        costs, kernels and levels lists (None or a number refused naming the field, not an
        AttributeError inside the step model)."""
        peaks = self.peak_flops_per_s
        if not isinstance(peaks, Mapping):
            raise SpecError(f"peak_flops_per_s must map dtypes ({', '.join(DTYPES)}) to FLOP/s, "
                            f"got {type(peaks).__name__}")
        if not peaks:
            raise SpecError("peak_flops_per_s must name at least one dtype of " + ", ".join(DTYPES))
        for dtype in peaks:
            if dtype not in DTYPES:
                raise SpecError(
                    f"peak_flops_per_s: unknown dtype '{dtype}'{suggest(str(dtype), DTYPES)}; "
                    f"allowed: {', '.join(DTYPES)}"
                )
        object.__setattr__(self, "peak_flops_per_s", {
            str(dtype): bounded("peak_flops_per_s", flops, f"peak_flops_per_s.{dtype}")
            for dtype, flops in peaks.items()})
        for link in ("intra_node", "inter_node"):
            value = getattr(self, link)
            if isinstance(value, Mapping):
                check_fields(value, _LINK_FIELDS, link)
                for key in ("bandwidth_bytes_per_s", "latency_s"):
                    if key not in value:
                        raise SpecError(f"{link} is missing field '{key}'")
                value = _link_from(value, link)
            elif not isinstance(value, LinkSpec):
                raise SpecError(f"{link} must be a LinkSpec, or a mapping of its fields "
                                "(bandwidth_bytes_per_s and latency_s at least), got "
                                f"{type(value).__name__}")
            object.__setattr__(self, link, value)
        gemm = self.gemm_efficiency
        if not (isinstance(gemm, Mapping) and gemm
                and all(isinstance(v, GemmEfficiency) for v in gemm.values())):
            # a spec file's form (flat fields, or mappings by dtype), or a mix with fits
            gemm = _gemm_from(gemm if not isinstance(gemm, Mapping) else {
                k: dataclasses.asdict(v) if isinstance(v, GemmEfficiency) else v
                for k, v in gemm.items()}, f"hardware '{self.name}'")
        for dtype in gemm:
            if dtype not in (*DTYPES, "default"):
                raise SpecError(f"gemm_efficiency: unknown dtype '{dtype}'"
                                f"{suggest(str(dtype), DTYPES)}; allowed: {', '.join(DTYPES)} "
                                "or default")
        object.__setattr__(self, "gemm_efficiency", gemm)
        self._check_sustained()
        object.__setattr__(self, "collectives", _items(self.collectives, "collectives",
                                                       CollectiveFit, _FIT_FIELDS, _FIT_REQUIRED))
        object.__setattr__(self, "layer_costs", _items(
            self.layer_costs, "layer_costs", LayerCost, _LAYER_COST_FIELDS, _LAYER_COST_REQUIRED))
        fa = self.flash_attention
        if fa is not None and not isinstance(fa, FlashAttention):
            object.__setattr__(self, "flash_attention", _flash_from(fa, "hardware"))
        alternatives = self.flash_attention_alternatives
        if not isinstance(alternatives, (list, tuple)):
            raise SpecError("flash_attention_alternatives must be a list of kernels (each as "
                            f"flash_attention, with a name), got {type(alternatives).__name__}")
        object.__setattr__(self, "flash_attention_alternatives", tuple(
            a if isinstance(a, FlashAttention)
            else _flash_from(a, f"flash_attention_alternatives[{i}]", named=True)
            for i, a in enumerate(alternatives)))
        if not isinstance(self.levels, (list, tuple)):
            raise SpecError(f"levels must be a list of levels (FabricLevel, or mappings with "
                            f"{', '.join(_LEVEL_FIELDS)}), innermost first, or () for none; got "
                            f"{type(self.levels).__name__}")

    def _check_levels(self) -> None:
        """The fabric's levels nest, and the node links are the ones they give (node_links)."""
        levels = tuple(lv if isinstance(lv, FabricLevel) else _level_from(lv, i)
                       for i, lv in enumerate(self.levels))
        object.__setattr__(self, "levels", levels)
        if len(levels) < 2:
            raise SpecError(f"levels must list at least two levels (the node, then the network "
                            f"that leaves it), got {len(levels)}")
        names = [lv.name for lv in levels]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SpecError(f"levels: name '{dup}' is given twice")
        for i, lv in enumerate(levels):
            top = i == len(levels) - 1
            if top and lv.gpus is not None:
                raise SpecError(f"levels[{i}].gpus: the top level ({lv.name}) spans the whole "
                                "cluster: leave gpus out")
            if not top and lv.gpus is None:
                raise SpecError(f"levels[{i}].gpus is required: the GPUs of one {lv.name} "
                                "domain (only the top level has none)")
            if i and lv.has_nvls:
                raise SpecError(f"levels[{i}].nvls_bandwidth_fraction must be 0: NVLS is the "
                                "NVSwitch's all-reduce inside a node (level 0)")
            if i and lv.shares_host_link:
                raise SpecError(f"levels[{i}].shares_host_link must be false: it says a node's "
                                "GPU-to-GPU link is the GPU's host (PCIe) link, which its NIC "
                                "traffic crosses too (level 0)")
            if i == 0 and lv.oversubscription != 1:
                raise SpecError("levels[0].oversubscription must be 1: level 0 is the node's "
                                "own links (NVLink), each GPU's bandwidth its own")
            below = levels[i - 1].gpus if i else None
            if i and not top and below and (lv.gpus or 0) % below:
                raise SpecError(f"levels[{i}].gpus ({lv.gpus}) must be a multiple of "
                                f"levels[{i - 1}].gpus ({below}): the levels' domains nest")
        node, intra, inter = node_links(levels)
        for name, got, want in (("gpus_per_node", self.gpus_per_node, node),
                                ("intra_node", self.intra_node, intra),
                                ("inter_node", self.inter_node, inter)):
            if got != want:
                raise SpecError(f"{name} must agree with levels (a hardware with levels takes "
                                f"{name} from levels[{0 if name != 'inter_node' else 1}]): "
                                "change levels, not it")
        if len(levels) > 2 and any(c.scope == "inter" for c in self.collectives):
            raise SpecError("collectives: a fit of scope 'inter' is one network; this fabric has "
                            f"{len(levels) - 1} levels beyond the node: drop the fit or the levels")

    def fabric(self) -> tuple[tuple[str, int | None, float, float], ...]:
        """The fabric's levels, innermost first, as (name, GPUs of one domain or None for the
        top, a GPU's effective bandwidth share [B/s], latency per step [s]): `levels`, or the two
        a spec without them means (node: intra_node over gpus_per_node GPUs; network:
        inter_node, its per-node bandwidth shared by the node's GPUs)."""
        if self.levels:
            return tuple((lv.name, lv.gpus, lv.gpu_share_bytes_per_s, lv.latency_s)
                         for lv in self.levels)
        return (("node", self.gpus_per_node, self.intra_node.effective_bandwidth_bytes_per_s,
                 self.intra_node.latency_s),
                ("network", None,
                 self.inter_node.effective_bandwidth_bytes_per_s / self.gpus_per_node,
                 self.inter_node.latency_s))

    def peak(self, dtype: str) -> float:
        """Peak dense FLOP/s for a dtype; tf32 falls back to fp32 where the GPU has no TF32."""
        if dtype in self.peak_flops_per_s:
            return float(self.peak_flops_per_s[dtype])
        if dtype == "tf32" and "fp32" in self.peak_flops_per_s:
            return float(self.peak_flops_per_s["fp32"])
        # the plan's dtype, which the hardware does not run: a plan error, as dtype fp8 on a GPU
        # without FP8 is (fp8_recipe)
        raise PlanError(f"dtype {dtype}: hardware '{self.name}' ({self.gpu_name}) has no "
                        f"peak_flops_per_s.{dtype} (it has {', '.join(self.peak_flops_per_s)}): "
                        f"train in {self.default_dtype()}, or give its {dtype} peak")

    def default_dtype(self) -> str:
        """The training dtype when none is given: the fastest 16-bit type the hardware has
        (peak_flops_per_s names it), bf16 on a tie; fp32 (or tf32) on hardware without one
        (V100: fp16; H100, A100, MI300X: bf16)."""
        peaks = self.peak_flops_per_s
        for family in (("bf16", "fp16"), ("fp32", "tf32")):
            present = [d for d in family if d in peaks]
            if present:
                return max(present, key=lambda d: peaks[d])  # the first (bf16, fp32) on a tie
        return max(peaks, key=lambda d: peaks[d])  # fp8 only: what it has

    def fp8_recipe(self, recipe: str | None = None) -> str:
        """The FP8 scaling recipe a plan runs: `recipe`, or the hardware's default (the first of
        fp8_recipes); a PlanError naming the field where the hardware has no FP8 peak, or does not
        run the recipe (MXFP8 on Hopper)."""
        if "fp8" not in self.peak_flops_per_s:
            raise PlanError(f"dtype fp8: hardware '{self.name}' ({self.gpu_name}) has no "
                            f"peak_flops_per_s.fp8 (it has {', '.join(self.peak_flops_per_s)}): "
                            "give its FP8 tensor-core peak, or train in "
                            f"{self.default_dtype()}")
        if recipe is None:
            return self.fp8_recipes[0]
        if recipe not in self.fp8_recipes:
            why = " (MXFP8 needs block-scaled tensor cores: Blackwell, CDNA4)" \
                if recipe == "mxfp8" else ""
            raise PlanError(f"fp8_recipe {recipe}: hardware '{self.name}' runs fp8_recipes "
                            f"{', '.join(self.fp8_recipes)}{why}")
        return recipe

    def gemm(self, dtype: str) -> GemmEfficiency:
        """The GEMM fit of a dtype as measured (its `default` where it has none)."""
        if dtype in self.gemm_efficiency:
            return self.gemm_efficiency[dtype]
        if "default" not in self.gemm_efficiency:
            raise SpecError(f"hardware '{self.name}': gemm_efficiency has no {dtype} entry and "
                            f"no default (it has {', '.join(self.gemm_efficiency)}); give "
                            f"gemm_efficiency.{dtype} or gemm_efficiency.default")
        return self.gemm_efficiency["default"]

    def _check_sustained(self) -> None:
        """The GEMM ceilings a training step runs at (training_gemm: each fit's times
        sustained_clock_fraction) lie in a fit's own range, or the spec is refused naming
        sustained_clock_fraction: a value inside its own bound (up to 1.5) can still lift a
        ceiling over the peak, which a fit's check would blame on a field the user never set."""
        scale = self.sustained_clock_fraction
        if scale == 1.0:
            return
        ceilings = {dtype: [fit.max_fraction] + ([fit.large_max_fraction]
                                                 if fit.large_max_fraction > 0 else [])
                    for dtype, fit in self.gemm_efficiency.items()}
        lowest = max((FRACTION_FLOOR / min(c) for c in ceilings.values()), default=0.0)
        highest = min((1 / max(c) for c in ceilings.values()), default=math.inf)
        for dtype, each in ceilings.items():
            out = [c for c in each if not FRACTION_FLOOR <= c * scale <= 1]
            if out:
                raise SpecError(
                    f"sustained_clock_fraction {scale:g} takes gemm_efficiency.{dtype}'s GEMM "
                    f"ceiling {out[0]:g} to {out[0] * scale:.4g} of the peak, outside "
                    f"{FRACTION_FLOOR:g}..1: with these GEMM fits it must lie in "
                    f"{lowest:.4g}..{highest:.4g} (a training step's GEMMs run at each fit's "
                    "ceiling times it)")

    def training_gemm(self, dtype: str) -> GemmEfficiency:
        """The GEMM fit of a dtype as a training step runs it: its ceilings (max_fraction,
        large_max_fraction) times sustained_clock_fraction, the rest as measured."""
        fit = self.gemm(dtype)
        if self.sustained_clock_fraction == 1.0:
            return fit
        return dataclasses.replace(
            fit, max_fraction=fit.max_fraction * self.sustained_clock_fraction,
            large_max_fraction=fit.large_max_fraction * self.sustained_clock_fraction)

    def flash_kernel(self, dtype: str, name: str | None = None) -> FlashAttention | None:
        """The flash-attention kernel that runs this dtype, or None (not measured, or a dtype the
        kernel does not run): the default one, or the one named `name` (flash_attention_names;
        an unknown name is a PlanError naming those there are)."""
        fa = self.flash_attention
        if name:
            fa = self.named_flash_kernel(name)
        return fa if fa is not None and fa.runs(dtype) else None

    def flash_attention_names(self) -> tuple[str, ...]:
        """The names of the GPU's measured flash kernels, the default's first."""
        kernels = (self.flash_attention, *self.flash_attention_alternatives)
        return tuple(k.name for k in kernels if k is not None and k.name and k.dtypes)

    def named_flash_kernel(self, name: str) -> FlashAttention:
        """The flash kernel called `name`; PlanError where the GPU has none so named."""
        for kernel in (self.flash_attention, *self.flash_attention_alternatives):
            if kernel is not None and kernel.name == name and kernel.dtypes:
                return kernel
        names = self.flash_attention_names()
        raise PlanError(f"attention_kernel {name}: hardware '{self.name}' has no measured flash "
                        f"kernel called so; " + (f"its kernels: {', '.join(names)}" if names
                                                 else "it names none"))

    def replace(self, **changes: Any) -> HardwareSpec:
        """This hardware with some fields changed, checked as a new spec (an unknown field is
        refused with the closest name)."""
        return dataclasses.replace(self, **changes)

    @property
    def host_gpus(self) -> int:
        """GPUs one host drives (gpus_per_host, else gpus_per_node)."""
        return self.gpus_per_host or self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


keyword_fields(HardwareSpec, SpecError, "hardware")
keyword_fields(LinkSpec, SpecError, "link")
_TOP_FIELDS = [f.name for f in dataclasses.fields(HardwareSpec)] + ["base"]
_LINK_FIELDS = [f.name for f in dataclasses.fields(LinkSpec)]
_GEMM_FIELDS = [f.name for f in dataclasses.fields(GemmEfficiency)]
_FIT_FIELDS = [f.name for f in dataclasses.fields(CollectiveFit)]
_FIT_REQUIRED = [f.name for f in dataclasses.fields(CollectiveFit)
                 if f.default is dataclasses.MISSING]
_LAYER_COST_FIELDS = [f.name for f in dataclasses.fields(LayerCost)]
_FLASH_FIELDS = [f.name for f in dataclasses.fields(FlashAttention)]
_FLASH_POINT_FIELDS = [f.name for f in dataclasses.fields(FlashAttentionPoint)]
_LAYER_COST_REQUIRED = [f.name for f in dataclasses.fields(LayerCost)
                        if f.default is dataclasses.MISSING]


def merge_hardware(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A hardware mapping laid over another (a file over its base, a profile over a preset):
    field by field (deep_merge), but a flash_attention that names its kernel replaces the base's
    whole (its name, dtypes and points are another kernel's, not the base's), and one given as
    null (no kernel) takes the base's alternatives with it unless it gives its own."""
    merged = deep_merge(base, override)
    fa = override.get("flash_attention", ...)
    if isinstance(fa, Mapping) and "kernel" in fa:
        merged["flash_attention"] = dict(fa)
    elif fa is None and "flash_attention_alternatives" not in override:
        merged["flash_attention_alternatives"] = []
    return merged


def hardware_from_dict(data: Mapping[str, Any], where: str) -> HardwareSpec:
    """Build a HardwareSpec from a mapping of fields, checking every name and value."""
    check_fields(data, _TOP_FIELDS, where)
    required = ["peak_flops_per_s", "memory_bytes", "memory_bandwidth_bytes_per_s"]
    if not data.get("levels"):  # none, or a two-level spec's own mapping (to_dict): ()
        required = ["gpus_per_node", *required, "intra_node", "inter_node"]
    for key in required:
        if key not in data:
            raise SpecError(f"{where}: missing required field '{key}'")
    fields = {k: v for k, v in data.items() if k != "base" and not (k == "levels" and not v)}
    try:
        if "levels" in fields:
            fields["levels"] = _levels_from(fields["levels"])
            node, intra, inter = node_links(fields["levels"])
            # derived where left out (a spec file); a spec's own mapping (to_dict) repeats them;
            # a link given in part is laid over the derived one, so that what it changes is
            # refused as a disagreement with levels (HardwareSpec), not as a field left out
            fields.setdefault("gpus_per_node", node)
            for link, derived in (("intra_node", intra), ("inter_node", inter)):
                given = fields.get(link)
                fields[link] = ({**dataclasses.asdict(derived), **given}
                                if isinstance(given, Mapping) else
                                dataclasses.asdict(derived) if given is None else given)
        for link in ("intra_node", "inter_node"):
            value = fields[link]
            if not isinstance(value, Mapping):
                raise SpecError(f"{where}: {link} must be a mapping with {', '.join(_LINK_FIELDS)}")
            check_fields(value, _LINK_FIELDS, f"{where}: {link}")
            for key in ("bandwidth_bytes_per_s", "latency_s"):
                if key not in value:
                    raise SpecError(f"{where}: missing required field '{link}.{key}'")
            fields[link] = _link_from(value, link)
        peaks = fields["peak_flops_per_s"]
        if not isinstance(peaks, Mapping):
            raise SpecError(f"{where}: peak_flops_per_s must map dtypes ({', '.join(DTYPES)}) "
                            "to FLOP/s")
        fields["peak_flops_per_s"] = {str(k): bounded("peak_flops_per_s", v,
                                                      f"peak_flops_per_s.{k}")
                                      for k, v in peaks.items()}
        fields["gemm_efficiency"] = _gemm_from(fields.get("gemm_efficiency"), where)
        fits = _entries(fields.get("collectives", ()), "collectives", _FIT_FIELDS, _FIT_REQUIRED,
                        where)
        fields["collectives"] = tuple(CollectiveFit(**fit) for fit in fits)
        fields["layer_costs"] = _layer_costs_from(fields.get("layer_costs", ()), where)
        fields["flash_attention"] = _flash_from(fields.get("flash_attention"), where)
        alternatives = fields.get("flash_attention_alternatives") or ()
        if not isinstance(alternatives, (list, tuple)):
            raise SpecError(f"{where}: flash_attention_alternatives must be a list of kernels "
                            "(each as flash_attention, with a name)")
        fields["flash_attention_alternatives"] = tuple(
            _flash_from(a, f"{where}: flash_attention_alternatives[{i}]", named=True)
            for i, a in enumerate(alternatives))
        fields.setdefault("name", where)
        fields.setdefault("gpu_name", fields["name"])
        for key in _SCALAR_FIELDS:
            if key in fields:
                fields[key] = bounded(key, fields[key])
        fields["gpus_per_node"] = bounded("gpus_per_node", fields["gpus_per_node"])
        if fields.get("gpus_per_host") is not None:
            fields["gpus_per_host"] = bounded("gpus_per_host", fields["gpus_per_host"])
        return HardwareSpec(**fields)
    except TypeError as exc:  # a wrong type inside a nested field
        raise SpecError(f"{where}: {exc}") from None
    except SpecError as exc:  # name the file (or preset) as well as the field
        if str(exc).startswith(where):
            raise
        raise SpecError(f"{where}: {exc}") from None


def _items(value: Any, name: str, cls: type[Any], allowed: list[str],
           required: list[str]) -> tuple[Any, ...]:
    """A list field of a spec (collectives, layer_costs, a kernel's by_head_dim): each entry a
    `cls` or a mapping of its fields, built and checked; anything else refused naming the field."""
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{name} must be a list of entries with {', '.join(allowed)}, got "
                        f"{type(value).__name__}")
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, cls):
            out.append(entry)
            continue
        if not isinstance(entry, Mapping):
            raise SpecError(f"{name}[{i}] must be a mapping with {', '.join(allowed)}, got "
                            f"{type(entry).__name__}")
        check_fields(entry, allowed, f"{name}[{i}]")
        missing = [k for k in required if k not in entry]
        if missing:
            raise SpecError(f"{name}[{i}] is missing field '{missing[0]}'")
        try:
            out.append(cls(**entry))
        except SpecError as exc:
            raise SpecError(f"{name}[{i}]: {exc}") from None
    return tuple(out)


def _link_from(value: Mapping[str, Any], link: str) -> LinkSpec:
    """intra_node or inter_node from its mapping: numbers checked, protocols from their list,
    shares_host_link true or false."""
    fields: dict[str, Any] = {}
    for k, v in value.items():
        if k == "protocols":
            if not isinstance(v, (list, tuple)):
                raise SpecError(f"{link}.protocols must be a list of entries with "
                                f"{', '.join(_PROTOCOL_FIELDS)}")
            try:
                fields[k] = tuple(_protocol_from(p, i) for i, p in enumerate(v))
            except SpecError as exc:
                raise SpecError(f"{link}.{exc}") from None
        elif k == "shares_host_link":
            fields[k] = strict_bool(v, f"{link}.{k}")
        else:
            fields[k] = bounded(f"link.{k}", v, f"{link}.{k}")
    try:
        return LinkSpec(**fields)
    except SpecError as exc:
        raise SpecError(f"{link}.{exc}") from None


_LEVEL_FIELDS = [f.name for f in dataclasses.fields(FabricLevel)]


def _levels_from(value: Any) -> tuple[FabricLevel, ...]:
    """levels: a list of mappings (FabricLevel's fields), innermost first."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise SpecError(f"levels must be a list of levels, innermost first, each with "
                        f"{', '.join(_LEVEL_FIELDS)}")
    if len(value) < 2:
        raise SpecError(f"levels must list at least two levels (the node, then the network "
                        f"that leaves it), got {len(value)}")
    return tuple(_level_from(lv, i) for i, lv in enumerate(value))


def _level_from(value: Any, i: int) -> FabricLevel:
    """levels[i] from its mapping (or a FabricLevel), its numbers checked."""
    if isinstance(value, FabricLevel):
        return value
    if not isinstance(value, Mapping):
        raise SpecError(f"levels[{i}] must be a mapping with {', '.join(_LEVEL_FIELDS)}")
    check_fields(value, _LEVEL_FIELDS, f"levels[{i}]")
    for key in ("name", "bandwidth_bytes_per_s", "latency_s"):
        if key not in value:
            raise SpecError(f"levels[{i}] is missing field '{key}'")
    link = _link_from({k: v for k, v in value.items() if k in _LINK_ONLY}, f"levels[{i}]")
    extra = {k: v for k, v in value.items() if k not in _LINK_ONLY}
    if extra.get("gpus") is not None:
        extra["gpus"] = bounded("levels.gpus", extra["gpus"], f"levels[{i}].gpus")
    if "oversubscription" in extra:
        extra["oversubscription"] = bounded("levels.oversubscription", extra["oversubscription"],
                                            f"levels[{i}].oversubscription")
    try:
        return FabricLevel(**{k: getattr(link, k) for k in _LINK_ONLY}, **extra)
    except SpecError as exc:
        raise SpecError(f"levels[{i}].{exc}") from None


def _entries(value: Any, name: str, allowed: list[str], required: list[str],
             where: str) -> list[dict[str, Any]]:
    """A list field of mappings (collectives, layer_costs): each entry's fields checked."""
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{where}: {name} must be a list of entries with {', '.join(allowed)}")
    for i, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise SpecError(f"{where}: {name}[{i}] must be a mapping")
        check_fields(entry, allowed, f"{where}: {name}[{i}]")
        missing = [k for k in required if k not in entry]
        if missing:
            raise SpecError(f"{where}: {name}[{i}] is missing field '{missing[0]}'")
    return [dict(entry) for entry in value]


def _layer_costs_from(value: Any, where: str) -> tuple[LayerCost, ...]:
    out = []
    for i, fields in enumerate(_entries(value, "layer_costs", _LAYER_COST_FIELDS,
                                        _LAYER_COST_REQUIRED, where)):
        try:
            for key in ("tp", "forward_overhead_s", "backward_overhead_s", "compute_scale"):
                if key in fields:
                    fields[key] = bounded(f"layer_costs.{key}", fields[key])
            out.append(LayerCost(**fields))
        except SpecError as exc:
            raise SpecError(f"{where}: layer_costs[{i}]: {exc}") from None
    return tuple(out)


def _flash_from(value: Any, where: str, named: bool = False) -> FlashAttention | None:
    """flash_attention: {kernel, dtypes: [...], by_head_dim: [{head_dim, forward_max_fraction,
    forward_half_seq, backward_max_fraction, backward_half_seq}, ...], name, sustained_fraction,
    max_head_dim},
    or absent (named:
    an alternative kernel, present and with a name)."""
    if value is None and not named:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: flash_attention must be a mapping with "
                        f"{', '.join(_FLASH_FIELDS)}")
    check_fields(value, _FLASH_FIELDS, f"{where}: flash_attention")
    if "kernel" not in value:
        raise SpecError(f"{where}: missing required field 'flash_attention.kernel'")
    dtypes = value.get("dtypes", ())
    if isinstance(dtypes, str) or not isinstance(dtypes, (list, tuple)):
        raise SpecError(f"{where}: flash_attention.dtypes must be a list of dtypes "
                        f"({', '.join(DTYPES)})")
    points = _entries(value.get("by_head_dim", ()), "flash_attention.by_head_dim",
                      _FLASH_POINT_FIELDS, _FLASH_POINT_FIELDS, where)
    try:
        if named and not str(value.get("name", "")).strip():
            raise SpecError("missing required field 'name' (the name a plan picks this kernel "
                            "by)")
        if named and not dtypes:
            raise SpecError("dtypes: an alternative kernel runs some dtype (list them)")
        return FlashAttention(kernel=str(value["kernel"]), dtypes=tuple(dtypes),
                              by_head_dim=tuple(FlashAttentionPoint(**p) for p in points),
                              name=str(value.get("name", "")),
                              sustained_fraction=value.get("sustained_fraction", 1.0),
                              max_head_dim=value.get("max_head_dim", FLASH_MAX_HEAD_DIM))
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _gemm(fields: Mapping[str, Any], where: str) -> GemmEfficiency:
    missing = [f.name for f in dataclasses.fields(GemmEfficiency)
               if f.default is dataclasses.MISSING and f.name not in fields]
    if missing:
        raise SpecError(f"{where}: missing required field '{missing[0]}'")
    return GemmEfficiency(**fields)


def _gemm_from(value: Any, where: str) -> dict[str, GemmEfficiency]:
    """gemm_efficiency: {max_fraction, half_dim, ...} for all dtypes, or a mapping by dtype of
    those, or both (the flat fields are then the default for the dtypes not listed, as when a
    calibrated profile's per-dtype fits are laid over a preset's single model)."""
    if value is None:
        raise SpecError(f"{where}: missing required field 'gemm_efficiency'")
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: gemm_efficiency must be a mapping with "
                        f"{', '.join(_GEMM_FIELDS)}")
    flat = {key: v for key, v in value.items() if key in _GEMM_FIELDS}
    out: dict[str, GemmEfficiency] = {}
    if flat:
        if "default" in value:
            raise SpecError(
                f"{where}: gemm_efficiency has both top-level fields ({', '.join(flat)}) and a "
                "'default' entry; give one of them"
            )
        out["default"] = _gemm(flat, f"{where}: gemm_efficiency")
    for dtype, sub in value.items():
        if dtype in flat:
            continue
        if dtype not in (*DTYPES, "default"):
            raise SpecError(
                f"{where}: gemm_efficiency: unknown field '{dtype}'"
                f"{suggest(str(dtype), [*_GEMM_FIELDS, *DTYPES])}; "
                f"allowed: {', '.join(_GEMM_FIELDS)} or a dtype ({', '.join(DTYPES)}, default)"
            )
        if not isinstance(sub, Mapping):
            raise SpecError(f"{where}: gemm_efficiency.{dtype} must be a mapping")
        check_fields(sub, _GEMM_FIELDS, f"{where}: gemm_efficiency.{dtype}")
        out[dtype] = _gemm(sub, f"{where}: gemm_efficiency.{dtype}")
    if not out:
        raise SpecError(f"{where}: gemm_efficiency is empty; give {', '.join(_GEMM_FIELDS)} "
                        f"or a mapping of them by dtype ({', '.join(DTYPES)}, default)")
    return out  # without a default, a dtype not listed is refused where asked (gemm)


def load_hardware_dict(name_or_path: str | Path) -> dict[str, Any]:
    """The merged field mapping of a preset name or a spec file, `base:` resolved."""
    from perfmodel.specs.presets import HARDWARE_DIR, resolve

    path = resolve(name_or_path, HARDWARE_DIR, "hardware")
    data = read_mapping(path, "hardware")
    seen = {path}
    while "base" in data:
        base = data.pop("base")
        if base is None or not isinstance(base, str):
            raise SpecError(f"hardware file {path}: base must be a preset name or path")
        base_path = resolve(base, HARDWARE_DIR, "hardware", relative_to=path.parent)
        if base_path in seen:
            raise SpecError(f"hardware file {path}: base '{base}' forms a cycle")
        seen.add(base_path)
        base_data = read_mapping(base_path, "hardware")
        if data.get("levels"):  # a file's levels replace its base's fabric, node links included
            base_data = {k: v for k, v in base_data.items()
                         if k not in ("gpus_per_node", "intra_node", "inter_node")}
        data = merge_hardware(base_data, data)
    if path.parent == HARDWARE_DIR:
        data.setdefault("name", path.stem)
    else:
        data.setdefault("name", str(name_or_path))
    return data


def load_hardware(name_or_path: str | Path | HardwareSpec) -> HardwareSpec:
    """A HardwareSpec from a preset name (see `perfmodel presets`) or a YAML/JSON file."""
    if isinstance(name_or_path, HardwareSpec):
        return name_or_path
    data = load_hardware_dict(name_or_path)
    return hardware_from_dict(data, f"hardware '{name_or_path}'")


__all__ = ["BOUNDS", "COLLECTIVE_LIBRARIES", "DTYPES", "LAYER_PARTS", "LAYER_STYLES",
           "LINK_PROTOCOLS", "CollectiveFit", "FabricLevel", "FlashAttention",
           "FlashAttentionPoint",
           "GemmEfficiency", "HardwareSpec", "LayerCost", "LinkSpec", "ProtocolSpec",
           "hardware_from_dict", "load_hardware", "load_hardware_dict", "node_links"]
