"""Mixture-of-experts Hugging Face configs held out from the importer's development (issue:
Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V3, GPT-OSS imports within 0.5% of their model cards),
and the config fields found misread on them.

Each config is checked twice: against the exact count its family's modelling code builds
(transformers 5's modeling_<family>.py, instantiated on the meta device from the same
config.json; perfmodel leaves out only what perfmodel.params says it does not count: Qwen2-MoE's
shared-expert gate, h per MoE layer), and against its publisher's rounded figure.

tests/data/hf/<name>/config.json of these models are the published config.json values, read from
copies in public repositories (as tests/unit/test_hf_configs.py's issue-17 configs):
- deepseek-v2-lite-chat: deepseek-ai/DeepSeek-V2-Lite-Chat's config.json (snapshot
  85864749cd611b4353ce1decdb286193298f64c7) as transformers 4.49 logged it on loading, in a public
  fine-tuning log; DeepSeek-V2-Lite and -Chat share the architecture (github.com/deepseek-ai/
  DeepSeek-V2 README, model table). q_lora_rank null: its queries are not compressed.
- moonlight-16b-a3b-instruct: moonshotai/Moonlight-16B-A3B-Instruct's config.json at revision
  4e735b07a89f73647dfab71ab91b840f362ede5b (a public repository's test copy, key order and
  values kept): model_type deepseek_v3 with q_lora_rank null, n_group 1, vocab 163840.
- qwen2-57b-a14b: Qwen/Qwen2-57B-A14B's config.json (NVIDIA TensorRT-LLM's Qwen2-MoE unit test,
  QWEN2_57B_A14B_CONFIG): 64 experts of 2560, top 8, a 20480-wide shared expert, 4 kv heads.
- qwen3-coder-480b-a35b-instruct: Qwen/Qwen3-Coder-480B-A35B-Instruct's config.json (a public
  deployment guide's copy, without the quantization_config and compression_config it says it
  added): 160 experts of 2560, top 8, shared_expert_intermediate_size 0, qkv_bias false.
- glm-4.5-air: zai-org/GLM-4.5-Air's config.json as transformers 4.54.1 printed its
  Glm4MoeConfig on loading /models/ZhipuAI/GLM-4.5-Air, in a public repository's notes on
  ms-swift's convert_hf2mcore (keys in the printed, sorted order; _name_or_path added): hidden
  4096, 46 layers, 96 heads of 128, 8 kv heads, q/k/v biases, partial_rotary_factor 0.5, 128
  experts of 1408 and a shared one, top 8, 1 dense layer of 10944, 1 MTP layer, no QK norm,
  vocab 151552.
- glm-4.5: zai-org/GLM-4.5's fields, not a copy of its file (none was found in the public
  repositories searched): the keys of GLM-4.7's config.json (nvidia/GLM-4.7-NVFP4 at 47fa7dc8,
  transcribed in a public repository's test; its quantization_config and transformers_version
  left out), whose architecture fields GLM-4.5 shares, with GLM-4.5's max_position_embeddings
  131072 (GLM-4.6 raised it). Checked field by field against NVIDIA-NeMo/Megatron-Bridge
  src/megatron/bridge/models/glm/glm45_provider.py at 869bb397 (GLM45ModelProvider355B, "Provider
  for GLM 4.5 355B-A32B: https://huggingface.co/zai-org/GLM-4.5": 92 layers, the first 3 dense,
  hidden 5120, ffn 12288, 160 experts of 1536 and a 1536-wide shared expert, top 8, scaling 2.5,
  QK layernorm, 96 heads, 8 query groups, kv_channels 128, qkv biases, rotary_percent 0.5, rotary
  base 1e6, vocab 151552, untied, seq 131072, one MTP layer) and a public slime checkout's
  scripts/models/glm4.5-355B-A32B.sh (the same Megatron arguments).
"""

from __future__ import annotations

import json

import pytest

from perfmodel import SpecError, load_model
from perfmodel.params import parameter_counts
from perfmodel.specs.model import model_from_hf_config
from tests.conftest import ROOT

HF = ROOT / "tests/data/hf"


def _counts(name: str):
    model = load_model(str(HF / name), seq_len=4096)
    return model, parameter_counts(model)


