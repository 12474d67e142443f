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
  configs: the job configs of `predict --from-config` (every file of tests/data/configs: Megatron-LM
  argument lists and launch scripts, Megatron-DeepSpeed, NeMo 1, NeMo 2 / Megatron-Bridge,
  torchtitan TOML and JSON, DeepSpeed JSON, AutoModel YAML), read, resolved and predicted as the
  CLI does (cli.config_inputs, with the --model/--gpus each file's tests give):
    configs (mutated): the files' lines mutated as above;
    configs (fields): a key the file holds given a value of a wrong type (list, mapping, null,
      boolean, string, huge or negative number, NaN, a date) or its own value respelled (as a
      string, with '²', 5000 digits), or deleted, or a key added beside it (one a reader knows,
      or one that is no string) (TOML files written as TOML and as torchtitan's JSON dump);
    configs (megatron arguments): known Megatron-LM options (and Megatron-DeepSpeed's) set to
      random values: negative, zero, huge, floats, empty, missing or extra values;
    configs (launch scripts): bash scripts whose variables (arrays, arithmetic, defaults, quotes,
      command substitutions) give torchrun's world size and some of its arguments.
  A prediction with a NaN, an infinity or a negative number in it is a crash too.
A PerfmodelError is a refusal, except InternalError (perfmodel computed a NaN: a bug); an input
that takes over --limit seconds is a crash (a hang). The time is shared equally between the
targets; each distinct crash (exception and where it was raised) is printed once, with its input.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import io
import json
import math
import re
import shlex
import signal
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

from perfmodel.errors import InternalError, PerfmodelError

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "perfmodel/specs/presets"
LOG = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nvls-together-nccl-tests.txt"
TAGGED = ROOT / "tests/data/nccl-tests/derived/h100x16-2node-a3mega-allreduce.tag-output.log"
NCCL_JSON = ROOT / "tests/data/nccl-tests/derived/h100x8-allreduce-nvls-together.json"
GEMM = ROOT / "tests/data/gemm/xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"
DEEPGEMM = ROOT / "tests/data/gemm/h800-fp8-deepgemm-deepseek-v3-shapes.csv"
GRAPH = ROOT / "tests/data/cnn/alexnet.json"
CONFIGS = ROOT / "tests/data/configs"
HARDWARE = (PRESETS / "hardware/dgx-h100.yaml").read_text()
MODEL = (PRESETS / "models/llama3-8b.yaml").read_text()
HF_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
             "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}
HF_SEQ_LEN = 2048
PLANS = ("gpus,dp,tp,pp,micro_batch,global_batch,schedule,virtual_stages,recompute,zero,layers,"
         "overlap_grad_sync,dp_bucket_size,dp_bucketing\n"
         "8,8,1,1,1,8,1f1b,1,none,1,,true,40000000,all\n8,1,8,1,1,4,gpipe,1,full,0,,,,\n"
         "8,2,2,2,1,8,interleaved,2,selective,1,16,true,,megatron\n")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner,
                                                                       max_size=4)), max_leaves=12)
MODEL_FIELDS = ["layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden", "kind",
                "base", "norm", "gated_mlp", "fused_qkv", "tied_embeddings", "position_embedding",
                "name"]
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
kinds: dict[str, int] = {}  # each distinct crash (exception, where it was raised) -> how often
LIMIT_S = 120.0  # an input read for longer is a hang (--limit; a new plan family compiles first)


class Hang(Exception):
    """Raised in a loader that has run for LIMIT_S on one input."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"over {LIMIT_S:g} s on one input")


def crash_kind(error: BaseException) -> str:
    """'Type at file:line' of where the error was raised (its innermost frame of ours)."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if str(ROOT) in f.filename] or frames
    where = f"{Path(ours[-1].filename).relative_to(ROOT)}:{ours[-1].lineno}" if ours and \
        str(ROOT) in ours[-1].filename else (f"{ours[-1].filename}:{ours[-1].lineno}"
                                            if ours else "?")
    what = f"{type(error).__name__} at {where}"
    if isinstance(error, (InternalError, AssertionError)):  # raised in one place for all: by what
        what += ": " + re.sub(r"\d+", "N", str(error).split(" = ")[0])[:80]
    return what


