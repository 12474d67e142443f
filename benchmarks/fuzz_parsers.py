"""Fuzz the spec and log parsers for a bounded time (issue 8): every input must either parse or
raise a PerfmodelError (one clear line); any other exception is a crash, printed with the input that
caused it so it can become a regression test (tests/unit/test_fuzz_regressions.py).

Run: python benchmarks/fuzz_parsers.py [--seconds 120] [--only NAME ...]
Targets (hypothesis generates structured inputs and mutates real files: lines dropped, duplicated,
cut, garbled, swapped, or a YAML tag that would run code under an unsafe loader):
  specs: model spec (JSON dicts, YAML, TOML), Hugging Face config.json, layer graph, hardware spec
  (YAML, JSON dicts), plan CSV (predict --batch)
  logs: nccl-tests logs (plain, mpirun --tag-output, -J JSON; parsed, and imported with a cut
  allowed), GEMM sweep CSVs, calibration profiles (JSON dicts and mutated files)
The time is shared equally between the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyStrategyDefinition

from perfmodel.errors import PerfmodelError

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "perfmodel/specs/presets"
LOG = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nvls-together-nccl-tests.txt"
TAGGED = ROOT / "tests/data/nccl-tests/derived/h100x16-2node-a3mega-allreduce.tag-output.log"
NCCL_JSON = ROOT / "tests/data/nccl-tests/derived/h100x8-allreduce-nvls-together.json"
GEMM = ROOT / "tests/data/gemm/xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"
DEEPGEMM = ROOT / "tests/data/gemm/h800-fp8-deepgemm-deepseek-v3-shapes.csv"
GRAPH = ROOT / "tests/data/cnn/alexnet.json"
HARDWARE = (PRESETS / "hardware/dgx-h100.yaml").read_text()
MODEL = (PRESETS / "models/llama3-8b.yaml").read_text()
HF_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
             "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}
HF_SEQ_LEN = 2048
PLANS = ("gpus,dp,tp,pp,micro_batch,global_batch,schedule,virtual_stages,recompute,zero,layers\n"
         "8,8,1,1,1,8,1f1b,1,none,1,\n8,1,8,1,1,4,gpipe,1,full,0,\n"
         "8,2,2,2,1,8,interleaved,2,selective,1,16\n")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner,
                                                                       max_size=4)), max_leaves=12)
MODEL_FIELDS = ["layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden", "kind",
                "base", "norm", "gated_mlp", "tied_embeddings", "position_embedding", "name"]
HARDWARE_FIELDS = ["base", "gpus_per_node", "peak_flops_per_s", "memory_bytes", "intra_node",
                   "inter_node", "gemm_efficiency", "collectives", "memory_bandwidth_bytes_per_s",
                   "collective_algorithm", "kernel_overhead_s", "name"]
PROFILE_FIELDS = ["format", "version", "complete", "hardware", "fits", "measurements",
                  "provenance"]
UNSAFE_YAML = "!!python/object/apply:os.system ['echo pwned']"


def mutate_lines(text: str, draw: Callable[[Any], Any]) -> str:
    """text with up to 8 lines dropped, duplicated, cut, garbled, swapped or given a YAML tag
    (draw: hypothesis' draw function)."""
    lines = text.splitlines()
    for _ in range(draw(st.integers(0, 8))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "dup", "cut", "garble", "swap", "tag"]))
        if action == "drop":
            lines.pop(i)
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]), 1)))]
        elif action == "garble":
            lines[i] = draw(st.text(max_size=40))
        elif action == "tag":  # a YAML tag that only an unsafe loader would execute
            head, sep, _ = lines[i].partition(":")
            lines[i] = f"{head}{sep} {UNSAFE_YAML}" if sep else UNSAFE_YAML
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def mutate_doc(doc: Any, draw: Callable[[Any], Any]) -> Any:
    """A copy of a JSON document with up to 4 values replaced, deleted or added at random places
    (nested mappings and lists included): valid JSON whose fields are wrong."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 4))):
        node, path = doc, []
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(list(node) if isinstance(node, dict) else
                                       list(range(len(node)))))
            path.append((node, key))
            node = node[key]
        if not path:
            continue
        parent, key = path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[key] = draw(values)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(values)
        else:
            parent.append(draw(values))
    return doc


def toml_text(doc: dict[str, Any]) -> str:
    """A TOML document of top-level scalars (what a model spec holds), possibly ill-typed."""
    out = []
    for key, value in doc.items():
        if isinstance(value, bool):
            text = str(value).lower()
        elif isinstance(value, (int, float)):
            text = repr(value).replace("inf", "inf").replace("nan", "nan")
        elif value is None:
            text = '""'
        else:
            text = json.dumps(str(value))
        out.append(f"{json.dumps(key)} = {text}")
    return "\n".join(out) + "\n"


crashes: list[tuple[str, str]] = []


def check(kind: str, text: str | bytes, suffix: str, load: Callable[[Path], Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"input{suffix}"
        path.write_bytes(text if isinstance(text, bytes)
                         else text.encode("utf-8", errors="replace"))
        try:
            load(path)
        except PerfmodelError:
            pass
        except Exception:  # a crash: keep the input
            crashes.append((kind, str(text)))
            print(f"CRASH in {kind}:\n{traceback.format_exc()}\ninput:\n{str(text)[:2000]}\n")


def _loaders(profile_text: str) -> dict[str, Any]:
    """Each target: (strategy of inputs, file suffix, loader)."""
    from calibration.gemm_tables import read_gemm_table
    from calibration.importers import import_nccl_tests
    from calibration.nccl_tests import parse_nccl_tests
    from perfmodel.batch import run_batch
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model
    from perfmodel.specs.profile import apply_profile, load_profile

    def profile(path: Path) -> None:
        apply_profile(None, load_profile(path))

    def nccl_cut_allowed(path: Path) -> None:
        """Parse and fit, a cut log allowed: what `import-nccl-tests --allow-truncated` does."""
        import_nccl_tests([path], allow_truncated=True)

    @st.composite
    def cut(draw: Any, text: str) -> str:
        return text[: draw(st.integers(0, len(text)))]

    def plans(path: Path) -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run_batch(path, {"model": "tiny-gpt", "hardware": "dgx-h100"},
                      path.with_name("out.csv"), as_json=False)

    @st.composite
    def mutated(draw: Any, text: str) -> str:
        return mutate_lines(text, draw)

    @st.composite
    def fields_of(draw: Any, doc: Any) -> str:
        return json.dumps(mutate_doc(doc, draw), default=str)

    def hf_model(path: Path) -> None:
        """A config read without an error describes the model its numbers say, exactly."""
        spec = load_model(path, seq_len=HF_SEQ_LEN)
        cfg = json.loads(path.read_text())
        for ours, theirs in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                             ("heads", "num_attention_heads"), ("vocab", "vocab_size")):
            if getattr(spec, ours) != cfg[theirs] or isinstance(cfg[theirs], bool):
                raise AssertionError(f"accepted {theirs}={cfg[theirs]!r} as {ours}="
                                     f"{getattr(spec, ours)!r}")

    def hf_load(path: Path) -> Any:
        return load_model(path, seq_len=HF_SEQ_LEN)  # a config has no training length

    hf_keys = [*HF_CONFIG, "n_layer", "n_embd", "n_head", "n_positions", "n_inner"]
    hf = st.fixed_dictionaries({}, optional={k: st.one_of(values, st.integers(0, 10**6))
                                             for k in hf_keys}).map(
        lambda d: {"model_type": "llama", **d})
    return {
        "model spec (json)": (st.dictionaries(st.sampled_from(MODEL_FIELDS), values, max_size=8)
                              .map(lambda d: json.dumps(d, default=str)), ".json", load_model),
        "model spec (yaml)": (mutated(MODEL), ".yaml", load_model),
        "model spec (toml)": (st.dictionaries(st.sampled_from(MODEL_FIELDS), scalars, max_size=8)
                              .map(toml_text), ".toml", load_model),
        "hugging face config": (st.one_of(hf, st.just(HF_CONFIG).map(dict)).map(
            lambda d: json.dumps(d, default=str)), ".json", hf_load),
        "hugging face config (fields)": (fields_of(HF_CONFIG), ".json", hf_model),
        "hugging face config (mutated)": (mutated(json.dumps(HF_CONFIG, indent=1)), ".json",
                                          hf_load),
        "layer graph (fields)": (fields_of(json.loads(GRAPH.read_text())), ".json", load_model),
        "layer graph (mutated)": (mutated(GRAPH.read_text()), ".yaml", load_model),
        "hardware spec (yaml)": (mutated(HARDWARE), ".yaml", load_hardware),
        "hardware spec (fields)": (fields_of(yaml.safe_load(HARDWARE)), ".json", load_hardware),
        "hardware spec (json)": (st.dictionaries(st.sampled_from(HARDWARE_FIELDS), values,
                                                 max_size=8).map(
            lambda d: json.dumps({"base": "dgx-h100", **d}, default=str)), ".json",
                                 load_hardware),
        "plan csv": (mutated(PLANS), ".csv", plans),
        "nccl-tests log": (mutated(LOG.read_text()), ".txt", parse_nccl_tests),
        "nccl-tests log (tag-output)": (mutated(TAGGED.read_text()), ".log", nccl_cut_allowed),
        "nccl-tests log (tag-output, cut)": (cut(TAGGED.read_text()), ".log", nccl_cut_allowed),
        "nccl-tests json (fields)": (fields_of(json.loads(NCCL_JSON.read_text())), ".json",
                                     nccl_cut_allowed),
        "nccl-tests json (cut)": (cut(NCCL_JSON.read_text()), ".json", nccl_cut_allowed),
        "gemm sweep (xla)": (mutated("".join(GEMM.open().readlines()[:60])), ".csv",
                             read_gemm_table),
        "gemm sweep (deepgemm)": (mutated(DEEPGEMM.read_text()), ".csv", read_gemm_table),
        "profile (mutated)": (mutated(profile_text), ".json", profile),
        "profile (fields)": (fields_of(json.loads(profile_text)), ".json", profile),
        "profile (json)": (st.dictionaries(st.sampled_from(PROFILE_FIELDS), values, max_size=7)
                           .map(lambda d: json.dumps({"format": "perfmodel-profile",
                                                      "version": 1, **d}, default=str)),
                           ".json", profile),
    }


def real_profile() -> str:
    """A profile as `calibrate import-nccl-tests` writes it, to mutate."""
    from calibration.importers import import_nccl_tests, save

    with tempfile.TemporaryDirectory() as tmp:
        path = save(import_nccl_tests([LOG]), Path(tmp) / "p.json", base="dgx-h100")
        return path.read_text()


class OutOfTime(Exception):
    """Raised to end a hypothesis run when its share of the time is spent."""


def fuzz_one(name: str, strategy: Any, suffix: str, load: Callable[[Path], Any], seconds: float,
             budget: settings) -> int:
    """Feed the loader inputs drawn from strategy for `seconds`; returns how many it read."""
    deadline = time.monotonic() + seconds
    runs = 0

    @budget
    @given(strategy)
    def fuzz(text: str) -> None:
        nonlocal runs
        if time.monotonic() > deadline:
            raise OutOfTime
        runs += 1
        check(name, text, suffix, load)

    try:
        fuzz()
    except (OutOfTime, FlakyStrategyDefinition):  # the time limit, seen by hypothesis' replay
        pass
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", default=None, help="Target names (substrings).")
    args = parser.parse_args()
    targets = _loaders(real_profile())
    if args.only:
        targets = {k: v for k, v in targets.items() if any(o in k for o in args.only)}
    budget = settings(deadline=None, max_examples=10**6, suppress_health_check=list(HealthCheck),
                      database=None, phases=[Phase.generate])
    start = time.monotonic()
    for name, (strategy, suffix, load) in targets.items():
        runs = fuzz_one(name, strategy, suffix, load, args.seconds / len(targets), budget)
        print(f"{name}: {runs} inputs")
    print(f"fuzzed {len(targets)} parsers for {time.monotonic() - start:.0f} s: "
          f"{len(crashes)} crash(es)")
    raise SystemExit(1 if crashes else 0)


if __name__ == "__main__":
    main()