# (config, total, active: perfmodel's exact counts, equal to transformers' modelling code's)
EXACT = [
    # = the checkpoint's 15,706,484,224 parameters (a public repository's weight report of
    # DeepSeek-V2-Lite-Chat's safetensors: 5,291 tensors)
    ("deepseek-v2-lite-chat", 15_706_484_224, 2_661_150_208),
    ("moonlight-16b-a3b-instruct", 15_960_108_544, 2_914_774_528),
    # transformers: 57,408,658,944 and 14,249,270,784 with the shared-expert gates
    # (28 layers x 3584 = 100,352, not counted)
    ("qwen2-57b-a14b", 57_408_558_592, 14_249_170_432),
    ("qwen3-coder-480b-a35b-instruct", 480_154_859_520, 35_474_749_440),
    # transformers 5.24 (Glm4MoeForCausalLM on the meta device): 352,797,814,784 and
    # 33,632,251,904 with GLM-4.5's q/k norms (92 layers x 2 x 128 = 23,552, not counted)
    ("glm-4.5", 352_797_791_232, 33_632_228_352),
    ("glm-4.5-air", 106_852_245_504, 13_424_123_904),
]


@pytest.mark.parametrize("name,total,active", EXACT, ids=[e[0] for e in EXACT])
def test_held_out_counts_equal_the_modelling_codes(name, total, active):
    _, counts = _counts(name)
    assert (counts.total, counts.active) == (total, active)


def test_deepseek_v2_lite_matches_its_published_counts():
    """DeepSeek-V2 tech report (arXiv 2405.04434, Appendix B; github.com/deepseek-ai/DeepSeek-V2
    deepseek-v2-tech-report.pdf): 'DeepSeek-V2-Lite comprises 15.7B total parameters, of which
    2.4B are activated for each token'. Moonlight's README (github.com/MoonshotAI/Moonlight at
    c2ad5b20c605086526a179d36901bfc41b52b44b, benchmark table, DSV2-Lite column) gives both
    without the embedding parameters: 15.29B total, 2.24B activated.

    Ours: 15.706B total; active 2.661B, 2.451B without the input table (DeepSeek's convention
    for DeepSeek-V3's 36.7B), 2.242B without both tables. The '2.4B' is two digits that 2.451B
    only truncates to (2% above it): no convention reaches it within 0.5%, while the
    four-digit figures agree to their digits."""
    model, counts = _counts("deepseek-v2-lite-chat")
    assert model.q_lora_rank is None and model.kv_lora_rank == 512
    assert (model.experts, model.top_k, model.shared_experts, model.moe_first_dense) == (64, 6,
                                                                                           2, 1)
    assert model.expert_groups == 0  # topk_method greedy, n_group 1: no node limit
    assert counts.total == pytest.approx(15.7e9, rel=0.005)
    tables = 2 * model.vocab * model.hidden
    assert round((counts.total - tables) / 1e7) == 1529  # 15.29B
    assert round((counts.active - tables) / 1e7) == 224  # 2.24B
    assert counts.active - counts.embedding == 2_451_435_008
    assert int((counts.active - counts.embedding) / 1e8) == 24  # '2.4B', truncated


def test_moonlight_matches_its_published_counts():
    """Moonlight's README (github.com/MoonshotAI/Moonlight at c2ad5b20c605086526a179d36901bfc4
    1b52b44b): '#Total Params 16B', '#Activated Params 3B' (model table) and, without the
    embedding parameters, 'Total Params† 15.29B', 'Activated Param† 2.24B' (benchmark table:
    † 'The reported parameter counts exclude the embedding parameters', the input table and the
    output layer both)."""
    model, counts = _counts("moonlight-16b-a3b-instruct")
    assert model.q_lora_rank is None and model.mtp_layers == 0 and model.expert_groups == 0
    assert counts.total == pytest.approx(16e9, rel=0.005)
    assert round(counts.active / 1e9) == 3
    tables = 2 * model.vocab * model.hidden
    assert counts.total - tables == pytest.approx(15.29e9, rel=0.001)
    assert counts.active - tables == pytest.approx(2.24e9, rel=0.005)


