"""The documentation builds (`mkdocs build --strict`, offline) and its pages say what they must."""

from __future__ import annotations

import html
import re


def page_text(site, name: str) -> str:
    """The visible text of a page's article."""
    raw = (site / name / "index.html").read_text(encoding="utf-8") if name else (
        site / "index.html").read_text(encoding="utf-8")
    body = raw[raw.index("<article"):raw.index("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def test_build_is_strict_and_offline(site):
    pages = {p.parent.name for p in site.glob("*/index.html")}
    assert {"cli", "specs", "presets", "model", "accuracy"} <= pages
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def test_included_readme_sections_are_in_the_pages(site):
    """The README sections the docs include (snippets) arrived, not their markers."""
    accuracy = page_text(site, "accuracy")
    assert "Mean absolute error" in accuracy and "gpt-530b" in accuracy
    assert "Fits of the shared nccl-tests logs" in accuracy
    assert "Issue 4's target" in accuracy
    assert "Megatron-LM's implementation" in page_text(site, "model")
    for name in ("accuracy", "model"):
        assert "--8<--" not in page_text(site, name)


def test_generated_pages_are_filled(site):
    cli = page_text(site, "cli")
    assert "generated:" not in cli and "perfmodel calibrate import-nccl-tests" in cli
    specs = page_text(site, "specs")
    assert "generated:" not in specs and "NVL576 is the largest NVLink domain" in specs
    presets = page_text(site, "presets")
    assert "generated:" not in presets and "dgx-h100" in presets and "H100 SXM datasheet" in presets
