"""`perfmodel recommend`: the search, then why the best plan wins, what binds it, what-ifs."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

import numpy as np

from perfmodel.ahead import Ahead
from perfmodel.encode import compute_dtype
from perfmodel.errors import PlanError
from perfmodel.predict import Prediction, predict
from perfmodel.search import (
    Scored,
    SearchRequest,
    SearchResult,
    divisors,
    idle_options,
    objective_of,
    resolved_request,
    search,
    searches_cp,
)
from perfmodel.specs.hardware import LINK_PROTOCOLS, HardwareSpec, hardware_from_dict
from perfmodel.specs.loading import suggest
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import AXES, Dtype, EPDispatcher, Objective, Plan, plan_from_dict

# a plan's fields of dtype fp8 only, off in its bf16 twin (fp8_explanation)
BF16_FIELDS: dict[str, Any] = dict(fp8_recipe=None, fp8_output_layer=False, fp8_params=False)
COMM_TERMS = ("comm/tp", "comm/cp", "comm/ep", "comm/dp", "pipeline/p2p", "comm/fp8_amax")
# the degrees whose part in the best plan's win recommend reports (parallelism_wins)
WIN_AXES = (("cp", "context parallelism"), ("ep", "expert parallelism"),
            ("etp", "expert tensor parallelism"))


@dataclass
class Recommendation:
    result: SearchResult
    top: list[Prediction]
    explanation: dict[str, Any]

    def __repr__(self) -> str:
        # the generated one printed the request, the search's arrays and every prediction (15 KB)
        r = self.result
        head = (f"<Recommendation: {r.enumerated:,} plans searched, {r.evaluated:,} evaluated, "
                f"{r.feasible:,} fit")
        if not self.top:
            return head + ">"
        return head + "; best: " + "; then: ".join(p.summary() for p in self.top[:3]) \
            + (f" (and {len(self.top) - 3} more)>" if len(self.top) > 3 else ">")

    def _repr_html_(self) -> str:
        """Jupyter's view: the search's counts and its best plans, one line each."""
        import html

        r = self.result
        items = "".join(f"<li>{html.escape(p.summary())}</li>" for p in self.top)
        return (f"<p>{r.enumerated:,} plans searched, {r.evaluated:,} evaluated, "
                f"{r.feasible:,} fit</p><ol>{items}</ol>")

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        req = r.request
        plans = []
        for i, p in enumerate(self.top):
            entry = p.to_dict()
            entry["objective"] = float(r.best.objective[i])
            entry["objective_name"] = req.objective.value
            entry["gpus"] = p.plan.gpus
            entry.update(training_budget(req, p))
            plans.append(entry)
        return {
            "plans": plans,
            "evaluated": int(r.evaluated),
            "skipped": int(r.skipped),
            "enumerated": int(r.enumerated),
            "feasible": int(r.feasible),
            "search_time_s": r.search_time_s,
            "objective": req.objective.value,
            "objective_unit": objective_unit(req),
            "tokens": req.tokens,
            "gpu_hour_price": req.gpu_hour_price,
            "memory_margin": r.request.memory_margin,
            "memory_limit_bytes": r.capacity_bytes,
            "explanation": copy.deepcopy(self.explanation),  # a copy: the object's stays
        }


def _search_inputs(model: Any, hardware: Any, req: Any
                   ) -> tuple[TransformerSpec, HardwareSpec, SearchRequest]:
    """recommend's inputs as predict takes them (perfmodel.predict.resolve_inputs): a model or
    hardware by its spec, preset name or file; the request as a SearchRequest or its fields (a
    field not among them refused by name, a close one suggested)."""
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model

    spec = load_model(model)
    if not isinstance(spec, TransformerSpec):
        raise PlanError(f"model '{spec.name}' is a layer graph (CNN/MLP): recommend searches "
                        "transformers (a layer graph's grid: perfmodel.layerwise)")
    if isinstance(req, Mapping):
        names = [f.name for f in dataclasses.fields(SearchRequest)]
        unknown = [k for k in req if k not in names]
        if unknown:
            raise PlanError(f"unknown search request field '{unknown[0]}'"
                            f"{suggest(str(unknown[0]), names)}")
        req = SearchRequest(**req)
    elif not isinstance(req, SearchRequest):
        raise PlanError(f"req must be a SearchRequest or a mapping of its fields, got "
                        f"{type(req).__name__}")
    return spec, load_hardware(hardware), req


def recommend(model: TransformerSpec | str, hardware: HardwareSpec | str,
              req: SearchRequest | Mapping[str, Any], top: int = 5,
              on_chunk: Callable[[Scored], None] | None = None,
              prune: bool = False) -> Recommendation:
    """Search, predict the `top` best plans one by one (perfmodel.predict, Plan.check included)
    and explain the best. on_chunk, prune: see perfmodel.search.search (prune: the same best
    plans and explanation, the result's Pareto front and sample of the plans evaluated only).
    model and hardware: specs, or a preset's name or a spec file's path (as predict takes
    them); req: a SearchRequest or a mapping of its fields."""
    model, hardware, req = _search_inputs(model, hardware, req)
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise PlanError(f"top must be a whole number >= 1 (the best plans to predict), got "
                        f"{top!r}")
    top = int(top)
    model.require_costed()  # a mixture of experts, MLA, a window: refused, never costed as dense
    # the searches the explanation runs after this one, started beside it (perfmodel.ahead), of
    # the request as the search resolves it (SearchResult.request)
    req = resolved_request(model, hardware, req)
    runs = alternatives(model, req)
    # a search in another dtype (an FP8 search's bf16 twin) is of families this process builds
    # no module of: its child builds them beside this search instead of waiting for it to end
    ahead = Ahead(((key, partial(best_of, model, hardware, alt)) for key, alt in runs),
                  builds={key for key, alt in runs if alt.dtype != req.dtype})
    try:
        result = search(model, hardware, req, top=top, on_chunk=on_chunk, prune=prune)
        if not len(result.best):
            reason = infeasible_reason(model, hardware, req, result)
            return Recommendation(result, [], {"infeasible": reason})
        best_plans = [predict(model, hardware, plan, refuse_idle=False)
                      for plan in result.best_plans()]
        explanation = explain_best(model, hardware, result, best_plans)
        needed = needed_alternatives(req, best_plans[0])
        if req.dtype is Dtype.FP8:
            explanation["fp8"] = fp8_explanation(model, hardware, result, best_plans[0],
                                                 ahead, needed)
        wins = parallelism_wins(model, hardware, result, best_plans[0], ahead, needed)
        if wins:
            explanation["parallelism"] = wins
        return Recommendation(result, best_plans, explanation)
    finally:
        ahead.stop()


def alternatives(model: TransformerSpec, req: SearchRequest) -> list[tuple[str, SearchRequest]]:
    """The searches the explanation may run after the main one (run ahead: perfmodel.ahead), in
    the order of how often it does: an FP8 search's in bf16 (fp8_explanation: always), a mixture
    of experts' without expert parallelism where the request leaves ep open (parallelism_wins,
    where the best plan takes ep > 1: nearly always), and the search without context parallelism
    where it searches cp > 1 (where the best plan takes it: DeepSeek-V3 on 256 GB200 at 4,096
    tokens; a job the child has not reached when it is asked for is computed in this process,
    beside the child's). The one without etp (seldom) runs after it, where needed."""
    out = [("fp8", bf16_request(req))] if req.dtype is Dtype.FP8 else []
    if model.experts and req.ep is None:
        out.append(("ep", without(req, "ep")))
    if searches_cp(model, req):
        out.append(("cp", without(req, "cp")))
    return out


def needed_alternatives(req: SearchRequest, best: Prediction) -> set[str]:
    """The keys of alternatives() that the explanation of `best` asks for."""
    needed = {"fp8"} if req.dtype is Dtype.FP8 else set()
    return needed | {axis for axis, _ in WIN_AXES
                     if getattr(best.plan, axis) != 1 and getattr(req, axis) is None}


def bf16_request(req: SearchRequest) -> SearchRequest:
    """An FP8 search's request in its mixed precision without FP8 GEMMs (fields of dtype fp8
    only, off)."""
    return dataclasses.replace(req, **BF16_FIELDS, dtype=Dtype(compute_dtype(req.dtype)))


FP8_GEMM_TERMS = ("compute/forward/gemm", "compute/backward/gemm")
FP8_CAST_TERMS = ("compute/forward/fp8_cast", "compute/backward/fp8_cast",
                  "compute/fp8_weight_cast")
FP8_AMAX_TERM = "comm/fp8_amax"  # delayed scaling's and current scaling's (perfmodel.step.fp8)


def fp8_explanation(model: TransformerSpec, hardware: HardwareSpec, result: SearchResult,
                    best: Prediction, ahead: Ahead | None = None,
                    needed: Iterable[str] = ()) -> dict[str, Any]:
    """What FP8 does for the best plan of an fp8 search: the same search in bf16 (the plan's
    mixed precision without FP8 GEMMs) and its best plan, the best plan itself in bf16, and the
    terms FP8 changes (its GEMMs, its casts, its amax reductions); `says` puts it in a sentence,
    and `wins` is whether FP8 is what makes the best plan win (it beats the best bf16 plan)."""
    req = result.request
    alt_req = bf16_request(req)
    # this process's own predictions first, the bf16 search's best asked for after them: where
    # the cache is cold they build their modules while the child ends that search
    as_bf16 = best.plan.replace(**BF16_FIELDS, dtype=alt_req.dtype)
    same = predict(model, hardware, as_bf16, refuse_idle=False)
    predicted = _fp8_params_first(model, hardware, result, best)
    alt = _alternative(ahead, "fp8", model, hardware, alt_req, needed)
    gemm_s = sum(same.breakdown_s[k] - best.breakdown_s[k] for k in FP8_GEMM_TERMS)
    cast_s = sum(best.breakdown_s.get(k, 0.0) for k in FP8_CAST_TERMS)
    amax_s = best.breakdown_s.get(FP8_AMAX_TERM, 0.0)
    recipe = best.plan.fp8_recipe.value if best.plan.fp8_recipe else ""
    out: dict[str, Any] = {
        "recipe": recipe, "step_time_s": best.step_time_s,
        "same_plan_in_bf16_s": same.step_time_s,
        "same_plan_in_bf16_fits": same.memory_per_gpu_bytes <= result.capacity_bytes,
        "gemm_saved_s": gemm_s, "casts_s": cast_s, "amax_reductions_s": amax_s,
        "best_bf16_plan": None, "best_bf16_step_time_s": None, "best_bf16_objective": None,
        "speedup_over_best_bf16": None, "fp8_params_plan": None,
        "fp8_params_step_time_s": None, "fp8_params_objective": None, "fp8_params_from": None}
    why = (f"its linear layers' GEMMs in FP8 ({recipe} scaling) save {gemm_s:.4g} s per step "
           f"and its casts cost {cast_s:.4g} s"
           + (f", its amax reductions {amax_s:.4g} s" if amax_s > 0 else ""))
    objective, unit = float(result.best.objective[0]), objective_unit(req)
    if alt is not None:
        alt_objective = alt["objective"]
        out.update(best_bf16_plan=alt["plan"], best_bf16_step_time_s=alt["step_time_s"],
                   best_bf16_objective=alt_objective,
                   speedup_over_best_bf16=alt_objective / objective)
        wins = objective < alt_objective
        layout = "" if alt["plan"] == _short(best.plan) else f" ({alt['plan']})"
        if wins:
            says = (f"FP8 is what makes the best plan win: {objective:.4g} {unit} against "
                    f"{alt_objective:.4g} {unit} for the best bf16 plan{layout}, "
                    f"{alt_objective / objective:.2f}x; {why}")
        else:
            says = (f"FP8 does not win here: the best bf16 plan{layout} reaches "
                    f"{alt_objective:.4g} {unit} against {objective:.4g} {unit}; {why}")
    else:
        wins = True
        says = f"FP8 is what makes a plan fit: no plan fits in bf16 ({alt_req.dtype.value}); {why}"
    faster = fp8_params_faster(model, hardware, result, best, alt, predicted)
    if faster is not None:
        what, held, held_objective = faster
        out.update(fp8_params_plan=_short(held.plan), fp8_params_step_time_s=held.step_time_s,
                   fp8_params_objective=held_objective, fp8_params_from=what)
        bf16 = ""
        if alt is not None and not wins:  # where the best bf16 plan beats this search's
            bf16 = (f", {alt['objective'] / held_objective:.2f}x as fast as the best bf16 plan"
                    if held_objective < alt["objective"] else ", still behind the best bf16 plan")
        says += (f". With FP8 weights (--fp8-params) {what} ({out['fp8_params_plan']}) takes "
                 f"{held_objective:.4g} {unit} and fits: {objective / held_objective:.2f}x as "
                 f"fast as this search's best{bf16} (`recommend --fp8-params` searches every "
                 "plan with them)")
    out.update(wins=wins, says=says)
    return out


# the plans fp8_params_faster holds the weights of in FP8, and how the explanation names them
FP8_PARAMS_CANDIDATES = ("the best plan", "the best bf16 plan's layout",
                         "the fastest plan that does not fit")


def _fp8_params_first(model: TransformerSpec, hardware: HardwareSpec, result: SearchResult,
                      best: Prediction) -> dict[Plan, Prediction | None]:
    """fp8_params_faster's first candidate, the best plan with FP8 weights, predicted (None: its
    rules refuse it), where fp8_params_faster would predict it."""
    if result.request.fp8_params or best.plan.fp8_recipe is None:
        return {}
    plan = best.plan.replace(**_fp8_fields(best))
    return {plan: _predicted_or_none(model, hardware, plan)}


def _predicted_or_none(model: TransformerSpec, hardware: HardwareSpec,
                       plan: Plan) -> Prediction | None:
    """The plan's prediction; None where its rules refuse it."""
    try:
        return predict(model, hardware, plan, refuse_idle=False)
    except PlanError:
        return None


def _fp8_fields(best: Prediction) -> dict[str, Any]:
    """The best plan's FP8 fields, with FP8 weights."""
    return dict(dtype=best.plan.dtype, fp8_recipe=best.plan.fp8_recipe,
                fp8_output_layer=best.plan.fp8_output_layer, fp8_params=True)


def fp8_params_faster(model: TransformerSpec, hardware: HardwareSpec, result: SearchResult,
                      best: Prediction, bf16: dict[str, Any] | None,
                      predicted: Mapping[Plan, Prediction | None] | None = None
                      ) -> tuple[str, Prediction, float] | None:
    """Where an FP8 search holds the weights in bf16 (no --fp8-params): the best plan, the best
    bf16 plan's layout in FP8, and the fastest plan that does not fit, each with FP8 weights
    (fp8_params: under ZeRO 3 sharded, where TE's per-module caches keep every gathered weight's
    FP8 copy through the step, the whole model's on every GPU; docs/fp8.md). The fastest of them
    that fits and beats the search's best (by its objective), with what it is and its objective;
    None where none does, or the request holds FP8 weights already. A plan the FP8 weights'
    rules refuse (MXFP8 under ZeRO 3: encode.check_fp8_params) is left out. Three predictions,
    not a search: the best plan with FP8 weights may be another (`recommend --fp8-params`).
    `predicted`: predictions of some of these plans made before (None: refused), not made
    again."""
    req = result.request
    if req.fp8_params or best.plan.fp8_recipe is None:
        return None
    fp8 = _fp8_fields(best)
    plans = [best.plan.replace(**fp8), None, None]
    if bf16 is not None:
        plans[1] = plan_from_dict(bf16["fields"]).replace(**fp8)
    if result.unfit_faster:
        plans[2] = result.plan(result.fastest_unfit, 0).replace(**fp8)
    found: tuple[str, Prediction, float] | None = None
    objective_best = float(result.best.objective[0])
    seen = set()
    for what, plan in zip(FP8_PARAMS_CANDIDATES, plans, strict=True):
        if plan is None or plan in seen:
            continue
        seen.add(plan)
        p = predicted[plan] if predicted and plan in predicted \
            else _predicted_or_none(model, hardware, plan)
        if p is None or p.memory_per_gpu_bytes > result.capacity_bytes:
            continue
        objective = float(objective_of(req, model, np.array([p.step_time_s]),
                                       np.array([plan.gpus]))[0])
        if objective < objective_best * (1 - FASTER) and (found is None or objective < found[2]):
            found = (what, p, objective)
    return found


# how much faster an alternative must be to be said to beat the search's best: more than the
# rounding between the search's staged evaluation and a prediction of the same plan (a few units
# in the last place; the same plan with FP8 weights, which change no time, came out 2e-16 faster)
FASTER = 1e-9


def best_of(model: TransformerSpec, hardware: HardwareSpec,
            req: SearchRequest) -> dict[str, Any] | None:
    """The best plan of a pruned search: the plan in short, its objective and step time, its
    fields (Plan.to_dict); None if no plan fits (or is valid)."""
    alt = search(model, hardware, req, top=1, prune=True, count_unfit=False)
    if not len(alt.best):
        return None
    plan = alt.plan(alt.best, 0)
    return {"plan": _short(plan), "objective": float(alt.best.objective[0]),
            "step_time_s": float(alt.best.step_time_s[0]), "fields": plan.to_dict()}


def without(req: SearchRequest, axis: str) -> SearchRequest:
    """The request with the degree `axis` (cp, ep, etp) at 1, and its pins that only plans with
    that axis take left open: ep_comm_overlap pinned on searches only plans with ep > 1, so the
    search without expert parallelism leaves it to its default (off where ep is 1)."""
    fields: dict[str, Any] = {axis: 1}
    if axis == "ep" and req.ep_comm_overlap:
        fields["ep_comm_overlap"] = None
    return dataclasses.replace(req, **fields)


def best_without(model: TransformerSpec, hardware: HardwareSpec, req: SearchRequest,
                 axis: str) -> dict[str, Any] | None:
    """The best plan of the request's search with `axis` at 1 (best_of)."""
    return best_of(model, hardware, without(req, axis))


def _alternative(ahead: Ahead | None, key: str, model: TransformerSpec, hardware: HardwareSpec,
                 req: SearchRequest, needed: Iterable[str]) -> dict[str, Any] | None:
    """best_of(req): the child's that ran it ahead, else computed here."""
    compute = partial(best_of, model, hardware, req)
    return compute() if ahead is None else ahead.get(key, compute, needed)


def parallelism_wins(model: TransformerSpec, hardware: HardwareSpec, result: SearchResult,
                     best: Prediction, ahead: Ahead | None = None,
                     needed: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Whether context or expert parallelism is what makes the best plan win: for each of cp
    and ep the best plan uses (and the request did not pin), the same search without it (cp = 1,
    ep = 1): its best plan and how much slower it is (by the request's objective), or that no
    plan without it fits."""
    out = []
    req = result.request
    for axis, label in WIN_AXES:
        degree = getattr(best.plan, axis)
        if degree == 1 or getattr(req, axis) is not None:
            continue
        alt = _alternative(ahead, axis, model, hardware, without(req, axis), needed)
        entry: dict[str, Any] = {"axis": axis, "degree": degree, "best_without": None,
                                 "objective_without": None, "step_time_without_s": None}
        if alt is not None:
            objective = float(result.best.objective[0])
            other = alt["objective"]
            entry.update(best_without=alt["plan"], objective_without=other,
                         step_time_without_s=alt["step_time_s"])
            note = (f"{label} ({axis}={degree}) makes the best plan win: without it the best "
                    f"plan is {entry['best_without']}, {other / objective - 1:+.1%} "
                    f"({req.objective.value})")
        else:
            note = (f"{label} ({axis}={degree}) makes the best plan win: without it no plan fits "
                    "(or none is valid)")
        entry["note"] = note
        out.append(entry)
    return out


def objective_unit(req: SearchRequest) -> str:
    """The unit of a plan's "objective": seconds (per step or to train the token budget), or
    the units of --gpu-hour-price (for the budget, or for one step without --tokens)."""
    if req.objective is not Objective.COST:
        return "s"
    return "price units" if req.tokens else "price units per step"


def training_budget(req: SearchRequest, p: Prediction) -> dict[str, float]:
    """What the token budget (--tokens) takes with the plan and what it costs (--gpu-hour-price),
    as perfmodel.search.objective_of ranks them:
        steps_to_train = ceil(tokens / (global batch x sequence length)) (whole steps)
        time_to_train_s = steps_to_train x step time
        gpu_hours = time_to_train_s / 3600 x GPUs
        cost = gpu_hours x price;  cost_per_step = step time / 3600 x GPUs x price
    Only what the request gives: nothing without --tokens and --gpu-hour-price."""
    out: dict[str, float] = {}
    if req.tokens:
        steps = float(math.ceil(req.tokens / (p.plan.global_batch * p.model.seq_len)))
        out.update(steps_to_train=steps, time_to_train_s=steps * p.step_time_s,
                   gpu_hours=steps * p.step_time_s / 3600 * p.plan.gpus)
    if req.gpu_hour_price:
        out["cost_per_step"] = p.step_time_s / 3600 * p.plan.gpus * req.gpu_hour_price
        if req.tokens:
            out["cost"] = out["gpu_hours"] * req.gpu_hour_price
    return out


def percent(fraction: float) -> str:
    """A fraction as a percentage with the digits it needs: 10%, 99.9% (':.0%' printed 0.999 as
    100%, 0.0004 as 0%)."""
    scaled = fraction * 100
    for digits in range(17):
        text = f"{scaled:.{digits}f}"
        shown = float(text)
        if math.isclose(shown, scaled, rel_tol=1e-9) and (shown < 100 or fraction >= 1) \
                and (shown > 0 or fraction <= 0):
            return f"{text}%"
    return f"{scaled:.3g}%"


def memory_limit_line(result: SearchResult) -> str:
    """The memory a recommended plan may use, and why it is less than the GPU's."""
    r = result.request
    counted = "NCCL buffers; no fragmentation: the allocator's expandable segments" \
        if r.expandable_segments else "NCCL buffers, fragmentation"
    return (f"memory limit {result.capacity_bytes / 2**30:.1f} GiB per GPU: memory_margin "
            f"{percent(r.memory_margin)} kept free beyond what the model counts (tensors, reserve, "
            f"{counted}) (--memory-margin)")


class PlanCsv:
    """Every plan a search enumerates as CSV rows (Scored.frame's columns), written into `out` (a
    binary file, e.g. perfmodel.files.atomic_file) chunk by chunk as search(on_chunk=...) hands
    them over: memory stays bounded however many plans there are."""

    def __init__(self, out: BinaryIO, shared: dict[str, Any] | None = None,
                 experts: bool = False) -> None:
        self.out, self.rows, self.shared = out, 0, dict(shared or {})
        self.experts = experts  # the model is a mixture of experts (search.idle_options)

    def __call__(self, rows: Scored) -> None:
        frame = rows.frame(self.experts)
        at = list(frame.columns).index("evaluated")
        for i, (key, value) in enumerate(self.shared.items()):  # every plan's: one value
            frame.insert(at + i, key, value)
        # ... but where a plan has no use for it, its default, as Plans.plan gives the plan
        # (predict --batch refuses a cell that changes nothing)
        idle = idle_options(rows.plans.cols, self.experts)
        for key, blank in (("tp_backward", ""), ("ep_dispatcher", EPDispatcher.ALLTOALL.value),
                           ("dp_bucketing", ""), ("dp_bucket_size", "")):
            if key in frame.columns:
                column = idle["dp_bucketing" if key == "dp_bucket_size" else key]
                frame[key] = frame[key].where(~column, blank)
        self.out.write(frame.to_csv(index=False, header=self.rows == 0).encode("utf-8"))
        self.rows += len(rows)


def shared_columns(req: SearchRequest, model: TransformerSpec | None = None,
                   hardware: HardwareSpec | None = None) -> dict[str, Any]:
    """The plan options every plan of a search shares, as the CSV's columns (enums by name,
    None as empty); with the model and hardware, the attention the plans were costed with where
    the request leaves it to the hardware (flash or not, and the kernel)."""
    out: dict[str, Any] = {"dtype": req.dtype.value, "stack": req.stack.value,
                           "flash_attention": req.flash_attention}
    for key, value in req.shared().items():
        out[key] = getattr(value, "value", value)
    if model is not None and hardware is not None:
        from perfmodel.encode import resolve_flash

        flash = resolve_flash(req.flash_attention, model, hardware, req.dtype,
                              req.attention_kernel)
        kernel = hardware.flash_kernel(compute_dtype(req.dtype), req.attention_kernel) \
            if flash else None  # (fp8 attends in bf16)
        out.update(flash_attention=flash,
                   attention_kernel=(kernel.name or None) if kernel is not None else None)
    return {k: ("" if v is None else v) for k, v in out.items()}


def explain_best(model: TransformerSpec, hardware: HardwareSpec, result: SearchResult,
                 best: list[Prediction]) -> dict[str, Any]:
    """What binds the best plan and what the runner-up trades."""
    b = best[0]
    t = b.step_time_s
    comm = sum(b.breakdown_s.get(k, 0.0) for k in COMM_TERMS)
    bubble = b.breakdown_s["pipeline/bubble"]
    shares = {"memory": b.memory_per_gpu_bytes / b.memory_capacity_bytes,
              "bubble": bubble / t, "exposed_communication": comm / t, "mfu": b.mfu}
    binding = []
    objective = result.request.objective.value
    if objective != "step_time":  # the ranking is the objective's: a faster plan may cost more
        what = {"cost": "the cost of the run (GPU-hours x price)",
                "time_to_train": "the time to train the token budget"}.get(objective, objective)
        binding.append(f"the objective: plans are ranked by {what}, not by step time")
    if result.unfit_faster:
        j = result.fastest_unfit
        binding.append(
            f"memory: {'at least ' if result.unfit_faster_at_least else ''}{result.unfit_faster:,} "
            f"faster plans do not fit; the fastest of them ({_short(result.plan(j, 0))}) would "
            f"take {j.step_time_s[0]:.4g} s but needs {j.memory_bytes[0] / 2**30:.1f} GiB of "
            f"{result.capacity_bytes / 2**30:.1f} GiB")
    if shares["bubble"] > 0.05:
        binding.append(f"pipeline bubble: {shares['bubble']:.1%} of the step")
    if shares["exposed_communication"] > 0.05:
        parts = ", ".join(f"{k} {b.breakdown_s[k] / t:.1%}" for k in COMM_TERMS
                          if b.breakdown_s.get(k, 0.0) > 0)
        binding.append(f"exposed communication: {shares['exposed_communication']:.1%} ({parts})")
    compute = sum(v for k, v in b.breakdown_s.items() if k.startswith("compute/"))
    binding.append(f"compute efficiency: compute is {compute / t:.1%} of the step, MFU {b.mfu:.1%}")
    skipped = uneven_note(model, result.request)
    if skipped:
        binding.append(skipped)
    out: dict[str, Any] = {"best": _short(b.plan), "binding": binding, "shares": shares}
    if len(best) > 1:
        # the runner-up: the first plan that does not tie with the best (the same step time and
        # memory: plans that differ only where the model charges nothing, as a placement whose
        # groups lie on the same links); the ties are counted and what they change is named
        rank = next((i for i, p in enumerate(best) if i and not _ties(p, b)), 1)
        r = best[rank]
        diffs = sorted(((k, r.breakdown_s.get(k, 0) - v) for k, v in b.breakdown_s.items()),
                       key=lambda kv: -abs(kv[1]))
        ties = [p for p in best[1:] if _ties(p, b)]
        out["runner_up"] = {
            "plan": _short(r.plan),
            "slower_by_s": r.step_time_s - b.step_time_s,
            "memory_delta_bytes": r.memory_per_gpu_bytes - b.memory_per_gpu_bytes,
            # what differs beyond rounding (a term equal in both can differ by 1e-17 s)
            "trades": [f"{k} {d:+.4g} s" for k, d in diffs[:3] if abs(d) > 1e-9 * t],
            "rank": rank + 1,
            "ties": len(ties),
            "ties_differ_in": sorted({f for p in ties for f in _differ(p.plan, b.plan)}),
        }
    out["micro_batch_curve"] = micro_batch_curve(model, b.hardware, b.plan, result.capacity_bytes)
    return out


def _ties(p: Prediction, best: Prediction) -> bool:
    """p takes the best plan's step time and memory (to rounding)."""
    return (math.isclose(p.step_time_s, best.step_time_s, rel_tol=1e-12)
            and math.isclose(p.memory_per_gpu_bytes, best.memory_per_gpu_bytes, rel_tol=1e-12))


def _differ(plan: Any, other: Any) -> list[str]:
    """The Plan fields in which plan differs from other."""
    return [f.name for f in dataclasses.fields(plan)
            if getattr(plan, f.name) != getattr(other, f.name)]


def micro_batch_curve(model: TransformerSpec, hardware: HardwareSpec, plan: Any,
                      capacity_bytes: float | None = None) -> list[dict[str, Any]]:
    """Throughput and memory against the micro-batch size for the plan's layout (the micro-batch
    search of the PLOS ONE 2023 paper on pipelined model parallelism); `fits` against
    capacity_bytes (the search's memory limit), else the GPU's memory."""
    rows = []
    for mb in divisors(plan.global_batch // plan.dp):
        try:
            p = predict(model, hardware, plan.replace(micro_batch=mb), refuse_idle=False)
        except PlanError:
            continue
        # (the search's rule: the whole memory, the allocator's fragmentation margin included)
        fits = p.memory_per_gpu_bytes <= (p.memory_capacity_bytes if capacity_bytes is None
                                          else capacity_bytes)
        rows.append({"micro_batch": mb, "step_time_s": p.step_time_s,
                     "tokens_per_s": p.tokens_per_s,
                     "memory_per_gpu_bytes": p.memory_per_gpu_bytes, "fits": fits})
    return rows


def infeasible_reason(model: TransformerSpec, hardware: HardwareSpec, req: SearchRequest,
                      result: SearchResult) -> dict[str, Any]:
    """Why nothing was recommended: the rule that removed every plan, or the nearest plans."""
    if result.enumerated == 0:
        pinned = ("dp", "tp", "pp", "cp", "ep", "etp", "cp_comm", "micro_batch", "schedule",
                  "virtual_stages", "max_tp", "max_pp", "max_cp", "max_micro_batch", "tp_layout",
                  "tp_depth")
        unpinned: dict[str, Any] = dict.fromkeys(pinned)
        relaxed = dataclasses.replace(req, **unpinned)
        from perfmodel.search import count_plans

        pins = {k: getattr(getattr(req, k), "value", getattr(req, k)) for k in pinned
                if getattr(req, k) is not None}
        n = count_plans(model, relaxed) if pins else 0
        experts = (f", ep must divide the experts ({model.experts}) and tp x dp x cp / etp, "
                   "etp must divide tp" if model.experts else "")
        rules = (f"dp x cp x tp x pp must equal the GPU count, tp must divide heads "
                 f"({model.heads}) or make a 2D/2.5D/3D grid whose side divides it, "
                 f"{_pipeline_rule(model, req)}, dp x micro-batch must divide the global batch "
                 f"({req.global_batch}), 2 cp must divide seq_len ({model.seq_len}) where cp > 1"
                 f"{experts}; "
                 "`perfmodel predict` names the rule a given plan breaks")
        gpus = ", ".join(map(str, req.gpus))
        # the rule a plan of the request's pins and options breaks (where it pins any): Plan.
        # check's words, not the list of divisibility rules
        broken = _interleaving_rule(model, req) or (
            _broken_rule(model, req) if pins or _option_pins(req) else "")
        # the options pinned beside the degrees (the count without the pins keeps them): a
        # degree pin may leave none of them a plan (tp 1 and tp_comm_overlap)
        options = {k: getattr(v, "value", v) for k, v in _option_pins(req).items()
                   if k not in pins}
        beside = f" and the options {_words(options)}" if options else ""
        if req.recompute_every > model.layers:
            reason = (f"recompute_every {req.recompute_every} exceeds the model's "
                      f"{model.layers} layers: no layer would recompute (give at most "
                      f"{model.layers})")
        elif pins and n:
            reason = (f"no plan satisfies the pins {_words(pins)}{beside} with {gpus} GPUs ("
                      + (f"for one: {broken}" if broken else rules)
                      + f"); without the pins {n} plans exist")
        elif broken:
            reason = f"no plan with {gpus} GPUs satisfies the request: {broken}"
        else:
            reason = f"{gpus} GPUs cannot be split into a valid plan: {rules}"
            splits = nearest_splits(model, hardware, req)
            if splits:
                reason += f"; {splits_sentence(req, splits)}"
                return {"binding": "divisibility", "reason": reason, "nearest": [],
                        "nearest_splits": splits}
        return {"binding": "pins" if pins and n else "divisibility", "reason": reason,
                "nearest": []}
    rows, evaluated = result.nearest, result.evaluated > 0
    nearest: list[dict[str, Any]] = []
    for i in range(len(rows)):  # the leanest plan of each of the three leanest labels
        p = result.plan(rows, i)
        label = _short(p)
        if not evaluated:  # only the model states were bounded: name the layout, not the options
            label = (_degrees(p, ways=False)
                     + (f" layout={p.tp_layout.value}" if p.tp_layout.value != "1d" else "")
                     + (f" zero{p.zero}" if p.zero else ""))
        nearest.append({"plan": label, "memory_per_gpu_bytes": float(rows.memory_bytes[i]),
                        "step_time_s": float(rows.step_time_s[i]) if evaluated else None,
                        "bound_only": not evaluated})
    leanest = nearest[0]["memory_per_gpu_bytes"]
    what = "needs" if evaluated else "needs for its model states alone"
    remedies = _remedies(req, [result.plan(rows, i) for i in range(len(rows))], evaluated)
    reason = (f"no plan fits in memory: the leanest {what} {leanest / 2**30:.1f} GiB "
              f"per GPU of {result.capacity_bytes / 2**30:.1f} GiB usable "
              f"(memory_margin {percent(req.memory_margin)}); "
              f"{' or '.join(filter(None, (', '.join(remedies[:-1]), remedies[-1])))} "
              "reduce it")
    skipped = uneven_note(model, req)
    if skipped:
        reason += f"; {skipped}"
    return {"binding": "memory", "reason": reason, "nearest": nearest}


def _remedies(req: SearchRequest, plans: list[Plan], evaluated: bool) -> list[str]:
    """What would lower the nearest plans' memory: more GPUs always; ZeRO-3 unless they all
    shard with it; where the activations count (evaluated: not the model states alone), full
    recompute, offloading and a smaller micro-batch, each unless they all have it already."""
    out = ["more GPUs"]
    if not all(p.zero == 3 for p in plans):
        out.append("ZeRO-3")
    if not evaluated:  # only the model states were bounded: the activations change nothing
        return out
    recompute = ("full recompute of more layers (a larger --recompute-num-layers)"
                 if req.recompute_method.value == "block" else "full recompute")
    offload = "activation offloading (--cpu-offload-layers, pp 1)"
    if req.cpu_offload_layers:
        out.append(f"more offloaded layers, or {recompute} in place of {offload}")
    else:
        if not all(p.recompute.value == "full" for p in plans):
            out.append(recompute)
        out.append(offload)
    if not all(p.micro_batch == 1 for p in plans):
        out.append("a smaller micro-batch")
    return out


# how many GPU counts or global batches nearest_splits tries on each side of the request's
SPLIT_PROBES = 256


def nearest_splits(model: TransformerSpec, hardware: HardwareSpec,
                   req: SearchRequest) -> dict[str, list[int]]:
    """Where a request for one GPU count has no plan at all (the divisibility rules remove
    every split), the nearest that has one, by the rules the search enumerates with
    (perfmodel.search.plan_chunks; a count of whole nodes, encode.check_whole_nodes): the GPU
    counts just below and above at the request's global batch ("gpus"), and the global
    batches just below and above at its GPU count ("global_batch"), each tried up to
    SPLIT_PROBES away (a side with none within that is left out); {} for several counts."""
    from perfmodel.encode import check_whole_nodes
    from perfmodel.errors import PerfmodelError
    from perfmodel.search import plan_chunks

    if len(req.gpus) != 1:
        return {}
    gpus, batch = req.gpus[0], req.global_batch

    def splits(**fields: Any) -> bool:
        try:
            alt = dataclasses.replace(req, **fields)
            check_whole_nodes(hardware, alt.gpus[0])
            return any(len(chunk) for chunk in plan_chunks(model, alt))
        except PerfmodelError:  # out of the request's ranges, or not whole nodes
            return False

    def nearest(field: str, at: int) -> list[int]:
        """The first value with a split below `at` and the first above, where found."""
        found = []
        for side in (range(at - 1, max(0, at - SPLIT_PROBES - 1), -1),
                     range(at + 1, at + SPLIT_PROBES + 1)):
            found += next(([v] for v in side
                           if splits(**{field: (v,) if field == "gpus" else v})), [])
        return found

    out = {"gpus": nearest("gpus", gpus), "global_batch": nearest("global_batch", batch)}
    return {k: v for k, v in out.items() if v}


def splits_sentence(req: SearchRequest, splits: Mapping[str, list[int]]) -> str:
    """nearest_splits in words: 'the nearest with a plan: 64 or 80 GPUs at global batch 512, or
    72 GPUs at global batch 504 or 513'."""
    parts = []
    if splits.get("gpus"):
        parts.append(f"{' or '.join(map(str, splits['gpus']))} GPUs at global batch "
                     f"{req.global_batch}")
    if splits.get("global_batch"):
        parts.append(f"{req.gpus[0]} GPUs at global batch "
                     f"{' or '.join(map(str, splits['global_batch']))}")
    return "the nearest with a plan: " + ", or ".join(parts)


def said(value: Any) -> str:
    """A pinned value as a user writes it: 'true' (not 'True'), an option's name, several
    joined by '/'."""
    if isinstance(value, (tuple, list)):
        return "/".join(said(v) for v in value)
    value = getattr(value, "value", value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _words(fields: dict[str, Any]) -> str:
    """Pinned fields as a user writes them: 'tp 1, pp 1, tp_layout 1d'."""
    return ", ".join(f"{k} {said(v)}" for k, v in fields.items())


def _stages(layers: int, pp: int) -> str:
    """How the search splits layers over pp stages: '8 each', or an uneven split's
    (strategy.stage_split) '6, 7 on each of the 3 middle stages, 6'."""
    from perfmodel.strategy import stage_split

    first, last = stage_split(layers, pp)
    if not first:
        return f"{layers // pp} each"
    middle = -(-layers // pp)
    between = f"{middle} on each of the {pp - 2} middle stages, " if pp > 2 else ""
    return f"{first}, {between}{last}"


def _pipeline_rule(model: TransformerSpec, req: SearchRequest) -> str:
    """What the search asks of pp and the layers, as it enumerates them (perfmodel.search.
    uneven_pp): pp dividing the layers, unless --uneven-stages or a pinned pp split them
    unevenly (the first and the last stage short; never equal stages only, under Megatron's
    recompute methods); with the interleaved schedule pinned, virtual stages dividing every
    stage's layers. (It said "pp must divide layers" where a pinned pp 3 splits 32 layers.)"""
    layers = model.layers
    if req.megatron_full_only:
        text = (f"pp must divide layers ({layers}): Megatron's recompute methods "
                "(--recompute-method, --recompute-num-layers) are modelled on equal stages")
    elif req.uneven_stages:
        text = (f"pp must leave every stage at least one of the {layers} layers (where it does "
                "not divide them, --uneven-stages shortens the first and the last stage)")
    elif req.pp is not None:
        text = (f"pp {req.pp} must leave every stage at least one of the {layers} layers (a "
                "pinned pp that does not divide them shortens the first and the last stage)")
    else:
        text = (f"pp must divide layers ({layers}) (--uneven-stages also searches the pp that "
                "do not, the first and the last stage short)")
    if req.schedule is not None and req.schedule.value == "interleaved":
        text += (", the interleaved schedule's virtual_stages (2 or more) must divide every "
                 "stage's layers")
    return text


def _interleaving_rule(model: TransformerSpec, req: SearchRequest) -> str:
    """Where the interleaved schedule and pp are pinned: that no virtual_stages of 2 or more
    divides every stage's layers (the search's chunk_layers), or with the virtual stages pinned
    too and pp splitting the layers unevenly, that they do not; or "" (Plan.check's own words
    for an even split: layers divisible by pp x virtual_stages)."""
    from perfmodel.search import chunk_layers, uneven_pp

    if req.schedule is None or req.schedule.value != "interleaved" or req.pp is None \
            or req.pp < 2:
        return ""
    pp, layers, v = req.pp, model.layers, req.virtual_stages
    if layers % pp and not uneven_pp(model, req, pp):
        return ""  # pp itself is refused: the rules say so
    common = chunk_layers(layers, pp)
    split = f"pp {pp} splits the {layers} layers {_stages(layers, pp)}"
    if v is None and common < 2:
        return (f"schedule interleaved needs virtual_stages of 2 or more dividing every pipeline "
                f"stage's layers, and {split}: no such virtual_stages divides them (give a pp "
                "whose stages share a divisor, or another --schedule)")
    if v is not None and v >= 2 and layers % pp and common % v:
        return (f"virtual_stages {v} must divide every pipeline stage's layers, and {split} "
                f"(virtual_stages dividing them all: "
                f"{', '.join(str(d) for d in divisors(common) if d >= 2) or 'none'})")
    return ""


def _option_pins(req: SearchRequest) -> dict[str, Any]:
    """The per-plan options the request pins (those it leaves to the search are None)."""
    return {k: getattr(req, k) for k in (
        "cp_comm", "schedule", "virtual_stages", "recompute", "sequence_parallel", "zero",
        "overlap_grad_sync", "overlap_param_gather", "tp_comm_overlap", "ep_comm_overlap",
        "placement", "tp_layout", "tp_depth", "micro_batch") if getattr(req, k) is not None}


def _broken_rule(model: TransformerSpec, req: SearchRequest) -> str:
    """The rule a plan of the request breaks (Plan.check's words), where the plans the search
    would try first all break one: its pins, the request's options, every degree it leaves free
    1 but data parallelism (the GPUs' rest), and then tensor parallelism over a node; "" where
    such a plan is valid or none can be formed."""
    from perfmodel.errors import PlanError
    from perfmodel.strategy import Plan

    fixed = _option_pins(req)
    pinned = {k for k in ("dp", "tp", "pp", "cp", "ep", "etp") if getattr(req, k) is not None}
    broken = ""
    for tp in dict.fromkeys((req.tp or 1, req.tp or req.max_tp or 8)):
        for gpus in req.gpus:
            degrees: dict[str, Any] = {"tp": tp, "pp": req.pp or 1, "cp": req.cp or 1,
                                       "ep": req.ep or 1, "etp": req.etp or 1}
            rest = degrees["tp"] * degrees["pp"] * degrees["cp"]
            dp = req.dp or (gpus // rest if gpus % rest == 0 else 0)
            if not dp:
                continue
            try:
                plan = Plan(gpus=gpus, dp=dp, global_batch=req.global_batch, dtype=req.dtype,
                            flash_attention=req.flash_attention, stack=req.stack,
                            **degrees, **{**req.shared(), **fixed})
                plan.check(model)
            except PlanError as err:
                if not broken and _names_only(str(err), {*pinned, *fixed}):
                    broken = str(err)
                continue
            except (TypeError, ValueError):
                continue
            return ""  # a valid plan: the search's emptiness is not one rule's
    return broken


def _names_only(message: str, pinned: set[str]) -> bool:
    """Whether the plan fields a rule's message names are all pinned: a rule that also names a
    field the search chooses (zero, sequence_parallel, dp) is one the search would have kept,
    not why it found nothing."""
    import re

    from perfmodel.strategy import Plan

    fields = {f.name for f in dataclasses.fields(Plan)}
    named = {w for w in re.findall(r"[a-z_]+", message) if w in fields}
    return bool(named) and named <= pinned


def uneven_note(model: TransformerSpec, req: SearchRequest) -> str:
    """The pipeline degrees the search left out because they do not divide the layers (without
    --uneven-stages and with pp free), or ""."""
    from perfmodel.strategy import stage_split

    if (req.uneven_stages and not req.megatron_full_only) or req.pp is not None \
            or req.cpu_offload_layers:  # offloading searches pp 1 alone
        return ""
    left = sorted({pp for g in req.gpus for pp in divisors(g)
                   if model.layers % pp and stage_split(model.layers, pp)[0]
                   and (req.max_pp is None or pp <= req.max_pp)})
    if not left:
        return ""
    if req.megatron_full_only:
        return (f"pipeline: pp {', '.join(map(str, left))} do not divide the {model.layers} "
                "layers and were not searched: Megatron's recompute methods "
                "(--recompute-method, --recompute-num-layers) are modelled on equal stages only")
    pp = left[len(left) // 2]  # an example
    first, last = stage_split(model.layers, pp)
    return (f"pipeline: pp {', '.join(map(str, left))} do not divide the {model.layers} layers "
            f"and were not searched; --uneven-stages searches them with the first and the last "
            f"stage short (pp {pp}: {first} and {last} layers, {-(-model.layers // pp)} on "
            f"each other stage)")


def _degrees(plan: Any, ways: bool = True) -> str:
    """'dp=.. tp=.. pp=..' and cp, ep, etp where above 1; `ways`: with how cp and ep exchange
    (p2p, deepep, ...)."""
    degrees = f"dp={plan.dp} tp={plan.tp} pp={plan.pp}"
    if plan.cp > 1:
        degrees += f" cp={plan.cp}" + (f"({plan.cp_comm.value})" if ways else "")
    if plan.ep > 1:
        degrees += f" ep={plan.ep}" + ("" if plan.ep_dispatcher.value == "alltoall" or not ways
                                       else f"({plan.ep_dispatcher.value})")
    if plan.etp > 1:
        degrees += f" etp={plan.etp}"
    return degrees


def _placed(plan: Any, order: tuple[str, ...]) -> tuple[str, ...]:
    """A placement's order of the plan's axes of degree > 1 (an order of tp, dp and pp alone
    puts cp right outside tp: strategy.Placement)."""
    if "cp" not in order:
        at = order.index("tp") + 1
        order = (*order[:at], "cp", *order[at:])
    return tuple(a for a in order if getattr(plan, a, 1) > 1)


def _short(plan: Any) -> str:
    extra = []
    if plan.tp_layout.value != "1d":
        extra.append(f"layout={plan.tp_layout.value}"
                     + (f"(d={plan.tp_depth})" if plan.tp_depth > 1 else ""))
    if plan.virtual_stages > 1:
        extra.append(f"v={plan.virtual_stages}")
    # an uneven pipeline split: the first and the last stage's layers where given
    extra += [f"{end}-layers={n}" for end, n in (("first", plan.first_stage_layers),
                                                   ("last", plan.last_stage_layers)) if n]
    if plan.sequence_parallel:
        extra.append("sp")
    if plan.zero:
        extra.append(f"zero{plan.zero}")
    extra += [name for name, on in (("tp-overlap", plan.tp_comm_overlap),
                                    ("grad-overlap", plan.overlap_grad_sync),
                                    ("param-overlap", plan.overlap_param_gather),
                                    ("ep-overlap", plan.ep_comm_overlap)) if on]
    degrees = _degrees(plan)
    recompute = plan.recompute.value
    if plan.recompute_every > 1:
        recompute += f"(1-in-{plan.recompute_every})"
    if plan.recompute_method.value != "uniform" or plan.recompute_num_layers > 1:
        recompute += f"({plan.recompute_method.value}-{plan.recompute_num_layers})"
    if plan.cpu_offload_layers:
        extra.append(f"offload={plan.cpu_offload_layers}")
    if plan.overlap_grad_sync and (plan.dp_bucket_size is not None
                                   or plan.dp_bucketing.value != "megatron"):
        extra.append(f"buckets={plan.dp_bucket_size or 'default'}"
                     + ("" if plan.dp_bucketing.value == "megatron" else
                        f"({plan.dp_bucketing.value})"))
    if plan.attention_kernel:
        extra.append(f"attention={plan.attention_kernel}")
    # the ranks' order where it is not the default's for this plan (orders that differ only
    # in an axis of degree 1 place the ranks alike: search._placements)
    if _placed(plan, plan.placement) != _placed(plan, AXES):
        extra.append(f"placement={','.join(plan.placement)}")
    return (f"{degrees} mb={plan.micro_batch} {plan.schedule.value} "
            f"recompute={recompute}" + ("".join(f" {e}" for e in extra)))


_WHAT_IF = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*([0-9.eE+-]+|true|false|[+-]?nan|"
                      r"[+-]?infinity|[+-]?inf)\s*(x?)\s*$", re.IGNORECASE)


def apply_what_if(hardware: HardwareSpec | str, change: str, option: str = "--what-if"
                  ) -> HardwareSpec:
    """'inter_node.bandwidth_bytes_per_s=2x' (a factor), '=400e9' (a value) or, for a field
    that is true or false, '=false' -> a new spec. option: the command line's name for it in
    errors (sweep's --vary)."""
    from perfmodel.specs.hardware import load_hardware

    hardware = load_hardware(hardware)  # a preset's name or a file, as predict takes it
    if not isinstance(change, str):
        raise PlanError(f"{option} is one change as text, FIELD=VALUE or FIELD=FACTORx (e.g. "
                        f"inter_node.bandwidth_bytes_per_s=2x), got {type(change).__name__}")
    match = _WHAT_IF.match(change)
    if not match:
        raise PlanError(f"{option} must look like FIELD=VALUE or FIELD=FACTORx "
                        f"(e.g. inter_node.bandwidth_bytes_per_s=2x), or FIELD=true|false for a "
                        f"yes-or-no field (e.g. asynchronous_device=false), got '{change}'")
    given, is_factor = match.group(2).lower(), bool(match.group(3))
    flag = {"true": True, "false": False}.get(given)
    if flag is not None and is_factor:
        raise PlanError(f"{option}: {change}: true or false takes no factor")
    try:
        number = 0.0 if flag is not None else float(given)
    except ValueError:  # the pattern's characters, not a number ("1e", "--")
        raise PlanError(f"{option}: '{given}' in '{change}' is not a number") from None
    if not math.isfinite(number):  # 1e400: read as inf
        raise PlanError(f"{option}: '{given}' in '{change}' must be a finite number")
    path = match.group(1).split(".")
    data = hardware.to_dict()
    if data.get("levels"):  # a fabric's levels by index: levels.2.oversubscription=2
        data["levels"] = [dict(lv) for lv in data["levels"]]
        data.pop("intra_node"), data.pop("inter_node"), data.pop("gpus_per_node")
        if path[0] in ("intra_node", "inter_node", "gpus_per_node"):
            raise PlanError(f"{option}: hardware '{hardware.name}' takes {path[0]} from its "
                            "levels: change levels.N.FIELD (e.g. "
                            "levels.1.bandwidth_bytes_per_s=2x)")
    node: Any = data
    for key in path[:-1]:
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
            continue
        if not isinstance(node, dict) or key not in node:
            raise PlanError(f"{option}: unknown hardware field '{match.group(1)}'")
        node = node[key]
    last = path[-1]
    known = isinstance(node, dict) and last in node
    value = node[last] if known else None
    if not known or isinstance(value, (list, tuple, str)):
        fields = numeric_fields(hardware.to_dict())
        flags = sorted(k for k, v in hardware.to_dict().items() if isinstance(v, bool))
        raise PlanError(f"{option}: unknown numeric hardware field '{match.group(1)}'"
                        f"{suggest(match.group(1), [*fields, *flags])}; fields: "
                        f"{', '.join(fields)}; true or false: {', '.join(flags)}")
    if isinstance(value, bool):  # a yes-or-no field
        if flag is None:
            raise PlanError(f"{option}: {match.group(1)} is true or false, got '{given}'")
        node[last] = flag
    elif flag is not None:
        raise PlanError(f"{option}: {match.group(1)} is not a yes-or-no field; give a number "
                        "or a factor like 2x")
    elif value is None:  # a field the spec leaves unset (gpus_per_host): a value, no factor
        if is_factor:
            raise PlanError(f"{option}: {match.group(1)} is not set on hardware "
                            f"'{hardware.name}': give a value, not a factor")
        node[last] = number
    elif isinstance(value, dict):  # numbers by key (peak_flops_per_s by dtype): a factor
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   for v in value.values()):
            raise PlanError(f"{option}: {match.group(1)} is a group of fields; change one of "
                            f"them ({match.group(1)}.FIELD)")
        if not is_factor:
            raise PlanError(f"{option}: {match.group(1)} is a mapping; give a factor like 2x")
        node[last] = {k: v * number for k, v in value.items()}
    elif is_factor and not value:  # 0, or unset where 0 stands for another field's value
        raise PlanError(f"{option}: {match.group(1)} is 0 on hardware '{hardware.name}' (where "
                        "0 means unset, another field's value applies: see docs/specs.md): a "
                        "factor changes nothing; give a value")
    else:
        node[last] = value * number if is_factor else number
    data["collectives"] = [dataclasses.asdict(c) if not isinstance(c, dict) else c
                           for c in data.get("collectives", ())]
    gemm = data.pop("gemm_efficiency")
    data["gemm_efficiency"] = {k: v for k, v in gemm.items()}
    return hardware_from_dict(data, f"hardware '{hardware.name}' ({change})")


def numeric_fields(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the numeric fields of a hardware spec's mapping (what --what-if changes;
    a mapping by dtype, like peak_flops_per_s, takes a factor)."""
    out = []
    for key, value in data.items():
        if isinstance(value, dict) and key != "gemm_efficiency":
            if key == "peak_flops_per_s":  # by dtype: a factor scales them all
                out.append(f"{prefix}{key}")
            out += numeric_fields(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(f"{prefix}{key}")
    return sorted(set(out))


HARDWARE_SENSITIVITIES = {
    "peak_flops_per_s": "peak FLOP/s",
    "memory_bandwidth_bytes_per_s": "memory bandwidth",
    "intra_bandwidth": "intra-node bandwidth",
    "inter_bandwidth": "inter-node bandwidth",
    "intra_latency_s": "intra-node latency",
    "inter_latency_s": "inter-node latency",
    "kernel_overhead_s": "kernel overhead",
    "host_op_overhead_s": "host time per framework op",
    "host_op_backward_overhead_s": "host time per backward op",
    "host_link_bytes_per_s": "host link bandwidth (activation offloading)",
}


# the --what-if field of each parameter whose compiled name is another: sensitivities() names
# each parameter by the field that moves it (before 2026-12-07 by the compiled name, which
# --what-if refused: an API probe's finding)
WHAT_IF_FIELDS = {"intra_bandwidth": "intra_node.bandwidth_bytes_per_s",
                  "inter_bandwidth": "inter_node.bandwidth_bytes_per_s",
                  "intra_latency_s": "intra_node.latency_s",
                  "inter_latency_s": "inter_node.latency_s"}

# the compiled symbols that move with a hardware parameter, as --what-if moves them
# (apply_what_if rebuilds the spec, and perfmodel.encode derives these from it): peak_flops_per_s
# is the peak of every dtype, an fp8 plan's GEMMs at the FP8 peak among them; the memory
# bandwidth is the optimizer step's too (optimizer_bandwidth_efficiency a share of it). A fabric
# of levels' links are moved level by level through apply_what_if (sensitivities)
LINKED_SENSITIVITIES = {"peak_flops_per_s": ("fp8_peak_flops_per_s",),
                        "memory_bandwidth_bytes_per_s": ("optimizer_bandwidth_bytes_per_s",)}


def _linked(name: str, values: Mapping[str, float], hardware: HardwareSpec) -> tuple[str, ...]:
    """The compiled symbols a sensitivity to `name` moves with it, those the plan's values hold:
    LINKED_SENSITIVITIES, a link's low-latency
    protocols' step latency where the link gives the protocol none (perfmodel.encode.link_values:
    the Simple protocol's then), and the host's time per op where the spec leaves it unset
    (host_op_overhead_s 0: kernel_overhead_s's; host_op_backward_overhead_s 0: the forward's)."""
    moved = set(LINKED_SENSITIVITIES.get(name, ()))
    for link, spec in (("intra", hardware.intra_node), ("inter", hardware.inter_node)):
        if name == f"{link}_latency_s":
            moved |= {f"{link}_{p}_latency_s" for p in LINK_PROTOCOLS if spec.protocol(p) is None}
    if name == "kernel_overhead_s" and not hardware.host_op_overhead_s:
        moved.add("host_op_overhead_s")
    if (name == "host_op_overhead_s" or "host_op_overhead_s" in moved) \
            and not hardware.host_op_backward_overhead_s:
        moved.add("host_op_backward_overhead_s")
    return tuple(n for n in values if n in moved)


# the relative step of the central differences of sensitivities(): small against any parameter,
# large against float64 rounding (the step time's relative error ~1e-16 / 1e-6 = 1e-10)
SENSITIVITY_STEP = 1e-6


def sensitivities(model: TransformerSpec | str, hardware: HardwareSpec | str, plan: Any
                  ) -> dict[str, float]:
    """Elasticity of the step time to each hardware parameter, (dT/dx) (x/T): the central
    difference of the plan's compiled step-time formula at x (1 +- SENSITIVITY_STEP), all
    parameters in one vectorised evaluation. (A symbolic derivative of the whole step grows with
    the smooth maximum of host and device time, perfmodel.step.compose, into minutes.)

    -0.6 for peak FLOP/s means 1% more FLOP/s gives 0.6% less step time. At a kink of the model
    (a max of two equal terms) it is the mean of the one-sided slopes. Keyed by the --what-if
    field that moves each parameter (peak_flops_per_s, inter_node.bandwidth_bytes_per_s, ...).
    """
    import numpy as np

    from perfmodel.evaluate import compile_family, family_of, values_of
    from perfmodel.predict import resolve_inputs

    # a preset's name, a file, a dict plan: as predict takes them
    model, hardware, plan = resolve_inputs(model, hardware, plan)
    compiled = compile_family(family_of(model, hardware, plan), "search")
    values = values_of(model, hardware, plan)
    # host_link_bytes_per_s: what offloading copies; host_op_overhead_s unset (0) is
    # kernel_overhead_s's, which moves it (_linked)
    names = [n for n in HARDWARE_SENSITIVITIES if n in values
             and (n != "host_link_bytes_per_s" or plan.cpu_offload_layers)
             and (n != "host_op_overhead_s" or hardware.host_op_overhead_s)
             and (n != "host_op_backward_overhead_s" or hardware.host_op_backward_overhead_s)
             and not (hardware.levels and n in WHAT_IF_FIELDS)]
    # a fabric of levels: each level's bandwidth and latency, moved as --what-if
    # levels.N.FIELD moves them (the spec rebuilt, its values encoded again: which axes a level
    # prices is the encoding's); intra_node and inter_node, which --what-if refuses there,
    # are not named (an API probe's finding, 2026-12-07)
    levels = [f"levels.{i}.{field}" for i in range(len(hardware.levels))
              for field in ("bandwidth_bytes_per_s", "latency_s")
              if getattr(hardware.levels[i], field)] if hardware.levels else []
    rows = 1 + 2 * (len(names) + len(levels))
    columns = {k: np.full(rows, v, dtype=float) for k, v in values.items()}
    for i, name in enumerate(names):
        for moved in (name, *_linked(name, values, hardware)):
            columns[moved][1 + 2 * i] *= 1 + SENSITIVITY_STEP
            columns[moved][2 + 2 * i] *= 1 - SENSITIVITY_STEP
    for j, field in enumerate(levels, start=len(names)):
        for row, factor in ((1 + 2 * j, 1 + SENSITIVITY_STEP), (2 + 2 * j, 1 - SENSITIVITY_STEP)):
            moved_values = values_of(model, apply_what_if(hardware, f"{field}={factor!r}x"), plan)
            for k, v in moved_values.items():
                if k in columns:
                    columns[k][row] = v
    t = np.asarray(compiled(columns)["step_time"], dtype=float) * np.ones(rows)
    out = {}
    for i, name in enumerate([*names, *levels]):
        # the elasticity: the relative change of the step over the parameter's, 2 x the step
        out[WHAT_IF_FIELDS.get(name, name)] = float((t[1 + 2 * i] - t[2 + 2 * i])
                                                    / (2 * SENSITIVITY_STEP * t[0]))
    return out
