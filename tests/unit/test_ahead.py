"""Work run ahead in a child process (perfmodel.ahead): the results are the jobs' own, whether the
child gives them or this process computes them; a cold cache, a failed job or a child busy with
work nobody needs fall back to computing here; recommend's explanation is the same either way."""

from __future__ import annotations

import os
import time

import pytest

from perfmodel import evaluate, load_hardware, load_model
from perfmodel.ahead import Ahead
from perfmodel.recommend import best_without, recommend
from perfmodel.search import SearchRequest
from tests.conftest import wait_for


@pytest.fixture()
def forks(monkeypatch, tmp_path):
    """Children may be forked (as in the CLI: one thread), the disk cache a fresh directory."""
    if not hasattr(os, "fork") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("no child process here (one CPU, or no fork)")
    monkeypatch.setattr(evaluate, "_can_fork", lambda: True)
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PERFMODEL_NO_CACHE", raising=False)
    yield tmp_path


def _here() -> str:
    raise AssertionError("computed here, not given by the child")


def test_the_child_gives_each_result_in_order(forks):
    ahead = Ahead([("a", lambda: {"plan": "x", "objective": 1.5}), ("b", lambda: None),
                   ("c", lambda: [os.getpid()])])
    assert ahead.pid is not None
    assert ahead.get("a", _here, needed=("b", "c")) == {"plan": "x", "objective": 1.5}
    assert ahead.get("b", _here, needed=("c",)) is None
    pid = ahead.get("c", _here)[0]
    assert pid != os.getpid()  # computed in the child
    ahead.stop()
    assert ahead.pid is None and ahead.read is None


def test_a_job_the_child_has_not_reached_is_computed_here_beside_it(forks, tmp_path):
    """The child on a needed job before it: the later job is computed here meanwhile (waiting
    would take both jobs' time), and the child keeps on with the needed one."""
    go = tmp_path / "go"

    def first() -> int:  # ends only once this process has computed the second job
        while not go.exists():
            time.sleep(0.01)
        return os.getpid()

    ahead = Ahead([("first", first), ("second", lambda: "child")])
    assert ahead.get("second", lambda: "here", needed=("first",)) == "here"
    assert ahead.pid is not None  # kept: it is on a job still needed
    go.touch()
    assert ahead.get("first", _here) != os.getpid()  # the child's
    assert ahead.get("second", _here) == "here"  # asked again: the same result, not recomputed
    ahead.stop()


def test_what_the_child_cannot_give_is_computed_here(forks):
    def cold() -> str:
        return evaluate.cached("not-there", _here)  # the child reads the cache only

    ahead = Ahead([("fine", lambda: 1), ("cold", cold), ("after", lambda: 3)])
    assert ahead.get("fine", _here) == 1
    # the child waits for a module nobody builds: stopped, and its job computed here
    assert ahead.get("cold", lambda: "here") == "here"
    assert ahead.waiting is not None and ahead.waiting.endswith("-not-there.py")
    assert ahead.get("after", lambda: "here too") == "here too"
    assert ahead.pid is None
    assert ahead.get("unknown", lambda: 4) == 4


def test_a_module_the_child_lacks_is_waited_for_until_this_process_files_it(forks):
    """The child's search needs a module the cold cache lacks: it waits, and goes on once this
    process (which builds its own search's modules anyway) has filed it."""
    def job() -> int:
        return evaluate.cached("later", _here)["X"]

    ahead = Ahead([("job", job)])
    wait_for(lambda: ahead._drain(block=False) or ahead.waiting, "the child waits")
    assert ahead.waiting.endswith("-later.py") and "job" not in ahead.results
    assert evaluate.cached("later", lambda: "X = 7\n")["X"] == 7  # built and filed here
    assert ahead.get("job", _here) == 7  # the child's, not computed here
    assert ahead.waiting is None


def test_a_job_of_builds_builds_the_module_it_lacks_in_the_child(forks):
    """A job of a family this process builds no module of (an FP8 search's bf16 twin) builds
    what the cold cache lacks in the child, beside this process, instead of waiting for this
    process to end its own search and build it; the other jobs still only wait."""
    def job() -> tuple[int, int]:
        return evaluate.cached("theirs", lambda: f"X = {os.getpid()}\n")["X"], os.getpid()

    def other() -> int:
        return evaluate.cached("ours", _here)["Y"]

    ahead = Ahead([("job", job), ("other", other)], builds={"job"})
    built_by, child = ahead.get("job", _here, needed=("other",))
    assert built_by == child != os.getpid()  # built, filed and read in the child
    assert (forks / f"{evaluate._source_hash()}-theirs.py").is_file()
    wait_for(lambda: ahead._drain(block=False) or ahead.waiting, "the other job waits")
    assert ahead.waiting.endswith("-ours.py")  # not built there: this process's to build
    assert evaluate.cached("ours", lambda: "Y = 5\n")["Y"] == 5
    assert ahead.get("other", _here) == 5
    ahead.stop()


