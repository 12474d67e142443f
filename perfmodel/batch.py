"""`perfmodel predict --batch PLANS.csv`: many plans in one call; a bad row does not stop the
others."""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path
from typing import Any

from perfmodel.errors import DataError, PerfmodelError
from perfmodel.files import read_text_bounded, write_atomic
from perfmodel.output import document, json_text
from perfmodel.specs.resolve import resolve_hardware

PLAN_COLUMNS = ("gpus", "dp", "tp", "pp", "micro_batch", "global_batch", "schedule",
                "virtual_stages", "sequence_parallel", "recompute", "recompute_every",
                "recompute_method", "recompute_num_layers", "recompute_modules",
                "cpu_offload_layers", "dp_bucket_size", "dp_bucketing", "attention_kernel",
                "grad_dtype",
                "optimizer_dtype", "master_weights", "zero", "dtype", "fp8_recipe",
                "fp8_output_layer", "fp8_params", "flash_attention", "overlap_grad_sync",
                "overlap_param_gather", "tp_comm_overlap", "ep_comm_overlap", "pp_scatter_gather",
                "defer_grad_sync", "bf16_optimizer", "grad_accumulation_fusion", "tp_backward",
                "expandable_segments",
                "fsdp_reshard",
                "ep_dispatcher", "cross_entropy", "optimizer_kernels", "expert_weighting",
                "stack", "kernels",
                "pipeline_micro_batches", "first_stage_layers", "last_stage_layers",
                "pipeline_layout", "placement", "tp_layout", "tp_depth", "cp", "cp_comm", "ep",
                "etp")
MODEL_COLUMNS = ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "kv_heads")
# a row's inputs beside its plan and model: what --model, --hardware and --collective-algorithm
# give every row (a cell overrides the flag for its row)
ROW_COLUMNS = ("model", "hardware", "collective_algorithm")
RESULT_COLUMNS = ("step_time_s", "samples_per_s", "tokens_per_s", "model_flops_per_step",
                  "tflops_per_gpu", "mfu", "memory_per_gpu_bytes", "fits_in_memory",
                  "memory_verdict")
# the columns that hold whole numbers: written in ASCII digits (Python's int() and float() read
# '8_0' as 80 and a full-width '８' as 8: refused, as on the command line)
WHOLE_COLUMNS = MODEL_COLUMNS + ("gpus", "dp", "tp", "pp", "cp", "ep", "etp", "micro_batch",
                                 "global_batch", "virtual_stages", "recompute_every",
                                 "recompute_num_layers", "cpu_offload_layers", "dp_bucket_size",
                                 "zero", "tp_depth",
                                 "pipeline_micro_batches", "first_stage_layers",
                                 "last_stage_layers")
# the model each row predicted, resolved: the fields derived from others, and its size
RESOLVED_COLUMNS = ("ffn_hidden", "kv_heads", "parameters")
# the results perfmodel writes beside the plans it predicted (predict --batch's output,
# recommend --csv's rows): read back, ignored and predicted again
WRITTEN_COLUMNS = frozenset((*RESULT_COLUMNS, *RESOLVED_COLUMNS, "evaluated", "objective",
                             "error"))
MAX_WHOLE = 10**7  # the largest whole number of a plan's fields (perfmodel.strategy.Plan)
MAX_WHOLE_OF = {"dp_bucket_size": 10**13}  # ... but these (parameters, not ranks or layers)


def read_rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str], str]]]:
    """The header and the rows of a plans file: (line, cells by column, problem), the problem
    ('' when none) of a row that is not a plan: a row of empty cells, or one with more or fewer
    cells than the header."""
    # a spreadsheet's byte-order mark too
    text = read_text_bounded(path, "plans file", error=DataError, encoding="utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise DataError(f"plans file {path} is empty: it needs a header row with columns "
                        f"{', '.join(PLAN_COLUMNS)}")
    header = [h.strip() for h in reader.fieldnames]
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:  # a reader keeps the last of two cells of a name: which one was meant is unknown
        raise DataError(f"plans file {path}: column '{repeated[0]}' is given "
                        f"{header.count(repeated[0])} times: give each column once")
    allowed = set(PLAN_COLUMNS) | set(MODEL_COLUMNS) | set(ROW_COLUMNS)
    # what perfmodel wrote beside a plan (predict --batch's results, recommend --csv's): a file
    # of its own output reads back, its results predicted again rather than taken
    unknown = [h for h in header if h not in allowed and h not in WRITTEN_COLUMNS]
    if unknown:
        from perfmodel.specs.loading import suggest

        raise DataError(f"plans file {path}: unknown column '{unknown[0]}'"
                        f"{suggest(unknown[0], sorted(allowed))}; "
                        f"allowed: {', '.join(sorted(allowed))}")
    rows = []
    for row in reader:
        line = reader.line_num  # the row's last line (a quoted cell may span lines)
        cells = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        extra, missing = row.get(None), [k for k, v in row.items() if k is not None and v is None]
        problem = ""
        if extra:
            problem = (f"the row has {len(header) + len(extra)} cells, the header {len(header)} "
                       f"columns")
        elif missing:
            problem = (f"the row has {len(header) - len(missing)} cells, the header {len(header)} "
                       f"columns (no cell for '{missing[0]}')")
        elif not any(cells.values()):
            problem = "the row's cells are all empty (give a plan, or delete the row)"
        rows.append((line, cells, problem))
    if not rows:  # a header alone would print an empty table: say it holds no plan
        raise DataError(f"plans file {path} has a header and no rows: give one plan a row")
    return header, rows


