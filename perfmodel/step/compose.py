"""A Phase, and the one rule that composes phases into a micro-batch, a stage and a step.

A phase is what one part of the model does once in a micro-batch on a stage (the layers' forward,
the embedding's backward, the pipeline's sends and receives), or once per step (the gradient
sync, the optimizer). It has
    device:   seconds on the device, by breakdown term (kernels' rooflines; how much slower the
              framework runs them, where measured)
    host:     seconds of dispatch on the host, by breakdown term (perfmodel.step.host: framework
              ops x their host cost; the framework's measured fixed costs)
    comms:    the collectives it issues (perfmodel.step.collective), each adding its time to its
              own term
    overlaps: the compute its collectives may hide behind (Overlap: a share of some of its
              collectives' time, a window of compute, the part that never hides)
    present:  1 on a stage that holds the part (the embedding on the first stage), else 0
    comm_scale: the stage's share of its collectives' declared calls (the layers of an uneven
              pipeline split: the stage's layers over the first stage's, which the ledger counts).

The composition rule, here and nowhere else:
    t_phase = present x (device + host + exposed(comm))                                   [s]
    exposed(comm) = comm                                       what no Overlap covers
                  = I max(f c, c - (1 + k) W) + (1 - I) c      c: an Overlap's share of comm,
                                                               W: its window, f: its floor,
                                                               I: the plan overlaps, k: below
    hidden(comm)  = comm - exposed(comm)                       (reported, not counted)
    contention    = k / (1 + k) hidden(comm)                   (a compute term of its own)
The contention: compute that runs while a hidden collective runs is slower than alone (the two
contend for SMs, memory bandwidth and power; arXiv 2507.03114 measures 18.9 % on average, 40 % at
most, over A100, H100, MI250 and MI210), taking 1 + k as long, k = s_ovl
(HardwareSpec.overlap_compute_slowdown). A window W of compute with a collective of c beside it:
the compute advances at 1 / (1 + k) while the collective runs,
  - c <= (1 + k) W (the collective fits): the window's compute ends at c + (W - c / (1 + k)),
    k / (1 + k) c later than alone, and all of c is hidden;
  - c > (1 + k) W (it does not): all of the window runs slowed, (1 + k) W, k W later than alone,
    and what remains of the collective, c - (1 + k) W, is exposed.
Both cases are k / (1 + k) x the hidden part, with the window stretched to (1 + k) W: one
expression, continuous at c = (1 + k) W, 0 at k = 0 (the model before it). The floor's share
(the last chunk) runs after the compute and slows nothing. An Overlap whose window already
accounts for the contention gives k = 0 (userbuffers' pipelined reduce-scatters: their GEMMs
run on the SMs left to them, 1 / (1 - share) as long, perfmodel.step.tensor_parallel).
Overlaps whose windows share compute (FSDP's gathers and reductions, both in the backwards, over
one network) form a pool: each hides what its own window takes, h_i, and together at most
(1 + k) P, P the compute their windows span: every h_i scaled by min(1, (1 + k) P / sum h_i)
where all of them are on (_pooled).
    t_stage = sum of its micro-batch phases' terms, host and device composed as below
    t_mb    = max(t_first, t_middle, t_last)                   (the slowest stage)
    T_step  = m t_mb + T_bubble + sum of the step phases' terms (+ per-step launches)

Host and device (one micro-batch on one stage, its collective launches on the host):
  - synchronous ranks (CPU: the host runs the kernels itself; Family.asynchronous False): they
    add, t = H + D, as before issue 16 (the local validation's measured layer costs assume it).
  - an asynchronous device (a GPU: the host queues kernels and goes on): one segment between two
    synchronisations costs the smooth maximum of its host time H and its device time D (the
    device's work: compute and the collectives on its stream, exposed part),
        t = (H^p + D^p)^(1/p),   p = HOST_DEVICE_SHARPNESS = 8,
    a p-norm: homogeneous (a segment twice as long costs twice as much), differentiable (sympy's
    sensitivities), H + D at p = 1, max(H, D) as p grows. Its sharpness: the exact time of a
    segment, the host issuing its ops one by one into the device's queue, is the largest over k
    of (host time of the first k ops + device time of the rest), at least max(H, D); the device
    idles while the host works through the element-wise and view ops that open each block (its
    norm, the reshapes: about a third of a block's ops, a sixth of a layer's with two blocks), so
    that at H = D, over the layers of a stage, a few to ten per cent is lost; p = 8 loses 9 %
    (2^(1/8)) at H = D and under 1 % once one side is 1.5 times the other. The host's share
    shown in the breakdown is what the device does not hide: each host term x (t - D) / H; the
    rest is reported as hidden.
    The segment: a micro-batch's forward and backward on a stage. Megatron synchronises the
    device after each batched pipeline send/receive (p2p_communication: torch.cuda.synchronize,
    batch_p2p_sync), so with pp > 1 a micro-batch's forward and backward are two segments; they
    are taken as one (their host-to-device ratios are alike: the backward has ~2.4 x the ops of
    the forward and 2 x its FLOPs, and the p-norm of sums is within a per cent of the sum of
    p-norms there). With pp = 1 the host runs ahead across micro-batches; by homogeneity the
    same. A tensor-parallel collective synchronises the tp ranks' devices, not their hosts (NCCL
    queues it on the stream like a kernel): every tp rank issues the same ops, so its time is
    device time of the segment. Blocking collectives (gloo on CPU ranks) block the host too:
    there everything adds anyway. The step's phases (gradient sync, optimizer) follow the
    host's synchronisation at the end of the last micro-batch (the gradient norm, the loss
    scaler's check): they add.
    An MoE layer's forward synchronises the host with the device (Synced): the exchange's split
    sizes, and Transformer Engine's grouped GEMM's, are read on the host (Megatron-Core's token
    dispatchers: the all-to-all's `_maybe_dtoh_and_synchronize` at "before_ep_alltoall", or
    "before_finish" with ep 1; the all-gather dispatcher's `.cpu()`; DeepEP's dispatch waits on
    the GPU for the receive counts; torchtitan's all-to-all splits `.tolist()` with ep > 1). The
    host cannot run ahead past it: between two syncs, the layer's routed section R (the
    exchange, the experts, the combine) comes first and the rest A of the next layer (norms,
    attention, router) after it, and the device cannot start A's kernels before the host has
    issued R's: that segment costs
        max(H_R + max(H_A, D_A), D_R + D_A),  smoothly  D_A + ((H_R + e_A)^p + D_R^p)^(1/p),
        e_A = (H_A^p + D_A^p)^(1/p) - D_A (A's host time its device time does not hide),
    R host-bound then A device-bound adds H_R + D_A where the p-norm of the sums would hide one
    behind the other; with no host time it is D_R + D_A. The stage's MoE layers, n alike, cost
    n such segments, by homogeneity one with n times each time; the rest B of the micro-batch
    (its backward, which issues its exchanges with the split sizes the forward read, the dense
    layers, the embedding and the output layer) is one segment as above:
        t = D_A + ((H_R + e_A)^p + D_R^p)^(1/p) + (H_B^p + D_B^p)^(1/p).
Communication adds unless an Overlap of its phase covers it (tensor-parallel collectives behind
the GEMMs they feed, perfmodel.step.tensor_parallel; the data-parallel sync behind the backward,
the parameter gather behind the forward, perfmodel.step.data_parallel). A collective's launches
are charged where it is issued (its ledger phase: in every micro-batch, on the stages its ledger
entry names, or once per step), its time in the phase that holds it: FSDP's gathers, issued in
every micro-batch, are timed with the step's sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.lattice import lmax, lmin, power, product
from perfmodel.step.collective import Collective, issued_launches

ZERO, ONE = sp.Integer(0), sp.Integer(1)

# The breakdown of one micro-batch on a stage, and of the rest of the step, in print order.
STAGE_TERMS = (
    "compute/forward/gemm", "compute/forward/attention", "compute/forward/elementwise",
    "compute/forward/embedding_logits",
    "compute/backward/gemm", "compute/backward/attention", "compute/backward/elementwise",
    "compute/backward/embedding_logits",
    "compute/forward/framework", "compute/backward/framework", "compute/recompute",
    "compute/tp_overlap", "compute/overlap_contention", "comm/tp", "comm/cp", "comm/ep",
    "overhead/kernels", "overhead/loop", "pipeline/p2p", "overhead/collectives",
)
STEP_TERMS = ("pipeline/bubble", "comm/dp", "compute/dp_overlap_contention", "comm/dp_framework",
              "comm/tp_grads", "optimizer/step")
# where an Overlap's contention (module doc) goes: a stage's, the step's
CONTENTION_TERM, STEP_CONTENTION_TERM = "compute/overlap_contention", \
    "compute/dp_overlap_contention"
HIDDEN = ":hidden"  # a term's hidden part: term + HIDDEN (reported, not in the step time)

# The smooth maximum of host and device time on an asynchronous device (see the module doc).
HOST_DEVICE_SHARPNESS = 8
# A segment with neither host nor device time divides by this instead of 0 [s^(p-1)]: its host
# terms are 0 either way.
_NO_TIME_S8 = sp.Float(1e-300)
# Terms only some families have (an fp8 plan's casts, perfmodel.step.fp8; the weight gradients
# added apart, perfmodel.step.grad_accumulation; activation offloading's exposed copies,
# perfmodel.step.offload): a breakdown shows them where a phase gives them, after
# the terms above.
OPTIONAL_STAGE_TERMS = ("compute/forward/fp8_cast", "compute/backward/fp8_cast",
                        "compute/backward/grad_accumulation", "comm/offload", "comm/fp8_amax")
OPTIONAL_STEP_TERMS = ("compute/fp8_weight_cast",)


def _present(terms: tuple[str, ...], optional: tuple[str, ...],
             phases: Sequence[Phase]) -> tuple[str, ...]:
    """terms, and those of `optional` that some phase gives."""
    given = {t for p in phases for t in (*p.device, *p.host, *(x.term for x in p.comms))}
    return terms + tuple(t for t in optional if t in given)


@dataclass(frozen=True)
class Overlap:
    """Communication that may hide behind compute: `share` of the time of the collectives `of`
    (all of the phase's when empty), up to `window_s` of it (the compute as it runs alone,
    stretched by the contention), and never its `floor` share (the chunk that has nothing left to
    hide behind), when `enabled` (0/1 or an indicator). `contention`: how much slower the window's
    compute runs beside the collective (module doc; 0 where the window already accounts for it)."""

    behind: str  # the compute it hides behind, in words
    window_s: sp.Expr
    enabled: sp.Expr
    floor: sp.Expr = ZERO
    of: tuple[str, ...] = ()
    share: sp.Expr = ONE
    contention: sp.Expr = S.s_ovl
    # Overlaps whose windows share compute (FSDP's gathers behind every forward and backward,
    # its reductions behind the backwards) name one pool, with the compute their windows span
    # together (`pool_s`, the same on each): what they hide together never exceeds it (module
    # doc); "" for an overlap alone
    pool: str = ""
    pool_s: sp.Expr = ZERO

    def covers(self, c: Collective) -> bool:
        return not self.of or c.name in self.of


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One phase of a micro-batch on a stage (or of the step: per_step); see the module doc."""

    name: str
    device: Mapping[str, sp.Expr] = field(default_factory=dict)
    host: Mapping[str, sp.Expr] = field(default_factory=dict)
    comms: tuple[Collective, ...] = ()
    overlaps: tuple[Overlap, ...] = ()
    present: sp.Expr = ONE
    per_step: bool = False
    comm_scale: sp.Expr = ONE

    def __post_init__(self) -> None:
        known = STEP_TERMS + OPTIONAL_STEP_TERMS if self.per_step \
            else STAGE_TERMS + OPTIONAL_STAGE_TERMS
        for term in (*self.device, *self.host, *(c.term for c in self.comms)):
            if term not in known:
                raise ValueError(f"phase {self.name}: '{term}' is not a term of "
                                 f"{'the step' if self.per_step else 'a stage'}")
        wrong = [c.name for c in self.comms if c.in_phase != self.name]
        if wrong or (not self.per_step and any(c.per_step for c in self.comms)):
            raise ValueError(f"phase {self.name}: collectives {wrong} belong to another phase")
        names = {c.name for c in self.comms}
        for ov in self.overlaps:
            missing = [n for n in ov.of if n not in names]
            terms = {c.term for c in self.comms if ov.covers(c)}
            if missing or len(terms) > 1:
                raise ValueError(f"phase {self.name}: an overlap behind {ov.behind} covers "
                                 f"{missing or sorted(terms)}: not one term of its collectives")


