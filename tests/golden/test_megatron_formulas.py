"""Published formulas reproduced exactly by the symbolic model.

Sources:
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC21: Eq. 2 (parameters) and Eq. 3 (FLOPs per iteration with full recompute).
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022:
  Table 2 (activation memory per layer).
"""

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.names import AXES
from perfmodel.step import Family, build

L, h, a, s, V, B, b, t = S.L, S.h, S.a, S.s, S.V, S.B, S.b, S.tp
GPT = {S.kv: a, S.f: 4 * h}  # GPT-3 family: multi-head attention, MLP width 4h


def gpt_family(**options):
    """GPT-3 as in Megatron-LM: biases, LayerNorm, learned positions, tied embeddings, no gating."""
    fixed = dict(schedule="1f1b", recompute="none", sequence_parallel=False, zero=0, flash=False,
                 overlap_grad_sync=False, overlap_param_gather=False, tp_comm_overlap=False,
                 stack="eager", uneven_stages=False, gated=False, tied_embeddings=True,
                 learned_positions=True,
                 bias=True, qkv_bias=True, layernorm=True, tp_layout="1d",
                 scopes=tuple((axis, "intra") for axis in AXES))
    return Family(**{**fixed, **options})


def gpt(expr):
    return sp.simplify(sp.sympify(expr).subs(GPT))


def test_parameter_count_matches_narayanan_eq2():
    built = build(gpt_family())
    ours = gpt(built.quantities["parameters"]) - 2 * h  # Eq. 2 leaves out the final layer norm
    eq2 = 12 * L * h**2 * (1 + sp.Rational(13, 12) / h + (V + s) / (12 * L * h))
    assert sp.simplify(ours - eq2) == 0


def test_flops_with_full_recompute_match_narayanan_eq3():
    built = build(gpt_family(recompute="full"))
    # every layer recomputed (recompute_every 1), and L / pp is whole (a plan rule)
    ours = gpt(built.quantities["hardware_flops_per_step"]).subs({S.dp: 1, S.N_rc: 1}).replace(
        sp.floor, lambda x: x)
    eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert sp.simplify(ours - eq3) == 0


def test_model_flops_are_three_forward_passes():
    built = build(gpt_family())
    ours = gpt(built.quantities["model_flops_per_step_full_attention"]).subs(S.dp, 1)
    expected = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert sp.simplify(ours - expected) == 0


def test_model_flops_match_megatron_lm_num_floating_point_operations():
    """Megatron-LM megatron/training/training.py, num_floating_point_operations (since 8873b55,
    2025-03-06): 12 B s l h^2 ((1 + groups/heads + s/h/2) + f/h + V/(2 l h)), the causal attention
    core counted as half ("only half of the attention matrix is non-zero"); GPT: f = 4 h."""
    built = build(gpt_family())
    ours = gpt(built.quantities["model_flops_per_step"]).subs(S.dp, 1)
    megatron = 12 * B * s * L * h**2 * ((1 + 1 + s / h / 2) + 4 + V / (2 * L * h))
    assert sp.simplify(ours - megatron) == 0


def _act(tp, *, sequence_parallel=False, recompute="none"):
    expr = layer_activation_bytes(b, s, h, a, S.kv, S.f, tp, 2, sequence_parallel=sequence_parallel,
                                  full=recompute == "full", selective=recompute == "selective",
                                  flash=False, gated=False)
    return gpt(expr)


def test_activation_memory_matches_korthikanti_table2():
    sbh = s * b * h
    cases = {
        "no parallelism": (_act(1), sbh * (34 + 5 * a * s / h)),
        "tensor parallel": (_act(t), sbh * (10 + 24 / t + 5 * a * s / (h * t))),
        "tensor + sequence parallel": (_act(t, sequence_parallel=True),
                                       sbh / t * (34 + 5 * a * s / h)),
        "tensor parallel + selective": (_act(t, recompute="selective"), sbh * (10 + 24 / t)),
        "tensor + sequence + selective": (_act(t, sequence_parallel=True, recompute="selective"),
                                          sbh * 34 / t),
        "full recompute": (_act(t, recompute="full"), 2 * sbh),
    }
    for name, (ours, table2) in cases.items():
        assert sp.simplify(ours - table2) == 0, name
