"""A RoPE that rotates part of each head (TransformerSpec.rotary_fraction; GLM-4.5's
partial_rotary_factor 0.5, GPT-NeoX's rotary_pct 0.25), costed per kernel path
(perfmodel.costs.compute.fused_rope_bytes, eager_rope_bytes, rope_split_bytes).

Before, every rotary model was costed as rotating whole heads. Fused (Transformer Engine's kernel
copies the pass-through dimensions itself) and compiled kernels still read and write whole q and k;
op by op the rotation runs on the rotated share and the split and concatenation around it cost
apart. The eager numbers are worked by hand for the small layer of test_elementwise_kernels and
checked against a TorchDispatchMode count of the op-by-op rotation (bf16, torch 2.13)."""

from __future__ import annotations

import pytest
import sympy as sp

from perfmodel import Plan, SpecError, predict
from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.family import Family
from perfmodel.specs.model import load_model
from perfmodel.step import host as H
from perfmodel.step.context import Context
from perfmodel.step.layer import _layer_work

# the small layer of test_elementwise_kernels: T = 8 tokens, hidden 64, 8 query heads and 2 KV
# heads of 8, MLP 96, bf16
T, H_, A, KV, D, F, E = 8, 64, 8, 2, 8, 96, 2
N_H, N_Q, N_K, N_F = T * H_, T * A * D, T * KV * D, T * F  # 512, 512, 128, 768


def _eager(fraction, partial):
    return K.eager_elementwise_bytes(
        norm_elements=N_H, q_elements=N_Q, k_elements=N_K, kv_elements=N_K,
        expanded_elements=N_Q, mlp_elements=N_F, attention_elements=N_Q, e=E, layernorm=0,
        gated=1, gqa=1, flash=1, rotary=1, rotary_fraction=fraction, partial=partial)


def test_eager_partial_rope_bytes_by_hand():
    # whole heads: cast 2+4, complex product 4+4, cast back 4+2 per element, both ways
    assert _eager(1, 0)["rope"] == (20 * (N_Q + N_K), 20 * (N_Q + N_K))
    # half of each head: those ops on half the elements (10), the cat 2+2 forward; backward the
    # two slices' zero fills (2 + 2) and copies (2 r + 2 (1 - r), read and written: 4) and the
    # sum of q's two gradients (2 + 2 + 2)
    half = sp.Rational(1, 2)
    assert _eager(half, 1)["rope"] == (14 * (N_Q + N_K), 24 * (N_Q + N_K))
    assert K.rope_split_bytes(N_Q, E) == (4 * N_Q, 14 * N_Q)
    # the other terms do not move
    assert {k: v for k, v in _eager(half, 1).items() if k != "rope"} == {
        k: v for k, v in _eager(1, 0).items() if k != "rope"}
    # fused: whole q and k read and written, however much of them turns
    assert K.fused_rope_bytes(N_Q, N_K, E) == 2 * E * (N_Q + N_K)


def _context(kernels: str, partial: bool) -> Context:
    return Context.of(Family(
        schedule="1f1b", recompute="none", sequence_parallel=False, zero=0, flash=True,
        overlap_grad_sync=False, overlap_param_gather=False, tp_comm_overlap=False,
        stack="compiled" if kernels == "compiled" else "eager", kernels=kernels,
        uneven_stages=False, gated=True, tied_embeddings=False, learned_positions=False,
        rotary_positions=True, bias=False, qkv_bias=False, layernorm=False, tp_layout="1d",
        cp_comm="p2p", partial_rotary=partial))


VALUES = {S.b: 1, S.s: 8, S.h: 64, S.a: 8, S.kv: 2, S.f: 96, S.tp: 1, S.cp: 1, S.e: 2, S.W: 1,
          S.r_rot: sp.Rational(1, 2)}


def _bytes(kernels: str, partial: bool) -> tuple[sp.Expr, sp.Expr]:
    work = _layer_work(_context(kernels, partial), False)
    return (sp.nsimplify(work.elementwise_s.subs(VALUES)),
            sp.nsimplify(work.elementwise_back_s.subs(VALUES)))


@pytest.mark.parametrize("kernels", ["fused", "compiled"])
def test_a_partial_rotation_costs_fused_and_compiled_kernels_the_same(kernels):
    assert _bytes(kernels, True) == _bytes(kernels, False)


def test_a_partial_rotation_costs_eager_kernels_the_rotated_share_and_the_split():
    whole, half = _bytes("eager", False), _bytes("eager", True)
    assert half[0] - whole[0] == (14 - 20) * (N_Q + N_K)
    assert half[1] - whole[1] == (24 - 20) * (N_Q + N_K)


