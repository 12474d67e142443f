"""Element-wise traffic by how the ops run (perfmodel.strategy.Kernels): fused (Megatron-Core /
Transformer Engine), eager (torchtitan's modules op by op) and compiled (Inductor).

The eager numbers are worked by hand for a small layer, kernel by kernel, from torchtitan's code
at 015ccb237 (torchtitan/models/llama/model.py, torchtitan/models/norms.py); the same per-kernel
bytes came out of a TorchDispatchMode count of those functions in bf16 (torch 2.13).
"""

from __future__ import annotations

import json

import pytest
import sympy as sp

from perfmodel import symbols as S
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.costs import compute as K
from perfmodel.errors import PlanError
from perfmodel.evaluate import family_of
from perfmodel.family import Family
from perfmodel.specs.model import load_model
from perfmodel.specs.resolve import resolve_hardware
from perfmodel.step import host as H
from perfmodel.step.context import Context
from perfmodel.step.framework import eager_bias_grads, eager_input_sums, eager_layer_kernels
from perfmodel.step.layer import _layer_work
from perfmodel.strategy import Kernels, Plan, Stack, plan_from_dict
from tests.unit.test_configs import DATA

# a small layer: T = b s = 8 tokens, hidden 64, 8 query heads and 2 KV heads of 8, MLP 96, bf16
T, H_, A, KV, D, F, E = 8, 64, 8, 2, 8, 96, 2
N_H, N_Q, N_K, N_F = T * H_, T * A * D, T * KV * D, T * F  # 512, 512, 128, 768


def test_eager_rmsnorm_bytes_by_hand():
    # forward (8 kernels): x.float() 2+4, pow 4+4, mean 4 (+ O(T)), add and rsqrt O(T),
    # x * rsqrt 4+4, type_as 4+2, * weight 2+2 bytes per element
    forward = (6 + 8 + 4 + 8 + 6 + 4) * N_H
    # backward (16 kernels): g*y 3e, g*w 2e, sum e, cast 2+4, g*rsqrt 8, g*x 12, row sum 4,
    # mean's divide 4, x^1 8, x 2 8, x g 12, the two gradients' sum 12, cast back 4+2
    backward = (6 + 4 + 2 + 6 + 8 + 12 + 4 + 4 + 8 + 8 + 12 + 12 + 6) * N_H
    assert (forward, backward) == (18432, 47104)
    assert K.eager_rmsnorm_bytes(N_H, E) == (forward, backward)
    # fp32 activations: .float() and .type_as() return x itself, no casts
    assert K.eager_rmsnorm_bytes(N_H, 4) == (28 * N_H, 92 * N_H)


def test_eager_layer_bytes_by_hand():
    ops = K.eager_elementwise_bytes(
        norm_elements=N_H, q_elements=N_Q, k_elements=N_K, kv_elements=N_K,
        expanded_elements=N_Q, mlp_elements=N_F, attention_elements=N_Q, e=E, layernorm=0,
        gated=1, gqa=1, flash=1, rotary=1)
    assert ops["norms"] == (2 * 18432, 2 * 47104)
    # RoPE: cast 2+4, complex product 4+4, cast back 4+2 per element of q and k, both ways
    assert ops["rope"] == (20 * (N_Q + N_K), 20 * (N_Q + N_K))
    # repeat_kv: K and V copied from 2 to 8 heads (read 128, write 512 elements of 2 bytes)
    assert ops["repeat_kv"] == (2 * 2 * (N_K + N_Q),) * 2 == (2560, 2560)
    # silu (2+2) and mul (2+2+2); backward two muls and silu_backward, 3 x 2 bytes each
    assert ops["activation"] == (10 * N_F, 18 * N_F) == (7680, 13824)
    assert ops["residual"] == (2 * 6 * N_H, 2 * 6 * N_H)
    assert ops["transpose"] == (0, 0)  # flash attention writes (b, s, heads, d) already
    unfused = K.eager_elementwise_bytes(
        norm_elements=N_H, q_elements=N_Q, k_elements=N_K, kv_elements=N_K,
        expanded_elements=N_Q, mlp_elements=N_F, attention_elements=N_Q, e=E, layernorm=0,
        gated=1, gqa=0, flash=0, rotary=1)
    assert unfused["transpose"] == (4 * N_Q, 0) and unfused["repeat_kv"] == (0, 0)


