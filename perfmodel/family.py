"""The structure of a prediction (kept free of sympy so that a cached prediction never imports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """The structure of a prediction: everything that changes the shape of the formulas."""

    schedule: str = "1f1b"
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    flash: bool = False
    overlap_grad_sync: bool = False
    precision: str = "bf16"  # bf16, fp16 or fp32 (tf32 computes in fp32 storage)
    gated: bool = False
    tied_embeddings: bool = True
    learned_positions: bool = True
    bias: bool = True
    qkv_bias: bool = True
    layernorm: bool = True
    multi_stage: bool = False  # pp > 1: the first and last stages differ
    scopes: tuple[tuple[str, str], ...] = (("tp", "intra"), ("dp", "intra"), ("pp", "intra"))
    algorithm: str = "auto"
    fits: frozenset[tuple[str, str, str]] = frozenset()  # (op, scope, algorithm) calibrated

    def scope(self, axis: str) -> str:
        return dict(self.scopes)[axis]