@dataclass(frozen=True)
class Synced:
    """A stage's MoE layers' forward sections between the host's syncs, per micro-batch (module
    doc): host and device seconds of their routed sections (R: the exchange, the experts, the
    combine; the exchanges' exposed time, term comm/ep of the phases `comm_phases`, is added to
    device_r) and of the rest of their forwards (A: norms, attention, router, shared experts).
    All 0 where the plan has no such sync (perfmodel.step.moe.synced)."""

    host_r: sp.Expr
    device_r: sp.Expr
    host_a: sp.Expr
    device_a: sp.Expr
    comm_phases: tuple[str, ...] = ()
    on: sp.Expr = ONE  # 0/1 (or an indicator): the plan's MoE layers sync the host


def exposed(comm_s: sp.Expr, overlap: Overlap | None) -> sp.Expr:
    """The part of some communication time that is not hidden [s] (comm_s: what the Overlap
    covers, its share taken)."""
    return exposed_hidden(comm_s, overlap)[0]


def exposed_hidden(comm_s: sp.Expr, overlap: Overlap | None) -> tuple[sp.Expr, sp.Expr]:
    """(exposed, hidden) of some communication time [s], its enabled Overlap leaving
    u = max(f c, c - (1 + k) W) exposed (module doc):
        exposed = I u + (1 - I) c,   hidden = I (c - u)
    hidden written so, not as c - exposed: never below 0 in floating point either (c minus
    something at most c), where that difference rounds to -1e-18 with the overlap off (I = 0)."""
    if overlap is None:
        return comm_s, ZERO
    window = (1 + overlap.contention) * overlap.window_s
    unhidden = lmax(scaled(overlap.floor, comm_s), comm_s - window)
    return (scaled(overlap.enabled, unhidden) + scaled(1 - overlap.enabled, comm_s),
            scaled(overlap.enabled, comm_s - unhidden))