def test_host_and_kernel_counts_add_the_split_only_when_partial_and_eager():
    for kernels in ("fused", "eager"):
        whole = [sp.sympify(x).subs({S.a: 8, S.kv: 2}) for x in H.layer_ops(
            _context(kernels, False))]
        half = [sp.sympify(x).subs({S.a: 8, S.kv: 2}) for x in H.layer_ops(
            _context(kernels, True))]
        added = [h - w for h, w in zip(half, whole, strict=True)]
        assert added == ([H.EAGER_FORWARD_ROPE_SPLIT, H.EAGER_BACKWARD_ROPE_SPLIT]
                         if kernels == "eager" else [0, 0])
    assert (H.EAGER_FORWARD_ROPE_SPLIT, H.EAGER_BACKWARD_ROPE_SPLIT) == (6, 10)
    whole = K.eager_elementwise_kernels(layernorm=0, gated=1, gqa=1, flash=1, rotary=1, narrow=1)
    half = K.eager_elementwise_kernels(layernorm=0, gated=1, gqa=1, flash=1, rotary=1, narrow=1,
                                       partial=1)
    # the cat on q and on k; two zero fills, two copies and a sum on each
    assert (half[0] - whole[0], half[1] - whole[1]) == (2, 10)


def test_op_by_op_partial_rotation_matches_a_dispatch_count():
    """torchtitan's apply_rotary_emb ops on the first r d dimensions of each head, then
    torch.cat with the rest (the split transformers' glm4_moe apply_rotary_pos_emb does),
    counted under a TorchDispatchMode: every non-view op's input and output bytes, and every
    op dispatched (views included) for the host counts, per q (or k)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[bool, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            view = any(r.alias_info is not None for r in func._schema.returns)
            tensors = [t for t in tree_flatten((args, kwargs, out))[0]
                       if isinstance(t, torch.Tensor)]
            self.ops.append((view, sum(t.numel() * t.element_size() for t in tensors)))
            return out

    def rope(x, freqs):  # torchtitan 015ccb237, torchtitan/models/llama/model.py
        x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(x_ * freqs).flatten(3).type_as(x)

    b, s, heads, d = 2, 16, 64, 32  # many heads: the rotary table's bytes are < 1% of q's
    n = b * s * heads * d
    counts = {}
    for rotated in (d, d // 2):
        theta = torch.randn(s, rotated // 2)
        freqs = torch.polar(torch.ones_like(theta), theta).view(1, s, 1, rotated // 2)
        q = torch.randn(b, s, heads, d, dtype=torch.bfloat16, requires_grad=True) * 1
        with Count() as fwd:
            out = rope(q, freqs) if rotated == d else torch.cat(
                [rope(q[..., :rotated], freqs), q[..., rotated:]], dim=-1)
        grad = torch.randn_like(out)
        with Count() as bwd:
            out.backward(grad)
        # the backward's last op multiplies by the `* 1` above; the leaf's gradient is detached
        ops = (fwd.ops, bwd.ops[:-2])
        counts[rotated] = [(sum(nb for view, nb in o if not view) / n, len(o)) for o in ops]
    e = 2
    assert counts[d][0][0] == pytest.approx(float(K.eager_rope_bytes(1, e)), abs=0.2)
    assert counts[d][1][0] == pytest.approx(float(K.eager_rope_bytes(1, e)), abs=0.2)
    split_fwd, split_bwd = K.rope_split_bytes(1, e)
    rotation = float(K.eager_rope_bytes(1, e, sp.Rational(1, 2)))
    assert counts[d // 2][0][0] == pytest.approx(rotation + float(split_fwd), abs=0.2)
    # slice_backward dispatches as one op (its input and output); its zero fill and copy move
    # e bytes per element more than that, over the two slices
    assert counts[d // 2][1][0] == pytest.approx(rotation + float(split_bwd) - e, abs=0.2)
    # dispatches per tensor: 3 more forward (two slices, the cat), 5 more backward (the cat's
    # gradient sliced in two, two slice_backward, the sum), for q and for k
    assert 2 * (counts[d // 2][0][1] - counts[d][0][1]) == H.EAGER_FORWARD_ROPE_SPLIT
    assert 2 * (counts[d // 2][1][1] - counts[d][1][1]) == H.EAGER_BACKWARD_ROPE_SPLIT


@pytest.mark.parametrize("changes,field", [
    (dict(rotary_fraction=0), "rotary_fraction must be > 0 and <= 1"),
    (dict(rotary_fraction=1.5), "rotary_fraction must be > 0 and <= 1"),
    (dict(rotary_fraction=0.5, position_embedding="learned"),
     "rotary_fraction applies to rotary position embeddings"),
    (dict(rotary_fraction=0.5, position_embedding="alibi"),
     "rotary_fraction applies to rotary position embeddings"),
])
def test_rotary_fraction_is_refused_out_of_range_or_without_rope(changes, field):
    with pytest.raises(SpecError, match=field) as err:
        load_model("llama3-8b").replace(**changes)
    assert "\n" not in str(err.value)


def test_rotary_fraction_is_refused_with_mla():
    with pytest.raises(SpecError, match="rotary_fraction does not apply to multi-head latent"):
        load_model("deepseek-v3").replace(rotary_fraction=0.5)
    assert load_model("deepseek-v3").replace(rotary_fraction=1).rotary_fraction == 1


def test_a_partial_rotation_changes_only_eager_predictions():
    whole = load_model("llama3-8b")
    half = whole.replace(rotary_fraction=0.5)
    assert half.given()["rotary_fraction"] == 0.5 and whole.rotary_fraction == 1.0
    times = {}
    for kernels, stack in (("fused", "eager"), ("compiled", "compiled"), ("eager", "eager")):
        plan = Plan(gpus=8, dp=8, micro_batch=1, global_batch=8, kernels=kernels, stack=stack)
        times[kernels] = [predict(m, "dgx-h100", plan).step_time_s for m in (whole, half)]
    assert times["fused"][0] == times["fused"][1]
    assert times["compiled"][0] == times["compiled"][1]
    assert times["eager"][0] != times["eager"][1]


@pytest.mark.parametrize("kernels,stack", [("eager", "eager"), ("fused", "eager"),
                                           ("compiled", "compiled")])
def test_universal_and_specialised_formulas_agree_for_a_partial_rotation(kernels, stack):
    """The search's family (every option open, the share r_rot a symbol) and the plan's own
    fixed family (what explain prints) give the same step for a model rotating half of each
    head; the share reaches the step only op by op."""
    from perfmodel.evaluate import compile_family, family_of, values_of
    from perfmodel.specs.hardware import load_hardware

    model = load_model("llama3-8b").replace(rotary_fraction=0.5)
    hardware = load_hardware("dgx-h100")
    plan = Plan(gpus=8, dp=8, micro_batch=1, global_batch=8, kernels=kernels,
                stack=stack).check(model)
    values = values_of(model, hardware, plan)
    assert values["rotary_fraction"] == 0.5
    fixed = family_of(model, hardware, plan, specialise=True)
    assert fixed.partial_rotary and family_of(model, hardware, plan).partial_rotary
    ours = compile_family(family_of(model, hardware, plan))(values)
    theirs = compile_family(fixed)(values)
    assert float(ours["step_time"]) == pytest.approx(float(theirs["step_time"]), rel=1e-12)


def test_the_validation_job_model_of_a_partial_rotation_learns_positions():
    """The validation job learns a position table even for rotary models
    (validation.jobspec.job_model): a partial rotation goes with its RoPE, not refused as
    rotary_fraction without rotary positions."""
    from tests.conftest import ROOT
    from validation.jobspec import job_model, job_model_note

    glm = load_model(str(ROOT / "tests/data/hf/glm-4.5-air"), seq_len=4096)
    ran = job_model(glm)
    assert (ran.position_embedding, ran.rotary_fraction) == ("learned", 1.0)
    assert "learns a position table" in job_model_note(glm)
    with pytest.raises(SpecError, match="give 1 or leave it out"):
        glm.replace(position_embedding="learned")


def test_megatron_rotary_percent_is_read_and_written(tmp_path):
    """Megatron-LM's --rotary-percent (RotaryEmbedding rotates kv_channels x rotary_percent of
    each head: GLM-4.5's recipes give 0.5) is the model's rotary_fraction, read with rope
    positions and written back by the emitter; before, it was skipped as numerics with the same
    cost, and a GLM-4.5 spec emitted as a Megatron job rotated whole heads."""
    from perfmodel.configs import read_config, resolve_model
    from perfmodel.configs.megatron import megatron_arguments

    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--vocab-size 32000 --swiglu --normalization RMSNorm --disable-bias-linear "
            "--untie-embeddings-and-output-weights ")
    path = tmp_path / "args.txt"
    path.write_text(args + "--position-embedding-type rope --rotary-percent 0.5\n")
    spec = resolve_model(read_config(path), None, None)
    assert (spec.position_embedding, spec.rotary_fraction) == ("rotary", 0.5)
    path.write_text(args + "--position-embedding-type rope --rotary-percent 1.0\n")
    assert resolve_model(read_config(path), None, None).rotary_fraction == 1
    path.write_text(args + "--position-embedding-type learned_absolute --rotary-percent 0.5\n")
    assert resolve_model(read_config(path), None, None).rotary_fraction == 1  # no RoPE: unread
    path.write_text(args + "--position-embedding-type rope --rotary-percent 2\n")
    with pytest.raises(SpecError, match="rotary-percent must be > 0 and <= 1"):
        read_config(path)
    words = [w for group in megatron_arguments(spec, Plan(gpus=8, dp=8, global_batch=8))
             for w in group]
    assert words[words.index("--rotary-percent") + 1] == "0.5"
    whole = [w for group in megatron_arguments(spec.replace(rotary_fraction=1),
                                               Plan(gpus=8, dp=8, global_batch=8))
             for w in group]
    assert "--rotary-percent" not in whole
