"""Every option name Megatron-LM's argument parser registers, for the Megatron-LM reader's
typo rule (perfmodel.configs.megatron.parse_words): an option not read and not in this table,
a letter or two from one the reader reads, is refused as a likely misspelling; one in it is a real
Megatron-LM option, listed as not read.

Extracted from NVIDIA/Megatron-LM, its git history up to d98e8a64dd (2026-08-22), the union of:
  - the parser of d98e8a64dd itself: megatron/training/arguments.py add_megatron_arguments on an
    argparse.ArgumentParser (and pretrain_gpt.py's extra arguments where NVIDIA ModelOpt is
    installed, megatron/post_training/arguments.py add_modelopt_args), imported from the tree
    with the triton kernel modules (megatron/core/transformer/moe/ops, megatron/core/ssm/ops)
    stubbed, every --name of its actions' option_strings, argparse's --help left out: this takes
    in the options ArgumentGroupFactory makes from TransformerConfig, ModelParallelConfig and
    the training dataclasses (--no-X and --disable-X for a field true by default);
  - every '--name' string passed to an add_argument call (found with Python's ast) in each
    version of megatron/arguments.py (2020-03 to 2024-03) and megatron/training/arguments.py
    (2024-03 on) in the repository's history, 1,066 distinct files: the options of the older
    scripts the reader reads (--checkpoint-activations, --DDP-impl, --use-legacy-models, ...)
    and those registered only where a library is installed (--kitchen-config-file).
1,105 names.
"""

from __future__ import annotations