def scaled(factor: sp.Expr, x: sp.Expr) -> sp.Expr:
    """factor x; 0 where either is 0, without building the product (sympy's 0 x asks whether x
    is finite, every node under it: much of a family's build)."""
    if factor == 0 or x == 0:
        return ZERO
    return factor * x


def contention_s(comm_s: sp.Expr, overlap: Overlap) -> sp.Expr:
    """What hiding some communication costs its window's compute [s] (module doc):
        k / (1 + k) x hidden,   hidden = comm_s - exposed(comm_s)
    = k / (1 + k) x hidden where the collective fits in the stretched window (1 + k) W, k W
    where it does not; k = overlap.contention."""
    return _slowed(exposed_hidden(comm_s, overlap)[1], overlap)


def _slowed(hidden: sp.Expr, overlap: Overlap) -> sp.Expr:
    """k / (1 + k) x a hidden part (contention_s, from exposed_hidden's)."""
    k = overlap.contention
    return scaled(k / (1 + k), hidden)


@dataclass(frozen=True)
class Terms:
    """A phase's (or a stage's) seconds by breakdown term: on the device, on the host, and its
    communication's exposed and hidden parts."""

    device: dict[str, sp.Expr]
    host: dict[str, sp.Expr]
    comm: dict[str, sp.Expr]
    hidden: dict[str, sp.Expr]