def _shown(text: str) -> str:
    """A cell as an error quotes it: a long one (400 digits) by its ends and length."""
    return f"'{text}'" if len(text) <= 40 else \
        f"'{text[:12]}...{text[-4:]}' ({len(text)} characters)"


def _ascii_cells(row: dict[str, str]) -> None:
    """DataError for a whole-number cell not written in ASCII digits (WHOLE_COLUMNS), a plan's
    too large for a float (over 1.8e308: the plan, which reads it as one, would call it no whole
    number; the bound is named), or a recompute_modules cell with an empty name (',mlp': the
    command line refuses it too)."""
    for column in WHOLE_COLUMNS:
        text = row.get(column) or ""
        if not text.isascii() or "_" in text:
            raise DataError(f"column '{column}' must be a whole number in ASCII digits (no '_'), "
                            f"got {_shown(text)}")
        if column not in MODEL_COLUMNS and text.isdigit() and not math.isfinite(float(text)):
            # (the model's columns are read exactly, by whole: their spec names its bound)
            raise DataError(f"column '{column}' must be a whole number of at most "
                            f"{MAX_WHOLE_OF.get(column, MAX_WHOLE):g} (the most the plan field "
                            f"takes), got {_shown(text)}")
    modules = row.get("recompute_modules")
    if modules and not all(name.strip() for name in modules.split(",")):
        raise DataError(f"column 'recompute_modules': an empty name in '{modules}'; give module "
                        "names separated by single commas")


def whole(text: Any, column: str) -> int:
    """A cell that must hold a positive whole number; DataError naming the column otherwise.
    Digits are read exactly: a number too large for the plan or model names its bound there
    (a plan's cell beyond a float is refused by _ascii_cells first)."""
    shown = _shown(str(text))
    if isinstance(text, str) and (not text.isascii() or "_" in text):
        raise DataError(f"column '{column}' must be a whole number in ASCII digits (no '_'), "
                        f"got {shown}")
    digits = text.strip().lstrip("0") if isinstance(text, str) else ""
    if isinstance(text, str) and text.strip().isdigit():
        try:
            value = int(text)
        except ValueError:  # over Python's 4,300 digits: a number of its size stands for it
            value = 10 ** (len(digits) - 1)
    else:
        try:
            number = float(text)
        except (TypeError, ValueError):
            raise DataError(f"column '{column}' must be a whole number, got {shown}") from None
        if not math.isfinite(number) or number != int(number):
            raise DataError(f"column '{column}' must be a whole number >= 1, got {shown}")
        value = int(number)
    if value < 1:
        raise DataError(f"column '{column}' must be a whole number >= 1, got {shown}")
    return value


