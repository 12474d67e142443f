"""The names of the step model's symbols, with their typeset form and meaning; free of sympy.

perfmodel.symbols makes a sympy Symbol of each (and re-exports these tables); the plan encoder
(perfmodel.encode) and a cached prediction need only the names, so that a `predict` whose compiled
formulas are on disk never imports sympy.
"""

from __future__ import annotations

import dataclasses

from perfmodel.specs.hardware import LINK_PROTOCOLS, GemmEfficiency

# name -> (typeset name, meaning), in the order the symbols are made
NAMES: dict[str, tuple[str, str]] = {}


def _name(name: str, latex: str, meaning: str) -> str:
    NAMES[name] = (latex, meaning)
    return name


# model
_name("layers", "L", "transformer layers")
_name("hidden", "h", "hidden size")
_name("heads", "a", "attention heads")
_name("kv_heads", "n_kv", "key/value heads")
_name("ffn_hidden", "f", "MLP hidden size")
_name("head_dim", "d", "size of one attention head (the attention is a d wide)")
_name("seq_len", "s", "sequence length [tokens]")
_name("vocab", "V", "vocabulary size")
# a mixture of experts (perfmodel.step.moe)
_name("experts", "E", "routed experts per mixture-of-experts layer")
_name("top_k", "k_E", "routed experts each token is sent to")
_name("expert_ffn_hidden", "f_E", "MLP width of one routed expert")
_name("shared_ffn_hidden", "f_sh",
      "MLP width of the shared experts together (shared_experts x their width; 0: none)")
_name("capacity_factor", "c_E",
      "tokens an expert takes at most, as a multiple of its even share (GShard)")
_name("routing_imbalance", "rho_E", "the busiest expert's tokens over the mean (1: even)")
_name("expert_groups", "g_E",
      "groups of consecutive experts node-limited routing picks from (1: no limit)")
_name("group_topk", "M_E", "groups a token's experts come from (1: no limit)")
# multi-head latent attention (DeepSeek-V2, Sec. 2.1)
_name("q_lora_rank", "r_q", "MLA: rank of the compressed queries (0: not compressed)")
_name("kv_lora_rank", "r_kv", "MLA: rank of the compressed keys and values")
_name("qk_nope_head_dim", "d_nope", "MLA: query/key head size without rotary embedding")
_name("qk_rope_head_dim", "d_rope", "MLA: query/key head size with rotary embedding")
_name("v_head_dim", "d_v", "MLA: value head size")
_name("mtp_layers", "D_mtp", "multi-token-prediction modules (DeepSeek-V3, Sec. 2.2)")
# plan
_name("dp", "dp", "data-parallel degree")
_name("tp", "tp", "tensor-parallel degree")
_name("pp", "pp", "pipeline-parallel degree")
_name("cp", "cp", "context-parallel degree (each sequence split over cp ranks)")
_name("ep", "ep", "expert-parallel degree (the experts split over ep of a stage's tp x cp x dp "
      "ranks, after etp's)")
_name("etp", "etp", "expert-tensor-parallel degree (each expert's FFN split over etp of the tp "
      "ranks)")
_name("micro_batch", "b", "micro-batch size [samples]")
_name("global_batch", "B", "global batch size [samples]")
_name("virtual_stages", "v", "virtual pipeline stages per GPU (interleaving)")
_name("pipeline_flushes", "F_pp",
      "pipeline schedules per step, each with its fill and drain (torchtitan and NeMo AutoModel: "
      "one per gradient-accumulation step; 1: Megatron's one schedule)")
_name("first_stage_layers", "L_first",
      "layers of the first pipeline stage when given (0: the layers split evenly)")
_name("last_stage_layers", "L_last",
      "layers of the last pipeline stage when given (0: the layers split evenly)")
_name("bytes_per_element", "e", "bytes per activation/weight element")
_name("recompute_every", "N_rc",
      "the recompute policy applies to one layer in every N_rc of a stage (1: every layer)")
_name("recompute_num_layers", "N_rl",
      "full recompute's layers (Megatron --recompute-num-layers): a group's under the uniform "
      "method, a chunk's recomputed ones under block")
