"""The documentation builds (`mkdocs build --strict`, offline) and its pages say what they must."""

from __future__ import annotations

import html
import re
from pathlib import Path

from tests.docs.samples import DOC_FILES


def page_text(site, name: str) -> str:
    """The visible text of a page's article."""
    raw = (site / name / "index.html").read_text(encoding="utf-8") if name else (
        site / "index.html").read_text(encoding="utf-8")
    body = raw[raw.index("<article"):raw.index("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def test_build_is_strict_and_offline(site):
    pages = {p.parent.name for p in site.glob("*/index.html")}
    assert {Path(page).stem for page in DOC_FILES[2:]} <= pages  # the nav's pages after index.md
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def test_the_pages_say_what_moved_there_from_the_readme(site):
    """The sections the README once held arrived in the built pages, one phrase of each."""
    accuracy = page_text(site, "accuracy")
    assert "Mean absolute error" in accuracy and "gpt-530b" in accuracy
    assert "Fits of the shared nccl-tests logs" in accuracy
    assert "a suite of at" in accuracy and "What closed the gap" in accuracy
    model = page_text(site, "model")
    assert "Megatron-LM's implementation" in model and "contributors_crossover_bytes" in model
    assert "GMLake" in model and "Narayanan et al. (SC21)" in model
    assert "stage layers" in page_text(site, "calibration")
    assert "torch.distributed.pipelining" in page_text(site, "validation")
    assert "billion laughs" in page_text(site, "robustness")
    assert "PERFMODEL_CACHE_DIR" in page_text(site, "performance")
    assert "GPUs per node" in page_text(site, "cli")  # the exit codes, with their examples
    for page in site.glob("*/index.html"):
        assert "--8<--" not in page_text(site, page.parent.name), page


def test_generated_pages_are_filled(site):
    cli = page_text(site, "cli")
    assert "generated:" not in cli and "perfmodel calibrate import-nccl-tests" in cli
    specs = page_text(site, "specs")
    assert "generated:" not in specs and "NVL576 is the largest NVLink domain" in specs
    presets = page_text(site, "presets")
    assert "generated:" not in presets and "dgx-h100" in presets and "H100 SXM datasheet" in presets
