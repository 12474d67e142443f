"""HOW a model is trained: the parallel plan (degrees, layout, micro-batch, schedule) and its rules.

One vocabulary of parallel degrees everywhere: dp (data), tp (tensor), pp (pipeline); "axis" is a mesh
axis. Options are enums. `Plan.check(model, gpus_per_node)` refuses plans that cannot run, naming the rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perfmodel.errors import PlanError
from perfmodel.specs.loading import suggest
from perfmodel.specs.model import TransformerSpec


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZERO_BUBBLE = "zb"  # interleaved zero bubble, ZB1P (Qi et al. 2024), v chunks per GPU (v >= 1)
    ZBV = "zbv"  # zero bubble, V-shape: 2 chunks per GPU, rank r holds chunks r and 2 pp - 1 - r


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Dtype(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    TF32 = "tf32"


class TPLayout(StrEnum):
    """How the tensor-parallel group splits each linear layer.

    1d: Megatron (Shoeybi et al. 2019), column then row parallel, tp ranks.
    2d: SUMMA / Optimus (Xu et al. 2021), a q x q grid, tp = q^2.
    2.5d: Tesseract (Wang et al. 2021), d stacked q x q grids, tp = q^2 d.
    3d: Bian et al. 2021, a q x q x q cube, tp = q^3.
    """

    ONE_D = "1d"
    TWO_D = "2d"
    TWO_HALF_D = "2.5d"
    THREE_D = "3d"


def integer_root(n: int, k: int) -> int | None:
    """The whole number r with r**k == n, or None."""
    r = round(n ** (1 / k))
    for c in (r - 1, r, r + 1):
        if c >= 1 and c**k == n:
            return c
    return None


AXES = ("tp", "dp", "pp")
BYTES_PER_ELEMENT = {Dtype.BF16: 2, Dtype.FP16: 2, Dtype.FP32: 4, Dtype.TF32: 4}


def _enum(cls: type[StrEnum], value: Any, field: str) -> Any:
    if isinstance(value, cls):
        return value
    text = str(value).strip().lower()
    allowed = [m.value for m in cls]
    if text not in allowed:
        raise PlanError(f"{field} must be one of {', '.join(allowed)}, got '{value}'{suggest(text, allowed)}")
    return cls(text)


def _positive_int(value: Any, field: str, minimum: int = 1, maximum: int = 10**7) -> int:
    if isinstance(value, bool):
        raise PlanError(f"{field} must be a whole number, got {value}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PlanError(f"{field} must be a whole number, got '{value}'") from None
    if number != number or number in (float("inf"), float("-inf")) or number != int(number):
        raise PlanError(f"{field} must be a whole number, got '{value}'")
    if number < minimum or number > maximum:
        raise PlanError(f"{field} must be between {minimum} and {maximum:g}, got {int(number)}")
    return int(number)


def _bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise PlanError(f"{field} must be true or false, got '{value}'")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A parallel training plan.

    gpus = dp * tp * pp. The global batch (in samples) is split into dp replicas and, on each, into
    micro-batches of micro_batch samples: num_micro_batches = global_batch / (dp * micro_batch).
    placement lists the axes from the innermost (fastest-varying rank, inside a node first) out.
    """

    gpus: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    zero: int = 0
    dtype: Dtype = Dtype.BF16
    tp_layout: TPLayout = TPLayout.ONE_D
    tp_depth: int = 1
    flash_attention: bool = False
    overlap_grad_sync: bool = False
    placement: tuple[str, ...] = AXES

    def __post_init__(self) -> None:
        for key in ("dp", "tp", "pp", "micro_batch", "global_batch", "virtual_stages", "tp_depth",
                    "gpus"):
            object.__setattr__(self, key, _positive_int(getattr(self, key), key))
        object.__setattr__(self, "zero", _positive_int(self.zero, "zero", minimum=0, maximum=3))
        object.__setattr__(self, "schedule", _enum(Schedule, self.schedule, "schedule"))
        object.__setattr__(self, "recompute", _enum(Recompute, self.recompute, "recompute"))
        object.__setattr__(self, "dtype", _enum(Dtype, self.dtype, "dtype"))
        object.__setattr__(self, "tp_layout", _enum(TPLayout, self.tp_layout, "tp_layout"))
        for key in ("sequence_parallel", "flash_attention", "overlap_grad_sync"):
            object.__setattr__(self, key, _bool(getattr(self, key), key))
        placement = tuple(self.placement) if not isinstance(self.placement, str) else tuple(
            p.strip() for p in self.placement.split(",")
        )
        if sorted(placement) != sorted(AXES):
            raise PlanError(f"placement must order the axes {', '.join(AXES)} (innermost first), "
                            f"got {','.join(placement)}")
        object.__setattr__(self, "placement", placement)
        self._check_degrees()

    def _check_degrees(self) -> None:
        if self.dp * self.tp * self.pp != self.gpus:
            raise PlanError(
                f"dp x tp x pp must equal gpus: {self.dp} x {self.tp} x {self.pp} = "
                f"{self.dp * self.tp * self.pp}, but gpus = {self.gpus}"
            )
        if self.global_batch % (self.dp * self.micro_batch):
            raise PlanError(
                f"global_batch must be divisible by dp x micro_batch: {self.global_batch} is not a "
                f"multiple of {self.dp} x {self.micro_batch} = {self.dp * self.micro_batch}"
            )
        if self.schedule is Schedule.INTERLEAVED:
            if self.virtual_stages < 2:
                raise PlanError("schedule interleaved needs virtual_stages >= 2")
            if self.pp < 2:
                raise PlanError("schedule interleaved needs pp >= 2")
            if self.num_micro_batches % self.pp:
                raise PlanError(
                    f"schedule interleaved needs the number of micro-batches ({self.num_micro_batches}) "
                    f"to be a multiple of pp ({self.pp})"
                )
        elif self.schedule in (Schedule.ZERO_BUBBLE, Schedule.ZBV):
            if self.pp < 2:
                raise PlanError(f"schedule {self.schedule} needs pp >= 2")
            if self.schedule is Schedule.ZBV and self.virtual_stages != 2:
                raise PlanError("schedule zbv needs virtual_stages = 2 (two chunks per GPU, V-shape)")
            if self.num_micro_batches < self.pp:
                raise PlanError(f"schedule {self.schedule} needs at least pp ({self.pp}) micro-batches, "
                                f"got {self.num_micro_batches}")
        elif self.virtual_stages != 1:
            raise PlanError("virtual_stages > 1 needs schedule interleaved, zb or zbv, got schedule "
                            f"{self.schedule}")
        if self.sequence_parallel and self.tp == 1:
            raise PlanError("sequence_parallel needs tp > 1 (it shards along the tensor-parallel axis)")
        self._check_grid()

    def _check_grid(self) -> None:
        layout = self.tp_layout
        if layout is not TPLayout.TWO_HALF_D and self.tp_depth != 1:
            raise PlanError(f"tp_depth > 1 needs tp_layout 2.5d, got tp_layout {layout}")
        if layout is TPLayout.ONE_D:
            return
        if self.sequence_parallel:
            raise PlanError(f"sequence_parallel applies to tp_layout 1d only (tp_layout {layout} "
                            f"already distributes every activation)")
        if layout is TPLayout.TWO_D and integer_root(self.tp, 2) is None:
            raise PlanError(f"tp_layout 2d needs tp = q^2 (a square grid), got tp = {self.tp}")
        if layout is TPLayout.TWO_HALF_D:
            if self.tp % self.tp_depth or integer_root(self.tp // self.tp_depth, 2) is None:
                raise PlanError(f"tp_layout 2.5d needs tp = q^2 x tp_depth, got tp = {self.tp}, "
                                f"tp_depth = {self.tp_depth}")
        if layout is TPLayout.THREE_D and integer_root(self.tp, 3) is None:
            raise PlanError(f"tp_layout 3d needs tp = q^3 (a cube), got tp = {self.tp}")
        q = self.grid_q
        rows = q * self.tp_depth if layout is not TPLayout.THREE_D else q * q
        if self.micro_batch % rows:
            raise PlanError(f"tp_layout {layout} splits the samples of a micro-batch over {rows} "
                            f"ranks: micro_batch ({self.micro_batch}) must be a multiple of {rows}")

    @property
    def grid_q(self) -> int:
        """The side q of the tensor-parallel grid (tp for 1d)."""
        if self.tp_layout is TPLayout.ONE_D:
            return self.tp
        if self.tp_layout is TPLayout.THREE_D:
            return integer_root(self.tp, 3) or 1
        return integer_root(self.tp // self.tp_depth, 2) or 1

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def check(self, model: TransformerSpec) -> Plan:
        """The rules that need the model; returns self so calls chain."""
        if self.tp_layout is not TPLayout.ONE_D:
            q = self.grid_q
            for name, value in (("heads", model.heads), ("hidden", model.hidden),
                                ("ffn_hidden", model.ffn_hidden)):
                if value % q:
                    raise PlanError(f"{name} ({value}) must be divisible by the grid side q ({q}) "
                                    f"of tp_layout {self.tp_layout}")
            kv_ok = model.kv_heads % q == 0
            if not kv_ok:
                raise PlanError(f"kv_heads ({model.kv_heads}) must be divisible by the grid side q "
                                f"({q}) of tp_layout {self.tp_layout}")
        elif model.heads % self.tp:
            raise PlanError(f"heads ({model.heads}) must be divisible by tp ({self.tp})")
        if self.tp_layout is TPLayout.ONE_D and model.kv_heads % self.tp and self.tp % model.kv_heads:
            raise PlanError(
                f"kv_heads ({model.kv_heads}) must divide or be divisible by tp ({self.tp})"
            )
        if self.tp_layout is TPLayout.ONE_D and model.ffn_hidden % self.tp:
            raise PlanError(f"ffn_hidden ({model.ffn_hidden}) must be divisible by tp ({self.tp})")
        chunks = self.pp * self.virtual_stages
        if model.layers % chunks:
            raise PlanError(
                f"layers ({model.layers}) must be divisible by pp x virtual_stages "
                f"({self.pp} x {self.virtual_stages} = {chunks})"
            )
        if self.sequence_parallel and model.seq_len % self.tp:
            raise PlanError(f"seq_len ({model.seq_len}) must be divisible by tp ({self.tp}) "
                            f"for sequence_parallel")
        return self

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, StrEnum):
                out[key] = value.value
        out["placement"] = ",".join(self.placement)
        return out


PLAN_FIELDS = [f.name for f in dataclasses.fields(Plan)]


def plan_from_dict(data: dict[str, Any]) -> Plan:
    unknown = [k for k in data if k not in PLAN_FIELDS]
    if unknown:
        raise PlanError(f"unknown plan field '{unknown[0]}'{suggest(unknown[0], PLAN_FIELDS)}; "
                        f"allowed: {', '.join(PLAN_FIELDS)}")
    if "gpus" not in data:
        data = {**data, "gpus": int(data.get("dp", 1)) * int(data.get("tp", 1)) * int(data.get("pp", 1))}
    try:
        return Plan(**data)
    except TypeError as exc:
        raise PlanError(str(exc)) from None