def test_eager_kernel_counts_match_the_ops_counted():
    # bf16, RMSNorm, SwiGLU, GQA, rotary, flash: norms 2 x 8, RoPE 2 x 3, repeat_kv 2,
    # activation 2, residual 2 forward; norms 2 x 16, RoPE 2 x 5, repeat_kv 2, activation 3,
    # residual 2 backward
    forward, backward = K.eager_elementwise_kernels(layernorm=0, gated=1, gqa=1, flash=1,
                                                    rotary=1, narrow=1)
    assert (forward, backward) == (16 + 6 + 2 + 2 + 2, 32 + 10 + 2 + 3 + 2)


def _work(kernels: str, *, learned: bool, fp8: bool = False):
    fam = Family(schedule="1f1b", recompute="none", sequence_parallel=False, zero=0, flash=True,
                 overlap_grad_sync=False, overlap_param_gather=False, tp_comm_overlap=False,
                 stack="eager", kernels=kernels, uneven_stages=False, gated=True,
                 tied_embeddings=False, learned_positions=learned,
                 rotary_positions=not learned, bias=False, qkv_bias=False,
                 layernorm=False, tp_layout="1d", cp_comm="p2p", fp8=fp8)
    c = Context.of(fam)
    return c, _layer_work(c, False)


@pytest.mark.parametrize("learned", [True, False])
def test_fused_default_is_megatrons_plus_the_fused_rope(learned):
    c, work = _work("fused", learned=learned)
    ew = K.elementwise_bytes(c.T, S.b, S.s, S.h, S.a, S.f, S.tp, S.e, sequence_parallel=0,
                             flash=1, gated=1)
    before = ew["layernorm"] + ew["dropout_add"] + ew["activation"]  # Megatron's fused layer
    rope = 0 if learned else 2 * S.e * c.T * (S.a + S.kv) * (S.h / S.a) / S.tp
    W = S.W
    assert sp.simplify(work.elementwise_s - (before + rope) / W) == 0
    assert sp.simplify(work.elementwise_back_s - (2 * before + rope) / W) == 0


def test_compiled_adds_the_expanded_kv_and_eager_moves_more():
    values = {S.b: 1, S.s: 8, S.h: 64, S.a: 8, S.kv: 2, S.f: 96, S.tp: 1, S.cp: 1, S.e: 2,
              S.W: 1}
    fused = _work("fused", learned=False)[1]
    compiled = _work("compiled", learned=False)[1]
    eager = _work("eager", learned=False)[1]

    def num(x):
        return float(x.subs(values))

    # K and V written with 8 heads for the attention kernel, and their gradients read back
    assert num(compiled.elementwise_s) - num(fused.elementwise_s) == 2 * 2 * N_Q
    assert num(compiled.elementwise_back_s) - num(fused.elementwise_back_s) == 2 * 2 * N_Q
    hand_forward = 2 * 18432 + 20 * (N_Q + N_K) + 2560 + 7680 + 12 * N_H
    # (and the gradients' sums of the attention's input over wq, wk, wv and of the MLP's over
    # w1 and w3: 3 adds of 3 e N_h)
    hand_backward = 2 * 47104 + 20 * (N_Q + N_K) + 2560 + 13824 + 12 * N_H + 3 * 3 * E * N_H
    assert num(eager.elementwise_s) == hand_forward
    assert num(eager.elementwise_back_s) == hand_backward


def test_fp8_cast_terms_do_not_replace_the_elementwise_ones():
    # regression: the fp8 casts' (forward, backward) once overwrote the element-wise bytes
    plain, fp8 = _work("fused", learned=True)[1], _work("fused", learned=True, fp8=True)[1]
    assert sp.simplify(plain.elementwise_s - fp8.elementwise_s) == 0


