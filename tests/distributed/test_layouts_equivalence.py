"""2D (SUMMA), 3D and Pr x Pc layouts against a single-process reference, on gloo ranks.

Two launches do all the numerical checks (one of 4 ranks: 2D 2x2 and Pr x Pc 2x2, 1x4, 4x1 for the
MLP and the CNN; one of 8 ranks: 3D 2x2x2); a third times a layout through the module CLI. Every
rank compares the output, the input gradient and the gradient of every parameter piece it holds
with the same piece of the reference (fp32, rtol 1e-4, atol 1e-5), and logs its collectives, which
are checked here against the per-process counts and bytes of each layout's docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from perfmodel.errors import PlanError  # noqa: E402
from tests.conftest import PATIENCE_S  # noqa: E402
from workload.layouts import harness  # noqa: E402

pytestmark = pytest.mark.distributed
F32 = 4


def _leftovers(needle: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _suite(tmp: Path, nprocs: int) -> list[list[dict]]:
    out = tmp / f"checks{nprocs}.json"
    wall = harness.launch(["--check", "--json", str(out)], nprocs, tmp / "logs",
                          timeout_s=PATIENCE_S)  # its end; the bound is for a hang
    print(f"{nprocs} ranks: {wall:.1f} s")
    assert _leftovers(str(out)) == []
    return [json.loads((tmp / f"checks{nprocs}.rank{r}.json").read_text()) for r in range(nprocs)]


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _suite(tmp_path_factory.mktemp("four"), 4)


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    return _suite(tmp_path_factory.mktemp("eight"), 8)


def _ids(nprocs: int) -> list[str]:
    return [
        f"{layout}-{dims.get('model', 'block')}-{'x'.join(map(str, plan.values()))}"
        for layout, dims, plan in harness.SUITES[nprocs]
    ]


def _assert_equivalent(ranks: list[list[dict]], k: int) -> None:
    for rank, checks in enumerate(ranks):
        c = checks[k]
        bad = [r for r in c["results"] if not r["ok"]]
        assert not bad, f"rank {rank} {c['layout']} {c['plan']}: {bad}"
        # output, input grad, value and grad of every parameter piece, and every gradient gathered
        # back into its full tensor
        names = [r["name"] for r in c["results"]]
        params = [n.removesuffix(".value") for n in names if n.endswith(".value")]
        assert params
        assert {f"{p}.grad.full" for p in params} | {"output.full", "input.grad.full"} <= set(names)


@pytest.mark.parametrize("k", range(len(harness.SUITES[4])), ids=_ids(4))
def test_four_ranks_match_the_reference(four, k):
    _assert_equivalent(four, k)


def test_3d_eight_ranks_matches_the_reference(eight):
    _assert_equivalent(eight, 0)


def _table(check: dict) -> dict[tuple, tuple[float, int]]:
    return {
        (r["tag"], r["phase"], r["op"], r["axis"]): (r["calls"], r["nbytes"])
        for r in check["collectives"]
    }


BLOCK = harness.BLOCK_DIMS
N = BLOCK["batch"] * BLOCK["seq"]
H, FFN = BLOCK["hidden"], BLOCK["ffn"]
SHAPES = {"qkv": (H, 3 * H), "proj": (H, H), "up": (H, FFN), "down": (FFN, H)}


def test_2d_collectives_are_the_optimus_counts(four):
    """Per linear: q broadcasts of X_it (N K / q^2) on "col" and q of W_tj (K M / q^2) on "row"
    forward; backward q + q broadcasts and q + q reduces (Xu et al. 2021, Optimus)."""
    q = 2
    for rank in four:
        t = _table(rank[0])
        for name, (k, m) in SHAPES.items():
            nk, km = N * k // q**2 * F32, k * m // q**2 * F32
            assert t[(name, "fwd", "broadcast", "col")] == (q, nk)
            assert t[(name, "fwd", "broadcast", "row")] == (q, km)
            assert t[(name, "bwd", "broadcast", "col")] == (q, nk)
            assert t[(name, "bwd", "broadcast", "row")] == (q, km)
            assert t[(name, "bwd", "reduce", "col")] == (q, nk)
            assert t[(name, "bwd", "reduce", "row")] == (q, km)
        for ln in ("ln1", "ln2"):
            assert t[(ln, "fwd", "all_reduce", "col")] == (1, 2 * N // q * F32)
            assert t[(ln, "bwd", "all_reduce", "col")] == (1, 2 * N // q * F32)
            assert t[(ln, "bwd", "all_reduce", "row")] == (1, 2 * H // q * F32)
        assert len(t) == 4 * 6 + 2 * 3


def test_3d_collectives_are_gather_gather_reduce_scatter(eight):
    """Per linear: all_gather X on the input axis (N K / q^2), all_gather W on the weight axis
    (K M / q^2), reduce_scatter Y on the output axis (N M / q^2); backward all_gather dY on the
    output axis and reduce_scatter dX, dW on the input and weight axes."""
    q = 2
    roles = {"qkv": "acb", "up": "acb", "proj": "bca", "down": "bca"}  # (input, weight, output)
    for rank in eight:
        t = _table(rank[0])
        for name, (k, m) in SHAPES.items():
            a, w, o = roles[name]
            nk, km, nm = (N * k // q**2 * F32, k * m // q**2 * F32, N * m // q**2 * F32)
            assert t[(name, "fwd", "all_gather", a)] == (1, nk)
            assert t[(name, "fwd", "all_gather", w)] == (1, km)
            assert t[(name, "fwd", "reduce_scatter", o)] == (1, nm)
            assert t[(name, "bwd", "all_gather", o)] == (1, nm)
            assert t[(name, "bwd", "reduce_scatter", a)] == (1, nk)
            assert t[(name, "bwd", "reduce_scatter", w)] == (1, km)
        for ln in ("ln1", "ln2"):
            assert t[(ln, "fwd", "all_reduce", "b")] == (1, 2 * N // q**2 * F32)
            assert t[(ln, "bwd", "all_reduce", "b")] == (1, 2 * N // q**2 * F32)
            assert t[(ln, "bwd", "all_reduce", "a")] == (1, 2 * H // q * F32)
            assert t[(ln, "bwd", "all_reduce", "c")] == (1, 2 * H // q * F32)
        assert len(t) == 4 * 6 + 2 * 4


@pytest.mark.parametrize("k", [1, 2, 3], ids=["2x2", "1x4", "4x1"])
def test_prpc_mlp_collectives_are_the_gholami_counts(four, k):
    """Per layer (d_in -> d_out): all_gather of B/Pc x d_out on pr forward; backward all_reduce of
    B/Pc x d_in on pr and of the (d_out/Pr) x (d_in + 1) weight and bias gradient on pc; an axis
    of size 1 issues nothing (Pr = 1: data parallel, Pc = 1: model parallel)."""
    c = four[0][k]
    pr, pc, batch, widths = (
        c["plan"]["pr"],
        c["plan"]["pc"],
        c["dims"]["batch"],
        c["dims"]["widths"],
    )
    t = _table(c)
    expected = {}
    for layer, (d_in, d_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        tag = f"{2 * layer}:linear"
        if pr > 1:
            expected[(tag, "fwd", "all_gather", "pr")] = (1, batch // pc * d_out * F32)
            # the check's input needs a gradient, so the first layer reduces one too
            expected[(tag, "bwd", "all_reduce", "pr")] = (1, batch // pc * d_in * F32)
        if pc > 1:
            expected[(tag, "bwd", "all_reduce", "pc")] = (1, d_out // pr * (d_in + 1) * F32)
    assert t == expected


def test_prpc_cnn_collectives(four):
    """conv1 3 -> 8 channels on 8x8 images, pr = pc = 2, batch 8."""
    t = _table(four[0][4])
    assert t[("0:conv2d", "fwd", "all_gather", "pr")] == (1, 4 * 8 * 8 * 8 * F32)
    assert t[("0:conv2d", "bwd", "all_reduce", "pr")] == (1, 4 * 3 * 8 * 8 * F32)
    assert t[("0:conv2d", "bwd", "all_reduce", "pc")] == (1, 4 * (3 * 9 + 1) * F32)


def _suite_index(dims: dict, plan: dict) -> int:
    return next(k for k, (_, d, p) in enumerate(harness.SUITES[4]) if d is dims and p == plan)


@pytest.mark.parametrize("how", ["standard", "specialised"])
def test_prpc_layer_narrower_than_pr(four, how):
    """16 -> 2 features on pr = 4 (pc = 1, batch 8): the layer splits over c = 2 processes (ranks
    0, 1); standard: all_gather over all 4 of blocks padded to 2/c = 1 row (8 x 4 x 1 x 4 B) and
    all_reduce of dX (8 x 16 x 4 B) over all 4; specialised: both among ranks 0 and 1, each
    followed by one round of send_recv (0 -> 2, 1 -> 3), as perfmodel's --contributors models."""
    k = _suite_index(harness.NARROW_MLP_DIMS, {"pr": 4, "pc": 1, "contributors": how})
    out, grad = 8 * 2 * F32, 8 * 16 * F32
    for rank, checks in enumerate(four):
        rows = [r for r in checks[k]["collectives"] if r["tag"] == "2:linear"]
        got = {(r["phase"], r["op"], r["group_size"]): (r["calls"], r["nbytes"]) for r in rows}
        if how == "standard":
            want = {
                ("fwd", "all_gather", 4): (1, 8 * 4 * 1 * F32),
                ("bwd", "all_reduce", 4): (1, grad),
            }
        else:
            want = {("fwd", "send_recv", 2): (1, out), ("bwd", "send_recv", 2): (1, grad)}
            if rank < 2:
                want.update(
                    {("fwd", "all_gather", 2): (1, out), ("bwd", "all_reduce", 2): (1, grad)}
                )
        assert got == want, rank