def test_qwen2_57b_a14b_matches_its_published_counts():
    """Qwen2 Technical Report (arXiv 2407.10671), abstract: 'a Mixture-of-Experts model with 57
    billion parameters of which 14 billion are activated for each token' (two digits: ours
    57.41B and 14.25B, the embedding table counted as Qwen counts it for Qwen1.5-MoE-A2.7B)."""
    model, counts = _counts("qwen2-57b-a14b")
    assert (model.experts, model.top_k, model.expert_ffn_hidden) == (64, 8, 2560)
    assert (model.shared_experts, model.shared_expert_ffn_hidden, model.kv_heads) == (1, 20480, 4)
    assert counts.total == pytest.approx(57e9, rel=0.01)
    assert round(counts.total / 1e9) == 57 and round(counts.active / 1e9) == 14


def test_qwen3_coder_480b_matches_its_published_counts():
    """huggingface.co/Qwen/Qwen3-Coder-480B-A35B-Instruct, model card: '480B total parameters
    and 35B activated' (ours 480.15B and 35.47B; 34.54B without the input table: two digits
    either way)."""
    model, counts = _counts("qwen3-coder-480b-a35b-instruct")
    assert (model.experts, model.top_k, model.expert_ffn_hidden, model.shared_experts) == (
        160, 8, 2560, 0)
    assert (model.head_dim, model.kv_heads, model.attention_width) == (128, 8, 12288)
    assert counts.total == pytest.approx(480e9, rel=0.005)
    assert round(counts.active / 1e9) == 35 and round((counts.active - counts.embedding) / 1e9) \
        == 35


def _config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


# (config, key left out, what its family's configuration class sets it to). Before, each was read
# with perfmodel's own fallback: Mixtral 8x7B without num_key_value_heads had 32 kv heads (47.51B
# parameters against transformers' 46.70B), Qwen1.5-MoE without shared_expert_intermediate_size
# no shared expert (13.49B against 14.32B), DeepSeek-V3 without q_lora_rank uncompressed queries
# (678.8B against 671.0B), without first_k_dense_replace no dense layer (703.8B) and without
# n_routed_experts a dense model of 37.4B
UNSAID = [
    ("mixtral-8x7b-v0.1", "num_key_value_heads", "8"),
    ("qwen3-30b-a3b", "num_key_value_heads", "4"),
    ("qwen2-57b-a14b", "num_key_value_heads", "16"),
    ("gpt-oss-20b", "num_key_value_heads", "8"),
    ("mistral-7b-v0.1", "num_key_value_heads", "8"),
    ("qwen2.5-7b", "num_key_value_heads", "32"),
    ("qwen3-8b", "head_dim", "128"),
    ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size", "5632"),
    ("deepseek-v3", "q_lora_rank", "1536"),
    ("deepseek-v2-lite-chat", "q_lora_rank", "1536"),
    ("deepseek-v3", "qk_rope_head_dim", "64"),
    ("deepseek-v3", "first_k_dense_replace", r"3 \(transformers\) or 0 \(DeepSeek's\)"),
    ("deepseek-v2.5", "n_shared_experts", r"2 \(transformers\) or none \(DeepSeek's\)"),
    ("kimi-k2-instruct", "n_routed_experts",
     r"256 \(transformers\) or none, a dense model \(DeepSeek's\)"),
    # Glm4MoeConfig's own values (transformers 5.24)
    ("glm-4.5-air", "partial_rotary_factor", "0.5"),
    ("glm-4.5", "num_key_value_heads", "8"),
    ("glm-4.5-air", "n_routed_experts", "128"),
    ("glm-4.5", "num_nextn_predict_layers", "1"),
    ("glm-4.5", "n_shared_experts", "1"),
    ("glm-4.5", "first_k_dense_replace", "1"),
]


@pytest.mark.parametrize("name,key,default", UNSAID, ids=[f"{u[0]}-{u[1]}" for u in UNSAID])
def test_a_key_whose_class_default_is_not_ours_is_refused_when_absent(name, key, default):
    """transformers' configuration classes fill in an absent key with their own default (Mixtral's
    num_key_value_heads 8, Qwen3-MoE's 4, Qwen2-MoE's shared expert 5632 wide, DeepSeek's
    q_lora_rank 1536 ...), which is not what perfmodel would derive: refused naming the key,
    never read with perfmodel's fallback. DeepSeek's own configuration_deepseek.py (its configs'
    auto_map) and transformers' disagree on some (first_k_dense_replace, n_routed_experts,
    n_shared_experts): refused all the same."""
    cfg = {k: v for k, v in _config(name).items() if k != key}
    with pytest.raises(SpecError, match=f"is missing '{key}', which its configuration class sets "
                                        f"to {default}: give it"):
        model_from_hf_config(cfg, name, seq_len=4096)
    model_from_hf_config(_config(name), name, seq_len=4096)  # with it: read