_name("recompute_block", "I_{block}",
      "1 if full recompute takes Megatron's block method (the first N_rl layers of each chunk), "
      "0: uniform (every layer, in groups of N_rl)")
_name("dp_bucket_size", "N_{bkt}",
      "parameters per data-parallel bucket, each bucket's gradients reduced and its weights "
      "gathered by one collective with overlap_grad_sync (Megatron-Core --ddp-bucket-size; 0: "
      "its default, max(4e7, 1e6 dp cp))")
_name("dp_bucket_all", "I_{bkt}",
      "1 if every parameter is bucketed (Apex's DistributedFusedAdam, PyTorch DDP), 0: "
      "Megatron-Core's first model chunk, each later chunk one bucket")
_name("cpu_offload_layers", "N_off",
      "the model's first layers whose activations are offloaded to host memory (Megatron-Core "
      "--cpu-offloading-num-layers; 0: none)")
_name("tp_per_node", "k_tp", "ranks of one tensor-parallel group inside one node")
_name("dp_per_node", "k_dp", "ranks of one data-parallel group inside one node")
_name("pp_per_node", "k_pp", "ranks of one pipeline group inside one node")
_name("cp_per_node", "k_cp", "ranks of one context-parallel group inside one node")
_name("ep_per_node", "k_ep", "ranks of one expert-parallel group inside one node")
_name("dp_cp_per_node", "k_dpcp",
      "ranks of one data x context-parallel group (the gradients' group) inside one node")
_name("etp_per_node", "k_etp", "ranks of one expert-tensor-parallel group inside one node")
_name("etp_ep_per_node", "k_etpep",
      "ranks of one expert-tensor x expert-parallel group (the token counts') inside one node")
_name("edp_per_node", "k_edp",
      "ranks of one expert-data-parallel group (the experts' gradients' group) inside one node")
_name("tp_dp_cp_per_node", "k_tdc",
      "ranks of one tensor x data x context-parallel group (a pipeline stage's ranks: delayed "
      "scaling's amax reduction) inside one node")
# the tensor-parallel grid of the 2d / 2.5d / 3d layouts: sub-axes a (innermost), b, c
_name("tpa", "q_a", "tensor-parallel grid: ranks along its first axis (q)")
_name("tpb", "q_b", "tensor-parallel grid: ranks along its second axis (q)")
_name("tpc", "q_c", "tensor-parallel grid: ranks along its third axis (d for 2.5d, q for 3d)")
_name("tpa_per_node", "k_a", "ranks of one grid-axis-a group inside one node")
_name("tpb_per_node", "k_b", "ranks of one grid-axis-b group inside one node")
_name("tpc_per_node", "k_c", "ranks of one grid-axis-c group inside one node")
# hardware
_name("peak_flops_per_s", "F_peak",
      "peak FLOP/s of one GPU in the plan's dtype (bf16's for an FP8 plan, whose FP8 GEMMs take "
      "F_peak^fp8)")
_name("memory_bandwidth_bytes_per_s", "W_mem", "effective memory bandwidth [B/s]")
_name("host_link_bytes_per_s", "W_host",
      "one direction of a GPU's link to host memory (PCIe, NVLink-C2C) [B/s]")
_name("optimizer_bandwidth_bytes_per_s", "W_opt",
      "memory bandwidth the optimizer step reaches over its bytes per parameter [B/s]")
_name("kernel_overhead_s", "t_kernel", "launch + framework overhead per kernel [s]")
_name("kernel_overhead_tp_s", "t_kernel_tp",
      "overhead per kernel of a tensor-parallel layer, when measured (0: as t_kernel) [s]")
_name("optimizer_overhead_s", "t_opt0", "fixed cost of one optimizer step [s]")
_name("fsdp_forward_overhead_s", "t_fsdp^fwd",
      "fixed cost of one FSDP unit's forward hooks per micro-batch [s]")
_name("fsdp_backward_overhead_s", "t_fsdp^bwd",
      "fixed cost of one FSDP unit's backward hooks per micro-batch [s]")
_name("fsdp_reduce_overhead_s", "t_fsdp^red",
      "fixed cost of one FSDP unit's gradient reduction [s] (ZeRO 3: one per micro-batch, one "
      "a step where deferred, one per pipeline schedule under a pipeline; ZeRO 1-2: one a step)")
