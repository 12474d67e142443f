"""The JSON Schemas (draft 2020-12) of what the commands print with --json.

Every --json document is an object whose first field, "schema", names its kind and version,
"perfmodel.KIND/VERSION" (perfmodel.output.document writes it; SCHEMA_VERSIONS lists them). The
schema of each kind is built here and published in docs/schemas/KIND.json:

    python -m perfmodel.schemas docs/schemas      # writes them (tests/unit/test_json_schemas.py
                                                  # checks that the files are these)

The rule (docs/json.md): a field added keeps the version, so a reader ignores fields it does not
know (every object here allows more properties); a field renamed, removed or given another type
or meaning bumps the version. The schemas name what a reader may rely on: the required fields and
their types. Option values (schedule, recompute, dtype, ...) are strings, the choices of the
command's --help, so that a new choice is an addition.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from perfmodel.output import SCHEMA_VERSIONS, schema_id

DIALECT = "https://json-schema.org/draft/2020-12/schema"

NUMBER: dict[str, Any] = {"type": "number"}
ACTIVE: dict[str, Any] = {
    "type": "number",
    "description": "Parameters one token uses (a mixture of experts: the routed experts it is "
                   "not sent to left out), as the model's card counts them: the model spec's "
                   "active_count (all; no_embedding: without the embedding table; "
                   "no_embeddings: without it and an untied output layer)."}
MTP: dict[str, Any] = {
    "type": "number",
    "description": "The multi-token-prediction modules' own parameters (DeepSeek-V3's: a layer "
                   "like the last, a 2h x h projection and two norms each; their embedding and "
                   "output layer are the model's), not in parameters; 0 without them."}
NUMBER_OR_NULL: dict[str, Any] = {"type": ["number", "null"]}
STRING: dict[str, Any] = {"type": "string"}
STRINGS: dict[str, Any] = {"type": "array", "items": STRING}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
WHOLE: dict[str, Any] = {"type": "integer", "minimum": 1}
SECONDS_BY_TERM: dict[str, Any] = {
    "type": "object", "additionalProperties": NUMBER,
    "description": "Seconds per step by named term (perfmodel explain names them)."}
BYTES_BY_TERM: dict[str, Any] = {
    "type": "object", "additionalProperties": NUMBER,
    "description": "Bytes per GPU by named term."}


def obj(properties: dict[str, Any], required: list[str] | None = None,
        description: str = "") -> dict[str, Any]:
    """An object with these properties, all required unless `required` says which; more
    properties are allowed (an added field keeps the version)."""
    out: dict[str, Any] = {"type": "object", "properties": properties,
                           "required": list(properties) if required is None else required}
    if description:
        out["description"] = description
    return out


PLAN = obj({
    "gpus": WHOLE, "dp": WHOLE, "tp": WHOLE, "pp": WHOLE,
    "cp": {**WHOLE, "description": "Context-parallel degree (gpus = dp x cp x tp x pp)."},
    "cp_comm": {**STRING, "description": "How attention crosses the cp ranks: p2p, allgather, "
                                         "a2a."},
    "ep": {**WHOLE, "description": "Expert-parallel degree (of a stage's tp x cp x dp ranks)."},
    "etp": {**WHOLE, "description": "Expert-tensor-parallel degree (of the tp ranks)."},
    "micro_batch": WHOLE,
    "global_batch": WHOLE, "schedule": STRING, "virtual_stages": WHOLE,
    "sequence_parallel": BOOLEAN, "recompute": STRING,
    "recompute_every": {**WHOLE, "description": "The recompute policy applies to one layer in N."},
    "recompute_method": {**STRING, "description": "Full recompute's Megatron-LM method: uniform "
                                                  "(groups of recompute_num_layers) or block "
                                                  "(the first recompute_num_layers of each "
                                                  "chunk); absent: uniform."},
    "recompute_num_layers": {**WHOLE, "description": "Megatron-LM's --recompute-num-layers; "
                                                     "absent: 1."},
    "attention_kernel": {**STRING, "description": "The flash kernel by its name on the "
                                                  "hardware (cudnn, fa2, ...); absent: the "
                                                  "hardware's default."},
    "cpu_offload_layers": {"type": "integer", "minimum": 0,
                           "description": "The model's first layers whose activations are "
                                          "offloaded to host memory (Megatron-Core "
                                          "--cpu-offloading-num-layers); absent: 0."},
    "zero": {"type": "integer", "minimum": 0, "maximum": 3}, "dtype": STRING,
    "tp_layout": STRING, "tp_depth": WHOLE,
    "flash_attention": {**BOOLEAN,
                        "description": "Flash (true) or unfused (false) attention, --attention "
                                       "auto resolved (true where the hardware has a flash kernel "
                                       "for the dtype; the validation job: fused SDPA)."},
    "overlap_grad_sync": BOOLEAN, "overlap_param_gather": BOOLEAN, "tp_comm_overlap": BOOLEAN,
    "dp_bucket_size": {"type": "integer", "minimum": 1,
                       "description": "Parameters per data-parallel bucket of the overlapped "
                                      "gradient sync (Megatron-Core --ddp-bucket-size); absent: "
                                      "Megatron-Core's default, max(4e7, 1e6 dp cp)."},
    "dp_bucketing": {"type": "string", "enum": ["megatron", "all"],
                     "description": "Which parameters are bucketed: megatron (the first model "
                                    "chunk's, each later chunk one bucket) or all (Apex's "
                                    "DistributedFusedAdam, PyTorch DDP, DeepSpeed); absent: "
                                    "megatron."},
    "ep_comm_overlap": BOOLEAN,
    "pp_scatter_gather": {**BOOLEAN,
                          "description": "Megatron-LM's scatter-gather of pipeline sends (1/tp "
                                         "sent, all-gathered over tp); left out: off"},
    "fsdp_reshard": {"type": "string", "enum": ["forward", "backward", "step"],
                     "description": "zero 3, pp 1: when a unit's gathered weights are freed: "
                                    "after each forward (gathered again for the backward), "
                                    "each backward, or the step's last backward (the reduction "
                                    "deferred too); left out: forward"},
    "defer_grad_sync": {**BOOLEAN,
                        "description": "zero 3, pp 1: the gradients accumulate unsharded and "
                                       "are reduce-scattered in the last micro-batch only "
                                       "(NeMo AutoModel's defer_fsdp_grad_sync); left out: off, "
                                       "every micro-batch reduce-scatters"},
    "expandable_segments": {**BOOLEAN,
                            "description": "PyTorch's caching allocator with expandable "
                                           "segments (PYTORCH_CUDA_ALLOC_CONF="
                                           "expandable_segments:True): no fragmentation margin "
                                           "counted; left out: off"},
    "bf16_optimizer": {**BOOLEAN,
                       "description": "bf16, zero 1: DeepSpeed's BF16_Optimizer, each "
                                      "micro-batch's bf16 gradients added into fp32 ones, "
                                      "all-reduced in fp32; left out: off"},
    "grad_accumulation_fusion": {**BOOLEAN,
                                 "description": "Megatron-Core's gradient accumulation fusion: "
                                                "false, each micro-batch's weight gradients "
                                                "written in the parameter's dtype and added "
                                                "into the main gradients apart "
                                                "(--no-gradient-accumulation-fusion); left out: "
                                                "true"},
    "tp_backward": {"type": "string", "enum": ["megatron", "dtensor"],
                    "description": "tensor parallelism's backward: megatron (Megatron-Core, "
                                   "Transformer Engine: sequence-parallel inputs gathered again "
                                   "for the weight gradients, the input gradients' reductions "
                                   "behind the weight-gradient GEMMs) or dtensor (torch DTensor: "
                                   "the gathered inputs kept, each reduction in turn); left out: "
                                   "by the kernels (fused: megatron)"},
    "pipeline_micro_batches": {"type": "integer", "minimum": 0,
                               "description": "Micro-batches of one pipeline schedule where the "
                                              "step runs several; left out: one schedule"},
    "ep_dispatcher": {"type": "string",
                      "description": "A mixture of experts' dispatcher: alltoall (NCCL) or deepep "
                                     "(DeepEP/HybridEP); left out: alltoall"},
    "cross_entropy": {"type": "string",
                      "description": "The loss's kernel: unfused (fp32 logits), no-upcast (the "
                                     "same on the logits' own dtype), torch (PyTorch's on fp32 "
                                     "logits, three copies), te (Transformer Engine's fused "
                                     "cross entropy), native (Megatron-Core's native fusion) "
                                     "or flash-attn (flash-attn's fused cross entropy); left "
                                     "out: unfused"},
    "optimizer_kernels": {"type": "string", "enum": ["fused", "foreach"],
                          "description": "How the AdamW step runs: fused (one kernel) or foreach "
                                         "(torch's multi-tensor passes); left out: fused"},
    "expert_weighting": {"type": "string", "enum": ["activation", "output"],
                         "description": "Where a mixture of experts applies its routing weights: "
                                        "in the experts' activation or on their outputs; left "
                                        "out: activation"},
    "stack": {"type": "string", "description": "eager, compiled or cuda-graphs"},
    "kernels": {"type": "string",
                "description": "How the element-wise ops run: fused (Megatron-Core / TE), eager "
                               "(op by op) or compiled (Inductor)"},
    "first_stage_layers": {"type": "integer", "minimum": 0,
                           "description": "0: the layers split evenly"},
    "last_stage_layers": {"type": "integer", "minimum": 0,
                          "description": "0: the layers split evenly"},
    "recompute_modules": {"type": "string",
                          "description": "recompute selective only: its modules, comma-separated "
                                         "(absent: the attention core)."},
    "pipeline_layout": {"type": "string",
                        "description": "Every pipeline stage's layers as Megatron's "
                                       "--pipeline-model-parallel-layout writes them (absent: "
                                       "none)."},
    "placement": {"type": "string", "description": "The axes, innermost first: tp,dp,pp ..."},
    "grad_dtype": {"type": ["string", "null"], "description": "Main gradients' dtype; null: fp32."},
    "optimizer_dtype": {"type": ["string", "null"],
                        "description": "Optimizer states' dtype; null: fp32 with master weights."},
    "master_weights": {"type": "string", "enum": ["fp32", "remainders", "none"],
                       "description": "The master weights beside bf16 ones: an fp32 copy, its "
                                      "16-bit remainders (Megatron's precision-aware optimizer) "
                                      "or none (absent: fp32 with fp32 optimizer states, none "
                                      "with bf16)."},
    "fp8_recipe": {"type": ["string", "null"],
                   "description": "dtype fp8 only: Transformer Engine's scaling recipe (delayed, "
                                  "current, mxfp8), the hardware's default resolved."},
    "fp8_output_layer": {**BOOLEAN, "description": "dtype fp8 only: the output layer's GEMM in "
                                                   "FP8 too."},
    "fp8_params": {**BOOLEAN, "description": "dtype fp8 only: the linear weights held in FP8 "
                                             "(Megatron-LM --fp8-param-gather; with zero 3, "
                                             "Megatron FSDP's)."},
}, required=["gpus", "dp", "tp", "pp", "micro_batch", "global_batch", "schedule", "virtual_stages",
             "sequence_parallel", "recompute", "recompute_every", "zero", "dtype", "tp_layout",
             "tp_depth", "flash_attention", "overlap_grad_sync", "placement", "grad_dtype",
             "optimizer_dtype"],
    description="A transformer's parallel plan (perfmodel.strategy.Plan); option values as the "
                "command line spells them.")

PREDICTION = obj({
    "step_time_s": NUMBER, "samples_per_s": NUMBER, "tokens_per_s": NUMBER,
    "model_flops_per_step": NUMBER, "hardware_flops_per_step": NUMBER,
    "tflops_per_gpu": NUMBER, "mfu": NUMBER, "memory_per_gpu_bytes": NUMBER,
    "memory_capacity_bytes": NUMBER,
    "fits_in_memory": {**BOOLEAN, "description": "memory_per_gpu_bytes (the caching "
                                                 "allocator's fragmentation margin included) "
                                                 "is at most memory_capacity_bytes."},
    "memory_verdict": {"type": "string", "enum": ["fits", "tight", "does not fit"],
                       "description": "fits: fits_in_memory; tight: only the fragmentation "
                                      "margin does not fit (memory_without_margin_bytes "
                                      "does); does not fit: memory_without_margin_bytes "
                                      "exceeds the GPU (perfmodel.predict.memory_verdict)."},
    "memory_without_margin_bytes": {**NUMBER, "description": "The memory per GPU without the "
                                                             "fragmentation margin, on the "
                                                             "stage that holds the most "
                                                             "without it."},
    "breakdown_s": SECONDS_BY_TERM,
    "hidden_s": {**SECONDS_BY_TERM, "description": "Seconds per step each term hid (not in the "
                                                   "step time): communication behind compute, "
                                                   "host dispatch behind the device's work."},
    "memory_breakdown_bytes": BYTES_BY_TERM,
    "bottleneck_stage": STRING, "parameters": NUMBER, "active_parameters": ACTIVE,
    "mtp_parameters": MTP, "micro_batches": WHOLE, "plan": PLAN, "model": STRING,
    "hardware": STRING,
    "model_flops_per_step_full_attention": {
        **NUMBER, "description": "Model FLOPs with the attention core counted whole "
                                 "(torchtitan); model_flops_per_step counts the causal half "
                                 "(Megatron-LM)."},
    "mfu_full_attention": {**NUMBER, "description": "MFU of model_flops_per_step_full_attention."},
    "flops_convention": {**STRING, "description": "How model_flops_per_step and mfu count."},
    "mfu_fp8_peak": {**NUMBER, "description": "dtype fp8 only: MFU over the FP8 dense peak (mfu "
                                              "is over the bf16 peak: mfu_convention)."},
    "mfu_convention": {**STRING, "description": "dtype fp8 only: which peak each MFU divides "
                                                "by."},
}, required=["step_time_s", "samples_per_s", "tokens_per_s", "model_flops_per_step",
             "hardware_flops_per_step", "tflops_per_gpu", "mfu", "memory_per_gpu_bytes",
             "memory_capacity_bytes", "fits_in_memory", "memory_verdict",
             "memory_without_margin_bytes", "breakdown_s",
             "memory_breakdown_bytes", "bottleneck_stage", "parameters", "active_parameters",
             "micro_batches", "plan", "model", "hardware", "model_flops_per_step_full_attention",
             "mfu_full_attention", "flops_convention"],
    description="One plan's prediction (perfmodel.predict.Prediction.to_dict).")

MODEL_SUMMARY = {"model_source": STRING, "seq_len": WHOLE, "seq_len_from": STRING}

SETTING = obj({"key": STRING, "value": {"description": "As the config gives it."},
               "note": STRING}, required=["key", "note"],
              description="One setting of a job config and what perfmodel made of it.")
JOB_CONFIG = obj({
    "path": STRING,
    "framework": {"type": "string",
                  "description": "megatron, nemo, torchtitan, deepspeed or automodel"},
    "read": {"type": "array", "items": SETTING, "description": "Settings read: what each became."},
    "ignored": {"type": "array", "items": SETTING,
                "description": "Settings that do not change the step, with why."},
    "unknown": {"type": "array", "items": SETTING,
                "description": "Settings perfmodel's reader does not know (not read)."},
    "notes": STRINGS,
    "pins": {**STRINGS, "description": "The plan fields the config states (recommend pins "
                                       "them)."},
}, description="--from-config: the job config read (perfmodel.configs.JobConfig.to_dict).")

GRID_PLAN = obj({
    "pr": WHOLE, "pc": WHOLE, "global_batch": WHOLE, "norm": STRING, "variant": STRING,
    "contributors": STRING, "dtype": STRING, "gpus": WHOLE,
}, description="A layer graph's Pr x Pc plan (perfmodel.layerwise.GridPlan).")

GRID_PREDICTION = obj({
    "step_time_s": NUMBER, "samples_per_s": NUMBER, "breakdown_s": SECONDS_BY_TERM,
    "memory_per_gpu_bytes": NUMBER, "memory_breakdown_bytes": BYTES_BY_TERM,
    "fits_in_memory": BOOLEAN, "model_flops_per_step": NUMBER, "mfu": NUMBER,
    "plan": GRID_PLAN, "model": STRING, "hardware": STRING,
    "layer_degrees": {"type": "object", "additionalProperties": {"type": "integer"}},
    "collective_algorithm": {"type": ["string", "null"], "description": "The collective "
                             "algorithm --collective-algorithm or the spec pinned (auto: the "
                             "hardware chooses); predict's."},
}, required=["step_time_s", "samples_per_s", "breakdown_s", "memory_per_gpu_bytes",
             "memory_breakdown_bytes", "fits_in_memory", "model_flops_per_step", "mfu", "plan",
             "model", "hardware", "layer_degrees"],
    description="A layer graph's prediction (perfmodel.layerwise.GridPrediction.to_dict).")

RECOMMENDED = {
    "allOf": [PREDICTION, obj({
        "objective": NUMBER,
        "objective_name": STRING,
        "gpus": WHOLE,
        "steps_to_train": NUMBER, "time_to_train_s": NUMBER, "gpu_hours": NUMBER,
        "cost": NUMBER, "cost_per_step": NUMBER,
    }, required=["objective", "objective_name", "gpus"])],
    "description": "A recommended plan: its prediction, the value it is ranked by (objective, "
                   "in the document's objective_unit) and, with --tokens, steps_to_train, "
                   "time_to_train_s and gpu_hours; with --gpu-hour-price, cost_per_step and, "
                   "with both, cost (of the token budget), in the units of the price.",
}

CURVE_POINT = obj({"micro_batch": WHOLE, "step_time_s": NUMBER, "tokens_per_s": NUMBER,
                   "memory_per_gpu_bytes": NUMBER, "fits": BOOLEAN})

EXPLANATION = {
    "description": "Why the best plan wins (best, binding, shares, runner_up, micro_batch_curve) "
                   "or, when no plan fits, why (infeasible).",
    "oneOf": [
        obj({"best": STRING, "binding": STRINGS,
             "shares": {"type": "object", "additionalProperties": NUMBER},
             "runner_up": obj({"plan": STRING, "slower_by_s": NUMBER,
                               "memory_delta_bytes": NUMBER, "trades": STRINGS,
                               "rank": {**WHOLE, "description": "Its place among the plans "
                                        "shown: the first that does not tie with the best."},
                               "ties": {"type": "integer", "minimum": 0,
                                        "description": "Plans shown that take the best "
                                        "plan's step time and memory."},
                               "ties_differ_in": {**STRINGS, "description": "The plan fields "
                                                  "in which those ties differ from the best."}},
                              required=["plan", "slower_by_s", "memory_delta_bytes", "trades"]),
             "micro_batch_curve": {"type": "array", "items": CURVE_POINT},
             "fp8": obj({
                 "recipe": STRING, "step_time_s": NUMBER, "same_plan_in_bf16_s": NUMBER,
                 "same_plan_in_bf16_fits": BOOLEAN, "gemm_saved_s": NUMBER, "casts_s": NUMBER,
                 "amax_reductions_s": NUMBER, "best_bf16_plan": {"type": ["string", "null"]},
                 "best_bf16_step_time_s": NUMBER_OR_NULL, "best_bf16_objective": NUMBER_OR_NULL,
                 "speedup_over_best_bf16": NUMBER_OR_NULL, "wins": BOOLEAN, "says": STRING,
                 "fp8_params_plan": {"type": ["string", "null"], "description": "Without "
                                     "--fp8-params: the fastest of the best plan, the best "
                                     "bf16 plan's layout and the fastest plan that does not "
                                     "fit, each with FP8 weights, that fits and beats the best "
                                     "plan (null: none does)."},
                 "fp8_params_step_time_s": NUMBER_OR_NULL,
                 "fp8_params_objective": NUMBER_OR_NULL,
                 "fp8_params_from": {"type": ["string", "null"], "description": "Which of the "
                                     "three fp8_params_plan is."}},
                 description="--dtype fp8: the same search in bf16, its best plan, the best "
                             "plan in bf16, whether FP8 is what makes the best plan win, and "
                             "a plan that FP8 weights (--fp8-params) make faster."),
             "parallelism": {
                 "type": "array", "description": "Where the best plan has context or expert "
                 "parallelism that the request left free: the best plan without it (the same "
                 "search with cp = 1 or ep = 1), null where none fits.",
                 "items": obj({"axis": STRING, "degree": WHOLE,
                               "best_without": {"type": ["string", "null"]},
                               "objective_without": NUMBER_OR_NULL,
                               "step_time_without_s": NUMBER_OR_NULL, "note": STRING})}},
            required=["best", "binding", "shares", "micro_batch_curve"]),
        obj({"infeasible": obj({
            "binding": STRING, "reason": STRING,
            "nearest": {"type": "array", "items": obj({
                "plan": STRING, "memory_per_gpu_bytes": NUMBER,
                "step_time_s": NUMBER_OR_NULL, "bound_only": BOOLEAN})},
            "nearest_splits": obj(
                {"gpus": {"type": "array", "items": WHOLE},
                 "global_batch": {"type": "array", "items": WHOLE}}, required=[],
                description="Where one GPU count has no plan at all (binding divisibility): "
                            "the nearest GPU counts below and above with one at the global "
                            "batch, and the nearest global batches at the GPU count (a side "
                            "with none within 256 left out).")},
            required=["binding", "reason", "nearest"])}),
    ],
}


def _document(kind: str, title: str, body: dict[str, Any]) -> dict[str, Any]:
    """A schema of kind: body's properties after the "schema" field, whose value it fixes."""
    props = {"schema": {"const": schema_id(kind),
                        "description": "The kind and version of this document."}}
    props.update(body.get("properties", {}))
    out = {"$schema": DIALECT, "$id": f"urn:perfmodel:schema:{kind}:{SCHEMA_VERSIONS[kind]}",
           "title": title, **{k: v for k, v in body.items() if k != "properties"}}
    out["type"] = "object"
    out["properties"] = props
    out["required"] = ["schema", *body.get("required", [])]
    return out