def run_batch(path: Path, kw: dict[str, Any], out: Path | None, as_json: bool) -> int:
    """Predict every row; write the input columns plus the prediction fields. Returns failed
    rows."""
    from perfmodel.idle import refuse_idle_flags
    from perfmodel.predict import predict
    from perfmodel.specs.model import TransformerSpec, load_model
    from perfmodel.strategy import derived_dp, fields_given, plan_from_dict

    header, rows = read_rows(path)
    base_model = kw.get("model")
    hardware = None
    if kw.get("hardware") or kw.get("profile"):
        hardware = resolve_hardware(kw.get("hardware"), kw.get("profile"),
                                    kw.get("collective_algorithm"))
    results: list[dict[str, Any]] = []
    failures = 0
    for line, row, problem in rows:
        record: dict[str, Any] = dict(row)
        try:
            if problem:
                raise DataError(problem)
            _ascii_cells(row)
            model_name = row.get("model") or base_model
            if not model_name:
                raise DataError("no model: give --model or a 'model' column")
            overrides = {k: whole(row[k], k) for k in MODEL_COLUMNS if row.get(k)}
            if "seq_len" not in overrides and kw.get("seq_len") is not None:
                overrides["seq_len"] = kw["seq_len"]  # --seq-len: the rows' default
            model = load_model(model_name, **overrides)
            if not isinstance(model, TransformerSpec):  # a CNN or MLP: its own command line
                raise DataError(f"model '{model.name}' is a layer graph (CNN/MLP): --batch "
                                "predicts transformers; give it its grid with perfmodel predict "
                                "--pr R --pc C")
            hw = hardware
            if row.get("hardware"):
                from perfmodel.specs.hardware import load_hardware

                hw = load_hardware(row["hardware"])
                if kw.get("collective_algorithm"):  # --collective-algorithm: every row's
                    hw = hw.replace(collective_algorithm=kw["collective_algorithm"])
            if hw is None:
                raise DataError("no hardware: give --hardware/--profile or a 'hardware' column")
            if row.get("collective_algorithm"):  # the row's, over --collective-algorithm's
                hw = hw.replace(collective_algorithm=row["collective_algorithm"])
            plan_kw: dict[str, Any] = {k: row[k] for k in PLAN_COLUMNS if row.get(k)}
            plan_kw.setdefault("dtype", kw.get("dtype") or hw.default_dtype())
            if "gpus" in plan_kw and "dp" not in plan_kw:  # dp what the others leave, as
                # predict's --gpus without --dp (perfmodel.cli.derive_dp)
                tp, pp, cp = (whole(plan_kw.get(k, 1), k) for k in ("tp", "pp", "cp"))
                gpus = whole(plan_kw["gpus"], "gpus")
                dp = derived_dp(gpus, tp, pp, cp)
                if dp is None:
                    raise DataError(f"gpus ({gpus}) must be a multiple of tp x pp x cp "
                                    f"({tp * pp * cp}) to derive dp from it; or give dp")
                plan_kw["dp"] = dp
            degrees = [whole(plan_kw.get(k, 1), k) for k in ("dp", "tp", "pp", "cp")]
            plan_kw.setdefault("gpus", math.prod(degrees))
            plan_kw.setdefault("global_batch",
                               degrees[0] * whole(plan_kw.get("micro_batch", 1), "micro_batch"))
            plan = plan_from_dict(plan_kw).check(model)
            # a cell the row sets is the user's, as a flag given: refused where it changes
            # nothing (perfmodel.idle), as predict refuses the flag; a cell at the plan's default
            # is as empty (perfmodel.strategy.fields_given: the plans perfmodel writes give every
            # field, and read back they are the same plans)
            refuse_idle_flags(plan, model, fields_given(plan, plan_kw).__contains__)
            result = predict(model, hw, plan, refuse_idle=False)  # its cells checked above
            summary = result.to_dict()
            record.update({k: summary[k] for k in RESULT_COLUMNS})
            record.update(ffn_hidden=model.ffn_hidden, kv_heads=model.kv_heads,
                          parameters=result.parameters, error="")
        except (PerfmodelError, ValueError) as exc:
            failures += 1
            print(f"error: {path}:{line}: {exc}", file=sys.stderr)
            # nothing of a result read back stands for this row (WRITTEN_COLUMNS): the
            # results emptied, the model's resolved sizes kept where the row gives them
            record.update({k: "" for k in (*RESULT_COLUMNS, "parameters")})
            record.update({k: "" for k in RESOLVED_COLUMNS if not row.get(k)})
            record["error"] = str(exc)
        results.append(record)
    # recommend's own results (its search's) are not this prediction's: left out
    stale = ("evaluated", "objective")
    for record in results:
        for key in stale:
            record.pop(key, None)
    columns = [c for c in header if c not in stale] + [
        c for c in (*RESULT_COLUMNS, *RESOLVED_COLUMNS, "error") if c not in header]
    if as_json:  # a result a failed row lacks is null (empty in the CSV)
        missing = {*RESULT_COLUMNS, *RESOLVED_COLUMNS}
        nulled = [{k: None if k in missing and v == "" else v for k, v in r.items()}
                  for r in results]
        text = json_text(document("predict.batch", {"rows": nulled}))
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(results)
        text = buffer.getvalue()
    if out:
        write_atomic(out, text, what="results")
        print(f"wrote {len(results)} rows ({failures} failed) to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return failures