def test_an_explicit_null_keeps_its_meaning():
    """q_lora_rank null (DeepSeek-V2-Lite, Moonlight: uncompressed queries) and n_routed_experts
    null (DeepSeek's modelling code: a dense model) are given, not absent."""
    lite = model_from_hf_config(_config("deepseek-v2-lite-chat"), "lite", seq_len=4096)
    assert lite.q_lora_rank is None
    dense = {k: v for k, v in _config("deepseek-v2.5").items() if k != "n_shared_experts"}
    assert model_from_hf_config({**dense, "n_routed_experts": None}, "d", 4096).experts == 0


def test_qwen3_moe_has_no_shared_expert_whatever_its_config_carries():
    """Qwen3MoeSparseMoeBlock builds routed experts only: shared_expert_intermediate_size (0 in
    Qwen3-Coder-480B's config) is not read. Before, a nonzero one added a shared expert: 2560
    wide, 62 layers of 3 x 6144 x 2560, 2.93B parameters transformers does not build."""
    cfg = _config("qwen3-coder-480b-a35b-instruct")
    plain = parameter_counts(model_from_hf_config(cfg, "q", seq_len=4096))
    wider = model_from_hf_config({**cfg, "shared_expert_intermediate_size": 2560}, "q", 4096)
    assert wider.shared_experts == 0 and parameter_counts(wider) == plain
    # Qwen2-MoE's is read: Qwen2MoeSparseMoeBlock's shared_expert
    q2 = _config("qwen2-57b-a14b")
    assert model_from_hf_config(q2, "q2", 4096).shared_expert_ffn_hidden == 20480


def test_qwen3_mlp_bias_is_not_read():
    """Qwen3's and Qwen3-MoE's MLPs and experts have no biases whatever mlp_bias says (their
    modelling code does not read it): a config with mlp_bias true is the same model, where it was
    refused as 'attention_bias false with mlp_bias true'. attention_bias true (biases on q, k, v
    and o, none on the MLP) stays refused: perfmodel's bias covers the output and the MLP
    together."""
    for name in ("qwen3-30b-a3b", "qwen3-8b"):
        cfg = _config(name)
        assert model_from_hf_config({**cfg, "mlp_bias": True}, name, 4096) == \
            model_from_hf_config(cfg, name, 4096)
        with pytest.raises(SpecError, match="attention_bias true with mlp_bias false"):
            model_from_hf_config({**cfg, "attention_bias": True}, name, 4096)


def test_qwen2_moe_qkv_bias_is_read():
    """transformers 5's Qwen2MoeConfig has qkv_bias (true by default: Qwen1.5-MoE and Qwen2-MoE
    configs leave it out) and Qwen2MoeAttention puts q, k and v biases only with it. Before, a
    config with qkv_bias false kept them: 28 layers x (3584 + 2 x 512) = 129,024 parameters
    transformers does not build for Qwen2-57B-A14B."""
    cfg = _config("qwen2-57b-a14b")
    with_bias = model_from_hf_config(cfg, "q", 4096)
    without = model_from_hf_config({**cfg, "qkv_bias": False}, "q", 4096)
    assert with_bias.qkv_bias and not without.qkv_bias and not without.bias
    assert parameter_counts(with_bias).total - parameter_counts(without).total == 28 * (
        3584 + 2 * 4 * 128)