def test_kernels_and_stack_rules():
    with pytest.raises(PlanError, match="kernels eager"):
        Plan(gpus=1, stack="compiled", kernels="eager")
    with pytest.raises(PlanError, match="kernels compiled"):
        Plan(gpus=1, stack="eager", kernels="compiled")
    assert Plan(gpus=1, stack="cuda-graphs", kernels="eager").kernels is Kernels.EAGER
    assert Plan(gpus=1).kernels is Kernels.FUSED
    # a plan that names no kernels takes its stack's
    assert plan_from_dict({"gpus": 1, "stack": "compiled"}).kernels is Kernels.COMPILED
    assert plan_from_dict({"gpus": 1}).kernels is Kernels.FUSED
    # a Plan likewise (as the command line and a dict: the same fields, the same plan); kernels
    # given are kept, and written so that the dict reads back as the same plan
    assert Plan(gpus=1, stack=Stack.COMPILED).kernels is Kernels.COMPILED
    fused = Plan(gpus=1, stack=Stack.COMPILED, kernels="fused")
    assert fused.to_dict()["kernels"] == "fused"
    assert plan_from_dict(fused.to_dict()).kernels is Kernels.FUSED


def test_host_counts_torchtitans_rope_and_repeat_kv_when_eager():
    model, hw = load_model("llama3-8b"), resolve_hardware("dgx-a100-80gb", None)
    counts = {}
    for kernels in ("fused", "eager"):
        plan = Plan(gpus=8, dp=8, micro_batch=1, global_batch=8, kernels=kernels)
        c = Context.of(family_of(model, hw, plan, specialise=True))
        counts[kernels] = [sp.sympify(x).subs({S.a: 32, S.kv: 8}) for x in H.layer_ops(c)]
    # fused: one RoPE call on q and one on k, each way; eager: torchtitan's ops (views included)
    assert [e - f for e, f in zip(counts["eager"], counts["fused"], strict=True)] == [
        H.EAGER_FORWARD_ROPE - 2 + H.EAGER_FORWARD_REPEAT_KV,
        H.EAGER_BACKWARD_ROPE - 2 + H.EAGER_BACKWARD_REPEAT_KV]


def test_host_counts_the_jobs_unfused_core_as_torch_dispatches_it():
    """The host ops an unfused core adds under eager kernels (host.EAGER_*_UNFUSED) are the
    dispatches the validation job's layer makes beyond SDPA's, views included, forward and
    backward (multi-head, bf16 on the CPU)."""
    torch = pytest.importorskip("torch")
    from workload.model import Block

    Count = _byte_counter(lambda name: False)  # its op count alone

    m = {"hidden": 64, "heads": 4, "kv_heads": 4, "head_dim": 16, "bias": True,
         "ffn_hidden": 256, "gated_mlp": False, "norm": "layernorm", "experts": 0}
    dispatched = {}
    for unfused in (False, True):
        block = Block(m).to(torch.bfloat16)
        block.attention.unfused = unfused
        x = torch.randn(2, 32, 64, dtype=torch.bfloat16, requires_grad=True)
        with Count() as forward:
            y = block(x)
        with Count() as backward:
            y.backward(torch.ones_like(y))
        dispatched[unfused] = (forward.ops, backward.ops)
    assert dispatched[True][0] - dispatched[False][0] == H.EAGER_FORWARD_UNFUSED
    assert dispatched[True][1] - dispatched[False][1] == H.EAGER_BACKWARD_UNFUSED
    # and the model charges them where the plan runs the core unfused, op by op
    model, hw = load_model("gpt2-small"), resolve_hardware("dgx-a100-80gb", None)
    ops = {}
    for flash in (True, False):
        plan = Plan(gpus=1, micro_batch=1, global_batch=1, kernels="eager",
                    flash_attention=flash)
        c = Context.of(family_of(model, hw, plan, specialise=True))
        ops[flash] = [sp.sympify(x) for x in H.layer_ops(c)]
    assert [u - f for u, f in zip(ops[False], ops[True], strict=True)] == [
        H.EAGER_FORWARD_UNFUSED, H.EAGER_BACKWARD_UNFUSED]


def test_torchtitan_config_without_compile_runs_eager_kernels(tmp_path):
    text = (DATA / "torchtitan_llama3_8b.toml").read_text()
    assert "[compile]\nenable=false" in text
    job = read_config(DATA / "torchtitan_llama3_8b.toml")
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert (plan["stack"], plan["kernels"]) == ("eager", "eager")
    compiled = tmp_path / "compiled.toml"
    compiled.write_text(text.replace("[compile]\nenable=false", "[compile]\nenable=true", 1))
    job = read_config(compiled)
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert (plan["stack"], plan["kernels"]) == ("compiled", "compiled")
    fused_norm = tmp_path / "fused_norm.toml"
    fused_norm.write_text(text.replace("[model]", '[model]\nnorm_type = "fused_rmsnorm"', 1))
    with pytest.raises(Exception, match="norm_type"):
        read_config(fused_norm)


