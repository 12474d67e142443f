"""The one atomic writer (perfmodel.files.write_atomic) and every output the CLI writes through it:
a device, FIFO or directory is refused, a symlink is written through, an existing file keeps its
mode and owner, and a read-only or full disk is one line with exit code 7."""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli import main
from perfmodel.errors import OutputError
from perfmodel.files import write_atomic

EXIT_OUTPUT = 7
ROOT_USER = os.geteuid() == 0


def _char_device(tmp_path: Path) -> Path:
    """A character device of our own (the null device's numbers), never the real /dev/null."""
    if not ROOT_USER:
        pytest.skip("making a device node needs root")
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return node


def test_a_new_file_is_whole_and_has_the_mode_open_would_give(tmp_path):
    target = write_atomic(tmp_path / "a.txt", "hello")
    mask = os.umask(0)
    os.umask(mask)
    assert target.read_text() == "hello"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]  # no temporary file left


def test_an_existing_file_keeps_its_mode_and_owner(tmp_path):
    target = tmp_path / "a.csv"
    target.write_text("old")
    target.chmod(0o640)
    if ROOT_USER:
        os.chown(target, 65534, 65534)  # nobody
    write_atomic(target, "new")
    st = target.stat()
    assert target.read_text() == "new" and stat.S_IMODE(st.st_mode) == 0o640
    if ROOT_USER:
        assert (st.st_uid, st.st_gid) == (65534, 65534)


def test_a_symlink_is_written_through_to_its_target(tmp_path):
    real = tmp_path / "data" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.json"]


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    write_atomic(link, "x")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "x"


@pytest.mark.parametrize("kind", ["directory", "FIFO", "character device", "symlink to a FIFO"])
def test_special_files_are_refused_and_left_alone(tmp_path, kind):
    if kind == "directory":
        target = tmp_path / "d"
        target.mkdir()
    elif kind == "character device":
        target = _char_device(tmp_path)
    else:
        target = tmp_path / "fifo"
        os.mkfifo(target)
        if kind == "symlink to a FIFO":
            link = tmp_path / "link"
            link.symlink_to(target)
    before = os.stat(target).st_mode
    with pytest.raises(OutputError, match=r"refusing to write .*: it is (a|an) "):
        write_atomic(tmp_path / "link" if kind == "symlink to a FIFO" else target, "x")
    assert os.stat(target).st_mode == before  # still the same kind of file


def test_a_missing_directory_is_refused_unless_asked_to_make_it(tmp_path):
    with pytest.raises(OutputError, match="output directory does not exist"):
        write_atomic(tmp_path / "no" / "a.txt", "x")
    assert write_atomic(tmp_path / "no" / "a.txt", "x", make_parents=True).read_text() == "x"


@pytest.mark.parametrize("code, reason", [(errno.EROFS, "the file system is read-only"),
                                          (errno.ENOSPC, "no space left"),
                                          (errno.EACCES, "permission denied")])
def test_disk_errors_are_one_line_and_leave_the_old_file(tmp_path, monkeypatch, code, reason):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OutputError, match=f"cannot write output .*a.txt: {reason}"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


# --- the CLI's outputs --------------------------------------------------------------------------

def run_main(args: list[str]) -> tuple[int, str, str]:
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


LLAMA = ["predict", "--model", "llama2-7b", "--hardware", "dgx-h100"]
REC = ["recommend", "--model", "gpt2-small", "--hardware", "dgx-a100-80gb", "--gpus", "8",
       "--global-batch", "64", "--top", "1"]
SWEEP = ["sweep", "--model", "alexnet", "--hardware", "dgx-v100", "--gpus", "16",
         "--global-batch", "256", "--vary", "peak_flops_per_s=1e14,2e14"]


def _plans(tmp_path: Path) -> Path:
    plans = tmp_path / "plans.csv"
    plans.write_text("dp,tp\n8,1\n")
    return plans


OUTPUTS = {  # command -> the arguments before the output path
    "predict --plot": lambda d: [*LLAMA, "--plot"],
    "predict --trace": lambda d: [*LLAMA, "--trace"],
    "predict --timeline": lambda d: [*LLAMA, "--timeline"],
    "predict --html": lambda d: [*LLAMA, "--html"],
    "recommend --html": lambda d: [*REC, "--html"],
    "predict --batch --out": lambda d: [*LLAMA, "--batch", _plans(d), "--out"],
    "recommend --csv": lambda d: [*REC, "--csv"],
    "recommend --plot": lambda d: [*REC, "--plot"],
    "sweep --csv": lambda d: [*SWEEP, "--csv"],
}


@pytest.mark.parametrize("command", list(OUTPUTS))
@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_cli_outputs_refuse_special_files(tmp_path, command, kind):
    target = tmp_path / "out"
    if kind == "FIFO":
        os.mkfifo(target)
    else:
        target = _char_device(tmp_path)
    # were the FIFO opened, this would block forever: open its other end after a while instead
    unblock = threading.Timer(60, lambda: open(target, "rb").close()) if kind == "FIFO" else None
    if unblock:
        unblock.start()
    try:
        code, _, err = run_main([*OUTPUTS[command](tmp_path), target])
    finally:
        if unblock:
            unblock.cancel()
    assert code == EXIT_OUTPUT, err
    assert err.strip().count("\n") == 0 and err.startswith("error: refusing to write"), err
    assert not stat.S_ISREG(os.stat(target).st_mode)


@pytest.mark.parametrize("command", ["predict --batch --out", "recommend --csv", "sweep --csv"])
def test_cli_outputs_write_through_symlinks_and_keep_modes(tmp_path, command):
    real = tmp_path / "real.csv"
    real.write_text("old")
    real.chmod(0o600)
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    code, _, err = run_main([*OUTPUTS[command](tmp_path), link])
    assert code == 0, err
    assert link.is_symlink() and real.read_text().startswith(("dp,", "gpus,", "peak_flops"))
    assert stat.S_IMODE(real.stat().st_mode) == 0o600


def test_cli_a_full_disk_is_one_line_and_exit_7(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "r.csv"
    out.write_text("old")
    code, _, err = run_main([*REC, "--csv", out])
    assert code == EXIT_OUTPUT and err.strip().splitlines() == [
        f"error: cannot write plans CSV {out}: no space left on device"]
    assert out.read_text() == "old"