def _with(base: dict[str, Any], extra: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {**base, "properties": {**base["properties"], **extra},
            "required": [*base["required"], *required]}


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of the --json documents of kind (a key of SCHEMA_VERSIONS)."""
    if kind == "predict":
        body = _with(PREDICTION, {
            **MODEL_SUMMARY,
            "extrapolations": {**STRINGS, "description": "What the prediction takes beyond "
                               "what was measured or asked: sizes outside a --profile's fits, "
                               "a flash kernel at a head size not measured, the collectives a "
                               "pinned --collective-algorithm does not run."},
            "profile": obj({"path": STRING, "complete": BOOLEAN,
                            "missing_stages": {"type": ["array", "null"], "items": STRING},
                            "note": {"type": ["string", "null"]}},
                           required=["path", "complete"]),
            "config": JOB_CONFIG,
            "collective_algorithm": {"type": ["string", "null"], "description": "The "
                                     "collective algorithm --collective-algorithm or the spec "
                                     "pinned (auto: the hardware chooses)."},
        }, [*MODEL_SUMMARY, "extrapolations"])
        return _document(kind, "perfmodel predict --json", body)
    if kind == "predict.grid":
        return _document(kind, "perfmodel predict --json (a layer graph)", GRID_PREDICTION)
    if kind == "predict.batch":
        row = {"type": "object", "properties": {
            "error": {"type": "string", "description": "Empty when the row was predicted."},
            **{k: NUMBER_OR_NULL for k in ("step_time_s", "samples_per_s", "tokens_per_s",
                                           "model_flops_per_step", "tflops_per_gpu", "mfu",
                                           "memory_per_gpu_bytes", "parameters")},
            "fits_in_memory": {"type": ["boolean", "null"]},
            "memory_verdict": {"type": ["string", "null"],
                               "enum": ["fits", "tight", "does not fit", None],
                               "description": "As a prediction's (predict.json)."}},
            "required": ["error", "step_time_s", "memory_per_gpu_bytes", "fits_in_memory",
                         "memory_verdict"],
            "description": "A row of the plans file: its columns as given (strings), then the "
                           "prediction (null when the row failed, with error saying why)."}
        return _document(kind, "perfmodel predict --batch --json", obj(
            {"rows": {"type": "array", "items": row}}))
    if kind == "recommend":
        body = obj({
            "model": STRING, "parameters": NUMBER, "active_parameters": ACTIVE,
            "mtp_parameters": MTP, **MODEL_SUMMARY,
            "plans": {"type": "array", "items": RECOMMENDED, "description": "Best first."},
            "evaluated": {"type": "integer", "description": "Plans evaluated in full (they "
                          "passed the memory bound and, in a pruned search, the step-time "
                          "bound)."},
            "enumerated": {"type": "integer",
                           "description": "Plans searched: every plan the rules allow."},
            "feasible": {"type": "integer", "description": "Of the plans evaluated, those "
                         "that fit."},
            "skipped": {"type": "integer", "description": "Plans not evaluated because a lower "
                        "bound on their step time ranks them below the best, or because they do "
                        "not fit in memory and that bound says they are not faster than the best "
                        "(0 when the search evaluates every plan: --csv, --plot, --html)."},
            "search_time_s": NUMBER,
            "objective": STRING,
            "objective_unit": {"type": "string", "description": "s, price units or price "
                                                                 "units per step"},
            "tokens": NUMBER_OR_NULL, "gpu_hour_price": NUMBER_OR_NULL,
            "memory_margin": NUMBER, "memory_limit_bytes": NUMBER,
            "explanation": EXPLANATION,
            "sensitivities": {"type": "object", "additionalProperties": NUMBER},
            "what_if": obj({"changes": STRINGS,
                            "best": {"oneOf": [RECOMMENDED, {"type": "null"}]},
                            "speedup": NUMBER_OR_NULL}),
            "validation": {"type": "object"},
            "config": JOB_CONFIG,
            "emitted": obj({"format": STRING, "plan_rank": WHOLE, "files": STRINGS,
                            "searched": {"type": "string",
                                         "description": "what the search kept to, for the "
                                                        "framework to run it"},
                            "fastest_of_any_framework": {"oneOf": [
                                obj({"plan": STRING, "objective": NUMBER,
                                     "step_time_s": NUMBER}), {"type": "null"}],
                                "description": "the best plan of the search without "
                                               "those limits, where it beats the written one"}},
                           description="--emit-config: the plan written (its rank in plans) "
                                       "and the files."),
        }, required=["model", "parameters", "active_parameters", *MODEL_SUMMARY, "plans",
                     "evaluated", "enumerated", "feasible", "search_time_s", "objective",
                     "objective_unit", "tokens", "gpu_hour_price", "memory_margin",
                     "memory_limit_bytes", "explanation"])
        return _document(kind, "perfmodel recommend --json", body)
    if kind == "recommend.grid":
        return _document(kind, "perfmodel recommend --json (a layer graph)", obj({
            "plans": {"type": "array", "items": GRID_PREDICTION},
            "evaluated": {"type": "integer"}, "feasible": {"type": "integer"},
            "search_time_s": NUMBER}))
    if kind == "collective":
        return _document(kind, "perfmodel collective --json", obj({
            "op": STRING, "bytes": NUMBER, "ranks": WHOLE, "ranks_per_node": WHOLE,
            "scope": STRING, "algorithm": STRING, "time_s": NUMBER,
            "algbw_bytes_per_s": {**NUMBER_OR_NULL, "description": "null for one rank"},
            "busbw_bytes_per_s": NUMBER_OR_NULL, "bus_factor": NUMBER,
            "by_algorithm_s": {"type": "object", "additionalProperties": NUMBER},
            "protocol": {"type": ["string", "null"],
                         "description": "simple, ll or ll128; null for a calibrated fit"},
            "by_option_s": {"type": "object", "additionalProperties": NUMBER,
                            "description": "seconds by 'algorithm/protocol' (empty for a fit)"},
            "hardware": STRING,
            "fabric_level": {**STRING, "description": "the fabric level the group reaches: node "
                                                      "inside one, else a level's name"},
            "priced_on": {**STRING, "description": "the level whose bandwidth prices the "
                                                   "group: the slowest it crosses (node inside "
                                                   "one); its steps take the most latency of "
                                                   "the levels it crosses"},
            "extrapolations": {**STRINGS, "description": "With --profile: the collective "
                                                         "outside the sizes or rank counts its "
                                                         "fit measured, or of no fit of it."}}))
    if kind == "sweep":
        point = {"type": "object", "properties": {
            "pr": WHOLE, "pc": WHOLE, "step_time_s": NUMBER, "samples_per_s": NUMBER,
            "mfu": NUMBER, "communication_share": NUMBER, "memory_per_gpu_bytes": NUMBER,
            "fits_in_memory": BOOLEAN},
            "required": ["pr", "pc", "step_time_s", "samples_per_s", "mfu",
                         "memory_per_gpu_bytes", "fits_in_memory"],
            "additionalProperties": NUMBER,
            "description": "One point: the varied fields' values, the split, the results, its "
                           "memory per GPU and whether it fits, and 'time:TERM' seconds per "
                           "term."}
        return _document(kind, "perfmodel sweep --json", obj(
            {"rows": {"type": "array", "items": point}}))
    if kind == "presets":
        counts = obj({"parameters": NUMBER, "active_parameters": ACTIVE,
                      "mtp_parameters": MTP})
        return _document(kind, "perfmodel presets --json", obj({
            "hardware": STRINGS, "models": STRINGS,
            "model_parameters": {"type": "object", "additionalProperties": counts},
            "flash_kernels": {"type": "object", "additionalProperties": STRINGS,
                              "description": "Each hardware preset's measured flash kernels "
                                             "by name (--attention-kernel), its default "
                                             "first."}}))
    if kind == "validate":
        term = obj({"name": STRING, "predicted_s": NUMBER_OR_NULL,
                    "measured_s": NUMBER_OR_NULL, "relative_error": NUMBER_OR_NULL})
        return _document(kind, "perfmodel validate --json (and its report.json)", obj({
            "model": STRING, "hardware": STRING, "plan": PLAN, "ranks": WHOLE,
            "backend": STRING, "status": STRING,
            "predicted_step_time_s": NUMBER_OR_NULL, "measured_step_time_s": NUMBER_OR_NULL,
            "relative_error": NUMBER_OR_NULL, "steps": {"type": ["integer", "null"]},
            "terms": {"type": "array", "items": term},
            "terms_stage": {"type": "string", "enum": ["all", "first", "middle", "last"],
                            "description": "The pipeline stage whose ranks' mean the measured "
                                           "terms are: the prediction's slowest (its terms'); "
                                           "the step time is the slowest rank's"},
            "terms_ranks": {"type": "array", "items": {"type": "integer"}},
            "memory": {"type": "object"}, "launch": obj({"status": STRING}),
            "created": STRING, "prediction": PREDICTION, "caveats": STRINGS,
            "measured_trace": {
                "type": "array", "items": obj({
                    "rank": {"type": "integer"}, "coords": {"type": "object"},
                    "events": {"type": "array", "items": obj({
                        "kind": STRING, "start_s": NUMBER, "end_s": NUMBER,
                        "micro_batch": {"type": ["integer", "null"]},
                        "chunk": {"type": ["integer", "null"]}, "thread": STRING},
                        required=["kind", "start_s", "end_s"])},
                }, required=["rank", "events"]),
                "description": "Each rank's events of its last timed step, seconds from the "
                               "step's start (validation.trace draws them: validate --trace)"},
        }, required=["model", "plan", "status", "predicted_step_time_s",
                     "measured_step_time_s", "relative_error", "steps", "terms", "memory",
                     "launch", "created"]))
    if kind == "validate.dry-run":
        row = obj({"axis": STRING, "op": STRING, "bytes": NUMBER, "job_count": NUMBER,
                   "model_count": NUMBER_OR_NULL, "agree": BOOLEAN},
                  required=["axis", "op", "bytes", "job_count", "agree"])
        return _document(kind, "perfmodel validate --dry-run --json", obj({
            "model": STRING, "plan": PLAN, "world_size": WHOLE,
            "rows": {"type": "array", "items": row}, "totals": {"type": "array"},
            "comm_debug_mode_agrees": BOOLEAN, "ledger_available": BOOLEAN,
            "agree": {"type": ["boolean", "null"]}, "notes": STRINGS}))
    raise KeyError(f"no JSON schema of kind '{kind}'; kinds: {', '.join(SCHEMA_VERSIONS)}")


def write_all(directory: Path) -> list[Path]:
    """Write every kind's schema to directory/KIND.json; the paths written."""
    from perfmodel.files import write_atomic
    from perfmodel.output import json_text

    paths = []
    for kind in SCHEMA_VERSIONS:
        path = directory / f"{kind}.json"
        write_atomic(path, json_text(schema(kind)) + "\n", what="JSON schema", make_parents=True)
        paths.append(path)
    return paths


if __name__ == "__main__":  # python -m perfmodel.schemas DIR
    for written in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        print(f"wrote {written}")