def phase_terms(phase: Phase, m: sp.Expr = ONE) -> Terms:
    """A phase's seconds by breakdown term, by the rule above (m: micro-batches per step, for the
    per-micro-batch collectives a step phase holds)."""
    def summed(part: Mapping[str, sp.Expr]) -> dict[str, sp.Expr]:
        return {t: scaled(phase.present, x) for t, x in part.items()}

    def time(c: Collective) -> sp.Expr:
        return comm_time(phase, c, m)

    comm: dict[str, list[sp.Expr]] = {}
    hidden: dict[str, list[sp.Expr]] = {}
    covered: dict[str, list[sp.Expr]] = {c.name: [] for c in phase.comms}
    slowed: list[sp.Expr] = []
    for ov in phase.overlaps:
        mine = [c for c in phase.comms if ov.covers(c)]
        if not mine:
            continue
        for name in {c.name for c in mine}:  # (several collectives may share a name: each once)
            covered[name].append(ov.share)
        if ov.pool:  # (below, with the others of its pool)
            continue
        total = scaled(ov.share, sp.Add(*(time(c) for c in mine)))
        shown, hid = exposed_hidden(total, ov)
        comm.setdefault(mine[0].term, []).append(shown)
        hidden.setdefault(mine[0].term, []).append(hid)
        if ov.contention != 0:
            slowed.append(_slowed(hid, ov))
    for pooled in _pools(phase, m).values():
        for term, shown, hid, slow in _pooled(pooled):
            comm.setdefault(term, []).append(shown)
            hidden.setdefault(term, []).append(hid)
            if slow != 0:
                slowed.append(slow)
    for c in phase.comms:
        rest = 1 - sp.Add(*covered[c.name])
        comm.setdefault(c.term, []).append(scaled(rest, time(c)))
    device = dict(phase.device)
    if slowed:
        term = STEP_CONTENTION_TERM if phase.per_step else CONTENTION_TERM
        device[term] = device.get(term, ZERO) + sp.Add(*slowed)
    return Terms(summed(device), summed(phase.host),
                 {t: scaled(phase.present, sp.Add(*x)) for t, x in comm.items()},
                 {t: scaled(phase.present, sp.Add(*x)) for t, x in hidden.items()})


Pooled = list[tuple[Overlap, str, sp.Expr, sp.Expr]]  # (overlap, term, c_i, h_i) of a pool


def _pools(phase: Phase, m: sp.Expr = ONE) -> dict[str, Pooled]:
    """The phase's pools of overlaps (Overlap.pool) that cover some of its collectives: each
    overlap with its term, the communication it covers (c_i, its share taken) and what it hides
    alone (h_i)."""
    out: dict[str, Pooled] = {}
    for ov in phase.overlaps:
        mine = [c for c in phase.comms if ov.covers(c)]
        if ov.pool and mine:
            total = scaled(ov.share, sp.Add(*(comm_time(phase, c, m) for c in mine)))
            out.setdefault(ov.pool, []).append((ov, mine[0].term, total,
                                                exposed_hidden(total, ov)[1]))
    return out


def _pool_share(pooled: Pooled) -> sp.Expr:
    """r of a pool (_pooled): the share of what its overlaps hide alone that they hide together."""
    k = pooled[0][0].contention
    on = product(*(ov.enabled for ov, _, _, _ in pooled))
    together = sp.Add(*(h for _, _, _, h in pooled))
    fits = lmin(ONE, product((1 + k) * pooled[0][0].pool_s,
                             power(lmax(together, _NO_TIME_S8), -1)))
    return 1 - scaled(on, 1 - fits)