def test_a_waiting_child_whose_parent_has_gone_ends(forks):
    """A child left waiting (its parent killed before stopping it) does not wait for ever."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # the parent that goes: its child waits for a module nobody will build
        try:
            os.close(read)
            ahead = Ahead([("job", lambda: evaluate.cached("never", _here))])
            wait_for(lambda: ahead._drain(block=False) or ahead.waiting, "the child waits")
            os.write(write, str(ahead.pid).encode())
        finally:
            os._exit(0)  # no exit handlers: the child is not stopped
    os.close(write)
    with os.fdopen(read) as pipe:
        child = int(pipe.read())
    os.waitpid(middle, 0)
    wait_for(lambda: _ended(child), "the orphaned child ends")


def _ended(pid: int) -> bool:
    """No such process, or a zombie nobody has collected yet (the reaper is not ours)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_busy_with_an_unneeded_job_is_stopped(forks):
    ahead = Ahead([("slow", lambda: time.sleep(3600)), ("wanted", lambda: 1)])
    pid = ahead.pid
    assert ahead.get("wanted", lambda: "here", needed=()) == "here"
    assert ahead.pid is None
    with pytest.raises(ProcessLookupError):  # stopped and collected
        os.kill(pid, 0)


def test_no_child_where_none_may_be_forked(monkeypatch):
    monkeypatch.setattr(evaluate, "_can_fork", lambda: False)
    ahead = Ahead([("a", _here)])
    assert ahead.pid is None
    assert ahead.get("a", lambda: 2) == 2


def test_recommend_explains_the_same_with_the_search_run_ahead(forks, monkeypatch):
    """A mixture of experts whose best plan takes ep (the search without it run ahead): the
    explanation's best plan without ep is the search's own, and the same as without a child."""
    model, hw = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    req = SearchRequest(gpus=(16,), global_batch=64)
    recommend(model, hw, req, top=1, prune=True)  # fills the cache: the child reads it
    forked = []
    original = Ahead.__init__

    def init(self, jobs, builds=()):
        original(self, jobs, builds)
        forked.append(self.pid)

    monkeypatch.setattr(Ahead, "__init__", init)
    rec = recommend(model, hw, req, top=1, prune=True)
    assert forked and forked[0] is not None
    wins = {w["axis"]: w for w in rec.explanation["parallelism"]}
    alt = best_without(model, hw, rec.result.request, "ep")
    assert alt is not None and wins["ep"]["best_without"] == alt["plan"]
    assert wins["ep"]["objective_without"] == alt["objective"]
    monkeypatch.setattr(evaluate, "_can_fork", lambda: False)
    assert recommend(model, hw, req, top=1, prune=True).explanation == rec.explanation


def test_a_child_stopped_before_it_has_its_own_handlers_never_runs_the_parents_code(
        forks, monkeypatch):
    """A child stopped at once (recommend refuses its input and stops the child it has just
    forked) may get the SIGTERM before it has set its own handler: the parent's handler (the
    CLI's raises) then raised in the child, which went on in its copy of the parent's code (the
    CLI, or a test runner's loop: a second runner its parent waited for, for ever). The signals
    are held from the fork until the child's handlers are set; here the child is slowed before
    them, and must end by the SIGTERM, not in the parent's code."""
    import signal

    me = os.getpid()

    class Stop(Exception):
        pass

    def raise_stop(signum, frame):
        raise Stop

    real_getppid = os.getppid
    asleep = forks / "asleep"

    def slow_getppid():  # the child's first call, before its handlers: the SIGTERM lands here
        if os.getpid() != me:
            asleep.touch()
            time.sleep(1.0)
        return real_getppid()

    monkeypatch.setattr(os, "getppid", slow_getppid)
    previous = signal.signal(signal.SIGTERM, raise_stop)
    try:
        try:
            ahead = Ahead([("job", lambda: 1)])
        finally:
            if os.getpid() != me:
                os._exit(99)  # the child, in the parent's code
        pid = ahead.pid
        assert pid is not None
        wait_for(asleep.exists, "the child has reached its first call")
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        ahead.pid = None
        ahead._close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, \
        os.waitstatus_to_exitcode(status)


def test_an_fp8_recommend_explains_the_same_with_its_bf16_twin_built_in_the_child(forks,
                                                                                monkeypatch):
    """An FP8 search's bf16 twin is of families the parent builds no module of: on a cold
    cache the child builds them (before 2026-12-07 it waited for the parent to end its search
    and build them after: DeepSeek-V3 on 256 GB200, 7.0 s -> 4.9 s); the explanation is the
    same as without a child."""
    from perfmodel.strategy import Dtype

    model, hw = load_model("llama2-7b"), load_hardware("dgx-h100")
    req = SearchRequest(gpus=(8,), global_batch=16, dtype=Dtype.FP8)
    made = []
    original = Ahead.__init__

    def init(self, jobs, builds=()):
        original(self, jobs, builds)
        made.append((self.pid, set(self.builds)))

    monkeypatch.setattr(Ahead, "__init__", init)
    rec = recommend(model, hw, req, top=1, prune=True)  # a cold cache: forks's fresh directory
    assert made and made[0][0] is not None and made[0][1] == {"fp8"}
    assert rec.explanation["fp8"]["best_bf16_plan"] is not None
    monkeypatch.setattr(evaluate, "_can_fork", lambda: False)
    assert recommend(model, hw, req, top=1, prune=True).explanation == rec.explanation