def test_megatron_config_runs_fused_kernels():
    job = read_config(DATA / "megatron_llama3_8b.txt")
    assert job.plan["kernels"] == "fused"


def test_cli_predict_kernels(run_cli):
    args = ("predict", "--model", "llama3-8b", "--hardware", "dgx-a100-80gb", "--dp", "8",
            "--global-batch", "8", "--json")
    fused = json.loads(run_cli(*args).stdout)
    eager = run_cli(*args, "--kernels", "eager")
    assert eager.returncode == 0, eager.stderr
    eager_data = json.loads(eager.stdout)
    assert eager_data["plan"]["kernels"] == "eager" and fused["plan"]["kernels"] == "fused"
    assert eager_data["breakdown_s"]["compute/forward/elementwise"] \
        > 2 * fused["breakdown_s"]["compute/forward/elementwise"]
    refused = run_cli(*args, "--stack", "compiled", "--kernels", "eager")
    assert refused.returncode == 4 and len(refused.stderr.strip().splitlines()) == 1


def test_eager_layernorm_and_bias_gradients_by_hand():
    # a GPT-2 style layer (LayerNorm, biases, GeLU, learned positions): 8 tokens, hidden 64, MLP
    # 96, bf16; the biased outputs: Q, K, V (64 each), the attention output (64), MLP up (96)
    # and down (64)
    biased = T * (3 * H_ + H_ + F + H_)

    def ops(weight_pass):
        return K.eager_elementwise_bytes(
            norm_elements=N_H, q_elements=0, k_elements=0, kv_elements=N_H,
            expanded_elements=N_H, mlp_elements=N_F, attention_elements=N_H, e=E, layernorm=1,
            gated=0, gqa=0, flash=1, rotary=0, bias_elements=biased,
            norm_weight_pass=weight_pass)

    cpu, gpu = ops(0), ops(1)
    # nn.LayerNorm: one kernel forward (read x, write y); backward reads g and x, writes dx,
    # and on a GPU a second kernel reads g and x again for the weight's and bias's gradients
    assert cpu["norms"] == (2 * 2 * E * N_H, 2 * 3 * E * N_H)
    assert gpu["norms"] == (2 * 2 * E * N_H, 2 * 5 * E * N_H)
    # each bias gradient reads its output's gradient once, backward only
    assert cpu["bias_grads"] == gpu["bias_grads"] == (0, E * biased) == (0, 6656)
    assert cpu["rope"] == (0, 0)
    forward, backward = K.eager_elementwise_kernels(
        layernorm=1, gated=0, gqa=0, flash=1, rotary=0, narrow=1, bias_kernels=6,
        norm_weight_pass=1)
    # norms 2 x 1, activation 1, residual 2 forward; norms 2 x 2, activation 1, residual 2 and
    # the 6 bias gradients (wq, wk, wv, wo, w1, w2) backward
    assert (forward, backward) == (2 + 1 + 2, 4 + 1 + 2 + 6)


