"""What every phase reads: the plan's derived quantities and the family's options as 0/1 values.

A Family fixes some options and leaves others open (perfmodel.family). `flag` turns an option into
a number: a fixed one into 0 or 1, an open one into its indicator symbol (perfmodel.symbols.FLAGS),
so that one expression covers every plan. `Context.of(family)` does it once for every option.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, wraps
from typing import Any, TypeVar

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs.lattice import applied, lmax, lmin
from perfmodel.family import Family

I = S.FLAGS  # noqa: E741  (indicator symbols by option name)


def flag(value: object, name: str) -> sp.Expr:
    """A fixed option as 0/1, an open one (None) as its indicator symbol."""
    if value is None:
        return I[name]
    return sp.Integer(1 if value else 0)


def active(n: sp.Expr) -> sp.Expr:
    """1 when a group has more than one rank, else 0 (degrees are whole numbers >= 1):
    min(1, n - 1)."""
    return sp.Min(1, n - 1, evaluate=False)


# the optional terms of the GEMM model: the Family flag that says a hardware has one, its parameters
_GEMM_OPTIONAL = {
    "gemm_split_k": ("split_k_ratio", "split_k_chunk"),
    "gemm_large_kernel": ("large_flops", "large_max_fraction", "large_parallel_half"),
    "gemm_epilogue": ("epilogue_s",),
    "unaligned_logits": ("unaligned_fraction",),
}


def device(fam: Family | None = None, *, fp8: bool = False) -> K.Device:
    """The device's symbols. The optional terms of the GEMM model (perfmodel.costs.gemm_efficiency:
    split-K, the large-tile kernel, the epilogue) enter the expressions only for hardware whose
    GEMM fit has them (Family.gemm_split_k, gemm_large_kernel, gemm_epilogue). fp8: the FP8 GEMMs'
    (their peak and fit; perfmodel.costs.fp8)."""
    dropped = {name for flag_, names in _GEMM_OPTIONAL.items()
               if fam is None or not getattr(fam, flag_) for name in names}
    table = S.FP8_GEMM if fp8 else S.GEMM
    gemm = {name: sym for name, sym in table.items() if name not in dropped}
    return K.Device(S.F8 if fp8 else S.F, S.W, S.t_k, gemm)


def stage_layers(fam: Family) -> dict[str, sp.Expr]:
    """Layers of the first, a middle and the last pipeline stage: L / pp each, or (uneven splits,
    Megatron --decoder-first/last-pipeline-num-layers) the given first and last stage's, the
    stages not given sharing the rest evenly:
        share = (L - L_first - L_last) / (pp - [L_first > 0] - [L_last > 0])
    (the plan rules make it whole; with one stage, L). A middle stage with pp <= 2 is none: its
    numbers are those of a stage that holds neither end and never exceed the others'. A layout
    whose middle ranks differ gives the most any holds (Family.middle_layers)."""
    if fam.uneven_stages is False:
        return {st: S.L / S.pp for st in ("first", "middle", "last")}
    given_first = sp.Min(1, S.L_first, evaluate=False)
    given_last = sp.Min(1, S.L_last, evaluate=False)
    share = (S.L - S.L_first - S.L_last) / sp.Max(1, S.pp - given_first - given_last,
                                                   evaluate=False)
    # a layout whose ranks between hold unequal layers: each costed as the one with the most
    # (perfmodel.pipeline_layout, middle_layers)
    middle = share if fam.middle_layers is None else sp.Integer(fam.middle_layers)
    return {"first": S.L_first + (1 - given_first) * share, "middle": middle,
            "last": S.L_last + (1 - given_last) * share}


def full_recomputed_layers(fam: Family, n: sp.Expr) -> sp.Expr:
    """The layers full recompute repeats of a stage that holds n, where the plan recomputes
    fully (the option's flag not included): torchtitan's one in N (Plan.recompute_every), the
    N-th, 2N-th, ... layer the rank builds, floor(n / N); Megatron's methods over the stage's v
    chunks of n / v layers: block, the first N_rl of each, min(floor(n / N), N_rl v) (N is 1
    with them, and N_rl > n / v recomputes every layer); uniform, every layer, floor(n / N) = n
    (workload.model.build_chunk; megatron/core/transformer/transformer_block.py)."""
    recomputed = applied(sp.floor, n / S.N_rc)
    if not fam.megatron_recompute:
        return recomputed
    block = S.I_block
    return lmin(recomputed, block * S.N_rl * S.v + (1 - block) * n)


def _option(fam: Family, name: str, value: str) -> sp.Expr:
    """1 if the family's option `name` is `value`, its indicator if the option is open."""
    option = getattr(fam, name)
    return option if option is None else option == value


R = TypeVar("R")


def per_context(fn: Callable[..., R]) -> Callable[..., R]:
    """fn(c, *args) computed once per Context and arguments (hashable: sympy expressions,
    strings, numbers), kept on the context: a build asks for the same expression many times
    (each stage, with and without recompute), and sympy would construct it again each time.
    Only for functions of the context that return immutable values (sympy expressions)."""
    @wraps(fn)
    def once(c: Context, *args: Any) -> R:
        memo: dict[Any, Any] = c.__dict__.setdefault("_per_context", {})
        key = (fn, args)
        if key not in memo:
            memo[key] = fn(c, *args)
        out: R = memo[key]
        return out
    return once


@dataclass(frozen=True)
class Context:
    """The family, the device, and what the phases derive from the plan's symbols.

    T = b s / cp tokens of a micro-batch on one rank (context parallelism splits each sequence);
    m = B / (dp b) micro-batches per step (Narayanan et al. SC21, Sec. 2.2); L / pp layers per
    stage. Options are 0/1 (or indicator symbols when open).
    """

    fam: Family
    dev: K.Device
    d: sp.Expr  # the head size: its own symbol d, or h / a (the attention is a d wide)
    T: sp.Expr  # tokens of a micro-batch on one rank: b s / cp
    m: sp.Expr  # micro-batches per step
    layers_per_stage: sp.Expr  # the first stage's: what the ledger counts (rank 0's)
    stage_layers: dict[str, sp.Expr]  # first, middle, last (see stage_layers)
    multi: sp.Expr  # 1 with several pipeline stages, 0 with one
    single: sp.Expr  # 1 - multi
    seq_parallel: sp.Expr
    # the share of a stage's layers under each recompute policy (the option's 0/1 times
    # floor(n / N) / n with Plan.recompute_every N; 0 under the others)
    full: sp.Expr  # full recompute
    full_on: sp.Expr  # the plan recomputes fully (Plan.recompute full): 0/1, or its indicator
    selective: sp.Expr  # selective recompute (Megatron: the attention core, or its modules)
    op: sp.Expr  # per-op selective recompute (torchtitan)
    # 1 where some layer of the stage recomputes fully (resp. per op): it needs a buffer to
    # recompute into
    full_any: sp.Expr
    op_any: sp.Expr
    zero1: sp.Expr  # ZeRO stage >= 1 (and likewise zero2, zero3)
    zero2: sp.Expr
    zero3: sp.Expr
    gpipe: sp.Expr
    interleaved: sp.Expr
    zero_bubble: sp.Expr  # zb or zbv
    zbv: sp.Expr
    flash: sp.Expr
    overlap_grad_sync: sp.Expr
    overlap_param_gather: sp.Expr
    tp_comm_overlap: sp.Expr
    compiled: sp.Expr  # the stack: torch.compile
    graphs: sp.Expr  # the stack: CUDA graphs
    # how the element-wise ops run (perfmodel.strategy.Kernels): eager (op by op), compiled
    # (Inductor); neither: fused (Megatron-Core / Transformer Engine)
    eager_kernels: sp.Expr
    te_loss: sp.Expr  # 1: Transformer Engine's fused cross entropy (Plan.cross_entropy te)
    loss_no_upcast: sp.Expr  # 1: the loss on the logits' own dtype (Plan.cross_entropy no-upcast)
    loss_torch: sp.Expr  # 1: PyTorch's loss on fp32 copies (Plan.cross_entropy torch)
    loss_native: sp.Expr  # 1: Megatron-Core's native fused loss (Plan.cross_entropy native)
    loss_flash: sp.Expr  # 1: flash-attn's fused loss (Plan.cross_entropy flash-attn)
    # 1: the routing weights scale the experts' activation (Plan.expert_weighting activation)
    weighted_activation: sp.Expr
    compiled_kernels: sp.Expr
    asynchronous: bool  # the device runs what the host queues (perfmodel.step.compose)
    gated: sp.Expr
    bias: sp.Expr
    qkv_bias: sp.Expr
    layernorm: sp.Expr  # 1: LayerNorm (weight and bias), 0: RMSNorm (weight)
    tied: sp.Expr
    learned_positions: sp.Expr
    rotary_positions: sp.Expr  # 1: RoPE on q and k (0: learned or ALiBi)
    grid2: sp.Expr  # tensor parallelism on a 2d grid (2.5d: with depth)
    grid3: sp.Expr  # on a 3d cube
    megatron: sp.Expr  # Megatron 1D: 1 - grid2 - grid3
    split: sp.Expr  # 1 where every activation is split over the tp ranks (SP, or a grid)
    act_ranks: sp.Expr  # ranks an activation is split over: 1 + split (tp - 1)
    # context parallelism: how attention crosses the cp ranks (one of the three is 1)
    cp_p2p: sp.Expr
    cp_allgather: sp.Expr
    cp_a2a: sp.Expr
    # the attention's head sizes: queries and keys d_qk, values d_v (d each, or MLA's), and the
    # heads of K and V (kv, or a with MLA)
    d_qk: sp.Expr
    d_v: sp.Expr
    kv_heads: sp.Expr
    # FP8 training (perfmodel.costs.fp8): 1 for an fp8 plan; the device of its linear layers'
    # GEMMs (FP8 peak and fit; dev for other plans) and the bytes of their operands (e_8; e)
    fp8: sp.Expr = sp.Integer(0)
    linear_dev: K.Device | None = None
    fp8_output: sp.Expr = sp.Integer(0)  # 1: the output layer's GEMM in FP8 too
    # full recompute as Megatron-LM groups it (Plan.recompute_method, recompute_num_layers): the
    # inputs a fully recomputed layer keeps (uniform in groups of k: a group's input, 1/k a
    # layer, ceil(n_chunk / k) / n_chunk), and the layers one recompute materializes at once (a
    # group's k); 1 and 1 layer by layer
    full_inputs: sp.Expr = sp.Integer(1)
    full_group: sp.Expr = sp.Integer(1)
    # 1 where the model's hidden (resp. attention) dropout rate is above 0: its masks are kept
    # and written (TransformerSpec.hidden_dropout); 0: PyTorch's dropout returns its input
    dropout: sp.Expr = sp.Integer(1)
    attention_dropout: sp.Expr = sp.Integer(1)

    @property
    def linear(self) -> K.Device:
        """The device the linear layers' GEMMs run on: FP8 for an fp8 plan."""
        return self.linear_dev or self.dev

    def full_layers(self, n: sp.Expr) -> sp.Expr:
        """The layers full recompute repeats of a stage that holds n (full_recomputed_layers; 0
        under the other policies): whole layers, where full x n is their share of the first
        stage's applied to n."""
        return self.full_on * full_recomputed_layers(self.fam, n)

    def recomputes(self, module: str) -> sp.Expr:
        """The share of the stage's layers whose `module` selective recompute repeats
        (perfmodel.strategy.RECOMPUTE_MODULES): selective's share where the plan names it (the
        attention core where it names none), else 0."""
        modules = self.fam.recompute_modules or ("core_attn",)
        return self.selective if module in modules else sp.Integer(0)

    @property
    def regather(self) -> sp.Expr:
        """1 where the stack gathers a sequence-parallel column-parallel layer's input again in the
        backward for its weight gradient (Megatron 1D with sequence parallelism under Megatron's
        tensor-parallel backward, megatron_backward), else 0."""
        return self.megatron * self.seq_parallel * self.megatron_backward

    @property
    def fused_kernels(self) -> sp.Expr:
        """1 where the element-wise ops run as the Megatron-Core / Transformer Engine stack's
        fused kernels (Plan.kernels fused), 0 eager or compiled."""
        return 1 - self.eager_kernels - self.compiled_kernels

    @property
    def megatron_backward(self) -> sp.Expr:
        """1 where tensor parallelism's backward runs as Megatron-Core's and Transformer Engine's
        linear layers run it (Plan.tp_backward megatron; where not given, fused kernels), 0 as
        torch's DTensor runs it (dtensor; eager or compiled kernels)."""
        if self.fam.tp_backward is None:
            return self.fused_kernels
        return sp.Integer(int(self.fam.tp_backward == "megatron"))

    @property
    def core(self) -> sp.Expr:
        """The share of the layers whose attention core is recomputed (selective recompute's
        core_attn)."""
        return self.recomputes("core_attn")

    @property
    def gqa(self) -> sp.Expr:
        """1 where K and V have fewer heads than the queries (grouped-query attention: a > kv),
        else 0: min(1, a / kv - 1)."""
        return active(S.a / self.kv_heads)

    @property
    def rotary(self) -> sp.Expr:
        """1 for rotary position embeddings, else 0 (learned positions, ALiBi)."""
        return self.rotary_positions

    @property
    def head_first(self) -> sp.Expr:
        """1 where the first rank holds the output layer too: zbv's V shape puts the model's first
        and last chunks on rank 0 (ScheduleZBVZeroBubble; workload.model builds it so), else 0
        (the last rank holds it; with one stage, the only one)."""
        return self.multi * self.zbv

    @cached_property
    def max_stage_layers(self) -> sp.Expr:
        """The layers of the stage that holds the most (what a per-step sync waits on); built
        once per context, unsorted (sympy's Max compares the stages' counts and asks which is
        larger, most of a hundredth of a second each time, perfmodel.costs.lattice)."""
        return lmax(*self.stage_layers.values())

    @property
    def tokens(self) -> sp.Expr:
        """Tokens of a micro-batch of one replica, b s (every cp rank's together)."""
        return S.b * S.s

    @classmethod
    def of(cls, fam: Family) -> Context:
        seq_parallel = flag(fam.sequence_parallel, "sequence_parallel")
        grid2 = flag(_option(fam, "tp_layout", "2d"), "tp2d")
        grid3 = flag(_option(fam, "tp_layout", "3d"), "tp3d")
        megatron = 1 - grid2 - grid3
        split = megatron * seq_parallel + (1 - megatron)
        multi = active(S.pp)
        zero = [flag(None if fam.zero is None else fam.zero >= k, f"zero{k}") for k in (1, 2, 3)]
        layers = stage_layers(fam)
        n = layers["first"]
        # the layers the policy applies to: floor(n / N) of the stage's n (torchtitan wraps the
        # N-th, 2N-th, ... layer it builds); any: 1 if there is one (an uneven pipeline split
        # takes the first stage's share for every stage)
        recomputed = applied(sp.floor, n / S.N_rc)
        share, any_ = recomputed / n, sp.Min(1, recomputed, evaluate=False)
        # full recompute, Megatron's methods over each of the stage's v chunks (n / v layers):
        # block, the first N_rl layers of each; uniform, every layer, in groups of N_rl
        # (megatron/core/recompute.py; I_block 0 and N_rl 1: every layer alone)
        full_layers = full_recomputed_layers(fam, n)
        full_group, full_inputs = sp.Integer(1), sp.Integer(1)
        if fam.megatron_recompute:
            chunk = n / S.v
            block = S.I_block
            full_group = block + (1 - block) * lmin(S.N_rl, chunk)
            full_inputs = block + (1 - block) * applied(sp.ceiling, chunk / S.N_rl) / chunk
        full = flag(_option(fam, "recompute", "full"), "recompute_full")
        op = flag(_option(fam, "recompute", "op"), "recompute_op")
        d = S.d if fam.free_head_dim else S.h / S.a
        return cls(
            fam=fam, dev=device(fam), d=d,
            T=S.b * S.s / S.cp, m=S.B / (S.dp * S.b), layers_per_stage=n, stage_layers=layers,
            multi=multi, single=1 - multi, seq_parallel=seq_parallel,
            full=full * full_layers / n, full_on=full, full_inputs=full_inputs,
            full_group=full_group,
            selective=flag(_option(fam, "recompute", "selective"), "recompute_selective") * share,
            op=op * share, full_any=full * any_, op_any=op * any_,
            zero1=zero[0], zero2=zero[1], zero3=zero[2],
            gpipe=flag(_option(fam, "schedule", "gpipe"), "gpipe"),
            interleaved=flag(_option(fam, "schedule", "interleaved"), "interleaved"),
            zero_bubble=flag(None if fam.schedule is None else fam.schedule in ("zb", "zbv"),
                             "zero_bubble"),
            zbv=flag(_option(fam, "schedule", "zbv"), "zbv"),
            flash=flag(fam.flash, "flash"),
            overlap_grad_sync=flag(fam.overlap_grad_sync, "overlap_grad_sync"),
            overlap_param_gather=flag(fam.overlap_param_gather, "overlap_param_gather"),
            tp_comm_overlap=flag(fam.tp_comm_overlap, "tp_comm_overlap"),
            compiled=flag(_option(fam, "stack", "compiled"), "stack_compiled"),
            graphs=flag(_option(fam, "stack", "cuda-graphs"), "stack_graphs"),
            eager_kernels=flag(_option(fam, "kernels", "eager"), "kernels_eager"),
            compiled_kernels=flag(_option(fam, "kernels", "compiled"), "kernels_compiled"),
            te_loss=flag(_option(fam, "cross_entropy", "te"), "cross_entropy_te"),
            loss_no_upcast=flag(_option(fam, "cross_entropy", "no-upcast"),
                                "cross_entropy_no_upcast"),
            loss_torch=flag(_option(fam, "cross_entropy", "torch"), "cross_entropy_torch"),
            loss_native=flag(_option(fam, "cross_entropy", "native"), "cross_entropy_native"),
            loss_flash=flag(_option(fam, "cross_entropy", "flash-attn"), "cross_entropy_flash"),
            weighted_activation=flag(_option(fam, "expert_weighting", "activation"),
                                     "moe_weighted_activation"),
            asynchronous=fam.asynchronous,
            gated=flag(fam.gated, "gated"), bias=flag(fam.bias, "bias"),
            qkv_bias=flag(fam.qkv_bias, "qkv_bias"), layernorm=flag(fam.layernorm, "layernorm"),
            tied=flag(fam.tied_embeddings, "tied"),
            learned_positions=flag(fam.learned_positions, "learned_positions"),
            rotary_positions=flag(fam.rotary_positions, "rotary_positions"),
            grid2=grid2, grid3=grid3, megatron=megatron, split=split,
            act_ranks=1 + split * (S.tp - 1),
            cp_p2p=flag(_option(fam, "cp_comm", "p2p"), "cp_p2p"),
            cp_allgather=flag(_option(fam, "cp_comm", "allgather"), "cp_allgather"),
            cp_a2a=flag(_option(fam, "cp_comm", "a2a"), "cp_a2a"),
            d_qk=S.d_nope + S.d_rope if fam.mla else d,
            d_v=S.d_v if fam.mla else d,
            kv_heads=S.a if fam.mla else S.kv,
            fp8=sp.Integer(int(fam.fp8)),
            dropout=sp.Integer(int(fam.dropout)),
            attention_dropout=sp.Integer(int(fam.attention_dropout)),
            linear_dev=device(fam, fp8=True) if fam.fp8 else None,
            fp8_output=sp.Integer(int(fam.fp8 and fam.fp8_output_layer)),
        )


def linear_gemm_time(c: Context, g: K.Gemm) -> sp.Expr:
    """One linear layer's GEMM [s]: in bf16 (the plan's dtype) on the device, or, for an fp8
    plan, on the FP8 device with e_8-byte operands and a bf16 output (perfmodel.costs.fp8)."""
    if c.fam.fp8:
        return K.gemm_time(g, S.e8, c.linear, output_bytes_per_element=S.e)
    return K.gemm_time(g, S.e, c.dev)
