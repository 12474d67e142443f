"""Fuzz the spec and log parsers for a bounded time (issue 8): every input must either parse or
raise a PerfmodelError (one clear line); any other exception is a crash, printed with the input that
caused it so it can become a regression test.

Run: python benchmarks/fuzz_parsers.py [--seconds 60]
Uses hypothesis to generate structured and mutated inputs: YAML/JSON spec texts (hardware, model,
layer graph, plan CSV rows) and nccl-tests logs (a real log with lines dropped, duplicated, cut or
garbled).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import FlakyStrategyDefinition
from hypothesis import strategies as st

from perfmodel.errors import PerfmodelError

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nvls-together-nccl-tests.txt"
HARDWARE = (ROOT / "perfmodel/specs/presets/hardware/dgx-h100.yaml").read_text()
MODEL = (ROOT / "perfmodel/specs/presets/models/llama3-8b.yaml").read_text()

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner,
                                                                       max_size=4)), max_leaves=12)
FIELDS = ["layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden", "kind", "base",
          "gpus_per_node", "peak_flops_per_s", "memory_bytes", "intra_node", "inter_node",
          "gemm_efficiency", "collectives", "norm", "gated_mlp", "layers_list"]


def mutate_lines(text: str, data: st.DataObject) -> str:
    lines = text.splitlines()
    for _ in range(data.draw(st.integers(0, 8))):
        if not lines:
            break
        i = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "dup", "cut", "garble", "swap"]))
        if action == "drop":
            lines.pop(i)
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][: data.draw(st.integers(0, max(len(lines[i]), 1)))]
        elif action == "garble":
            lines[i] = data.draw(st.text(max_size=40))
        else:
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


crashes: list[tuple[str, str]] = []


def check(kind: str, text: str, suffix: str, load) -> None:  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"input{suffix}"
        path.write_bytes(text.encode("utf-8", errors="replace"))
        try:
            load(path)
        except PerfmodelError:
            pass
        except Exception:  # a crash: keep the input
            crashes.append((kind, text))
            print(f"CRASH in {kind}:\n{traceback.format_exc()}\ninput:\n{text[:2000]}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model

    from calibration.nccl_tests import parse_nccl_tests as parse_log

    deadline = time.monotonic() + args.seconds / 4
    budget = settings(deadline=None, max_examples=10**6, suppress_health_check=list(HealthCheck),
                      database=None, phases=[Phase.generate])

    class OutOfTime(Exception):
        """Raised to end a hypothesis run when its share of the time is spent."""

    def out_of_time() -> bool:
        if time.monotonic() > deadline:
            raise OutOfTime
        return False

    @budget
    @given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=8))
    def fuzz_model_json(doc: dict) -> None:
        if out_of_time():
            return
        check("model spec (json)", json.dumps(doc, default=str), ".json", load_model)

    @budget
    @given(st.data())
    def fuzz_hardware_yaml(data: st.DataObject) -> None:
        if out_of_time():
            return
        check("hardware spec (yaml)", mutate_lines(HARDWARE, data), ".yaml", load_hardware)

    @budget
    @given(st.data())
    def fuzz_model_yaml(data: st.DataObject) -> None:
        if out_of_time():
            return
        check("model spec (yaml)", mutate_lines(MODEL, data), ".yaml", load_model)

    @budget
    @given(st.data())
    def fuzz_nccl_log(data: st.DataObject) -> None:
        if out_of_time():
            return
        check("nccl-tests log", mutate_lines(LOG.read_text(), data), ".txt", parse_log)

    start = time.monotonic()
    for fuzz in (fuzz_model_json, fuzz_hardware_yaml, fuzz_model_yaml, fuzz_nccl_log):
        deadline = time.monotonic() + args.seconds / 4
        try:
            fuzz()
        except (OutOfTime, FlakyStrategyDefinition):  # the time limit, seen by hypothesis' replay
            pass
    print(f"fuzzed for {time.monotonic() - start:.0f} s: {len(crashes)} crash(es)")
    raise SystemExit(1 if crashes else 0)


if __name__ == "__main__":
    main()