_name("collective_overhead_s", "t_coll",
      "fixed cost of one collective call (launch, dispatch) [s]")
_name("host_op_overhead_s", "t_op",
      "host time of one framework op of an eager stack (dispatch and launch) [s]")
_name("host_op_backward_overhead_s", "t_op^bwd",
      "host time of one framework op of an eager stack's backward (autograd's engine) [s]")
_name("gpus_per_node", "G", "GPUs per node")
_name("ranks_per_device", "rho", "ranks time-sharing one device (1 on GPUs)")
_name("overlap_compute_slowdown", "s_ovl",
      "slowdown of compute that runs while a hidden collective runs: it takes 1 + s_ovl as long")
_name("intra_latency_s", "alpha_intra", "intra-node latency per step [s]")
_name("intra_bandwidth", "beta_intra", "intra-node bandwidth per GPU, effective [B/s]")
_name("inter_latency_s", "alpha_inter", "inter-node latency per step [s]")
_name("inter_bandwidth", "beta_inter", "inter-node bandwidth per node, effective [B/s]")
# the link model of a GPU preset (perfmodel.specs.hardware.LinkSpec): a collective call's start-up,
# the low-latency protocols, NVLink SHARP inside a node
LINKS = ("intra", "inter")


def _call_and_protocol_names(key: str, sub: str, where: str) -> None:
    """A link's call start-up (Simple) and, per low-latency protocol, its start-up, latency per
    step and bandwidth fraction: names key_..., symbols t_call_sub, alpha_sub^p, f_sub^p."""
    _name(f"{key}_call_latency_s", f"t_call_{sub}",
          f"start-up of one collective call {where}, Simple protocol [s]")
    for p in LINK_PROTOCOLS:
        _name(f"{key}_{p}_call_latency_s", f"t_call_{sub}^{p}",
              f"start-up of one collective call {where}, {p.upper()} protocol [s]")
        _name(f"{key}_{p}_latency_s", f"alpha_{sub}^{p}",
              f"latency per step {where}, {p.upper()} protocol [s]")
        _name(f"{key}_{p}_bandwidth_fraction", f"f_{sub}^{p}",
              f"bandwidth of the {p.upper()} protocol {where}, as a fraction of Simple's")


for _link, _where in (("intra", "inside a node"), ("inter", "between nodes")):
    _call_and_protocol_names(_link, _link, _where)
_name("intra_nvls_latency_s", "t_nvls", "NVLink SHARP all-reduce: latency of one call [s]")
_name("intra_nvls_bandwidth_fraction", "f_nvls",
      "NVLink SHARP all-reduce: bandwidth as a fraction of the intra-node Simple bandwidth")
# what a GPU holds beyond the tensors (HardwareSpec.nccl_buffer_bytes, memory_fragmentation)
_name("nccl_buffer_bytes", "M_nccl", "GPU memory of one NCCL communicator's buffers [B]")
_name("memory_fragmentation", "f_frag",
      "fraction of the caching allocator's reserved memory that no tensor uses")
# the hardware's fused (flash) attention kernel at the model's head size
# (HardwareSpec.flash_attention)
_name("flash_measured", "I_fa",
      "1 if the hardware's flash-attention kernel is measured for the dtype, else 0 (fused "
      "attention's products then run at the GEMM efficiency)")
_name("flash_forward_max_fraction", "E_fa^fwd",
      "flash-attention forward: fraction of peak reached by long sequences (the kernel's "
      "measured fraction x its sustained_fraction)")
_name("flash_forward_half_seq", "s_fa^fwd",
      "flash-attention forward: sequence length at which it reaches half of that [tokens]")
_name("flash_backward_max_fraction", "E_fa^bwd",
      "flash-attention backward: fraction of peak reached by long sequences (the kernel's "
      "measured fraction x its sustained_fraction)")
_name("flash_backward_half_seq", "s_fa^bwd",
      "flash-attention backward: sequence length at which it reaches half of that [tokens]")