def check(kind: str, text: str | bytes | tuple[str, str], suffix: str,
          load: Callable[[Path], Any]) -> None:
    """Load the input (text, or (file name, text) to name the file); a crash is recorded and
    printed with its input the first time one of its kind (crash_kind) is seen."""
    name = f"input{suffix}"
    if isinstance(text, tuple):
        name, text = text
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(text if isinstance(text, bytes)
                         else text.encode("utf-8", errors="replace"))
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        try:
            load(path)
        except InternalError as error:  # a NaN perfmodel computed: its bug, not the input's
            _crash(kind, name, text, error)
        except PerfmodelError:
            pass
        except Exception as error:  # a crash: keep the input
            _crash(kind, name, text, error)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _crash(kind: str, name: str, text: str | bytes, error: BaseException) -> None:
    crashes.append((kind, str(text)))
    what = crash_kind(error)
    kinds[what] = kinds.get(what, 0) + 1
    if kinds[what] == 1:
        print(f"CRASH in {kind} ({name}): {what}\n{traceback.format_exc()}\n"
              f"input:\n{str(text)[:2000]}\n", flush=True)


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


# the command line each example config is predicted with (its tests' --model, --gpus, ...), by
# file stem; a file not named here is predicted with --gpus 8
CONFIG_ARGS: dict[str, list[str]] = {
    "automodel_qwen3_30b_a3b": ["--gpus", "8"],
    "bridge_llama3_8b": ["--gpus", "16"],
    "deepspeed_auto": ["--model", "llama3-8b", "--gpus", "8", "--dtype", "bf16",
                       "--micro-batch", "2", "--global-batch", "32"],
    "deepspeed_offload": ["--model", "llama3-8b"],
    "deepspeed_zero3": ["--model", "llama3-8b", "--seq-len", "4096"],
    "megatron_deepspeed_bloom_176b": ["--gpus", "384"],
    "megatron_gpt3_175b": ["--model", "gpt3-175b"],
    "megatron_v2_gpt3_175b": ["--model", "gpt3-175b", "--gpus", "1024"],
    "nemo1_nemotron4_15b": ["--model", "{nemotron}"],  # a spec file of the config's model
    "nemo2_llama3_8b": [],
    "torchtitan_2024_llama3_8b": ["--gpus", "64"],
    "torchtitan_llama3_70b": ["--gpus", "64"],
    "torchtitan_llama3_8b_pp": ["--gpus", "16"],
}
# a Megatron-DeepSpeed argument list (tests/unit/test_megatron_deepspeed.py's)
MEGATRON_DEEPSPEED = ("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
                      "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 "
                      "--bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--deepspeed --zero-stage 1")
# what a user writes where a number goes, and worse
WORDS = st.one_of(st.integers(-2**70, 2**70).map(str),
                  st.sampled_from(["0", "-1", "1", "2", "3", "7", "8", "64", "1e400", "-1e400",
                                   "nan", "inf", "-inf", "1.5", "0.0", "-0.5", "", " ", "1e3",
                                   "0x10", "1_000", "True", "false", "None", "null", "auto",
                                   "[]", "{}", "1,2", "a:b", "${X}", "$((1/0))", "'", "\\",
                                   "\u00b2", "\u0663", "\uff18", "9" * 5000, "1" + "0" * 400]),
                  st.floats().map(repr), st.text(max_size=10))
# a wrong value for a known key of a YAML, TOML or JSON config
WRONG = st.one_of(values, st.sampled_from([[], {}, None, True, False, "", "auto", 0, -1, 1, 2,
                                           3, 8, 2**63, -2**63, 10**30, 0.5, 1.5, -0.0,
                                           float("nan"), float("inf"), "1", "8", "bf16", "none",
                                           "full", [1], [0, 0], {"a": 1},
                                           datetime.date(2024, 1, 1),
                                           datetime.datetime(2024, 1, 1, 12, 0),
                                           "layers.\u00b2", "\u00b2", "9" * 5000]))
# a key a parsed config may hold that is no string (YAML reads `1:`, `null:`, `true:` so)
ODD_KEYS = st.one_of(st.integers(-3, 10**20), st.none(), st.booleans(), st.floats(),
                     st.text(max_size=8))


