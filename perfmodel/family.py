"""The structure of a prediction (kept free of sympy so that a cached prediction never imports it).

Every option of a Family is either fixed (a value) or left open (None). Open options become 0/1
indicator symbols in the expressions, so the *universal* family (all open) is one expression for
every plan of every transformer: it is compiled once and evaluated over arrays of plans. A fixed
family specialises the same expressions, which is what `perfmodel explain` prints.
"""

from __future__ import annotations

from dataclasses import dataclass

SCOPES = ("intra", "inter", "mixed")


@dataclass(frozen=True)
class Family:
    schedule: str | None = None  # gpipe, 1f1b, interleaved
    recompute: str | None = None  # none, selective, full
    sequence_parallel: bool | None = None
    zero: int | None = None
    flash: bool | None = None
    overlap_grad_sync: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    stack: str | None = None  # eager, compiled, cuda-graphs (perfmodel.strategy.Stack)
    kernels: str | None = None  # fused, eager, compiled (perfmodel.strategy.Kernels)
    uneven_stages: bool | None = None  # first / last stage layers given (else L / pp each)
    gated: bool | None = None
    tied_embeddings: bool | None = None
    learned_positions: bool | None = None
    rotary_positions: bool | None = None
    bias: bool | None = None
    qkv_bias: bool | None = None
    layernorm: bool | None = None
    tp_layout: str | None = None  # 1d, 2d (2.5d is 2d with depth), 3d
    # the head size: its own symbol d (a model whose attention, heads x head_dim, is not hidden
    # wide, and the universal family), or h/a (every other model: the formulas as published)
    free_head_dim: bool = False
    scopes: tuple[tuple[str, str | None], ...] = (
        ("tp", None), ("dp", None), ("pp", None), ("tpa", None), ("tpb", None), ("tpc", None),
        ("cp", None), ("ep", None), ("dp_cp", None), ("edp", None), ("etp", None),
        ("etp_ep", None), ("tp_dp_cp", None))
    # how attention crosses the cp ranks (perfmodel.strategy.CPComm): p2p, allgather, a2a, or
    # None (open: indicators)
    cp_comm: str | None = None
    # fixed by the model (a model without them has none of their terms): a mixture of experts
    # (perfmodel.step.moe) with its dense layers (indices from 0), whether it has shared experts
    # and a capacity factor (else dropless); multi-head latent attention, its queries compressed
    # or not; multi-token-prediction modules
    moe: bool = False
    moe_dense_layers: tuple[int, ...] = ()
    # the dense layers on the first rank, the last rank and the ranks between, where a pipeline
    # layout places them (Plan.pipeline_layout); None: by their position (perfmodel.step.moe)
    stage_dense: tuple[int, int, int] | None = None
    # the decoder layers each rank between the first and the last is costed with, where a
    # pipeline layout gives them unequal ones (PipelineLayout.middle_layers); None: equal
    middle_layers: int | None = None
    # selective recompute's modules (Plan.recompute_modules); () the attention core alone
    recompute_modules: tuple[str, ...] = ()
    # the expert-parallel all-to-alls overlapped with another micro-batch (Plan.ep_comm_overlap;
    # None: open, its indicator)
    ep_comm_overlap: bool | None = None
    # a pipeline layout's chunks (PipelineLayout.end_chunks): the first, the fullest between
    # and the last rank's first and last chunk's layers and its own; None: equal chunks
    end_chunks: tuple[tuple[int, int, int], ...] | None = None
    # Megatron-LM's scatter-gather of pipeline sends (Plan.pp_scatter_gather; never searched)
    pp_scatter_gather: bool = False
    # DeepSpeed's BF16_Optimizer (Plan.bf16_optimizer; never searched): each micro-batch's bf16
    # gradients added into fp32 ones, all-reduced in fp32
    bf16_optimizer: bool = False
    # Megatron-Core's gradient accumulation fusion (Plan.grad_accumulation_fusion; never
    # searched): off, each micro-batch's weight gradients added into the main gradients apart
    grad_accumulation_fusion: bool = True
    # how tensor parallelism's backward runs (Plan.tp_backward: megatron, dtensor; never
    # searched): None, the kernels' stack decides (fused: megatron)
    tp_backward: str | None = None
    # FSDP's reduction deferred to the last micro-batch (Plan.defer_grad_sync; never searched)
    defer_grad_sync: bool = False
    # when ZeRO 3 without a pipeline frees a unit's gathered weights (Plan.fsdp_reshard: forward,
    # backward, step; never searched)
    fsdp_reshard: str = "forward"
    # the step runs its micro-batches as several pipeline schedules (Plan.pipeline_micro_batches)
    pipeline_flushes: bool = False
    # the experts' dispatcher (Plan.ep_dispatcher: alltoall, deepep; None: open, its indicator)
    ep_dispatcher: str | None = None
    # how the loss runs over the logits (Plan.cross_entropy: unfused, no-upcast, torch, te,
    # native, flash-attn; None: open, its indicators)
    cross_entropy: str | None = None
    # where the experts' routing weights multiply (Plan.expert_weighting: activation, output;
    # None: open, its indicator)
    expert_weighting: str | None = None
    moe_shared: bool = False
    moe_capacity: bool = False
    moe_round_robin: bool = False  # the router's routing is round_robin (TransformerSpec.routing)
    mla: bool = False
    mla_q_lora: bool = False
    mtp: bool = False
    mtp_last_moe: bool = False  # the MTP modules' layer is an MoE layer (the model's last is)
    # fixed in every family: the collective algorithm the hardware asks for, and which collectives
    # have calibrated fits, as (op, scope, algorithm)
    algorithm: str = "auto"
    fits: frozenset[tuple[str, str, str]] = frozenset()
    # and the hardware's collective library (the algorithms "auto" chooses from), the parts of its
    # link model ("intra:call", "intra:ll", "intra:ll128", "intra:nvls", "intra:host_link",
    # "inter:..."; see link_features), and the protocol when one is fixed ("auto": the cheapest)
    collective_library: str = "generic"
    link_features: frozenset[str] = frozenset()
    protocol: str = "auto"
    # the hardware's fabric levels (HardwareSpec.levels): 2, a node and the network that leaves
    # it (every axis's group beyond its node crosses inter_node); more: each axis's group beyond
    # its node crosses the slowest level its ranks reach, its own link symbols (perfmodel.names)
    fabric_levels: int = 2
    # fixed too: which optional terms the hardware's GEMM model has: a split-K switch (AMD fits
    # do), a large-tile kernel, an epilogue time (perfmodel.costs.gemm_efficiency)
    gemm_split_k: bool = False
    gemm_large_kernel: bool = False
    gemm_epilogue: bool = False
    # and whether the output layer's GEMMs run unaligned (the vocabulary not a multiple of 16
    # bytes' elements) on hardware whose fit measures such GEMMs (GemmEfficiency.unaligned_fraction)
    unaligned_logits: bool = False
    # and which (part, style, tp degree) the hardware's measured layer costs cover
    layer_costs: frozenset[tuple[str, str, int]] = frozenset()
    # and whether the device runs what the host queues while the host goes on (a GPU: host and
    # device time overlap) or the host runs it (CPU ranks: they add); perfmodel.step.compose
    asynchronous: bool = False
    # fixed for a request: FP8 training (the linear layers' GEMMs in FP8, the casts, copies and
    # scaling state; perfmodel.costs.fp8), the output layer's GEMM in FP8 too, and whether some
    # layers attend over a sliding window shorter than the sequence (the model's)
    fp8: bool = False
    fp8_output_layer: bool = False
    fp8_params: bool = False  # the linear weights held in FP8 (Plan.fp8_params)
    # the FP8 recipe (perfmodel.costs.fp8.RECIPES; None without FP8), fixed by the request: which
    # amax reductions Transformer Engine issues (delayed scaling: a stage's ranks at each autocast
    # exit; current scaling: the tp group at each cast of a shard it gathers;
    # perfmodel.step.fp8.amax_collectives, tp_amax_collectives)
    fp8_recipe: str | None = None
    windowed: bool = False
    attention_sinks: bool = False  # the model's: a learned logit per head (parameters only)
    clamped_glu: bool = False  # the model's: its gated MLP clamps its halves (perfmodel.step.moe)
    # the model's RoPE rotates part of each head (TransformerSpec.rotary_fraction < 1): its share
    # as a symbol, and the split and concatenation an op-by-op rotation adds
    partial_rotary: bool = False
    # the model's code projects q, k and v in one linear layer (TransformerSpec.fused_qkv): a
    # layer run op by op sums no gradients of the attention's input (perfmodel.step.framework.
    # eager_input_sums) and reduces its qkv bias gradient in one kernel
    fused_qkv: bool = False
    # full recompute by a Megatron method beyond uniform 1 (Plan.recompute_method,
    # recompute_num_layers; the request's, every plan's): its layer choice and groups as symbols
    # (perfmodel.step.context); False: every layer alone, as the formulas were before it
    megatron_recompute: bool = False
    # activations of the first layers offloaded to host memory (Plan.cpu_offload_layers > 0; the
    # request's): their count and the host link as symbols (perfmodel.step.offload)
    cpu_offload: bool = False
    # the model's dropout: whether its hidden (embedding and residual branches) and attention
    # dropout rates are above 0 (TransformerSpec.hidden_dropout, attention_dropout): only then
    # are masks kept and written
    dropout: bool = True
    attention_dropout: bool = True

    def scope(self, axis: str) -> str | None:
        """Where the axis's groups lie (intra, inter, mixed), or None: open (an axis a family
        does not list, as one written before cp and ep, is open)."""
        return dict(self.scopes).get(axis)