# FP8 training (perfmodel.costs.fp8): the linear layers' GEMMs at the FP8 rate and efficiency,
# the bytes of the casts, copies and scaling state of the plan's Transformer Engine recipe
_name("fp8_peak_flops_per_s", "F_peak^fp8", "peak FLOP/s of one GPU in FP8 (dense)")
_name("fp8_operand_bytes", "e_8",
      "bytes per element of an FP8 GEMM operand (1; MXFP8: 1 + 1/32 for its E8M0 scales)")
_name("fp8_quantize_bytes", "q_8",
      "bytes a cast to FP8 moves per element: reads it in bf16 (current scaling: twice, an amax "
      "pass first), writes its rowwise and columnwise FP8 copies")
_name("fp8_weight_copy_bytes", "c_w8",
      "bytes per linear-layer parameter of the FP8 weight copies Transformer Engine caches for "
      "the step (rowwise, and columnwise where it is a separate copy)")
_name("fp8_weight_cast_bytes", "q_w8",
      "bytes per linear-layer parameter of the step's weight casts: a cast (q_8), or with FP8 "
      "weights (fp8_params) the transpose of each (Hopper: read 1, write 1; Blackwell: none)")
_name("fp8_gather_bytes", "g_8",
      "bytes per FP8 weight the distributed optimizer (or, ZeRO 3, FSDP) all-gathers with FP8 "
      "weights (fp8_params): "
      "1 (per-tensor recipes: gathered in FP8); MXFP8: 2, bf16 gathered into the gradient "
      "buffer and quantized after (Megatron reuse_grad_buf_for_mxfp8_param_ag)")
_name("fp8_gathered_transpose_bytes", "t_8",
      "bytes per element of an activation or grad output that sequence parallelism all-gathers "
      "in FP8 to make its columnwise copy after the gather (per-tensor recipes where that copy "
      "is a transpose, Hopper: read 1, write 1; else 0); the shard's cast writes t_8 / 2 fewer")
_name("fp8_saved_bytes", "s_8",
      "bytes per element of an FP8 GEMM input saved for the weight gradient (its columnwise copy)")
_name("fp8_scaling_state_bytes", "M_scale8",
      "bytes of scaling state per FP8 GEMM (delayed scaling: amax history, scale, inverse "
      "scale of each of its tensors)")
# sliding-window attention (perfmodel.costs.compute.windowed_pairs)
_name("window", "w", "tokens a windowed layer attends back over (sliding_window)")
_name("windowed_share", "rho_w", "share of the layers that attend over a sliding window")
# partial rotary embeddings (perfmodel.costs.compute.eager_rope_bytes)
_name("rotary_fraction", "r_rot", "share of each head's dimensions RoPE rotates (rotary_fraction)")
# bytes per parameter, by precision (see perfmodel.costs.memory)
_name("weight_bytes_per_param", "e_w", "bytes per parameter of the weights")
_name("grad_bytes_per_param", "e_g", "bytes per parameter of the gradients")
_name("optimizer_bytes_per_param", "e_o", "bytes per parameter of the optimizer states")
_name("sharded_weight_bytes_per_param", "e_w3",
      "bytes per parameter of the weights under ZeRO 3 (the fp32 shard FSDP gathers)")
_name("sharded_optimizer_bytes_per_param", "e_o3",
      "bytes per parameter of the optimizer states under ZeRO 3 (beside the fp32 shard)")
_name("optimizer_step_bytes_per_param", "e_step",
      "bytes the optimizer step reads and writes per local parameter")

# the groups a collective runs over: dp_cp, the dp x cp ranks of a replica (its gradients); ep, the
# ranks that exchange tokens for the experts; edp, those holding the same experts (their gradients);
# etp, the ranks one expert's FFN is split over; etp_ep, the etp x ep ranks (Megatron-Core's tp_ep
# group: the token counts' all-gather with etp > 1); tp_dp_cp, every rank of a pipeline stage
# (Megatron-Core's amax reduction group: an FP8 plan's delayed scaling)
AXES = ("tp", "dp", "pp", "tpa", "tpb", "tpc", "cp", "ep", "dp_cp", "edp", "etp", "etp_ep",
        "tp_dp_cp")
SCOPES = ("intra", "inter", "mixed")  # where a group's ranks lie: one node, one per node, both