def test_prpc_one_feature_on_pr_2_is_spread_alone(four):
    """16 -> 1 feature on pr = 2 x pc = 2: c = 1, nothing to gather or reduce among one holder; one
    send_recv each way; only the holders (pr coordinate 0: ranks 0, 1) reduce the weight gradient
    (1 x 17 x 4 B) along pc."""
    k = _suite_index(harness.NARROW_MLP1_DIMS, {"pr": 2, "pc": 2, "contributors": "specialised"})
    for rank, checks in enumerate(four):
        t = {key: v for key, v in _table(checks[k]).items() if key[0] == "2:linear"}
        want = {
            ("2:linear", "fwd", "send_recv", "pr"): (1, 4 * 1 * F32),
            ("2:linear", "bwd", "send_recv", "pr"): (1, 4 * 16 * F32),
        }
        if rank < 2:
            want[("2:linear", "bwd", "all_reduce", "pc")] = (1, 17 * F32)
        assert t == want, rank


def test_time_layout_through_the_module_cli(tmp_path):
    out = tmp_path / "t.json"
    dims = {"model": "mlp", "batch": 8, "widths": [16, 32, 8]}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "workload.layouts",
            "--layout",
            "prpc",
            "--plan",
            '{"pr": 2, "pc": 2}',
            "--dims",
            json.dumps(dims),
            "--steps",
            "3",
            "--warmup",
            "1",
            "--json",
            str(out),
            "--nprocs",
            "4",
        ],
        cwd=harness.ROOT,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,  # its exit; the bound is for a hang
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["world_size"] == 4
    for key in ("forward_s", "backward_s", "optimizer_s", "comm_s"):
        assert data[key] > 0, key
    assert data["step_s"] >= data["forward_s"] + data["backward_s"]
    ops = {(c["tag"], c["phase"], c["op"], c["axis"]) for c in data["collectives"]}
    # training: the first layer's input needs no gradient, so no all_reduce of it
    assert ("0:linear", "bwd", "all_reduce", "pr") not in ops
    assert ("2:linear", "bwd", "all_reduce", "pr") in ops
    assert _leftovers(str(out)) == []


