"""The loss's memory, counted on the ops torch runs: Megatron's vocabulary-parallel cross entropy
(perfmodel.step.memory.LOSS_LOGITS, LOSS_LOGITS_OWN), replayed op by op below; and, with eager
kernels (LOSS_LOGITS_EAGER), torchtitan's loss, which the validation job shares
(workload.model.loss_fn: F.cross_entropy of the logits cast to fp32), with the bf16 logits
deleted before the backward as torchtitan's train step does. Every tensor an aten op allocates
is tracked on torch's dispatch until its storage is freed; the peak, less what was live before,
is the number of vocabulary-wide buffers the model counts."""

from __future__ import annotations

import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from perfmodel.step.memory import LOSS_LOGITS, LOSS_LOGITS_EAGER, LOSS_LOGITS_OWN  # noqa: E402
from workload.model import loss_fn  # noqa: E402


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages aten ops allocated that are still alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, n = storage.data_ptr(), storage.nbytes()
            if n and key not in self._seen:
                self._seen.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, key, n)
        return out

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self._seen.discard(key)


def test_the_eager_loss_holds_three_fp32_logits_at_the_backward():
    tokens, vocab, hidden = 1024, 8192, 16  # the logits dominate everything else
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (1, tokens))
    fp32_logits = 4 * tokens * vocab
    with LiveBytes() as mem:
        logits = x @ w.t()
        loss = loss_fn(logits, target)
        del logits  # torchtitan's train step: "need to free to before bwd to avoid peaking memory"
        before = mem.live
        mem.peak = before
        loss.backward()
    assert (mem.peak - before) / fp32_logits == pytest.approx(LOSS_LOGITS_EAGER - 1, abs=0.05)
    # what is live before the backward: the saved log_softmax output, one of the three
    assert before / fp32_logits == pytest.approx(1, abs=0.05)


def test_the_loss_without_an_upcast_holds_three_bf16_logits_at_the_backward():
    """NeMo AutoModel's MaskedCrossEntropy with fp32_upcast false (F.cross_entropy on the bf16
    logits as they are: Plan.cross_entropy no-upcast): the same three buffers, in bf16, however
    the rest of the model's kernels run."""
    import torch.nn.functional as F

    tokens, vocab, hidden = 1024, 8192, 16
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,))
    bf16_logits = 2 * tokens * vocab
    with LiveBytes() as mem:
        logits = (x @ w.t()).view(-1, vocab)
        loss = F.cross_entropy(logits, target, reduction="sum")
        del logits
        before = mem.live
        mem.peak = before
        loss.backward()
    assert (mem.peak - before) / bf16_logits == pytest.approx(LOSS_LOGITS_EAGER - 1, abs=0.05)
    assert before / bf16_logits == pytest.approx(1, abs=0.05)