def test_deepseek_fields_its_two_modelling_codes_read_differently_are_refused():
    """moe_layer_freq (1 in every published DeepSeek and Kimi config): DeepSeek's
    modeling_deepseek.py, which the configs' auto_map names (and vLLM, SGLang), keeps layer i
    dense unless i % moe_layer_freq == 0; transformers' DeepseekV2/V3DecoderLayer ignores it.
    Before, 2 was read DeepSeek's way: DeepSeek-V2-Lite at 9.16B parameters where transformers
    builds 15.71B. mlp_bias true in a deepseek_v2 config: transformers' DeepseekV2MLP biases the
    dense and shared MLPs (223,616 parameters for DeepSeek-V2-Lite), DeepSeek's code none; it was
    ignored. Both are refused naming the field; deepseek_v3's classes read no mlp_bias."""
    lite = _config("deepseek-v2-lite-chat")
    with pytest.raises(SpecError, match="moe_layer_freq 2 is not modelled"):
        model_from_hf_config({**lite, "moe_layer_freq": 2}, "lite", 4096)
    with pytest.raises(SpecError, match="mlp_bias true in a deepseek_v2 config is not modelled"):
        model_from_hf_config({**lite, "mlp_bias": True}, "lite", 4096)
    v3 = _config("deepseek-v3")
    assert model_from_hf_config({**v3, "mlp_bias": True}, "v3", 4096) == \
        model_from_hf_config(v3, "v3", 4096)
    assert model_from_hf_config({**lite, "mlp_bias": False, "moe_layer_freq": 1}, "lite",
                                4096).moe_layer_count == 26


@pytest.mark.parametrize("mtype,cfg,field", [
    ("phimoe", {"num_local_experts": 16, "lm_head_bias": True}, "lm_head_bias"),
    ("granitemoe", {"num_local_experts": 32, "logits_scaling": 6.0}, "logits_scaling"),
])
def test_moe_families_perfmodel_cannot_cost_whole_are_refused_naming_why(mtype, cfg, field):
    """phimoe's biases (attention output and output layer, none on its experts) and
    granitemoe's scalings are refused naming the field, not as an unknown mixture of experts.
    glm4_moe, refused so for its partial_rotary_factor, is read since rotary_fraction costs it
    (test_glm4_moe_is_read_as_its_modelling_code_builds_it)."""
    with pytest.raises(SpecError, match=f"model_type '{mtype}' is a mixture of experts .*{field}"):
        model_from_hf_config({"model_type": mtype, **cfg}, mtype, seq_len=4096)


def test_glm4_moe_is_read_as_its_modelling_code_builds_it():
    """transformers 5.24's modeling_glm4_moe: GQA attention 96 x 128 wide (not hidden wide), q,
    k, v biased and o_proj not (attention_bias), RoPE on partial_rotary_factor 0.5 of each head,
    the first first_k_dense_replace layers dense, then routed experts and a shared MLP
    moe_intermediate_size x n_shared_experts wide, every MLP SwiGLU without biases, the output
    untied; the MTP layer counted apart as DeepSeek-V3's. Before, glm4_moe was refused for its
    partial rotary embedding."""
    for name, layers, hidden, first, experts, width in (
            ("glm-4.5", 92, 5120, 3, 160, 1536), ("glm-4.5-air", 46, 4096, 1, 128, 1408)):
        model, counts = _counts(name)
        assert (model.layers, model.hidden, model.moe_first_dense, model.experts,
                model.expert_ffn_hidden) == (layers, hidden, first, experts, width)
        assert (model.heads, model.kv_heads, model.head_dim, model.attention_width) == (
            96, 8, 128, 12288)
        assert (model.top_k, model.shared_experts, model.shared_expert_ffn_hidden) == (8, 1, width)
        assert (model.qkv_bias, model.bias, model.gated_mlp, model.tied_embeddings) == (
            True, False, True, False)
        assert (model.position_embedding, model.rotary_fraction, model.mtp_layers) == (
            "rotary", 0.5, 1)
        assert model.expert_groups == 0  # n_group 1: no node limit
        assert model.uncosted() == []
    # GLM-4.5's MTP layer: a MoE layer (attention with q, k, v biases; 160 routed experts and
    # the shared one; the router; two norms), eh_proj 2 h x h and enorm, hnorm and its
    # shared_head.norm (vLLM's glm4_moe_mtp.py: SharedHead's norm; counted since 2026-12-07)
    _, counts = _counts("glm-4.5")
    h = 5120
    attention = h * 12288 + 12288 + 2 * (h * 1024 + 1024) + 12288 * h
    moe_layer = attention + (160 + 1) * 3 * h * 1536 + h * 160 + 2 * h
    assert counts.mtp == moe_layer + 2 * h * h + 3 * h == 3_988_069_376
    air = _config("glm-4.5-air")
    grouped = model_from_hf_config({**air, "n_group": 8, "topk_group": 4}, "air", 4096)
    assert (grouped.expert_groups, grouped.group_topk) == (8, 4)
    # transformers 5 saves the share in rope_parameters, which Glm4MoeConfig reads first
    saved = {k: v for k, v in air.items() if k != "partial_rotary_factor"}
    saved["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000,
                                "partial_rotary_factor": 0.25}
    assert model_from_hf_config(saved, "air", 4096).rotary_fraction == 0.25
    with pytest.raises(SpecError, match="layer_types other than full_attention"):
        model_from_hf_config({**air, "layer_types": ["sliding_attention"] * 46}, "air", 4096)


