"""A golden corpus of predictions: a refactoring guard, not a source of truth.

Thousands of plans over the hardware and transformer presets of issue 15, tensor layout (1d, 2d,
2.5d, 3d), schedule, recompute, ZeRO stage, placement and option, each with its step time, every
breakdown term, every memory term and the communication ledger; and the answers of a few
`recommend` queries.
A change that means to leave the model's numbers alone (a restructuring) must reproduce them to
1e-9 relative (tests/golden/test_corpus.py). A change that means to change them regenerates the
corpus in the same commit and says why in its message:

    python -m tests.golden.corpus            # writes tests/golden/data/corpus.json.gz
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).parent / "data" / "corpus.json.gz"
SEED = 20261124
PER_PAIR = 36  # plans per (model, hardware) pair: 11 x 6 x 36 = 2376
LAYOUTS = ("1d", "2d", "2.5d", "3d")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "zbv")
RECOMPUTES = ("none", "selective", "full", "op")
PLACEMENTS = ("tp,dp,pp", "tp,pp,dp", "dp,tp,pp", "pp,tp,dp")
STACKS = ("eager", "eager", "compiled", "cuda-graphs")
RECOMMEND = (  # (model, hardware, gpus, global batch, dtype)
    ("gpt3-175b", "dgx-a100-80gb", 1024, 1536, "bf16"),
    ("llama3-8b", "dgx-h100", 64, 512, "bf16"),
    ("llama2-70b", "mi300x", 256, 1024, "bf16"),
    ("gpt2-small", "dgx-v100", 16, 256, "fp16"),
)


# The presets the corpus was written over (issue 15). Presets added later (issue 17: Llama 3.1,
# Mistral, Mixtral, Qwen3, DeepSeek-V3, gpt-oss; B200, GB200 NVL72, H100 PCIe, MI325X, MI355X)
# are checked by their own tests: adding one must not reshuffle these plans.
CORPUS_MODELS = ("gpt-1t", "gpt-22b", "gpt-530b", "gpt2-small", "gpt3-175b", "llama2-70b",
                 "llama2-7b", "llama3-405b", "llama3-70b", "llama3-8b", "tiny-gpt")
CORPUS_HARDWARE = ("dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-v100", "hgx-h200", "mi300x")


def _presets() -> tuple[list[str], list[str]]:
    from perfmodel.specs.presets import HARDWARE_DIR, MODELS_DIR

    for directory, names in ((MODELS_DIR, CORPUS_MODELS), (HARDWARE_DIR, CORPUS_HARDWARE)):
        missing = [n for n in names if not (directory / f"{n}.yaml").is_file()]
        if missing:
            raise FileNotFoundError(f"the corpus' presets {missing} are gone from {directory}")
    return list(CORPUS_MODELS), list(CORPUS_HARDWARE)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _candidate(rng: random.Random, model: Any, dtype: str) -> dict[str, Any]:
    """A random plan; most break a rule and are thrown away by the caller."""
    layout = rng.choice(LAYOUTS)
    tp = {"1d": rng.choice([1, 2, 4, 8, 16]), "2d": rng.choice([4, 16]),
          "2.5d": rng.choice([8, 16, 18, 32]), "3d": rng.choice([8, 27, 64])}[layout]
    depth = {8: 2, 16: 4, 18: 2, 32: 2}.get(tp, 1) if layout == "2.5d" else 1
    pp = rng.choice([d for d in _divisors(model.layers) if d <= 16])
    dp = rng.choice([1, 2, 4, 8, 16, 32])
    schedule = rng.choice(SCHEDULES) if pp > 1 else "1f1b"
    chunks = model.layers // pp
    virtual = 1
    if schedule in ("interleaved", "zb"):
        virtual = rng.choice([v for v in _divisors(chunks) if v <= 8 and
                              (v >= 2 or schedule == "zb")] or [1])
    elif schedule == "zbv":
        virtual = 2
    split = 1 if layout == "1d" else {"2d": 1, "2.5d": depth, "3d": 1}[layout] * round(
        tp ** (1 / 3) if layout == "3d" else (tp // depth) ** 0.5) ** (2 if layout == "3d" else 1)
    micro = split * rng.choice([1, 2, 4])
    micro_batches = rng.choice([1, 2, 4, 8, 16, 32]) * (pp if schedule != "1f1b" else 1)
    sequence_parallel = layout == "1d" and tp > 1 and rng.random() < 0.5
    zero = rng.choice([0, 1, 2, 3]) if dp > 1 else 0
    recompute = rng.choice(RECOMPUTES)
    bf16 = dtype == "bf16"
    # an uneven pipeline split now and then: the first and last stages v layers short (or long);
    # the plan rules throw away the splits that do not divide
    first = last = 0
    if pp > 1 and schedule != "zbv" and rng.random() < 0.15:
        first, last = (max(0, chunks + rng.choice([-virtual, virtual])) for _ in range(2))
    return dict(gpus=dp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batch=micro,
                global_batch=dp * micro * micro_batches, schedule=schedule,
                virtual_stages=virtual, sequence_parallel=sequence_parallel,
                recompute=recompute,
                recompute_every=rng.choice([2, 3]) if recompute != "none" and rng.random() < 0.2
                else 1,
                zero=zero, dtype=dtype, tp_layout=layout, tp_depth=depth,
                flash_attention=rng.choice([True, False, None]),
                overlap_grad_sync=rng.random() < 0.3,
                grad_dtype="bf16" if bf16 and rng.random() < 0.2 else None,
                optimizer_dtype="bf16" if bf16 and rng.random() < 0.2 else None,
                overlap_param_gather=zero > 0 and rng.random() < 0.3,
                tp_comm_overlap=sequence_parallel and rng.random() < 0.5,
                stack=rng.choice(STACKS), first_stage_layers=first, last_stage_layers=last,
                placement=rng.choice(PLACEMENTS))


def plans() -> list[tuple[str, str, dict[str, Any]]]:
    """(model, hardware, plan) of the corpus: PER_PAIR valid plans per pair, deterministic."""
    from perfmodel.encode import check_whole_nodes
    from perfmodel.errors import PerfmodelError
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model
    from perfmodel.strategy import plan_from_dict

    rng = random.Random(SEED)
    models, hardware = _presets()
    out = []
    for hw_name in hardware:
        hw = load_hardware(hw_name)
        dtypes = [d for d in ("bf16", "fp16", "fp32", "tf32") if _supports(hw, d)]
        for name in models:
            model = load_model(name)
            kept = 0
            for _ in range(20000):
                plan = _candidate(rng, model, rng.choice(dtypes))
                if hw.flash_attention is not None and not hw.flash_attention.dtypes \
                        and plan["flash_attention"]:
                    plan["flash_attention"] = False  # no flash kernel on this GPU (V100)
                try:
                    plan_from_dict(dict(plan)).check(model)
                    check_whole_nodes(hw, plan["gpus"])  # (a partly filled last node: refused)
                except PerfmodelError:
                    continue
                out.append((name, hw_name, plan))
                kept += 1
                if kept == PER_PAIR:
                    break
    return out


def _supports(hardware: Any, dtype: str) -> bool:
    try:
        return hardware.peak(dtype) > 0
    except Exception:
        return False


def _record(model: str, hardware: str, plan: dict[str, Any]) -> dict[str, Any]:
    from perfmodel.predict import comm_ledger, predict

    r = predict(model, hardware, plan, refuse_idle=False)  # the plan as recorded
    return {"model": model, "hardware": hardware, "plan": plan,
            "step_time_s": r.step_time_s, "memory_per_gpu_bytes": r.memory_per_gpu_bytes,
            "model_flops_per_step": r.model_flops_per_step,
            "hardware_flops_per_step": r.hardware_flops_per_step, "parameters": r.parameters,
            "breakdown_s": r.breakdown_s, "hidden_s": r.hidden_s,
            "memory_breakdown_bytes": r.memory_breakdown_bytes,
            "ledger": comm_ledger(model, plan, hardware)}


def _recommend(model: str, hardware: str, gpus: int, batch: int,
               dtype: str) -> list[dict[str, Any]]:
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model

    rec = recommend(load_model(model), load_hardware(hardware),
                    SearchRequest(gpus=(gpus,), global_batch=batch, dtype=dtype), top=5)
    return [{"plan": p.plan.to_dict(), "step_time_s": p.step_time_s} for p in rec.top]


def make() -> dict[str, Any]:
    return {"predictions": [_record(*p) for p in plans()],
            "recommend": [{"query": list(q), "top": _recommend(*q)} for q in RECOMMEND]}


def write(path: Path = CORPUS) -> None:
    from perfmodel.files import write_atomic

    data = json.dumps(make(), separators=(",", ":"), sort_keys=True)
    write_atomic(path, gzip.compress(data.encode(), mtime=0), what="golden corpus",
                 make_parents=True)


def load(path: Path = CORPUS) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def differences(old: Any, new: Any, rtol: float = 1e-9, where: str = "") -> list[str]:
    """Every place where two records differ beyond rtol (numbers) or at all (anything else)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{where}.{k}: missing" for k in old if k not in new]
        out += [f"{where}.{k}: new" for k in new if k not in old]
        for k in old.keys() & new.keys():
            out += differences(old[k], new[k], rtol, f"{where}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: {len(old)} items, now {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True))
                for d in differences(a, b, rtol, f"{where}[{i}]")]
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers) and not isinstance(old, bool):
        if math.isclose(old, new, rel_tol=rtol, abs_tol=1e-300):
            return []
        return [f"{where}: {old!r} -> {new!r}"]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


if __name__ == "__main__":
    write()
    print(f"wrote {CORPUS}")