def pool_shares(phase: Phase, m: sp.Expr = ONE) -> dict[str, sp.Expr]:
    """Each pool of the phase's overlaps: its r (_pooled), as its terms hold it (explain names
    it: the pool's hidden communication written whole in each of its terms would repeat every
    collective's time several times)."""
    return {name: _pool_share(pooled) for name, pooled in _pools(phase, m).items()}


def _pooled(pooled: Pooled) -> list[tuple[str, sp.Expr, sp.Expr, sp.Expr]]:
    """(term, exposed, hidden, contention) of overlaps that share their windows' compute (a
    pool: (overlap, term, c_i its communication, h_i what it hides alone) each): each hides at
    most what its own window takes (h_i), and together at most what the compute they span takes,
    P (pool_s), stretched by the contention as one window is (module doc):
        hidden_i = h_i r,   r = 1 - (prod_i I_i) (1 - min(1, (1 + k) P / sum_i h_i))
    (the pool binds where every overlap of it is on: with one off, the other's window is all it
    has, which its h_i holds); exposed_i = c_i - hidden_i. Windows that share nothing (P their
    sum) give r = 1."""
    r = _pool_share(pooled)
    out = []
    for ov, term, c, h in pooled:
        hid = scaled(r, h)
        out.append((term, c - hid, hid, _slowed(hid, ov) if ov.contention != 0 else ZERO))
    return out


def comm_time(phase: Phase, c: Collective, m: sp.Expr = ONE) -> sp.Expr:
    """A collective's time in its phase [s]: per micro-batch, or per step in a per-step phase (m
    micro-batches per step), times the phase's comm_scale."""
    return scaled(phase.comm_scale, c.time_per_step_s(m) if phase.per_step else c.time_s)


def overlap_floors(phase: Phase, m: sp.Expr = ONE) -> list[tuple[sp.Expr, sp.Expr]]:
    """(enabled, floor) of each switchable Overlap of the phase: a lower bound on what it adds to
    its terms [s], whatever `enabled` is (0 to 1; a search's bound, perfmodel.evaluate.
    step_lower_bound): k / (1 + k) of the communication it covers, c. Its terms hold
    c - I (c - u) / (1 + k) of it (exposed, module doc) and k / (1 + k) I (c - u) (contention),
    together at least k / (1 + k) c for 0 <= I <= 1, 0 <= u <= c and k >= 0. Only the Overlaps
    whose `enabled` is not a number and whose contention k is not 0; m as phase_terms'."""
    out = []
    for ov in phase.overlaps:
        mine = [c for c in phase.comms if ov.covers(c)]
        if not mine or ov.enabled.is_number or ov.contention == 0:
            continue
        k = ov.contention
        covered = sp.Add(*(comm_time(phase, c, m) for c in mine))
        out.append((ov.enabled, scaled(phase.present, scaled(ov.share, covered) * k / (1 + k))))
    return out


def launch_s(collectives: Iterable[Collective], stage: str | None = None,
             per_launch_s: sp.Expr = S.t_coll, head_first: sp.Expr | int = 0) -> sp.Expr:
    """Host time of launching collectives, per_launch_s per call [s]: on a stage (per
    micro-batch) those issued in a micro-batch on that stage (perfmodel.step.collective
    .issued_share: their ledger stage names it, every stage, or the output layer's where the
    stage holds it; head_first: Context.head_first); with stage None (per step) those issued once
    per step.

    Note: with pp = 1 the one stage is composed twice, as "first" and as "last", and each counts
    only the launches its ledger stage names (the first lacks the output layer's, the last the
    embedding's), while their time counts on both; kept as it was (issue 15 changes no number).
    """
    if stage is None:
        calls = [c.launches for c in collectives if c.per_step]
    else:
        calls = [launches for _, launches in issued_launches(collectives, stage, head_first)]
    return per_launch_s * sp.Add(*calls)


def smooth_max(host_s: sp.Expr, device_s: sp.Expr) -> sp.Expr:
    """(H^p + D^p)^(1/p), p = HOST_DEVICE_SHARPNESS [s] (see the module doc)."""
    return power(_power_sum(host_s, device_s), sp.Rational(1, HOST_DEVICE_SHARPNESS))


def _power_sum(host_s: sp.Expr, device_s: sp.Expr) -> sp.Expr:
    """H^p + D^p [s^p] (powers and products here through perfmodel.costs.lattice's power and
    product: the expressions sympy builds, without its questions about every node of H and D)."""
    p = HOST_DEVICE_SHARPNESS
    return power(host_s, p) + power(device_s, p)


