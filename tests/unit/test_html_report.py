"""predict --html / recommend --html: one self-contained page that renders in a real browser.

Rendered in headless Chromium (Debian's package, /usr/bin/chromium; .ci/run installs it): the
DOM after load holds the expected sections, every image drew, the page's own script recorded no
error and no refused fetch (its Content-Security-Policy refuses any network access), Chromium
logged no console message, and the screenshot is not blank. Each browser run is waited on to its
exit, never on a fixed sleep.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PATIENCE_S

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium to render the report "
           "(apt-get install -y chromium; .ci/run does it)")

MODEL, HARDWARE = "llama3-8b", "dgx-h100"
PREDICT = ("predict", "--model", MODEL, "--hardware", HARDWARE, "--pp", "4", "--tp", "2",
           "--dp", "2", "--global-batch", "32", "--schedule", "interleaved",
           "--virtual-stages", "2")
RECOMMEND = ("recommend", "--model", MODEL, "--hardware", HARDWARE, "--gpus", "16",
             "--global-batch", "64")


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on a local page to its exit (its own fresh profile, no network
    services); stderr carries its log, console messages included."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         *args, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=PATIENCE_S, check=False)


def render(tmp_path: Path, page: Path) -> tuple[str, str, Path]:
    """(the DOM after load, the browser's console lines, a screenshot's path)."""
    dom = chromium(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    snap = chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2400",
                    "--hide-scrollbars")
    assert snap.returncode == 0 and shot.exists(), snap.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() + snap.stderr.splitlines()
               if "CONSOLE" in line or "Uncaught" in line]
    return dom.stdout, "\n".join(console), shot


def assert_not_blank(shot: Path) -> None:
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)[..., :3]
    drawn = (pixels < 0.9).any(axis=-1).mean()  # share of pixels that are not (near) white
    assert pixels.std() > 0.02 and drawn > 0.02, (pixels.std(), drawn)


def assert_rendered(dom: str, console: str, ids: tuple[str, ...], images: int) -> None:
    root = re.search(r"<html[^>]*>", dom)
    assert root is not None
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', root.group(0)))
    assert attrs.get("data-rendered") == "yes", attrs
    assert "data-errors" not in attrs, attrs["data-errors"]
    drawn, total = map(int, attrs["data-images"].split("/"))
    assert drawn == total >= images
    for ident in ids:
        assert f'id="{ident}"' in dom, ident
    assert console == ""


def offline(text: str) -> None:
    """Nothing the page loads comes from elsewhere: no remote src, href or url()."""
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", text)
    assert "<link" not in text


def test_the_predict_report_is_self_contained(run_cli, tmp_path):
    out = run_cli(*PREDICT, "--html", "report.html")
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "report.html").read_text()
    offline(text)
    assert "Content-Security-Policy" in text and "data:image/png;base64," in text


def test_the_recommend_report_says_time_to_train_and_cost(run_cli, tmp_path):
    out = run_cli(*RECOMMEND, "--tokens", "1e12", "--gpu-hour-price", "2.5", "--html",
                  "report.html", "--json")
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "report.html").read_text()
    offline(text)
    for header in ("GPUs", "time to train", "GPU-hours", "cost"):
        assert f"<th>{header}</th>" in text, header
    best = json.loads(out.stdout)["plans"][0]
    assert f"{best['gpu_hours']:,.0f}" in text  # the JSON's number, as the table prints it


@needs_chromium
def test_the_predict_report_renders_in_chromium(run_cli, tmp_path):
    out = run_cli(*PREDICT, "--html", "report.html")
    assert out.returncode == 0, out.stderr
    dom, console, shot = render(tmp_path, tmp_path / "report.html")
    assert_rendered(dom, console, ("title", "plan-table", "summary-cards", "breakdown-table",
                                   "breakdown-chart", "memory-table", "memory-chart",
                                   "timeline-chart"), images=3)
    assert MODEL in dom and "interleaved" in dom
    assert_not_blank(shot)


@needs_chromium
def test_the_recommend_report_renders_in_chromium(run_cli, tmp_path):
    out = run_cli(*RECOMMEND, "--html", "report.html")
    assert out.returncode == 0, out.stderr
    offline((tmp_path / "report.html").read_text())
    dom, console, shot = render(tmp_path, tmp_path / "report.html")
    assert_rendered(dom, console, ("plans-table", "plan-table", "breakdown-table",
                                   "memory-table", "timeline-chart", "runner-up-table",
                                   "pareto-chart", "curve-table"), images=4)
    assert_not_blank(shot)


@needs_chromium
def test_a_page_that_reaches_out_is_caught(tmp_path):
    # the checks above can fail: a remote image is refused by the page's policy, and both the
    # page's own record and Chromium's console say so
    from perfmodel.htmlreport import page

    path = tmp_path / "bad.html"
    path.write_text(page("bad", "a remote image", [
        ("remote", "remote", '<img id="x" src="https://example.invalid/x.png">')]))
    dom, console, _ = render(tmp_path, path)
    assert "data-errors" in dom and "refused" in dom
    assert "Content Security Policy" in console
    with pytest.raises(AssertionError):
        offline(path.read_text())


def test_the_report_names_every_parallel_degree_of_a_mixture_of_experts(run_cli, tmp_path):
    """An MoE plan's header gives ep and etp (expert tensor parallelism) beside dp, tp and pp:
    two plans that differ only in etp must not read alike."""
    plan = ("predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--gpus", "8",
            "--dp", "4", "--tp", "2", "--ep", "4", "--sequence-parallel", "--global-batch", "8")
    for etp, expected in (("2", "dp=4 tp=2 pp=1 ep=4 etp=2,"), ("1", "dp=4 tp=2 pp=1 ep=4,")):
        out = run_cli(*plan, "--etp", etp, "--html", f"report{etp}.html")
        assert out.returncode == 0, out.stderr
        assert expected in (tmp_path / f"report{etp}.html").read_text()


def test_the_recommend_report_says_what_fp8_and_context_parallelism_do(run_cli, tmp_path):
    """The report gives what the terminal and --json give: whether FP8 makes the best plan win
    (and the plan FP8 weights make faster), and what context parallelism does for it; a search
    in bf16 without cp or ep has no such section."""
    out = run_cli("recommend", "--model", MODEL, "--hardware", HARDWARE, "--gpus", "64",
                  "--global-batch", "512", "--dtype", "fp8", "--html", "report.html", "--json")
    assert out.returncode == 0, out.stderr
    why = json.loads(out.stdout)["explanation"]
    text = (tmp_path / "report.html").read_text()
    section = re.search(r'id="wins".*?</section>', text, re.S)
    assert section is not None and why["parallelism"]
    for line in (why["fp8"]["says"], *(w["note"] for w in why["parallelism"])):
        assert f"<li>{html.escape(line)}</li>" in section.group(0)
    out = run_cli("recommend", "--model", MODEL, "--hardware", HARDWARE, "--gpus", "64",
                  "--global-batch", "512", "--cp", "1", "--html", "plain.html")
    assert out.returncode == 0, out.stderr
    assert 'id="wins"' not in (tmp_path / "plain.html").read_text()