class _MegatronCrossEntropy(torch.autograd.Function):
    """Megatron-Core's vocab_parallel_cross_entropy on one tensor-parallel rank, op by op as
    megatron/core/tensor_parallel/cross_entropy.py runs them (core_r0.8.0, baf94af3c6: the
    VocabParallelCrossEntropy steps; the all-reduces over tp are the identity on one rank):
    the logits upcast, shifted by their maximum in place, exponentiated in place, normalised in
    place and saved; the backward writes the gradient into the saved softmax."""

    @staticmethod
    def forward(ctx: Any, logits: Any, target: Any) -> Any:
        logits = logits.float()  # calculate_logits_max
        logits_max = torch.max(logits, dim=-1)[0]
        logits -= logits_max.unsqueeze(dim=-1)  # calculate_predicted_logits, in place
        logits_2d = logits.view(-1, logits.size(-1))
        arange_1d = torch.arange(logits_2d.size(0))
        predicted = logits_2d[arange_1d, target.view(-1)].clone().view_as(target)
        exp_logits = logits
        torch.exp(logits, out=exp_logits)
        sum_exp = exp_logits.sum(dim=-1)
        loss = torch.log(sum_exp) - predicted  # calculate_cross_entropy_loss
        exp_logits.div_(sum_exp.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        softmax, target = ctx.saved_tensors
        grad_input = softmax  # prepare_gradient_calculation_operands: in place
        grad_2d = grad_input.view(-1, grad_input.size(-1))
        grad_2d[torch.arange(grad_2d.size(0)), target.view(-1)] -= 1.0
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None


@pytest.mark.parametrize("dtype, own", [("bfloat16", 2), ("float32", 0)])
def test_megatrons_loss_holds_one_fp32_copy_beside_the_logits(dtype, own):
    """Megatron's loss (Plan.cross_entropy unfused) over bf16 logits: its peak above what was
    live before the logits, in the forward and again in the backward, is one fp32 and one bf16
    vocabulary-wide buffer (LOSS_LOGITS, LOSS_LOGITS_OWN): the logits beside the upcast copy
    while it runs, the saved softmax beside the gradient cast back to bf16 at the backward.
    Logits in fp32 are the copy itself (`.float()` returns them): one buffer."""
    tokens, vocab, hidden = 1024, 8192, 16
    x = torch.randn(1, tokens, hidden, dtype=getattr(torch, dtype), requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=getattr(torch, dtype), requires_grad=True)
    target = torch.randint(0, vocab, (1, tokens))
    elements = tokens * vocab
    expected = LOSS_LOGITS * 4 + LOSS_LOGITS_OWN * own
    with LiveBytes() as mem:
        before = mem.live
        mem.peak = before
        logits = x @ w.t()
        loss = _MegatronCrossEntropy.apply(logits, target).sum()
        del logits  # GPTModel's forward returns the loss: the logits go with its frame
        # (abs 0.2: the token-long buffers beside, and matmul's workspace in fp32)
        assert (mem.peak - before) / elements == pytest.approx(expected, abs=0.2)
        saved = mem.live  # the saved softmax, fp32
        mem.peak = saved
        loss.backward()
    assert (saved - before) / elements == pytest.approx(4, abs=0.2)
    assert (mem.peak - before) / elements == pytest.approx(expected, abs=0.2)


class MovedBytes(TorchDispatchMode):
    """Bytes the aten ops read and write over vocabulary-wide tensors (numel >= wide): each op's
    tensor arguments read (its `out=` written), its results written; views move nothing, an
    indexed read or write (index, index_put_) touches one element a row, not the row, and the
    output layer's GEMMs (mm) are the model's GEMM terms, not the loss's."""

    SKIPPED = ("view", "_unsafe_view", "unsqueeze", "squeeze", "t", "transpose", "expand",
               "alias", "detach", "as_strided", "index", "index_put", "index_put_", "arange",
               "lift_fresh", "lift_fresh_copy", "ones_like", "mm", "bmm", "addmm")

    def __init__(self, wide: int) -> None:
        super().__init__()
        self.wide, self.moved = wide, 0

    def _bytes(self, tensors: Any) -> int:
        return sum(t.numel() * t.element_size() for t in tensors
                   if isinstance(t, torch.Tensor) and t.numel() >= self.wide)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.__name__.split(".")[0] not in self.SKIPPED:
            reads = tree_flatten(args)[0] + tree_flatten({k: v for k, v in kwargs.items()
                                                        if k != "out"})[0]
            self.moved += self._bytes(reads) + self._bytes(tree_flatten(out)[0])
        return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_megatrons_loss_moves_the_bytes_the_model_counts(dtype):
    """Megatron's loss (Plan.cross_entropy unfused with fused kernels) replayed op by op: the bytes
    its ops move over the vocabulary-wide tensors, forward and backward, per logit, are the
    model's (perfmodel.costs.compute: 32 beside the upcast's e + 4 forward, 8 beside the
    upcast's backward 4 + e; logits already fp32 are not copied)."""
    import sympy as sp

    from perfmodel.costs.compute import LossKernel, cross_entropy_bytes

    tokens, vocab, hidden = 256, 4096, 8
    x = torch.randn(1, tokens, hidden, dtype=getattr(torch, dtype), requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=getattr(torch, dtype), requires_grad=True)
    target = torch.randint(0, vocab, (1, tokens))
    elements = tokens * vocab
    logits = x @ w.t()  # the output layer's (its backward's GEMMs not counted)
    with MovedBytes(elements) as forward:
        loss = _MegatronCrossEntropy.apply(logits, target).sum()
    with MovedBytes(elements) as backward:
        loss.backward()
    e = logits.element_size()
    model = [float(b.subs({}) if isinstance(b, sp.Expr) else b) / elements
             for b in cross_entropy_bytes(sp.Integer(tokens), sp.Integer(vocab), sp.Integer(1),
                                          LossKernel(), e)]
    assert forward.moved / elements == pytest.approx(model[0], abs=0.01)
    assert backward.moved / elements == pytest.approx(model[1], abs=0.01)
    assert model == ([38, 14] if e == 2 else [32, 8])