def host_share(host_s: sp.Expr, device_s: sp.Expr) -> sp.Expr:
    """x = ((H^p + D^p)^(1/p) - D) / H: the share of the host's time the device does not hide.

    Written without the subtraction, which cancels catastrophically where H << D (a share of
    -1e-17 would show a negative host term): with S = (H^p + D^p)^(1/p),
        S - D = (S^p - D^p) / sum_{k<p} S^k D^(p-1-k) = H^p / sum_{k<p} S^k D^(p-1-k),
    so x = H^(p-1) / sum_{k<p} S^k D^(p-1-k), in [0, 1] and exact to rounding; 0 without host
    time, and the sum is kept above 0 (a segment with neither host nor device time).
    """
    p = HOST_DEVICE_SHARPNESS
    total = _power_sum(host_s, device_s)
    # S^k = (H^p + D^p)^(k/p), as sympy writes a power of a power
    denominator = sp.Add(*(product(power(total, sp.Rational(k, p)) if k else ONE,
                                   power(device_s, p - 1 - k)) for k in range(p)))
    return product(power(host_s, p - 1), power(lmax(denominator, _NO_TIME_S8), -1))


def _add(parts: Iterable[Terms], launches_s: sp.Expr, terms: Sequence[str]) -> Terms:
    out = Terms(*({t: ZERO for t in terms} for _ in range(4)))
    for p in parts:
        for mine, theirs in ((out.device, p.device), (out.host, p.host), (out.comm, p.comm),
                             (out.hidden, p.hidden)):
            for t, x in theirs.items():
                mine[t] = mine[t] + x
    if launches_s != 0:
        target = "overhead/collectives" if "overhead/collectives" in terms else "optimizer/step"
        out.host[target] = out.host[target] + launches_s
    return out


@dataclass(frozen=True)
class Stage:
    """One micro-batch on a stage composed: its terms [s] (what predict evaluates), what they
    hide, and, on an asynchronous device, the host's exposed share written as a symbol x (what
    explain prints: `display`, with x = ((H^p + D^p)^(1/p) - D) / H from `host_share`)."""

    terms: dict[str, sp.Expr]
    hidden: dict[str, sp.Expr]
    display: dict[str, sp.Expr]
    host_share: tuple[sp.Symbol, sp.Expr, sp.Expr, sp.Expr] | None = None  # x, its value, H, D
    # where the stage's MoE layers synchronise the host (Synced): H_R, D_R, H_A, D_A [s]
    synced: tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr] | None = None
    # on an asynchronous device, H by breakdown term (each a time, >= 0; they add up to H):
    # what the search's lower bound keeps of the host (perfmodel.evaluate.step_lower_bound)
    host_terms: Mapping[str, sp.Expr] = field(default_factory=dict)
    # the micro-batch's forward as it runs [s] (forward_s): its phases' host and device alone
    forward: sp.Expr = ZERO


def _times(share: sp.Expr, host_s: sp.Expr) -> sp.Expr:
    """share x host_s (0 without host time; see scaled), built as sympy would (lattice.product)."""
    return ZERO if host_s == 0 else product(share, host_s)


def stage_terms(phases: Sequence[Phase], launches_s: sp.Expr, asynchronous: bool = False,
                stage: str = "stage", synced: Synced | None = None,
                forward_synced: Synced | None = None) -> Stage:
    """One micro-batch on one stage, by breakdown term [s]: its phases and its launches, host
    and device composed as the module doc says (synced: its MoE layers' forward sections
    between the host's syncs, on an asynchronous device; forward_synced: those of the forward
    alone, without the recompute's, for the forward as it runs, Stage.forward); and what its
    terms hide (communication behind compute, host time behind the device's), by term."""
    names = _present(STAGE_TERMS, OPTIONAL_STAGE_TERMS, phases)
    each = [phase_terms(p) for p in phases]
    t = _add(each, launches_s, names)
    f_host, f_device = _forward_parts(phases, each)
    if not asynchronous:
        terms = {k: t.device[k] + t.host[k] + t.comm[k] for k in names}
        return Stage(terms, {k: t.hidden[k] for k in names}, terms, forward=f_host + f_device)
    host = sp.Add(*t.host.values())
    device = sp.Add(*t.device.values(), *(x for k, x in t.comm.items() if k != "pipeline/p2p"))
    sections = None
    if synced is None:
        shown = host_share(host, device)
    else:
        sections = _sections(synced, phases, each)
        shown = synced_share(host, device, *sections)
    x = sp.Symbol(f"x_host_{stage}")
    hidden_share = 1 - shown
    # the forward alone, from its start: one segment, or its MoE layers' sections between the
    # host's syncs and the rest (forward_s)
    f_excess = _times(host_share(f_host, f_device), f_host) if synced is None \
        else _synced_excess(f_host, f_device, *_sections(forward_synced or synced, phases, each),
                            clamp=True)
    return Stage({k: t.device[k] + _times(shown, t.host[k]) + t.comm[k] for k in names},
                 {k: t.hidden[k] + _times(hidden_share, t.host[k]) for k in names},
                 {k: t.device[k] + x * t.host[k] + t.comm[k] for k in names},
                 (x, shown, host, device), sections, dict(t.host),
                 forward=f_device + f_excess)