def _places(node: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value in a parsed document, at any depth."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    out = []
    for key, child in items:
        out.append((node, key))
        out += _places(child)
    return out


def mutate_known(doc: Any, draw: Callable[[Any], Any], keys: Any = ODD_KEYS) -> Any:
    """A copy of a parsed config with 1 to 3 of the keys it holds (at any depth) given a wrong
    value or deleted, or a key drawn from `keys` added beside one."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        paths = _places(doc)
        if not paths:
            return doc
        parent, key = draw(st.sampled_from(paths))
        action = draw(st.integers(0, 7))
        if action == 0:
            del parent[key]
        elif action == 1 and isinstance(parent, dict):  # a key of another type beside it
            parent[draw(keys)] = copy.deepcopy(draw(WRONG))  # never one shared [] or {}
        elif action == 2:  # its value respelled: a number as a string, odd digits, a huge one
            was = parent[key]
            parent[key] = draw(st.sampled_from([str(was), f"{was}\u00b2", f"{was}.5", f"-{was}",
                                                f"layers.{was}\u00b2", [f"{was}\u00b2"],
                                                "9" * 5000]))
        else:
            parent[key] = copy.deepcopy(draw(WRONG))
    return doc


def toml_of(doc: Any) -> str:
    """A parsed TOML document written back as TOML (sections, inline tables and arrays; dates
    as TOML dates; None, which TOML cannot hold, as an empty string)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if v != v else ("inf" if v > 0 else "-inf")
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (datetime.date, datetime.datetime)):
            return v.isoformat()
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps("" if v is None else str(v), ensure_ascii=False)

    def key(k: Any) -> str:
        return json.dumps(str(k).lower() if isinstance(k, bool) else str(k), ensure_ascii=False)

    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    lines = [f"{key(k)} = {value(v)}" for k, v in doc.items() if k not in tables]
    for name, table in tables.items():
        lines.append(f"[{key(name)}]")
        lines += [f"{key(k)} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def finite_prediction(result: Any) -> None:
    """AssertionError when a prediction holds a NaN, an infinity or a negative number (as
    predict --json and the table print them)."""
    from perfmodel.render import print_prediction

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and (
                not math.isfinite(value) or value < 0):
            raise AssertionError(f"predicted {where} = {value}")

    walk(result.to_dict(), "prediction")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_prediction(result)
    found = re.search(r"(?<![\w/.])-?(nan|inf)(?![\w/])", out.getvalue(), re.I)
    if found:
        raise AssertionError(f"printed {found.group(0)}: {out.getvalue()}")


def _config_loaders(tmp: Path) -> dict[str, Any]:
    """The job-config targets: (strategy of (file name, text), suffix, loader)."""
    from perfmodel import cli
    from perfmodel.configs import read_config
    from perfmodel.configs.megatron import READ_OPTIONS
    from perfmodel.files import write_atomic
    from perfmodel.output import json_text
    from perfmodel.predict import predict as run

    nemotron = tmp / "nemotron4-15b.yaml"  # NeMo 1 configs hold no vocabulary (the tokenizer's)
    fields = read_config(CONFIGS / "nemo1_nemotron4_15b.yaml").model
    write_atomic(nemotron, yaml.safe_dump({"kind": "transformer", "name": "nemotron4-15b",
                                           "vocab": 256000, **fields}), what="model spec")

    def from_config(path: Path) -> None:
        """What `predict --from-config PATH --hardware dgx-h100 [--json]` does with it."""
        args = [a.format(nemotron=nemotron) for a in CONFIG_ARGS.get(path.stem, ["--gpus", "8"])]
        ctx = cli.predict.make_context("predict", ["--from-config", str(path), "--hardware",
                                                   "dgx-h100", *args])
        with ctx:
            model, hardware, plan, job = cli.config_inputs(dict(ctx.params))
        job.report()
        result = run(model, hardware, plan, refuse_idle=False)
        json_text({**result.to_dict(), **cli.model_summary(model), "config": job.to_dict()})
        finite_prediction(result)

    files = sorted(p for p in CONFIGS.iterdir() if p.is_file())
    texts = {p.name: p.read_text() for p in files}

    @st.composite
    def mutated(draw: Any) -> tuple[str, str]:
        name = draw(st.sampled_from(sorted(texts)))
        return name, mutate_lines(texts[name], draw)

    parsed: dict[str, Any] = {}
    for p in files:
        with contextlib.suppress(Exception):
            if p.suffix == ".toml":
                import tomllib

                parsed[p.name] = parsed[f"{p.stem}.json"] = tomllib.loads(p.read_text())
            elif p.suffix in (".json", ".yaml"):
                parsed[p.name] = yaml.safe_load(p.read_text())

    # keys a reader may look for that a file lacks: every key of every example, Megatron's
    # options as NeMo writes them, and sections of the DeepSpeed and NeMo readers
    names = {str(k) for doc in parsed.values() for _, k in _places(doc) if isinstance(k, str)}
    names |= {o.replace("-", "_") for o in READ_OPTIONS} | {
        "activation_checkpointing", "data_types", "optim", "tokenizer", "strategy", "pipeline",
        "elasticity", "fp16", "bf16", "amp", "optimizer", "zero_optimization", "config",
        "activation_checkpoint", "float8", "experimental", "converters"}
    keys = st.one_of(ODD_KEYS, st.sampled_from(sorted(names)), st.sampled_from(sorted(names)))

    @st.composite
    def known_fields(draw: Any) -> tuple[str, str]:
        name = draw(st.sampled_from(sorted(parsed)))
        doc = mutate_known(parsed[name], draw, keys)
        if name.endswith(".toml"):
            return name, toml_of(doc)
        if name.endswith(".json"):  # JSON's keys are strings, its dates strings
            return name, json.dumps(doc, default=str)
        return name, yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)

    bases = {"megatron_llama3_8b.txt": texts["megatron_llama3_8b.txt"],
             "megatron_deepspeed.txt": MEGATRON_DEEPSPEED.replace(" --", "\n--")}
    options = sorted(READ_OPTIONS)

    @st.composite
    def megatron_arguments(draw: Any) -> tuple[str, str]:
        name = draw(st.sampled_from(sorted(bases)))
        lines = bases[name].splitlines()
        for _ in range(draw(st.integers(1, 6))):
            option = draw(st.sampled_from(options))
            arity = READ_OPTIONS[option]
            count = draw(st.sampled_from([max(arity, 1), max(arity, 1), 0, 1, 2, 3]))
            words = [shlex.quote(draw(WORDS)) for _ in range(count)]
            line = " ".join([f"--{option}", *words])
            same = [i for i, old in enumerate(lines) if old.split(" ")[0] == f"--{option}"]
            if same and draw(st.booleans()):
                lines[same[0]] = line
            else:
                lines.insert(draw(st.integers(0, len(lines))), line)
        return name, "\n".join(lines) + "\n"

    @st.composite
    def launch_script(draw: Any) -> tuple[str, str]:
        """A bash launch script: variables (scalars, arrays, arithmetic on each other, defaults,
        command substitutions, quotes), then torchrun running pretrain_gpt.py with some
        arguments given through them."""
        names = ["A", "B", "N", "ARGS", "X"]
        ref = st.one_of(
            st.integers(0, 64).map(str),
            st.sampled_from(["$A", "${B}", "${N:-8}", "${X:=2}", "${A:+1}", "${ARGS[@]}",
                             "${ARGS[1]}", '"${ARGS[*]}"', "$((A*B))", "$((A/B))", "$((A%N))",
                             "$((-A+1))", "$(( (A+1)*B ))", "$((A*A*A*A))", "$((A", "${A",
                             "$(hostname)", "`nproc`", "'$A'", '"$A"x', "\\$A", "$1", "$@",
                             "${#ARGS[@]}", "$((99999999999*99999999999))",
                             "$((A*A*A*A*A*A*A*A*A*A*A*A))"]),
            WORDS.map(shlex.quote), WORDS)
        lines = ["#!/bin/bash"]
        for _ in range(draw(st.integers(0, 10))):
            name = draw(st.sampled_from(names))
            form = draw(st.sampled_from(["set", "set", "array", "append", "export", "if"]))
            value = draw(ref)
            if form == "array":
                items = " ".join(draw(st.lists(ref, max_size=4)))
                lines.append(f"{name}=(\n  {items}\n)")
            elif form == "append":
                lines.append(f"{name}+=({value})" if draw(st.booleans()) else
                             f"{name}+={value}")
            elif form == "export":
                lines.append(f"export {name}={value}")
            elif form == "if":
                lines.append(f"if [ -n \"$X\" ]; then\n  {name}={value}\nfi")
            else:
                lines.append(f"{name}={value}")
        args = [a for a in texts["megatron_llama3_8b.txt"].splitlines() if a.startswith("--")]
        for _ in range(draw(st.integers(0, 4))):  # an option's value through a variable
            i = draw(st.integers(0, len(args) - 1))
            args[i] = f"{args[i].split(' ')[0]} {draw(ref)}"
        launcher = draw(st.sampled_from([
            "torchrun --nproc_per_node {} --nnodes {}", "torchrun --nproc-per-node={} --nnodes={}",
            "python -m torch.distributed.run --nproc_per_node {} --nnodes {}",
            "deepspeed --num_gpus {} --num_nodes {}", "srun python3 {} {}"]))
        lines.append(launcher.format(draw(ref), draw(ref)) + " pretrain_gpt.py \\\n    "
                     + " \\\n    ".join(args))
        return "launch.sh", "\n".join(lines) + "\n"

    return {
        "configs (mutated)": (mutated(), "", from_config),
        "configs (launch scripts)": (launch_script(), "", from_config),
        "configs (fields)": (known_fields(), "", from_config),
        "configs (megatron arguments)": (megatron_arguments(), "", from_config),
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
    global LIMIT_S
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", default=None, help="Target names (substrings).")
    parser.add_argument("--limit", type=float, default=LIMIT_S,
                        help="Seconds one input may take before it counts as a hang.")
    args = parser.parse_args()
    LIMIT_S = args.limit
    tmp = tempfile.TemporaryDirectory()
    targets = {**_loaders(real_profile()), **_config_loaders(Path(tmp.name))}
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
    for what, count in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {count} x {what}")
    tmp.cleanup()
    raise SystemExit(1 if crashes else 0)


if __name__ == "__main__":
    main()