# A fabric of more than two levels (HardwareSpec.levels): the link an axis's group crosses beyond
# its node is the slowest level its ranks cross, one for each axis (perfmodel.encode.
# outer_link_values sets them; a two-level fabric's groups all read inter_*)
for _axis in AXES:
    _where = f"beyond the node, at the slowest fabric level one {_axis} group crosses"
    _name(f"{_axis}_outer_latency_s", f"alpha_inter,{_axis}", f"latency per step {_where} [s]")
    _name(f"{_axis}_outer_bandwidth", f"beta_inter,{_axis}",
          f"bandwidth per node {_where}: a GPU's share x G, effective [B/s]")
    _call_and_protocol_names(f"{_axis}_outer", f"inter,{_axis}", _where)

# options as 0/1 indicators, so that one expression covers every plan: option -> symbol name
FLAGS: dict[str, str] = {
    option: _name(f"is_{option}", f"I_{{{option}}}", f"1 if {meaning}, else 0")
    for option, meaning in [
        ("sequence_parallel", "sequence parallelism"),
        ("recompute_full", "full recompute"),
        ("recompute_selective", "selective recompute"),
        ("recompute_op", "per-op selective recompute (torchtitan)"),
        ("zero1", "ZeRO stage >= 1"),
        ("zero2", "ZeRO stage >= 2"),
        ("zero3", "ZeRO stage 3"),
        ("gpipe", "GPipe schedule"),
        ("interleaved", "interleaved 1F1B schedule"),
        ("zero_bubble", "a zero-bubble schedule (zb or zbv)"),
        ("zbv", "the V-shape zero-bubble schedule"),
        ("flash", "fused (flash) attention"),
        ("overlap_grad_sync", "the gradient sync overlaps backward"),
        ("overlap_param_gather", "the parameter all-gather overlaps the forward"),
        ("tp_comm_overlap", "tensor-parallel communication overlaps the GEMMs"),
        ("ep_comm_overlap", "the expert-parallel all-to-alls overlap another micro-batch's "
                            "compute (combined 1F1B)"),
        ("ep_deepep", "the experts' dispatch and combine run DeepEP's kernels (a token sent "
                      "once per node, forwarded over NVLink)"),
        ("moe_weighted_activation", "the routing weights scale the experts' activation "
                                    "(Megatron-Core), not their outputs at the combine"),
        ("cross_entropy_te", "the loss runs Transformer Engine's fused cross entropy (the "
                             "gradient written in place into the bf16 logits)"),
        ("cross_entropy_no_upcast", "the loss runs on the logits in their own dtype, without "
                                    "an fp32 copy"),
        ("cross_entropy_torch", "the loss is PyTorch's cross entropy on fp32 copies of the "
                                "logits (three at the backward's start)"),
        ("cross_entropy_native", "the loss runs Megatron-Core's native fused cross entropy "
                                 "(its steps compiled, on an fp32 copy of the logits)"),
        ("cross_entropy_flash", "the loss runs flash-attn's fused cross entropy (the bf16 "
                                "logits kept, their gradient a new tensor beside them)"),
        ("stack_compiled", "the layers run compiled (torch.compile)"),
        ("stack_graphs", "the layers run as CUDA graphs"),
        ("kernels_eager", "the element-wise ops run op by op (unfused PyTorch modules)"),
        ("kernels_compiled", "the element-wise ops run as Inductor's fused kernels"),
        ("gated", "gated (SwiGLU) MLP"),
        ("bias", "linear layers have biases"),
        ("qkv_bias", "the QKV projection has a bias"),
        ("layernorm", "LayerNorm (0: RMSNorm)"),
        ("tied", "tied input/output embeddings"),
        ("learned_positions", "learned position embeddings"),
        ("rotary_positions", "rotary position embeddings (RoPE)"),
        ("tp2d", "tensor parallelism on a 2d grid (SUMMA; 2.5d with depth)"),
        ("tp3d", "tensor parallelism on a 3d cube"),
        ("cp_p2p", "context parallelism passes K/V round a ring (p2p)"),
        ("cp_allgather", "context parallelism all-gathers K/V (allgather)"),
        ("cp_a2a", "context parallelism swaps sequence for heads by all-to-all (a2a, Ulysses)"),
        ("sync_bn", "synchronized batch norm (layer graphs)"),
        ("split_collectives", "Gather+Bcast / Reduce+Bcast instead of Allgather / Allreduce"),
        ("contributors_specialised", "a layer split over fewer ranks than Pr gathers/reduces "
                                     "among its holders, then copies to the others"),
        ("contributors_auto", "the cheaper of the standard and specialised collectives, per call"),
        *[(f"{axis}_{scope}", f"the {axis} group is {scope}-node")
          for axis in AXES for scope in SCOPES],
    ]
}
# the indicators of layer graphs (perfmodel.layerwise sets them); a transformer has none of them
LAYER_GRAPH_FLAGS = ("sync_bn", "split_collectives", "contributors_specialised",
                     "contributors_auto")