def _sections(synced: Synced, phases: Sequence[Phase], each: Sequence[Terms]) -> tuple[
        sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
    """(H_R, D_R, H_A, D_A) [s] of a stage's synced MoE sections, the exposed comm/ep of the
    phases that hold their exchanges in D_R."""
    exchanged = scaled(synced.on, sp.Add(*(
        terms.comm.get("comm/ep", ZERO) for p, terms in zip(phases, each, strict=True)
        if p.name in synced.comm_phases)))
    return synced.host_r, synced.device_r + exchanged, synced.host_a, synced.device_a


def _in_forward(phase: str) -> bool:
    """The phase runs in the forward, by the last part of its name (layers/forward, cp/ring/
    forward; not cp/ring_first/backward, layers@last/recompute, pipeline/p2p)."""
    return phase.rsplit("/", 1)[-1] == "forward"


def _forward_parts(phases: Sequence[Phase], each: Sequence[Terms]) -> tuple[sp.Expr, sp.Expr]:
    """(H_f, D_f) [s]: the host time and the device time (its exposed communication with it) of
    a stage's micro-batch forward: its forward phases' terms, and the compute/forward terms of a
    phase of both passes (FSDP's hooks). The pipeline's sends and receives (a phase of both
    passes, and no device time) and the loop's work are not the forward's."""
    host: list[sp.Expr] = []
    device: list[sp.Expr] = []
    for phase, t in zip(phases, each, strict=True):
        whole = _in_forward(phase.name)
        host += [x for k, x in t.host.items() if whole or k.startswith("compute/forward")]
        device += [x for part in (t.device, t.comm) for k, x in part.items()
                   if k != "pipeline/p2p" and (whole or k.startswith("compute/forward"))]
    return sp.Add(*host), sp.Add(*device)


def synced_share(host_s: sp.Expr, device_s: sp.Expr, host_r: sp.Expr, device_r: sp.Expr,
                 host_a: sp.Expr, device_a: sp.Expr) -> sp.Expr:
    """x = (t - D) / H for a stage whose MoE layers synchronise the host (module doc):
        t - D = (H_R + e_A) s(H_R + e_A, D_R) + H_B s(H_B, D_B),   e_A = H_A s(H_A, D_A),
    s(a, b) = host_share(a, b), the excess of the p-norm over b per unit of a, so that each
    excess is exact to rounding (host_share); H_B = H - H_R - H_A, D_B = D - D_R - D_A. 0
    without host time."""
    excess = _synced_excess(host_s, device_s, host_r, device_r, host_a, device_a)
    return product(excess, power(lmax(host_s, _NO_TIME_S8), -1))


def _synced_excess(host_s: sp.Expr, device_s: sp.Expr, host_r: sp.Expr, device_r: sp.Expr,
                   host_a: sp.Expr, device_a: sp.Expr, clamp: bool = False) -> sp.Expr:
    """t - D of synced_share [s]. clamp: H_B and D_B at least 0, where H and D are one pass's
    (the forward's, whose sections are counted apart from the terms that hold them)."""
    e_a = _times(host_share(host_a, device_a), host_a)
    routed = host_r + e_a
    rest_host, rest_device = host_s - host_r - host_a, device_s - device_r - device_a
    if clamp:
        rest_host, rest_device = lmax(rest_host, ZERO), lmax(rest_device, ZERO)
    return _times(host_share(routed, device_r), routed) \
        + _times(host_share(rest_host, rest_device), rest_host)


def _passes(terms: Mapping[str, sp.Expr]) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """(F, B, X) of a stage's composed terms: its compute/forward terms, its compute/backward
    terms with the recompute (which runs in the backward), and the rest of its time (the
    host's exposed dispatch, exposed communication, the contention, the pipeline's waits)."""
    forward: list[sp.Expr] = []
    backward: list[sp.Expr] = []
    rest: list[sp.Expr] = []
    for name, t in terms.items():
        (forward if name.startswith("compute/forward") else backward
         if name.startswith("compute/backward") or name == "compute/recompute" else rest).append(t)
    return sp.Add(*forward), sp.Add(*backward), sp.Add(*rest)


def backward_s(stage: Stage) -> sp.Expr:
    """One micro-batch's backward on a stage as it runs [s], the window a collective on a stream
    of its own runs beside (the data-parallel sync): the stage's micro-batch less its forward
    as it runs (forward_s), so the backward's compute and recompute, its exposed communication
    and host time, the pipeline's sends and the loop's work; at least 0 (rounding). What an
    overlapped sync leaves exposed, c - W, then adds the forward and c to the step: more work in
    the backward never shortens it. Until 2026-12-07 the compute/backward terms alone (a faster
    GPU shrank the window of a host-bound stage whose step did not shrink); then those and the
    backward's share of the compute, B / (F + B), of the rest of the stage's time, a share that
    grew with the backward's work: recompute widened the window by more than its own time
    where the stage's exposed tensor-parallel time was shared out (a step 0.6% shorter with
    selective recompute: Llama 2 7B on 16 MI300X, tp 8)."""
    return lmax(sp.Add(*stage.terms.values()) - stage.forward, ZERO)


def in_backward_s(part: sp.Expr, terms: Mapping[str, sp.Expr]) -> sp.Expr:
    """A part of a stage's backward compute (part [s] of its compute/backward terms) as the host
    lets it run: with its share (of the compute) of the host's exposed time (the overhead/
    terms: a host-bound stage pays it for every kernel), part (1 + H_x / (F + B)) (one
    division: a stage without compute, pp 2's middle, gives 0). Its communication is not its:
    the weight gradients a zero-bubble schedule defers issue none."""
    f, b, _ = _passes(terms)
    host = sp.Add(*(t for name, t in terms.items() if name.startswith("overhead/")))
    return part + scaled(part, product(host, power(lmax(f + b, _NO_TIME_S8), -1)))


def forward_s(stage: Stage) -> sp.Expr:
    """One micro-batch's forward on a stage as it runs [s] (the window the parameter gathers
    hide behind): its forward phases' device time, their exposed communication and the host's
    time for them, composed as one segment from the forward's start, (H_f^p + D_f^p)^(1/p)
    (module doc; H_f + D_f on synchronous ranks), or as the MoE layers' sections between the
    host's syncs and the rest where they synchronise it. It depends on the forward alone;
    backward_s is the rest of the stage's micro-batch. Until 2026-12-07 the compute/forward
    terms and the forward's share of the compute, F / (F + B), of the rest of the stage's time."""
    return stage.forward


def step_terms(phases: Sequence[Phase], m: sp.Expr, launches_s: sp.Expr,
               bubble_s: sp.Expr) -> tuple[dict[str, sp.Expr], dict[str, sp.Expr]]:
    """The step's terms beyond its m micro-batches [s]: the pipeline bubble, the step phases, and
    the launches of the per-step collectives (charged to the optimizer step); and what their
    communication hides."""
    names = _present(STEP_TERMS, OPTIONAL_STEP_TERMS, phases)
    t = _add((phase_terms(p, m) for p in phases), launches_s, names)
    terms = {k: t.device[k] + t.host[k] + t.comm[k] for k in names}
    terms["pipeline/bubble"] = terms["pipeline/bubble"] + bubble_s
    return terms, dict(t.hidden)


# --- the step's composition: functions applied to the terms' symbols (what `explain` prints) and
# to their expressions (what predict evaluates), so that the two cannot differ -------------------

def micro_batch_time(stage_times: Iterable[sp.Expr]) -> sp.Expr:
    """t_mb = max over the stages of one micro-batch's time [s]: the slowest sets the pace."""
    return lmax(*stage_times)


def other_stages_time(first: sp.Expr, middle: sp.Expr, last: sp.Expr, t_mb: sp.Expr,
                      pp: sp.Expr, multi: sp.Expr) -> sp.Expr:
    """t_other = (t_first + (pp - 2) t_middle + t_last - t_mb) / (pp - 1) [s]: one micro-batch's
    time on a stage other than the slowest, on average over them (0 with one stage). The
    pipeline's fill and drain take the sum over the stages of each one's time, less the slowest's
    (whose time every micro-batch pays anyway): a flow shop of identical jobs finishes in
    sum_i t_i + (m - 1) max_i t_i. Equal stages give t_other = t_mb."""
    stages = first + sp.Max(0, pp - 2, evaluate=False) * middle + last
    return multi * (stages - t_mb) / sp.Max(1, pp - 1, evaluate=False)


def step_time(m: sp.Expr, t_mb: sp.Expr, terms: Mapping[str, sp.Expr]) -> sp.Expr:
    """T_step = m t_mb + T_bubble + T_dp + T_dp_contention + T_dp_framework + T_tp_grads + T_opt
    [s] (+ T_fp8_wc, an fp8 plan's weight casts)."""
    return sp.Add(m * t_mb, *(terms[name] for name in (*STEP_TERMS, *OPTIONAL_STEP_TERMS)
                              if name in terms))


# the symbols of the composition, as `explain` prints it
M_SYM, T_MB, W_FILL = sp.Symbol("m"), sp.Symbol("t_mb"), sp.Symbol("W_fill")
T_OTHER = sp.Symbol("t_other")
T_ZBV = sp.Symbol("T_zbv")  # a ZB-V plan's bubble as its order runs (pipeline.zbv_bubble_s)
STAGE_SYMBOLS = {"first": sp.Symbol("t_first"), "last": sp.Symbol("t_last"),
                 "middle": sp.Symbol("t_middle")}
STEP_SYMBOLS = {"pipeline/bubble": sp.Symbol("T_bubble"), "comm/dp": sp.Symbol("T_dp"),
                "compute/dp_overlap_contention": sp.Symbol("T_dp_contention"),
                "comm/dp_framework": sp.Symbol("T_dp_framework"),
                "comm/tp_grads": sp.Symbol("T_tp_grads"), "optimizer/step": sp.Symbol("T_opt"),
                "compute/fp8_weight_cast": sp.Symbol("T_fp8_wc")}
