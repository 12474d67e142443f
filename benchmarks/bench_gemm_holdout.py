"""Hold-out error of the GEMM efficiency model on the published GPU sweeps (issue 3, item 4).

    python benchmarks/bench_gemm_holdout.py [TABLE.csv ...] [--folds 5] [--seeds 0 1 2] [--csv OUT]

For each GPU and dtype of each XLA matmul table (tests/data/gemm by default, and the earlier
H100/B200 campaigns of ../shared/data/gemm when that directory is there), the model of
calibration.fit.GemmModel is fitted on (folds-1)/folds of the shapes and predicts the rest; the
table gives the median and worst relative error over all held-out shapes, per seed of the split,
with the terms the fit on the whole sweep chose (split-K threshold, large-tile kernel switch,
epilogue). Target: a median of at most 10% per GPU and dtype.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.fit import GemmModel, holdout_error  # noqa: E402
from calibration.gemm_tables import (  # noqa: E402
    bytes_per_element,
    device_info,
    output_bytes_per_element,
    peak_for,
    read_gemm_table,
)

TARGET = 0.10


def default_tables() -> list[Path]:
    tables = sorted((ROOT / "tests/data/gemm").glob("xla-matmul-perf-table-*.csv"))
    earlier = ROOT.parent / "shared/data/gemm/xla-matmul-perf-table-h100-b200-earlier-campaigns.csv"
    return tables + ([earlier] if earlier.exists() else [])


def sweeps(path: Path):
    table = read_gemm_table(path)
    keys = ["device", "dtype"] + (["source_commit"] if "source_commit" in table else [])
    for key, rows in table.groupby(keys, sort=False):
        yield dict(zip(keys, key, strict=True)), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="*", type=Path, help="GEMM tables (default: see above)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--csv", type=Path, help="write the rows as CSV")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 110))
    table = Table(title="GEMM model: error on held-out shapes")
    for col in ("device", "dtype", "median", "worst", "split-K ratio", "large kernel from",
                "epilogue [ps/elem]", "fit [s]"):
        table.add_column(col, justify="left" if col in ("device", "dtype") else "right")
    rows = []
    for path in args.tables or default_tables():
        for key, sweep in sweeps(path):
            dtype = key["dtype"]
            peak, _ = peak_for(key["device"], dtype)
            bw = device_info(key["device"])["memory_bandwidth_bytes_per_s"]

            def make(peak=peak, bw=bw, dtype=dtype) -> GemmModel:
                return GemmModel(peak, bw, bytes_per_element(dtype),
                                 output_bytes_per_element(dtype))

            start = time.perf_counter()
            errs = [holdout_error(sweep, make, folds=args.folds, seed=s) for s in args.seeds]
            whole = make().fit(sweep).params_
            wall = time.perf_counter() - start
            row = {
                "table": path.name, **key, "shapes": len(sweep),
                "median_rel_error": statistics.median(e["median_rel_error"] for e in errs),
                "worst_rel_error": max(e["worst_rel_error"] for e in errs),
                "split_k_ratio": whole["split_k_ratio"], "large_flops": whole["large_flops"],
                "epilogue_s": whole["epilogue_s"], "wall_s": wall,
            }
            rows.append(row)
            med = row["median_rel_error"]
            table.add_row(
                key["device"], dtype + (f" @{key['source_commit'][:8]}" if "source_commit" in key
                                        else ""),
                f"[{'green' if med <= TARGET else 'red'}]{med:.1%}[/]",
                f"{row['worst_rel_error']:.0%}",
                f"{row['split_k_ratio']:g}" if row["split_k_ratio"] else "-",
                f"2^{math.log2(row['large_flops']):.0f} FLOP" if row["large_flops"] else "-",
                f"{row['epilogue_s'] * 1e12:.2f}", f"{wall:.1f}",
            )
    console.print(table)
    within = sum(r["median_rel_error"] <= TARGET for r in rows)
    console.print(f"{within} of {len(rows)} sweeps within {TARGET:.0%} (median over the held-out "
                  f"shapes; seeds {args.seeds}, {args.folds} folds)")
    if args.csv:
        from perfmodel.files import write_atomic

        write_atomic(args.csv, pd.DataFrame(rows).to_csv(index=False), what="CSV")
        console.print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