@pytest.mark.parametrize(
    ("layout", "plan", "world", "message"),
    [
        ("2d", {}, 8, "q^2"),
        ("3d", {}, 4, "q^3"),
        ("2d", {"q": 3}, 4, "9 ranks"),
        ("prpc", {"pr": 3, "pc": 2}, 4, "pr * pc = 4"),
        ("1d", {}, 4, "layout must be"),
    ],
)
def test_bad_grids_are_plan_errors(layout, plan, world, message):
    with pytest.raises(PlanError, match=message.replace("^", r"\^").replace("*", r"\*")):
        harness.mesh_shape(layout, plan, world)


def test_bad_grid_from_the_cli_is_one_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "workload.layouts",
            "--layout",
            "3d",
            "--json",
            str(tmp_path / "x.json"),
            "--nprocs",
            "4",
        ],
        cwd=harness.ROOT,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert r.returncode == PlanError.exit_code
    assert r.stderr.strip().count("\n") == 0 and "q^3" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_hung_run_is_killed_whole(tmp_path):
    """Timeout: LaunchError, and no rank left running (the process group is killed)."""
    out = tmp_path / "hang.json"
    with pytest.raises(harness.LaunchError, match="timed out"):
        # 2 ranks of a 4-rank world: rendezvous never completes
        harness.launch(
            ["--check", "--json", str(out)], 2, tmp_path / "logs", timeout_s=3, world_size=4
        )
    assert _leftovers(str(out)) == []


def test_a_failed_rank_is_named_with_its_error(tmp_path):
    out = tmp_path / "bad.json"
    with pytest.raises(
        harness.LaunchError, match=r"(?s)rank [01] failed: .*suite runs on \[4, 8\]"
    ):
        harness.launch(["--check", "--json", str(out)], 2, tmp_path / "logs",
                       timeout_s=PATIENCE_S)
    assert _leftovers(str(out)) == []
    assert "Traceback" not in (tmp_path / "logs" / "rank0.log").read_text()