MEGATRON_LM_OPTIONS: frozenset[str] = frozenset("""
DDP-impl account-for-embedding-in-pipeline-split account-for-loss-in-pipeline-split
accumulate-allreduce-grads-in-fp32 activation-func-clamp-value activation-offload-fraction
activations-checkpoint-method activations-checkpoint-num-layers adam-beta1 adam-beta2 adam-eps
add-qkv-bias adlr-autoresume adlr-autoresume-interval align-param-gather
allow-ambiguous-pad-tokens allow-trivial-doc app-tag-run-name app-tag-run-version
apply-layernorm-1p apply-query-key-layer-scaling apply-residual-connection-post-layernorm
apply-wd-to-qk-layernorm async-ckpt-cpu-priority async-ckpt-io-priority async-ckpt-use-cpu-shm
async-indexer async-save async-strategy async-tensor-model-parallel-allreduce
async-tensor-parallel-allreduce attention-backend attention-dropout attention-output-gate
attention-softmax-in-fp32 auto-detect-ckpt-format batch-invariant-backend batch-invariant-mode
batch-size bert-embedder-type bert-load bert-no-binary-head bf16 bias-dropout-fusion
bias-gelu-fusion bias-swiglu-fusion biencoder-projection-dim
biencoder-shared-query-context-model block-data-path block-index-path block-top-k cache-dir
cache-mla-latents calc-ft-timeouts calculate-per-token-loss cased-data-path cased-vocab
chat-template check-for-large-grads check-for-spiky-loss
check-weight-hash-across-dp-replicas-interval checkpoint-activations checkpoint-attention
checkpoint-granularity checkpoint-method checkpoint-num-layers ckpt-assume-constant-structure
ckpt-convert-format ckpt-convert-save ckpt-convert-update-legacy-dist-opt-format
ckpt-drop-redundant-extra-state ckpt-format ckpt-fully-parallel-load
ckpt-fully-parallel-load-exchange-algo ckpt-fully-parallel-load-per-rank-objects
ckpt-fully-parallel-load-process-group ckpt-fully-parallel-save
ckpt-fully-parallel-save-process-group ckpt-pg-tensors-cache-create ckpt-pg-tensors-cache-path
ckpt-step classes-fraction clip-grad cloze-eval config-logger-dir context-parallel-size
cp-comm-type cpu-offloading-num-layers cpu-offloading-retain-pinned-cpu-buffers
create-all-gather-group cross-entropy-fusion-impl cross-entropy-loss-fusion cuda-graph-impl
cuda-graph-modules cuda-graph-scope cuda-graph-warmup-steps data-args-path data-cache-path
data-epochs data-impl data-loader data-parallel-random-init data-parallel-sharding-strategy
data-path data-per-class-fraction dataloader-defer-npy-index-mmap dataloader-fast-cache-load
dataloader-inter-document-masking dataloader-type dataloader_type ddp-average-in-collective
ddp-bucket-size ddp-num-buckets ddp-pad-buckets-for-high-nccl-busbw
ddp-param-name-patterns-for-fp32-local-accumulation ddp-reduce-scatter-with-fp32-accumulation
deallocate-pipeline-outputs debug decode-only-cuda-graphs decoder-first-pipeline-num-layers
decoder-last-pipeline-num-layers decoder-num-layers decoder-seq-length decoupled-lr
decoupled-min-lr decrease-batch-size-if-needed deep-init defer-embedding-wgrad-compute
delay-offload-until-cuda-graph delay-param-gather delay-wgrad-compute delim
delta-offload-bytes-across-pp-ranks deterministic-mode dino-bottleneck-size
dino-freeze-last-layer dino-head-hidden-size dino-local-crops-number dino-local-img-size
dino-norm-last-layer dino-teacher-temp dino-warmup-teacher-temp dino-warmup-teacher-temp-epochs
disable-align-grad-reduce disable-bf16-reduced-precision-matmul disable-bias-linear
disable-chunked-prefill disable-ckpt-load-validate-sharding-integrity
disable-clone-scatter-output-in-embedding disable-dsa-indexer-rotate-activation
disable-dsa-indexer-scoring-relu disable-flight-recorder-dump-on-timeout
disable-flight-recorder-extra-dump-on-exec disable-flight-recorder-include-only-active
disable-fp8-wgrad disable-gloo-process-groups disable-jit-fuser
disable-log-loss-scale-to-tensorboard disable-mamba-mem-eff-path disable-manual-gc-eval
disable-msc disable-pad-vocab-size disable-save-tokenizer-assets disable-straggler-on-startup
disable-strict-fsdp-dtensor-load disable-symmetric-registration
disable-tokenizer-sentencepiece-ignore-extra-whitespaces disable-tp-comm-bulk-dgrad
disable-tp-comm-bulk-wgrad disable-tp-comm-overlap-ag disable-tp-comm-overlap-rs
disable-tp-comm-split-ag disable-tp-comm-split-rs
disable-use-tokenizer-model-from-checkpoint-args disrib-opt-comm-mem-savings dist-ckpt-format
dist-ckpt-optim-fully-reshardable dist-ckpt-save-pre-mcore-014 dist-ckpt-strictness
dist-ckpt-workers distrib-opt-comm-mem-savings distrib-optim-fully-reshardable-mem-efficient
distribute-checkpointed-activations distribute-recomputed-activations
distribute-saved-activations distributed-backend distributed-timeout-minutes
distributed-timeout-seconds-after-init dsa-indexer-head-dim dsa-indexer-k-norm-epsilon
dsa-indexer-k-norm-fp32 dsa-indexer-loss-coeff dsa-indexer-n-heads dsa-indexer-rope-interleaved
dsa-indexer-skip-topk-offset dsa-indexer-topk dsa-indexer-topk-freq dsa-indexer-use-sparse-loss
dsa-kernel-backend dump-param-to-param-group-map embedding-init-method-std embedding-path
embedding-weights-in-fp32 empty-unused-memory-each-iter empty-unused-memory-level
enable-chunked-prefill enable-cuda-graph enable-experimental enable-ft-package
enable-full-sharding-in-hsdp enable-gpt-oss enable-mhc-connections enable-msc enable-one-logger
enable-onelogger encoder-num-layers encoder-pipeline-model-parallel-size encoder-seq-length
encoder-tensor-model-parallel-size end-wd end-weight-decay eod-mask-loss
ep-overlap-early-attn-memory-release erf-gelu error-injection-rate error-injection-type
eval-batch-size eval-global-batch-size eval-hf eval-interval eval-iters eval-max-preds-per-seq
eval-micro-batch-size eval-seq-length eval-text-key evidence-data-path exit-duration-in-mins
exit-interval exit-on-missing-checkpoint exit-signal exit-signal-handler
exit-signal-handler-for-dataloader exit-signal-handler-for-training exp-avg-dtype
exp-avg-sq-dtype experimental-attention-variant expert-model-parallel-size expert-parallel
expert-tensor-parallel-num-weight-shards expert-tensor-parallel-size export-default-te-spec
export-force-local-attention export-kd-cfg export-kd-teacher-ckpt-format export-kd-teacher-load
export-kd-teacher-model-config export-kv-cache-quant export-legacy-megatron export-model-type
export-moe-apply-probs-on-input export-offline-model export-qk-l2-norm export-quant-cfg
export-real-quant-cfg export-te-mcore-model external-cuda-graph faiss-use-gpu
fake-process-group fault-injector-delay-start-iteration fault-injector-fault-delay
fault-injector-fault-probabilities fault-injector-fault-types fault-injector-mtti-seconds
fault-injector-num-ranks fault-injector-offset-seconds fault-injector-ranks fault-injector-seed
ffn-hidden-size fim-data fim-eod-token fim-fragment-rate fim-middle-token fim-no-prefix
fim-pad-token fim-prefix-token fim-rate fim-split-sample fim-spm-rate fim-suffix-token
fine-grained-activation-offloading fine-grained-offloading-max-inflight-offloads finetune
finetune-data-files finetune-data-split finetune-hf-dataset first-last-layers-bf16
flash-attention-version flash-decode flight-recorder-dump-path
flight-recorder-include-stack-trace flight-recorder-trace-buffer-size fp16
fp16-lm-cross-entropy fp32-allreduce fp32-embedding fp32-layernorm fp32-residual-connection
fp32-tokentypes fp4-format fp4-param-gather fp4-quantizer-factory fp4-recipe
fp8-amax-compute-algo fp8-amax-history-len fp8-e4m3 fp8-format fp8-hybrid fp8-interval
fp8-margin fp8-output-proj fp8-param-gather fp8-quantizer-factory fp8-recipe freeze-all-layers
freeze-base-for-mtp fsdp-db-use-persist-buf-on-alloc-fail fsdp-double-buffer
fsdp-manual-registration ft-num-warmup-iters full-validation fused-residual-rmsnorm
gdp-cutedsl-kernel gdp-num-chunk-states-to-recompute gdp-num-householder genfile
global-batch-size glu-linear-offset gpu-sniff-test-interval grad-reduce-in-bf16 greedy
group-query-attention grpo-clamp-eps-lower grpo-clamp-eps-upper grpo-default-temperature
grpo-default-top-p grpo-entropy-term-weight grpo-filter-groups-with-same-reward grpo-group-size
grpo-iterations grpo-kl-beta grpo-prompts-per-step gtp-expert-remat-nccl-ub gtp-remat-nccl-ub
gtp-remat-opt-in-modules gtp-remat-reduce-scatter-with-fp32-accumulation hash-data-path
head-lr-mult heterogeneous-layers-config-encoded-json heterogeneous-layers-config-path
hidden-dropout hidden-size hierarchical-context-parallel-sizes high-priority-a2a-comm-stream
high-priority-stream-groups hybrid-attention-ratio hybrid-context-parallel hybrid-layer-pattern
hybrid-mlp-ratio hybrid-override-pattern hysteresis ict-head-size ict-load ict-one-sent img-dim
img-h img-w index-reload-interval indexer-batch-size indexer-log-interval
inference-batch-times-seqlen-threshold inference-coordinator-port
inference-cuda-graph-all-prefills inference-cuda-graph-max-tokens inference-cuda-graph-scope
inference-disable-ep-consensus inference-disable-triton-nvls-kernels inference-dynamic-batching
inference-dynamic-batching-active-buffer-size-gb inference-dynamic-batching-async-sched-mode
inference-dynamic-batching-block-size inference-dynamic-batching-buffer-guaranteed-fraction
inference-dynamic-batching-buffer-overflow-factor inference-dynamic-batching-buffer-size-gb
inference-dynamic-batching-chunk-size inference-dynamic-batching-cuda-graph-max-tokens
inference-dynamic-batching-cuda-graph-mixed-prefill-count
inference-dynamic-batching-cuda-graph-sizing-distribution
inference-dynamic-batching-logprobs-mode inference-dynamic-batching-mamba-memory-ratio
inference-dynamic-batching-mamba-triton-conv1d inference-dynamic-batching-max-requests
inference-dynamic-batching-max-requests-override inference-dynamic-batching-max-tokens
inference-dynamic-batching-max-tokens-override inference-dynamic-batching-num-cuda-graphs
inference-dynamic-batching-paused-buffer-size-gb inference-dynamic-batching-prefix-caching
inference-dynamic-batching-prefix-caching-coordinator-policy
inference-dynamic-batching-prefix-caching-eviction-policy
inference-dynamic-batching-prefix-caching-mamba-gb
inference-dynamic-batching-prefix-caching-routing-alpha
inference-dynamic-batching-sampling-backend
inference-dynamic-batching-track-generated-token-events
inference-dynamic-batching-track-paused-request-events
inference-dynamic-batching-unified-memory-level inference-flask-server-logging
inference-fuse-tp-communication inference-grouped-gemm-backend inference-logging-step-interval
inference-max-batch-size inference-max-requests inference-max-seq-length
inference-moe-disable-fused-quant-kernels inference-moe-token-dispatcher-type
inference-mp-coordinator-port inference-rng-tracker inference-shards
inference-text-gen-server-logging inference-use-synchronous-zmq-collectives
inference-wandb-logging inference-wandb-logging-step-interval init-method-std
init-method-xavier-uniform init-model-with-meta-device initial-loss-scale
initialize-socket-comms inprocess-active-world-size inprocess-barrier-timeout
inprocess-completion-timeout inprocess-empty-cuda-cache inprocess-granularity
inprocess-hard-timeout inprocess-heartbeat-interval inprocess-heartbeat-timeout
inprocess-last-call-wait inprocess-max-iterations inprocess-monitor-process-interval
inprocess-monitor-thread-interval inprocess-progress-watchdog-interval inprocess-restart
inprocess-soft-timeout inprocess-termination-grace-time input-data-sizes-file
inter-layer-model-parallel-size intermediate-size intra-layer-model-parallel-size
is-hybrid-model iter-per-epoch iterations-to-skip keep-fp8-transpose-cache
keep-fp8-transpose-cache-when-using-custom-fsdp kitchen-attention-backend kitchen-config-file
kitchen-recipe-number kv-channels kv-lora-rank langrl-env-config langrl-external-server
langrl-inference-server-conversation-template langrl-inference-server-type layernorm-epsilon
lazy-mpu-init legacy-tokenizer linear-attention-freq linear-conv-kernel-dim linear-key-head-dim
linear-num-key-heads linear-num-value-heads linear-value-head-dim lion-beta1 lion-beta2 load
load-main-params-from-ckpt load-model-opt-format load-openai local-rank local_rank
log-batch-size-to-tensorboard log-device-memory-used log-energy log-interval
log-max-attention-logit log-memory-interval log-memory-to-tensorboard log-num-zeros-in-grad
log-params-norm log-progress log-straggler log-throughput log-timers-to-tensorboard
log-validation-ppl-to-tensorboard log-world-size-to-tensorboard log-zeros logging-level
logits-load-decode-threads logits-load-dir logits-load-ignore-errors logits-load-kd-loss-alpha
logits-load-msc-prefetch-depth logits-load-prefetch-factor logits-save-dir logits-save-dtype
logits-save-top-k logits-save-top-p logits-save-top-p-min-k loose-json loss-scale
loss-scale-window lr lr-decay-iters lr-decay-samples lr-decay-style lr-warmup-fraction
lr-warmup-init lr-warmup-iters lr-warmup-percent lr-warmup-samples lr-wsd-decay-iters
lr-wsd-decay-samples lr-wsd-decay-style main-grads-dtype main-params-dtype
make-vocab-size-divisible-by mamba-head-dim mamba-inference-conv-states-dtype
mamba-inference-ssm-states-dtype mamba-num-groups mamba-num-heads mamba-state-dim
mamba-training-ssm-states-dtype manual-gc manual-gc-interval mask-factor mask-prob mask-type
max-num-samples max-position-embeddings max-preds-per-seq max-seqlen-per-cp-rank
max-seqlen-per-dp-cp-rank max-tokens-to-oom max-training-rank
megatron-fsdp-enable-fine-grained-param-gather megatron-fsdp-grad-comm-dtype
megatron-fsdp-main-grads-dtype megatron-fsdp-main-params-dtype
megatron-fsdp-max-pool-double-buffer megatron-fsdp-version memory-snapshot-path merge-file
mhc-init-gating-factor mhc-num-residual-streams mhc-recompute-layer-num mhc-sinkhorn-iterations
micro-batch-size microbatch-group-size-per-virtual-pipeline-stage mid-level-dataset-surplus
min-loss-scale min-lr min-offloaded-tensor-size min-scale mla-down-proj-fusion
mlp-chunks-for-prefill mlp-chunks-for-training mmap-warmup mock-data model-parallel-memory-opt
model-parallel-size model-spec modelopt-enabled moe-apply-probs-on-input moe-aux-loss-coeff
moe-combine-bwd-dtype moe-deepep-num-sms moe-dispatch-fwd-dtype moe-enable-deepep
moe-enable-routing-replay moe-expert-capacity-factor moe-expert-rank-capacity-factor
moe-extended-tp moe-ffn-hidden-size moe-flex-dispatcher-backend moe-flex-dispatcher-num-sms
moe-frequency moe-grouped-gemm moe-hybridep-num-blocks-permute
moe-hybridep-num-blocks-unpermute moe-hybridep-num-sms moe-hybridep-num-sms-preprocessing
moe-hybridep-pad-uneven-dispatch-inputs moe-input-jitter-eps moe-latent-size moe-layer-freq
moe-layer-recompute moe-loss-coeff moe-mlp-glu-interleave-size moe-ncclep-zero-copy
moe-pad-expert-input-to-capacity moe-pad-experts-for-cuda-graph-inference moe-paged-stash
moe-paged-stash-buffer-size-factor-cpu moe-paged-stash-buffer-size-factor-cuda
moe-paged-stash-page-size moe-per-layer-logging moe-permute-fusion
moe-permute-fusion-into-hybridep moe-router-bias-update-rate moe-router-dtype
moe-router-enable-expert-bias moe-router-force-biased moe-router-force-load-balancing
moe-router-fusion moe-router-group-topk moe-router-load-balancing-type moe-router-num-groups
moe-router-padding-for-fp8 moe-router-padding-for-quantization moe-router-pre-softmax
moe-router-quantile-balancing-ema moe-router-score-function moe-router-topk
moe-router-topk-limited-devices moe-router-topk-scaling-factor moe-router-type
moe-routing-trace-capture-hidden-states moe-routing-trace-capture-logits
moe-routing-trace-dump-weights moe-routing-trace-max-training-iters moe-routing-trace-path
moe-shared-expert-gate moe-shared-expert-glu-interleave-size
moe-shared-expert-intermediate-size moe-shared-expert-overlap moe-single-grouped-bias
moe-single-grouped-weight moe-token-dispatcher-type moe-token-drop-policy moe-token-dropping
moe-upcycling-granularity moe-use-grouped-tensor moe-use-legacy-grouped-gemm moe-use-upcycling
moe-z-loss-coeff mrope-section mscale mscale-all-dim mtp-detach-heads mtp-hsm
mtp-hybrid-override-pattern mtp-loss-scaling-factor mtp-num-layers mtp-standalone
mtp-use-repeated-layer multi-latent-attention multi-query-attention multiple-validation-sets
muon-coefficient-type muon-extra-scale-factor muon-fp32-matmul-prec muon-momentum muon-nesterov
muon-no-split-qkv muon-num-ns-steps muon-scalar-optimizer muon-scale-mode muon-tp-mode
muon-use-nesterov muon-use-syrk mup-attn-scale-power mup-base-head-dim mup-base-hidden-size
mup-embedding-mult mup-output-mult mup-width-mult nccl-all-reduce-for-prefill
nccl-communicator-config-path ner-data-path no-align-grad-reduce no-align-param-gather
no-async-tensor-model-parallel-allreduce no-barrier-with-level-1-timing no-bias-dropout-fusion
no-bias-gelu-fusion no-bias-swiglu-fusion no-check-for-nan-in-loss-and-grad
no-ckpt-fully-parallel-save no-ckpt-load-validate-sharding-integrity
no-clone-scatter-output-in-embedding no-contiguous-buffers-in-local-ddp
no-create-attention-mask-in-dataloader no-data-sharding no-delay-grad-reduce
no-dsa-indexer-rotate-activation no-dsa-indexer-scoring-relu no-flight-recorder-dump-on-timeout
no-flight-recorder-extra-dump-on-exec no-flight-recorder-include-only-active no-fp8-wgrad
no-gradient-accumulation-fusion no-gradient-reduce-div-fusion no-inference-disable-ep-consensus
no-inference-dynamic-batching-prefix-caching no-inference-text-gen-server-logging
no-inference-use-synchronous-zmq-collectives no-inference-wandb-logging no-initialization
no-load-optim no-load-rng no-log-learnig-rate-to-tensorboard no-log-loss-scale-to-tensorboard
no-log-memory-to-tensorboard no-manual-gc-eval no-masked-softmax-fusion no-mmap-bin-files
no-one-logger no-overlap-p2p-communication no-pad-vocab-size no-persist-layer-norm
no-pin-cpu-grads no-pin-cpu-params no-position-embedding no-query-key-layer-scaling
no-rl-inference-logprobs-is-correction no-rl-offload-inference-model-weights-when-idle
no-rl-partial-rollouts no-rl-persist-cuda-graphs no-rl-skip-bos-token
no-rl-training-cuda-graphs no-rl-use-sequence-packing no-rl-verify-model-weights-swap
no-rope-freq no-rope-fusion no-save-optim no-save-rng no-save-tokenizer-assets
no-scaled-masked-softmax-fusion no-scatter-gather-tensors-in-pipeline
no-strict-fsdp-dtensor-load no-tokenizer-sentencepiece-ignore-extra-whitespaces
no-tp-comm-bulk-dgrad no-tp-comm-bulk-wgrad no-tp-comm-overlap-ag no-tp-comm-overlap-rs
no-tp-comm-split-ag no-tp-comm-split-rs no-use-layer-wise-param-layout
no-use-tokenizer-model-from-checkpoint-args no-weight-decay-cond-type
no-yarn-correction-range-round-to-int non-persistent-ckpt-type non-persistent-global-ckpt-dir
non-persistent-local-ckpt-algo non-persistent-local-ckpt-dir non-persistent-save-interval
norm-epsilon normalization null-tokenizer-eod-id null-tokenizer-pad-id num-attention-heads
num-channels num-classes num-dataset-builder-threads num-distributed-optimizer-instances
num-experts num-layers num-layers-at-end-in-bf16 num-layers-at-start-in-bf16
num-layers-per-virtual-pipeline-stage num-microbatches num-microbatches-in-minibatch
num-query-groups num-samples num-speculative-tokens num-unique-layers
num-virtual-stages-per-pipeline-rank num-workers nvtx-ranges object-storage-cache-path
offload-modules one-logger-async one-logger-entity one-logger-project one-logger-run-name
onnx-safe openai-gelu optimizer optimizer-cpu-offload optimizer-cuda-graph
optimizer-offload-fraction otel-enabled otel-service-name otel-span-groups out-seq-length
outer-dp-sharding-strategy output-bert-embeddings output-logit-dtype
overlap-cpu-optimizer-d2h-h2d overlap-dispatch-backward-with-experts-wgrad overlap-grad-reduce
overlap-moe-expert-parallel-comm overlap-p2p-communication
overlap-p2p-communication-warmup-flush overlap-param-gather
overlap-param-gather-with-optimizer-step overlapping-eval override-checkpoint-version
override-ckpt-iteration override-lr-scheduler override-opt-param-scheduler
override-opt_param-scheduler padded-vocab-size param-sharing-style patch-dim
per-dataset-sequences-path per-split-data-args-path perform-rl-step persistent-save-interval
phase-transition-iterations pipeline-model-parallel-comm-backend pipeline-model-parallel-layout
pipeline-model-parallel-size pipeline-model-parallel-split-rank pool-type
position-embedding-type presplit-sentences pretrained-bert pretrained-checkpoint profile
profile-ranks profile-step-end profile-step-start projection-dim
pytorch-profiler-collect-callstack pytorch-profiler-collect-chakra
pytorch-profiler-collect-shapes q-lora-rank qad-train-target qk-clip qk-clip-alpha
qk-clip-threshold qk-head-dim qk-l2-norm qk-layernorm qk-pos-emb-head-dim query-in-block-prob
quick-geglu rampup-batch-size recompute recompute-activations recompute-granularity
recompute-method recompute-modules recompute-num-layers record-memory-history record-shapes
refit-method relative-attention-max-distance relative-attention-num-buckets
renormalize-blend-weights replication replication-factor replication-jump
report-topk-accuracies rerun-mode reset-attention-mask reset-position-ids
result-rejected-tracker-filename retriever-report-topk-accuracies retriever-score-scaling
retriever-seq-length retro-add-retriever retro-attention-gate retro-cyclic-train-iters
retro-encoder-attention-dropout retro-encoder-hidden-dropout retro-encoder-layers
retro-fix-sub-epoch retro-no-verify-neighbor-count retro-num-neighbors
retro-num-retrieved-chunks retro-project-dir retro-return-doc-ids retro-split-constraint
retro-workdir reuse-grad-buf-for-mxfp8-param-ag rl-calculate-intra-group-similarity
rl-consumption-granularity rl-default-temperature rl-default-top-k rl-default-top-p
rl-durable-rollout-bank rl-generation-batch-size rl-generation-lag
rl-importance-sampling-truncation-coef rl-inference-expert-model-parallel-size
rl-inference-expert-tensor-model-parallel-size rl-inference-logprobs-is-correction
rl-inference-model-unified-memory-level rl-inference-parsers
rl-inference-pipeline-model-parallel-size rl-inference-tensor-model-parallel-size
rl-kv-cache-management-mode rl-max-inflight-requests rl-num-parallel-generation-batches
rl-num-parallel-generations rl-offload-inference-model-weights-when-idle
rl-offload-kv-cache-during-training rl-offload-optimizer-during-inference
rl-parallel-generation-tasks rl-partial-rollouts rl-persist-cuda-graphs rl-profile
rl-profile-dir rl-prompts-per-eval rl-remove-kv-cache-during-training rl-reset-cuda-graphs
rl-rollout-bank-dir rl-rollout-bank-max-bytes rl-sequence-packing-algo
rl-sequence-packing-bin-size rl-sequence-packing-max-sequences-per-bin rl-skip-bos-token
rl-submission-granularity rl-training-cuda-graphs rl-use-sequence-packing
rl-verify-model-weights-swap rope-scaling-factor rope-type rotary-base rotary-interleaved
rotary-percent rotary-scaling-factor rotary-seq-len-interpolation-factor
run-workload-inspector-server s3-cache-path sample-input-file sample-output-file sample-rate
save save-activations-interval save-dgrads-interval save-interval save-params-interval
save-retain-interval save-tokens-per-expert-interval save-wgrads-interval
scaled-masked-softmax-fusion scaled-upper-triang-masked-softmax-fusion
scatter-gather-tensors-in-pipeline seed seq-length sequence-parallel sft
sft-tokenizer-prompt-format sgd-momentum shared-query-context-model sharp-enabled-group
short-seq-prob shuffle skip-train softmax-type spec split squared-relu standalone-embed-stage
standalone-embedding-stage start-eval-at-iter start-wd start-weight-decay
step-batch-size-schedule straggler-ctrlr-port straggler-minmax-count strict-lambada
suggested-communication-unit-size swiglu swin-backbone-type symmetric-ar-type
te-precision-config-file te-rng-tracker temperature tensor-model-parallel-size
tensor-parallel-num-weight-shards tensorboard-dir tensorboard-log-interval
tensorboard-queue-size test-data test-data-path test-mode text-key tiktoken-num-special-tokens
tiktoken-pattern tiktoken-special-tokens timing-log-level timing-log-option titles-data-path
tokenizer-hf-include-special-tokens tokenizer-hf-no-include-special-tokens
tokenizer-hf-no-use-fast tokenizer-hf-use-fast tokenizer-metadata tokenizer-model
tokenizer-model-type tokenizer-path tokenizer-sentencepiece-legacy tokenizer-special-tokens
tokenizer-type top_k top_p torch-fsdp2-no-reshard-after-forward tp-comm-bootstrap-backend
tp-comm-bulk-dgrad tp-comm-bulk-wgrad tp-comm-overlap tp-comm-overlap-cfg
tp-comm-overlap-rs-dgrad tp-comm-split-ag tp-comm-split-rs train-data train-data-path
train-iters train-samples train-sync-interval transformer-impl trust-remote-code
untie-embeddings-and-output-weights use-checkpoint-args use-checkpoint-lr-scheduler
use-checkpoint-opt-param-scheduler use-checkpoint-opt_param-scheduler
use-contiguous-buffers-in-ddp use-cpu-initialization use-custom-fsdp use-dist-ckpt
use-distributed-optimizer use-flash-attn use-fused-weighted-squared-relu use-gigatoken
use-gpu-initialization use-grouped-gemm-for-dense-mlp use-grouped-gemm-for-shared-expert
use-kitchen-attention use-legacy-models use-legacy-static-engine use-mcore-models
use-megatron-fsdp use-mp-args-from-checkpoint-args use-mup use-nccl-ub use-one-sent-docs
use-persistent-ckpt-worker use-pipelining use-precision-aware-optimizer use-pytorch-profiler
use-random-spans use-regular-masking use-ring-exchange-p2p use-rope-scaling
use-rotary-position-embeddings use-same-sampling-seed-across-dp-ranks use-sharp
use-te-activation-func use-torch-fsdp2 use-torch-optimizer-for-cpu-offload use-tp-pp-dp-mapping
use-transformer-engine-op-fuser v-head-dim valid-data valid-data-path validate-model-load
validation-set-names verify-integrity virtual-pipeline-model-parallel-size vision-backbone-type
vision-pretraining vision-pretraining-type vit-load vocab-extra-ids vocab-file vocab-size
wandb-entity wandb-exp-name wandb-project wandb-save-dir warmup wd-incr-style weight-decay
weight-decay-incr-style wgrad-deferral-limit window-attn-skip-freq window-size yaml-cfg
yarn-beta-fast yarn-beta-slow yarn-correction-range-round-to-int
yarn-original-max-position-embeddings
""".split())