def test_glm_4_5_counts_against_its_published_figures():
    """GLM-4.5 tech report (arXiv 2508.06471, Table 1) and github.com/zai-org/GLM-4.5 README:
    'GLM-4.5 has 355 billion total parameters with 32 billion active parameters, while
    GLM-4.5-Air adopts a more compact design with 106 billion total parameters and 12 billion
    active parameters'.

    Ours (= transformers' Glm4MoeForCausalLM): GLM-4.5 352.80B total, 33.63B active;
    GLM-4.5-Air 106.85B and 13.42B. The active figures are ours without the two vocabulary
    tables (GLM-4.5 32.08B, Air 12.18B: '32B' and '12B' to their two digits). No one count puts
    both totals within 0.5% of 355B and 106B: all of the model -0.62% and +0.80%; with the MTP
    layer +0.50% and +3.0%; without the input table -0.84% and +0.22%; without both tables -1.06%
    and -0.37%; without both tables and with the MTP layer +0.07% and +1.9%. The totals are
    checked within 1%."""
    for name, total, active in (("glm-4.5", 355e9, 32e9), ("glm-4.5-air", 106e9, 12e9)):
        model, counts = _counts(name)
        tables = 2 * model.vocab * model.hidden
        assert counts.total == pytest.approx(total, rel=0.01)
        assert round((counts.active - tables) / 1e9) == active / 1e9
        assert counts.reported == counts.active - tables  # reported as Zhipu AI counts
    _, big = _counts("glm-4.5")
    _, air = _counts("glm-4.5-air")
    assert (big.total / 355e9 - 1, air.total / 106e9 - 1) == (pytest.approx(-0.0062, abs=1e-4),
                                                              pytest.approx(0.0080, abs=1e-4))


def test_glm_4_5_air_is_predicted_and_its_half_rotation_costs_only_op_by_op():
    from perfmodel import Plan, load_model, predict

    air = load_model(str(HF / "glm-4.5-air"), seq_len=4096)
    whole = air.replace(rotary_fraction=1)
    for kernels in ("fused", "eager"):
        plan = Plan(gpus=64, tp=2, pp=2, ep=8, dp=16, sequence_parallel=True, global_batch=256,
                    kernels=kernels)
        half_s = predict(air, "dgx-h100", plan).step_time_s
        whole_s = predict(whole, "dgx-h100", plan).step_time_s
        assert (half_s == whole_s) == (kernels == "fused")


def test_deepseek_v3_without_topk_method_routes_by_groups():
    # transformers 5's DeepseekV3TopkRouter groups by n_group whatever the config says, and its
    # DeepseekV3Config has no topk_method (DeepSeek's V3 configs carry noaux_tc): a V3 config
    # without the key keeps its 8 groups of which a token's experts come from 4; a V2 config
    # without it takes DeepseekV2Config's greedy, no groups
    cfg = json.loads((ROOT / "tests/data/hf/deepseek-v3/config.json").read_text())
    assert model_from_hf_config(cfg, "v3", seq_len=4096).expert_groups == 8
    del cfg["topk_method"]
    spec = model_from_hf_config(cfg, "v3 without topk_method", seq_len=4096)
    assert (spec.expert_groups, spec.group_topk) == (8, 4)
    v2 = json.loads((ROOT / "tests/data/hf/deepseek-v2.5/config.json").read_text())
    v2.pop("topk_method", None)
    assert model_from_hf_config(v2, "v2 without topk_method", seq_len=4096).expert_groups in (0, 1)
