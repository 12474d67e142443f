"""docs/accuracy-runs.md is what benchmarks/bench_accuracy.py prints for the model as it is (issue
16, item 8: the docs' accuracy page is generated from the benchmark). A change that moves a
published run's prediction regenerates the page in the same commit:
    python benchmarks/bench_accuracy.py --markdown docs/accuracy-runs.md
The repository's copies of the shared data (tests/data/accuracy, tests/data/nccl-tests) are the
ones the page is generated from, so CI and a fresh checkout compare against the same rows."""

from __future__ import annotations

from benchmarks import bench_accuracy as B
from tests.conftest import ROOT


def test_the_generated_accuracy_page_is_current():
    data = ROOT / "tests" / "data"
    rows = B.published_rows(data / "accuracy") + B.table5_rows()
    page = B.markdown(rows, B.nccl_rows(data / "nccl-tests"))
    committed = (ROOT / B.GENERATED_PAGE).read_text(encoding="utf-8")
    assert committed == page, ("docs/accuracy-runs.md is stale: run python benchmarks/"
                               "bench_accuracy.py --markdown docs/accuracy-runs.md")


def test_the_accuracy_page_links_the_generated_tables():
    assert "accuracy-runs.md" in (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