def test_a_bias_gradient_is_a_sum_of_the_output_gradient_over_the_tokens():
    """What the bias term counts, under torch's dispatcher: nn.Linear's backward reduces the
    output's gradient (T x n) over the tokens in one op, beside the two GEMMs."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, list[int]]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append((str(func), [a.numel() for a in args
                                          if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    linear = torch.nn.Linear(H_, F).to(torch.bfloat16)
    x = torch.randn(2, T // 2, H_, dtype=torch.bfloat16, requires_grad=True)
    y = linear(x)
    with Ops() as ops:
        y.backward(torch.ones_like(y))
    reductions = [n for op, n in ops.seen if op.startswith("aten.sum")]
    assert reductions == [[T * F]]  # one pass over the output's gradient
    assert [op for op, _ in ops.seen].count("aten.mm.default") == 2


def _biased_work(asynchronous: bool, kernels: str = "eager", flash: bool = True,
                 dropout: bool = True):
    fam = Family(schedule="1f1b", recompute="none", sequence_parallel=False, zero=0, flash=flash,
                 overlap_grad_sync=False, overlap_param_gather=False, tp_comm_overlap=False,
                 stack="eager", kernels=kernels, uneven_stages=False, gated=False,
                 tied_embeddings=True, learned_positions=True, rotary_positions=False,
                 bias=True, qkv_bias=True, layernorm=True, tp_layout="1d", cp_comm="p2p",
                 fp8=False, asynchronous=asynchronous, dropout=dropout,
                 attention_dropout=dropout)
    return _layer_work(Context.of(fam), False)


def test_a_gpt2_layer_on_a_gpu_adds_the_norms_second_pass_and_the_bias_gradients():
    values = {S.b: 1, S.s: 8, S.h: 64, S.a: 8, S.kv: 8, S.f: 96, S.tp: 1, S.cp: 1, S.e: 2,
              S.W: 1}

    def num(x):
        return float(x.subs(values))

    gpu, cpu = _biased_work(True), _biased_work(False)
    biases = E * T * (3 * H_ + H_ + F + H_)
    assert num(gpu.elementwise_s) == num(cpu.elementwise_s)  # nothing forward
    assert num(gpu.elementwise_back_s) - num(cpu.elementwise_back_s) == 2 * 2 * E * N_H
    # the fused kernels' count is Megatron's (bias gradients and norms in their fused kernels)
    assert num(_biased_work(True, "fused").elementwise_back_s) == \
        num(_biased_work(False, "fused").elementwise_back_s)
    # the biases' reductions on both devices: the whole backward by hand, CPU (norms, GeLU,
    # the residual stream's two sums, the biases, the attention input's sums over wq, wk, wv)
    hand = 2 * 3 * E * N_H + 3 * E * N_F + 2 * 3 * E * N_H + biases + 2 * 3 * E * N_H
    assert num(cpu.elementwise_back_s) == hand


def _byte_counter(counts):
    """A TorchDispatchMode class whose instances count the ops they see (`ops`: every dispatch,
    views included) and add up the bytes of the tensors each op reads and writes (`total`:
    inputs and outputs), for the ops whose name `counts` accepts; a broadcast view (expand:
    repeat_interleave's input) as the bytes its storage holds."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Bytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.total = self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.ops += 1
            if counts(func.__name__.split(".")[0]):
                tensors = [t for t in tree_flatten((args, kwargs, out))[0]
                           if isinstance(t, torch.Tensor)]
                self.total += sum(min(t.numel() * t.element_size(),
                                      t.untyped_storage().nbytes()) for t in tensors)
            return out

    return Bytes


@pytest.mark.parametrize("unfused, kv", [(False, 4), (True, 4), (True, 2)])
def test_a_gpt_layers_elementwise_bytes_are_what_torch_dispatches(unfused, kv):
    """The eager count against the validation job's own GPT layer (workload.model.Block:
    LayerNorm, biases, GeLU, separate wq, wk, wv) under torch's dispatcher, bf16 on the CPU:
    every op but the GEMMs and the attention kernel, its inputs' and outputs' bytes, forward
    and backward (autograd's sums of the gradients of a tensor several ops read included);
    with its unfused core (workload.model.unfused_attention), the mask, softmax, scaling and
    copies beside the batched products, multi-head and grouped-query (its repeat_interleave,
    the eager count's repeat_kv). Within 1%: the norms' per-token statistics and the bias
    gradients' outputs, O(T) and O(n), are not counted. An out-of-place masked_fill is a clone
    and an in-place fill below the dispatcher (ATen's TensorAdvancedIndexing.cpp): counted so."""
    torch = pytest.importorskip("torch")
    from workload.model import Block

    b, s, h, heads, f = 2, 128, 256, 4, 1024
    views = {"view", "_unsafe_view", "t", "transpose", "expand", "detach", "alias",
             "unsqueeze", "squeeze"}
    # (the unfused core's batched products are counted: the model's GEMMs move the same bytes,
    # which are their time where the peak FLOP/s is made infinite below)
    skip = {"addmm", "mm", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward"}
    Bytes = _byte_counter(lambda name: name not in views | skip)

    class WithClones(Bytes):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if func.__name__ == "masked_fill.Scalar":
                self.total += 2 * out.numel() * out.element_size()
            return out

    m = {"hidden": h, "heads": heads, "kv_heads": kv, "head_dim": h // heads, "bias": True,
         "ffn_hidden": f, "gated_mlp": False, "norm": "layernorm", "experts": 0}
    torch.manual_seed(0)
    block = Block(m).to(torch.bfloat16)
    block.attention.unfused = unfused
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    with WithClones() as forward:
        y = block(x)
    grad = torch.randn_like(y)
    with WithClones() as backward:
        y.backward(grad)
    work = _biased_work(False, flash=not unfused, dropout=False)  # the job's: none
    values = {S.b: b, S.s: s, S.h: h, S.a: heads, S.kv: kv, S.f: f, S.tp: 1, S.cp: 1,
              S.e: 2, S.W: 1, S.F: sp.oo, S.I_fa: 1}

    def memory(t):  # a time's bytes at W = 1 B/s: a GEMM's its operands', a flash kernel's none
        t = t.subs(values)
        return float(t.subs({x: 0 for x in t.free_symbols if x.name == "gemm_min_time_s"}))

    assert memory(work.elementwise_s + work.attention_s) == pytest.approx(forward.total,
                                                                          rel=0.01)
    assert memory(work.elementwise_back_s + work.attention_backward_s) == \
        pytest.approx(backward.total, rel=0.01)


def _qkv_work(fused_qkv: bool):
    fam = Family(schedule="1f1b", recompute="none", sequence_parallel=False, zero=0, flash=True,
                 overlap_grad_sync=False, overlap_param_gather=False, tp_comm_overlap=False,
                 stack="eager", kernels="eager", uneven_stages=False, gated=False,
                 tied_embeddings=True, learned_positions=True, rotary_positions=False,
                 bias=True, qkv_bias=True, layernorm=True, tp_layout="1d", cp_comm="p2p",
                 fp8=False, asynchronous=False, free_head_dim=True, fused_qkv=fused_qkv)
    return Context.of(fam), _layer_work(Context.of(fam), False)


def test_a_fused_qkv_projection_concatenates_its_gradients_where_three_are_summed():
    """Under torch's dispatcher, bf16: three projections of the attention's input (wq, wk, wv)
    return three gradients of it, which autograd adds (two adds of T x h); one projection split
    in three (MPT's Wqkv) returns one, and split's backward concatenates the three gradients of
    its output (one cat of T x (a + 2 kv) d). The model's backward differs by the same bytes,
    and by one kernel less the sums (and two bias reductions fewer)."""
    torch = pytest.importorskip("torch")
    b, s, h, heads, kv, d = 2, 32, 256, 4, 2, 64
    # the input's path: the GEMMs, attention and biases apart
    Bytes = _byte_counter(lambda name: name in {"add", "add_", "cat"})

    def backward_bytes(fused: bool) -> int:
        torch.manual_seed(0)
        x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
        widths = [heads * d, kv * d, kv * d]
        if fused:
            q, k, v = torch.nn.Linear(h, sum(widths)).bfloat16()(x).split(widths, dim=2)
        else:
            q, k, v = (torch.nn.Linear(h, n).bfloat16()(x) for n in widths)
        q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 enable_gqa=True)
        with Bytes() as counter:
            out.backward(torch.ones_like(out))
        return counter.total

    values = {S.b: b, S.s: s, S.h: h, S.a: heads, S.kv: kv, S.d: d, S.f: 4 * h, S.tp: 1,
              S.cp: 1, S.e: 2, S.W: 1}
    (c_apart, apart), (c_fused, fused) = _qkv_work(False), _qkv_work(True)
    model = float((fused.elementwise_back_s - apart.elementwise_back_s).subs(values))
    measured = backward_bytes(True) - backward_bytes(False)
    assert measured == 2 * 2 * b * s * (heads + 2 * kv) * d - 2 * 3 * 2 * b * s * h  # by hand
    assert model == measured
    # kernels: two adds against one cat; the q, k and v biases' three reductions against one
    assert eager_input_sums(c_apart) - eager_input_sums(c_fused) == 2
    assert eager_bias_grads(c_apart)[1] - eager_bias_grads(c_fused)[1] == 2
    assert eager_layer_kernels(c_apart, (0, 0))[1] - eager_layer_kernels(c_fused, (0, 0))[1] == 3