# GemmEfficiency field -> symbol name
GEMM: dict[str, str] = {
    fld.name: _name(f"gemm_{fld.name}", f"gemm_{fld.name}",
                    f"GEMM efficiency parameter {fld.name}"
                    + (" (the fit's x sustained_clock_fraction)" if "max_fraction" in fld.name
                       else ""))
    for fld in dataclasses.fields(GemmEfficiency)
}
# the same for the FP8 GEMMs of an fp8 plan's linear layers (HardwareSpec.gemm("fp8"))
FP8_GEMM: dict[str, str] = {
    fld.name: _name(f"fp8_gemm_{fld.name}", f"gemm8_{fld.name}",
                    f"FP8 GEMM efficiency parameter {fld.name}"
                    + (" (the fit's x sustained_clock_fraction)" if "max_fraction" in fld.name
                       else ""))
    for fld in dataclasses.fields(GemmEfficiency)
}

FIT_PARTS = ("alpha_s", "busbw", "alpha_s_small", "busbw_small", "breakpoint_bytes")


def fit_names(op: str, scope: str) -> tuple[tuple[str, str, str], ...]:
    """(name, typeset name, meaning) of a calibrated collective fit's symbols, in the order of
    FIT_PARTS: alpha and bus bandwidth from the breakpoint on and below it, and the breakpoint."""
    return tuple((f"fit_{op}_{scope}_{part}", latex, meaning) for part, latex, meaning in (
        ("alpha_s", f"alpha_{{{op},{scope}}}", f"fitted latency per step of {op} ({scope}) [s]"),
        ("busbw", f"beta_{{{op},{scope}}}", f"fitted bus bandwidth of {op} ({scope}) [B/s]"),
        ("alpha_s_small", f"alpha^small_{{{op},{scope}}}",
         f"fitted latency per step of small {op} ({scope}) [s]"),
        ("busbw_small", f"beta^small_{{{op},{scope}}}",
         f"fitted bus bandwidth of small {op} ({scope}) [B/s]"),
        ("breakpoint_bytes", f"S^break_{{{op},{scope}}}",
         f"message size where {op} ({scope}) changes regime [B]")))


LAYER_COST_FIELDS = ("forward_overhead_s", "backward_overhead_s", "compute_scale")


def layer_cost_names(part: str, style: str, tp: int) -> tuple[str, ...]:
    """The table names of one LayerCost's symbols, in the order of LAYER_COST_FIELDS."""
    return tuple(f"lc_{part}_{style}_{tp}_{name}" for name in LAYER_COST_FIELDS)


def layer_cost_entries(part: str, style: str, tp: int) -> tuple[tuple[str, str, str], ...]:
    """(name, typeset name, meaning) of one LayerCost's symbols: the measured forward and
    backward overheads [s] and compute scale of one part in one tensor-parallel style and degree
    (HardwareSpec.layer_costs)."""
    fwd, bwd, scale = layer_cost_names(part, style, tp)
    return ((fwd, f"c^fwd_{{{part},{style},{tp}}}",
             f"measured fixed cost of the forward of one {part} ({style}, tp {tp}) [s]"),
            (bwd, f"c^bwd_{{{part},{style},{tp}}}",
             f"measured fixed cost of the backward of one {part} ({style}, tp {tp}) [s]"),
            (scale, f"s_{{{part},{style},{tp}}}",
             f"measured compute time of one {part} ({style}, tp {tp}) over its roofline"))
