"""Bad input, as a new user types it, across every command (issue 8).

One table: each row is a command given one kind of bad input (a misspelt preset, a missing or
unreadable file, malformed YAML/JSON/TOML, a wrong type, a missing or unknown field, a zero,
negative, NaN, infinite or absurd value, a broken divisibility rule, a profile of another version,
an nccl-tests log that is empty, cut short or from another tool) and what must come back: the exit
code of the error's class (docs/cli.md, "Exit codes"), one line on standard error that
names the field or file and what is allowed, and no traceback. Most rows run in this process
(perfmodel.cli.main, as the `perfmodel` script calls it); a few run as `python -m perfmodel`,
and `--debug` must show the traceback.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli import main
from perfmodel.errors import PlanError
from perfmodel.strategy import Plan
from tests.conftest import ROOT

USAGE, SPEC, PLAN, DATA = 2, 3, 4, 5
LOG = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
GEMM = ROOT / "tests/data/gemm/xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"
MAMF = ROOT / "tests/data/gemm/mamf-best-per-accelerator-ml-engineering.csv"

TINY = "kind: transformer\nlayers: 4\nhidden: 256\nheads: 8\nseq_len: 128\nvocab: 1024\n"


def _profile(**fields: object) -> str:
    import json

    doc = {"format": "perfmodel-profile", "version": 1, "complete": True,
           "hardware": {"base": "dgx-h100"}, "fits": {}}
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not None})


def _alias_bomb(head: str) -> str:
    """'Billion laughs': 9 aliases of 9 aliases, 9 levels: 9^9 values from 10 short lines."""
    anchors = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        anchors.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return head + "source: [" + ",\n  ".join(anchors) + "]\n"


_LOG_LINES = LOG.read_text().splitlines(keepends=True)
_FIRST_ROW = next(i for i, line in enumerate(_LOG_LINES) if line.strip().startswith("33554432"))

FILES: dict[str, str | bytes] = {
    # hardware: an FP8 recipe that is not Transformer Engine's
    "hw-fp8.yaml": "base: dgx-h100\nfp8_recipes: [delayed, mxfp4]\n",
    # hardware whose ranks run synchronously on their host (as a CPU profile's)
    "hw-sync.yaml": "base: dgx-h100\nasynchronous_device: false\n",
    # model specs
    "model-malformed.yaml": "layers: [4\n",
    "model-mla.yaml": TINY + "bias: false\nq_lora_rank: 64\nkv_lora_rank: 32\n"
                      "qk_nope_head_dim: 32\nqk_rope_head_dim: 16\nv_head_dim: 32\n",
    "model-malformed.json": '{"layers": 4,',
    "model-malformed.toml": "layers = [4\n",
    "model-list.yaml": "- 4\n- 256\n",
    "model-wrong-type.yaml": TINY.replace("layers: 4", 'layers: "four"'),
    "model-wrong-bool.yaml": TINY + 'gated_mlp: "yes"\n',
    "model-missing-field.yaml": TINY.replace("layers: 4\n", ""),
    "model-unknown-field.yaml": TINY + "hiden: 256\n",
    "model-zero.yaml": TINY.replace("layers: 4", "layers: 0"),
    "model-negative.yaml": TINY.replace("layers: 4", "layers: -4"),
    "model-nan.yaml": TINY.replace("layers: 4", "layers: .nan"),
    "model-inf.json": '{"kind": "transformer", "layers": 4, "hidden": 256, "heads": 8, '
                      '"seq_len": 128, "vocab": Infinity}',
    "model-absurd.yaml": "kind: transformer\nlayers: 100000\nhidden: 1000000\nheads: 1000\n"
                         "seq_len: 2048\nvocab: 50000\n",  # ~1e18 parameters
    "model-indivisible.yaml": TINY.replace("hidden: 256", "hidden: 250"),
    "model-base-typo.yaml": "base: tiny-gtp\nlayers: 2\n",
    "model-duplicate.yaml": TINY + "layers: 8\n",
    "model-duplicate.json": '{"kind": "transformer", "layers": 4, "layers": 8}',
    "model-good.toml": 'kind = "transformer"\nlayers = 4\nhidden = 256\nheads = 8\n'
                       'seq_len = 128\nvocab = 1024\nhiden = 3\n',
    "hf-unknown-family.json": '{"model_type": "lama", "num_hidden_layers": 2}',
    "hf-missing-field.json": '{"model_type": "llama", "num_hidden_layers": 32, '
                             '"hidden_size": 4096, "num_attention_heads": 32, '
                             '"max_position_embeddings": 4096, "vocab_size": 32000}',
    "hf-bias.json": '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, '
                    '"num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 1000, '
                    '"max_position_embeddings": 512, "attention_bias": true}',
    "hf-wrong-type.json": '{"model_type": "gpt2", "n_layer": "twelve", "n_embd": 768, '
                          '"n_head": 12, "vocab_size": 50257, "n_positions": 1024}',
    "hf-llama-experts.json": '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, '
                             '"num_attention_heads": 8, "intermediate_size": 512, '
                             '"vocab_size": 1000, "num_local_experts": 4}',
    "hf-layer-types.json": '{"model_type": "mistral", "num_hidden_layers": 4, "hidden_size": 256, '
                           '"num_attention_heads": 8, "num_key_value_heads": 8, '
                           '"intermediate_size": 512, '
                           '"vocab_size": 1000, "sliding_window": 64, "layer_types": '
                           '["full_attention", "sliding_attention", "sliding_attention", '
                           '"full_attention"]}',
    "model-experts-no-top-k.yaml": TINY + "experts: 8\n",
    "model-top-k-dense.yaml": TINY + "top_k: 2\n",
    "model-top-k-too-many.yaml": TINY + "experts: 8\ntop_k: 9\n",
    "model-all-dense.yaml": TINY + "experts: 8\ntop_k: 2\nmoe_first_dense: 4\n",
    "model-imbalance.yaml": TINY + "experts: 8\ntop_k: 2\nrouting_imbalance: 0.5\n",
    "model-dense-layer.yaml": TINY + "experts: 8\ntop_k: 2\nmoe_dense_layers: [1, 7]\n",
    "model-mla-partial.yaml": TINY + "kv_lora_rank: 64\nqk_nope_head_dim: 32\n",
    "model-mla-no-rank.yaml": TINY + "q_lora_rank: 64\n",
    "model-window-every.yaml": TINY + "full_attention_every: 2\n",
    "model-window-one.yaml": TINY + "sliding_window: 64\nfull_attention_every: 1\n",
    "model-alias-bomb.yaml": _alias_bomb(TINY),
    "model-recursive-alias.yaml": TINY + "source: &loop [*loop]\n",
    "model-nested.yaml": TINY + "source: " + "[" * 150 + "]" * 150 + "\n",
    "graph-not-a-list.yaml": "kind: layers\nlayers: 5\n",
    "graph-shape.yaml": "kind: layers\ninput_shape: 5\nlayers:\n  - {name: fc, kind: linear, "
                        "params: 10, flops: 20, gemm_m: 1, gemm_n: 10, gemm_k: 1}\n",
    "graph-kind.yaml": "kind: layers\nlayers:\n  - {name: fc, kind: linaer, params: 10}\n",
    # hardware specs
    "hw-malformed.yaml": "base: dgx-h100\ninter_node: {bandwidth_bytes_per_s: 1e9\n",
    "hw-base-typo.yaml": "base: dgx-h10\n",
    "hw-unknown-field.yaml": "base: dgx-h100\ninter_node:\n  bandwith_bytes_per_s: 1.0e+9\n",
    "hw-wrong-type.yaml": "base: dgx-h100\npeak_flops_per_s: 5\n",
    "hw-missing-field.yaml": "gpus_per_node: 8\n",
    "hw-negative.yaml": "base: dgx-h100\nmemory_bytes: -1\n",
    "hw-nan.yaml": "base: dgx-h100\nmemory_bytes: .nan\n",
    "hw-absurd.yaml": "base: dgx-h100\ngpus_per_node: 1.0e+9\n",
    "hw-efficiency.yaml": "base: dgx-h100\nintra_node:\n  efficiency: 2\n",
    "hw-alias-bomb.yaml": _alias_bomb("base: dgx-h100\n"),
    "hw-tiny-bandwidth.yaml": "base: dgx-h100\ninter_node:\n  bandwidth_bytes_per_s: 1.0e-300\n",
    "hw-huge-flops.yaml": "base: dgx-h100\npeak_flops_per_s: {bf16: 1.0e+300}\n",
    "hw-tiny-memory.yaml": "base: dgx-h100\nmemory_bytes: 1.0e-300\n",
    "hw-slow-kernels.yaml": "base: dgx-h100\nkernel_overhead_s: 1.0e+300\n",
    "hw-gemm-absurd.yaml": "base: dgx-h100\ngemm_efficiency: {bf16: {max_fraction: 0.8, "
                           "half_dim: 0, k_half_dim: 1.0e+300}}\n",
    "hw-fit-absurd.yaml": "base: dgx-h100\ncollectives:\n  - {op: all_reduce, scope: intra, "
                          "algorithm: ring, alpha_s: 1.0e-5, "
                          "bus_bandwidth_bytes_per_s: 1.0e-300}\n",
    # calibration profiles
    "profile-v2.json": _profile(version=2),
    "profile-not-a-profile.json": '{"layers": 4}',
    "profile-truncated.json": _profile()[:-20],
    "profile-unknown-field.json": _profile(extra=1),
    "profile-hw-unknown-field.json": _profile(hardware={"base": "dgx-h100", "memry_bytes": 5}),
    "profile-wrong-type.json": _profile(complete="yes"),
    "profile-missing-field.json": _profile(fits=None),
    "profile-nan.json": _profile(fits={"collective/all_reduce/intra/ring": {
        "kind": "collective", "op": "all_reduce", "scope": "intra", "algorithm": "ring",
        "params": {"alpha_s": float("nan")}, "median_rel_error": 0.01, "worst_rel_error": 0.02,
        "size_range": [1, 2], "n_points": 3}}),
    # nccl-tests logs
    "log-empty.txt": "",
    "log-cut-between-rows.txt": "".join(_LOG_LINES[: _FIRST_ROW + 3]),
    "log-cut-mid-row.txt": "".join(_LOG_LINES[: _FIRST_ROW + 3]) + _LOG_LINES[_FIRST_ROW + 3][:50],
    "log-header-only.txt": "".join(_LOG_LINES[:3]),
    "log-osu.txt": "# OSU MPI Allreduce Latency Test v7.3\n# Size       Avg Latency(us)\n"
                   "4                       1.52\n8                       1.49\n",
    "log-binary.txt": b"\x00\x01\x02 not text",
    "log-garbled.txt": LOG.read_text().replace("183.49", "18x.49"),
    # GEMM sweeps
    "gemm-empty.csv": "",
    "gemm-header-only.csv": "m,n,k,dtype,flops_per_s\n",
    "gemm-negative.csv": "m,n,k,dtype,flops_per_s\n256,256,256,bf16,-5\n",
    "gemm-nan.csv": "m,n,k,dtype,flops_per_s\n256,256,256,bf16,nan\n",
    "gemm-too-few.csv": "m,n,k,dtype,flops_per_s\n256,256,256,bf16,1e12\n",
    # plan CSVs for predict --batch
    "plans-unknown-column.csv": "gpus,dp,tpp\n8,8,1\n",
    "plans-empty.csv": "",
    "plans-wrong-type.csv": "gpus,dp,tp\n8,abc,1\n",
    "plans-nan.csv": "gpus,dp,tp\n8,nan,1\n",
    "plans-absurd.csv": "gpus,dp,tp\n1000000000,1000000000,1\n",
    "plans-indivisible.csv": "gpus,dp,tp,global_batch\n8,8,1,12\n",
    "plans-empty-row.csv": "gpus,dp,tp\n8,8,1\n,,\n",
    "plans-extra-cells.csv": "gpus,dp,tp\n8,8,1,5\n",
    "plans-short-row.csv": "gpus,dp,tp\n8,8\n",
    "plans-dev-zero.csv": "model,gpus,dp\n/dev/zero,8,8\n",
}
TOO_LARGE = 16 * 2**20 + 1  # bytes: one over perfmodel.files.MAX_INPUT_BYTES


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-input")
    for name, content in FILES.items():
        (d / name).write_bytes(content.encode() if isinstance(content, str) else content)
    (d / "a-directory").mkdir()
    (d / "out").mkdir()  # where OUT's profile goes: a missing directory is refused (exit 7)
    (d / "a-directory.yaml").mkdir()
    (d / "a-directory.json").mkdir()
    (d / "plans-alias-bomb.csv").write_text(f"model,gpus,dp\n{d}/model-alias-bomb.yaml,8,8\n")
    os.mkfifo(d / "fifo.yaml")  # opening it would block until a writer comes
    os.mkfifo(d / "fifo.txt")
    for name in ("huge.yaml", "huge.json", "huge.csv", "huge.txt"):  # sparse: no disk used
        with open(d / name, "wb") as fh:
            fh.truncate(TOO_LARGE)
    (d / "collect-fifo" / "results").mkdir(parents=True)
    os.mkfifo(d / "collect-fifo" / "meta.json")
    return d


@dataclass(frozen=True)
class Case:
    """`perfmodel ARGS` ({d} is the directory of FILES) must exit with `code`, print exactly
    `lines` lines on standard error, each needle among them."""

    command: str
    kind: str
    args: str
    code: int
    needles: tuple[str, ...]
    lines: int = 1

    @property
    def id(self) -> str:
        return f"{self.command}/{self.kind}"


PRED = "predict --hardware dgx-h100"
LLAMA = "predict --model llama2-7b --hardware dgx-h100"
EXPL = "explain --model llama2-7b --hardware dgx-h100"
COLL = "collective --op all_reduce --bytes 1GiB --ranks 16"
REC = "recommend --model llama2-7b --hardware dgx-h100 --gpus 8 --global-batch 8"
SWEEP = "sweep --model alexnet --hardware dgx-v100 --gpus 16 --global-batch 256"
VARY = "--vary peak_flops_per_s=1e14"
VAL = "validate --model tiny-gpt --hardware dgx-a100-80gb"
DRY = "validate --model tiny-gpt --dry-run"
NCCL = "calibrate import-nccl-tests"
GEMMI = "calibrate import-gemm"
OUT = "--out {d}/out/p.json"
HF = ROOT / "tests/data/hf"  # configs as published (tests/unit/test_hf_configs.py)
ALLOWED = "allowed:"

C = Case
CASES = [
    # --- predict -------------------------------------------------------------------------------
    C("predict", "preset typo", "predict --model llama2-7bb --hardware dgx-h100", SPEC,
      ("unknown model preset 'llama2-7bb'", "did you mean 'llama2-7b'", "presets:")),
    C("predict", "preset typo (hardware)", "predict --model llama2-7b --hardware dgx-h10", SPEC,
      ("did you mean 'dgx-h100'",)),
    C("predict", "preset typo (base of a file)", "predict --model llama2-7b --hardware "
      "{d}/hw-base-typo.yaml", SPEC, ("did you mean 'dgx-h100'",)),
    C("predict", "preset typo (model base)", f"{PRED} --model {{d}}/model-base-typo.yaml", SPEC,
      ("did you mean 'tiny-gpt'",)),
    C("predict", "option typo", f"{LLAMA} --micro-bach 2", USAGE,
      ("No such option '--micro-bach'", "'--micro-batch'")),
    C("predict", "choice typo", f"{LLAMA} --schedule 1fb1", USAGE, ("'1fb1'", "'1f1b'")),
    C("predict", "missing file", f"{PRED} --model {{d}}/nope.yaml", SPEC,
      ("model file not found", "nope.yaml")),
    C("predict", "missing profile", "predict --model llama2-7b --profile {d}/nope.json", SPEC,
      ("nope.json", "file not found")),
    C("predict", "missing plans", f"{LLAMA} --batch {{d}}/nope.csv", DATA,
      ("plans file", "nope.csv: file not found")),
    C("predict", "missing plan cells (a row of empty cells)", f"{LLAMA} --batch "
      "{d}/plans-empty-row.csv", DATA, ("plans-empty-row.csv:3", "cells are all empty")),
    C("predict", "missing plan cells (a short row)", f"{LLAMA} --batch {{d}}/plans-short-row.csv",
      DATA, ("plans-short-row.csv:2", "the row has 2 cells, the header 3 columns")),
    C("predict", "unknown column (extra cells)", f"{LLAMA} --batch {{d}}/plans-extra-cells.csv",
      DATA, ("plans-extra-cells.csv:2", "the row has 4 cells, the header 3 columns")),
    C("predict", "option without its partner (plan flag beside --batch)", f"{LLAMA} --tp 2 "
      "--batch {d}/plans-indivisible.csv", USAGE,
      ("--tp does not go with --batch", "a 'tp' column of the plans file")),
    C("predict", "option without its partner (--plot beside --batch)", f"{LLAMA} --batch "
      "{d}/plans-indivisible.csv --plot {d}/out/p.png", USAGE,
      ("--plot does not go with --batch",)),
    C("predict", "unreadable (a directory)", f"{PRED} --model {{d}}/a-directory.yaml", SPEC,
      ("a-directory.yaml", "is a directory")),
    C("predict", "unreadable hardware (a directory)", "predict --model llama2-7b --hardware "
      "{d}/a-directory.yaml", SPEC, ("a-directory.yaml", "is a directory")),
    C("predict", "malformed YAML", f"{PRED} --model {{d}}/model-malformed.yaml", SPEC,
      ("model-malformed.yaml", "not valid YAML", "line 2")),
    C("predict", "malformed JSON", f"{PRED} --model {{d}}/model-malformed.json", SPEC,
      ("model-malformed.json", "not valid JSON", "line 1")),
    C("predict", "malformed TOML", f"{PRED} --model {{d}}/model-malformed.toml", SPEC,
      ("model-malformed.toml", "not valid TOML")),
    C("predict", "malformed hardware", "predict --model llama2-7b --hardware "
      "{d}/hw-malformed.yaml", SPEC, ("hw-malformed.yaml", "not valid YAML")),
    C("predict", "not a mapping", f"{PRED} --model {{d}}/model-list.yaml", SPEC,
      ("model-list.yaml", "must hold a mapping of fields, got list")),
    C("predict", "wrong type", f"{PRED} --model {{d}}/model-wrong-type.yaml", SPEC,
      ("layers must be a number", "'four'")),
    C("predict", "wrong type (bool)", f"{PRED} --model {{d}}/model-wrong-bool.yaml", SPEC,
      ("gated_mlp must be true or false", "'yes'")),
    C("predict", "wrong type (hardware)", "predict --model llama2-7b --hardware "
      "{d}/hw-wrong-type.yaml", SPEC, ("peak_flops_per_s must map dtypes",)),
    C("predict", "wrong type (HF config)", f"{PRED} --model {{d}}/hf-wrong-type.json", SPEC,
      ("hf-wrong-type.json", "twelve")),
    C("predict", "wrong type (flag)", f"{LLAMA} --dp two", USAGE,
      ("'--dp'", "'two' is not a valid integer")),
    C("predict", "missing field", f"{PRED} --model {{d}}/model-missing-field.yaml", SPEC,
      ("missing required field 'layers'",)),
    C("predict", "missing field (hardware)", "predict --model llama2-7b --hardware "
      "{d}/hw-missing-field.yaml", SPEC, ("missing required field 'peak_flops_per_s'",)),
    C("predict", "missing field (HF config)", f"{PRED} --model {{d}}/hf-missing-field.json "
      "--seq-len 2048", SPEC, ("is missing 'intermediate_size'",)),
    C("predict", "missing field (HF config: no training length)", f"{PRED} --model "
      f"{HF}/llama-3.1-8b", SPEC, ("(Hugging Face config) has no training sequence length",
                                   "give --seq-len", "its max_position_embeddings is 131072")),
    # a mixture of experts and MLA are costed (issue 17): their plans' rules refuse what they
    # cannot run
    C("predict", "ep not dividing the experts (HF mixture of experts)", f"{PRED} --model "
      f"{HF}/mixtral-8x7b-v0.1 --seq-len 4096 --dp 6 --ep 3 --global-batch 6", PLAN,
      ("ep (3) must divide the experts (8)",)),
    C("predict", "cp not dividing the sequence", f"{LLAMA} --cp 3", PLAN,
      ("seq_len (4096) must be divisible by 2 cp (6)",)),
    C("predict", "ep on a dense model", f"{LLAMA} --dp 2 --ep 2", PLAN,
      ("ep (2) applies to a mixture-of-experts model: the model has no experts",)),
    C("predict", "unknown field (HF experts in a dense family)", f"{PRED} --model "
      "{d}/hf-llama-experts.json --seq-len 512", SPEC,
      ("model_type 'llama' is a mixture-of-experts model of a family perfmodel does not read "
       "(num_local_experts: 4)",)),
    C("predict", "unknown field (HF layer_types)", f"{PRED} --model {{d}}/hf-layer-types.json "
      "--seq-len 512", SPEC, ("layer_types puts full attention in layers [0, 3]",
                              "every k-th (layers k-1, 2k-1, ...) full")),
    C("predict", "missing field (experts)", f"{PRED} --model {{d}}/model-experts-no-top-k.yaml",
      SPEC, ("top_k must be given with experts (8)",)),
    C("predict", "unknown field (top_k of a dense model)", f"{PRED} --model "
      "{d}/model-top-k-dense.yaml", SPEC, ("top_k applies to a mixture-of-experts model: give "
                                           "experts",)),
    C("predict", "absurd (top_k)", f"{PRED} --model {{d}}/model-top-k-too-many.yaml", SPEC,
      ("top_k must be > 0 and <= 8, got 9 (at most the 8 experts)",)),
    C("predict", "absurd (every layer dense)", f"{PRED} --model {{d}}/model-all-dense.yaml", SPEC,
      ("moe_first_dense must be >= 0 and <= 3, got 4",)),
    C("predict", "zero (routing imbalance)", f"{PRED} --model {{d}}/model-imbalance.yaml", SPEC,
      ("routing_imbalance must be >= 1 and <= 4, got 0.5",)),
    C("predict", "absurd (dense layer index)", f"{PRED} --model {{d}}/model-dense-layer.yaml",
      SPEC, ("moe_dense_layers must be >= 0 and <= 3, got 7",)),
    C("predict", "missing field (MLA)", f"{PRED} --model {{d}}/model-mla-partial.yaml", SPEC,
      ("qk_rope_head_dim must be given with kv_lora_rank",)),
    C("predict", "unknown field (MLA without kv_lora_rank)", f"{PRED} --model "
      "{d}/model-mla-no-rank.yaml", SPEC, ("q_lora_rank applies to multi-head latent attention",)),
    C("predict", "unknown field (full attention without a window)", f"{PRED} --model "
      "{d}/model-window-every.yaml", SPEC, ("full_attention_every applies to sliding-window "
                                            "attention",)),
    C("predict", "absurd (full attention every layer)", f"{PRED} --model "
      "{d}/model-window-one.yaml", SPEC, ("full_attention_every 1 makes every layer full "
                                          "attention",)),
    C("predict", "unknown field (HF biases)", f"{PRED} --model {{d}}/hf-bias.json --seq-len 512",
      SPEC, ("attention_bias true with mlp_bias false is not modelled",)),
    C("predict", "missing flag", "predict --model llama2-7b", USAGE, ("--hardware",)),
    C("predict", "unknown field", f"{PRED} --model {{d}}/model-unknown-field.yaml", SPEC,
      ("unknown field 'hiden'", "did you mean 'hidden'", ALLOWED)),
    C("predict", "duplicate field", f"{PRED} --model {{d}}/model-duplicate.yaml", SPEC,
      ("model-duplicate.yaml: field 'layers' is given twice (line 7)",)),
    C("predict", "duplicate field (JSON)", f"{PRED} --model {{d}}/model-duplicate.json", SPEC,
      ("model-duplicate.json: field 'layers' is given twice",)),
    C("predict", "unreadable (a directory without config.json)", f"{PRED} --model "
      "{d}/a-directory", SPEC, ("a-directory holds no config.json",)),
    C("predict", "unknown field (TOML)", f"{PRED} --model {{d}}/model-good.toml", SPEC,
      ("unknown field 'hiden'", "did you mean 'hidden'")),
    C("predict", "unknown field (hardware)", "predict --model llama2-7b --hardware "
      "{d}/hw-unknown-field.yaml", SPEC,
      ("unknown field 'bandwith_bytes_per_s'", "did you mean 'bandwidth_bytes_per_s'")),
    C("predict", "unknown field (HF family)", f"{PRED} --model {{d}}/hf-unknown-family.json",
      SPEC, ("model_type 'lama' is not supported", "did you mean 'llama'")),
    C("predict", "unknown field (layer kind)", f"{PRED} --model {{d}}/graph-kind.yaml", SPEC,
      ("kind must be one of", "'linaer'")),
    C("predict", "unknown column", f"{LLAMA} --batch {{d}}/plans-unknown-column.csv", DATA,
      ("unknown column 'tpp'", "did you mean 'tp'")),
    C("predict", "zero", f"{PRED} --model {{d}}/model-zero.yaml", SPEC,
      ("layers must be > 0", "got 0")),
    C("predict", "zero (flag)", f"{LLAMA} --micro-batch 0", PLAN,
      ("micro_batch must be between 1",)),
    C("predict", "zero (layer graph)", "predict --model alexnet --hardware dgx-v100 --pr 0",
      PLAN, ("--pr must be between 1 and 1e+07, got 0",)),
    C("predict", "not a whole number (layer graph)", "predict --model alexnet --hardware "
      "dgx-v100 --pr 1.5", USAGE, ("'--pr'", "'1.5' is not a valid integer")),
    # the degrees do not divide the GPU count: a plan error, as dp x tp x pp != gpus
    C("predict", "divisibility (derived dp)", f"{LLAMA} --gpus 8 --tp 3", PLAN,
      ("--gpus (8) must be a multiple of tp x pp x cp",)),
    C("predict", "divisibility (layer graph, Pr over the GPUs)", "predict --model alexnet "
      "--hardware dgx-v100 --gpus 8 --pr 16", PLAN, ("--pr 16 must divide --gpus 8",)),
    C("predict", "negative stage layers", f"{LLAMA} --pp 2 --first-stage-layers -1", PLAN,
      ("--first-stage-layers must be between 0 and 1e+07, got -1",)),
    C("predict", "negative", f"{PRED} --model {{d}}/model-negative.yaml", SPEC,
      ("layers must be > 0", "got -4")),
    C("predict", "negative (flag)", f"{LLAMA} --dp -2", PLAN, ("dp must be between 1",)),
    C("predict", "negative (hardware)", "predict --model llama2-7b --hardware "
      "{d}/hw-negative.yaml", SPEC, ("memory_bytes must be >= 1e+06", "got -1")),
    C("predict", "NaN", f"{PRED} --model {{d}}/model-nan.yaml", SPEC,
      ("layers must be a finite number", "nan")),
    C("predict", "NaN (hardware)", "predict --model llama2-7b --hardware {d}/hw-nan.yaml", SPEC,
      ("memory_bytes must be a finite number",)),
    C("predict", "NaN (plan cell)", f"{LLAMA} --batch {{d}}/plans-nan.csv", DATA,
      ("plans-nan.csv:2", "column 'dp' must be a whole number")),
    C("predict", "inf", f"{PRED} --model {{d}}/model-inf.json", SPEC,
      ("vocab must be a finite number", "inf")),
    C("predict", "absurd model (1e18 parameters)", f"{PRED} --model {{d}}/model-absurd.yaml",
      SPEC, ("parameters", "more than 1e16 is refused")),
    C("predict", "absurd GPUs (1e9)", f"{LLAMA} --gpus 1000000000 --dp 1000000000", PLAN,
      ("dp must be between 1 and 1e+07",)),
    C("predict", "absurd hardware", "predict --model llama2-7b --hardware {d}/hw-absurd.yaml",
      SPEC, ("gpus_per_node must be >= 1 and <= 65536", "got 1e+09", "NVLink domain")),
    C("predict", "absurd efficiency", "predict --model llama2-7b --hardware "
      "{d}/hw-efficiency.yaml", SPEC, ("intra_node.efficiency must be >= 0.001 and <= 1",)),
    C("predict", "absurd plan cell", f"{LLAMA} --batch {{d}}/plans-absurd.csv", DATA,
      ("plans-absurd.csv:2", "dp must be between 1 and 1e+07")),
    C("predict", "divisibility (tp)", f"{LLAMA} --tp 3 --gpus 3", PLAN,
      ("heads (32) must be divisible by tp (3)",)),
    C("predict", "divisibility (pp)", f"{LLAMA} --pp 3", PLAN,
      ("layers (32) must be divisible by pp x virtual_stages",)),
    C("predict", "divisibility (batch)", f"{LLAMA} --dp 2 --global-batch 3", PLAN,
      ("global_batch must be divisible by dp x micro_batch",)),
    C("predict", "divisibility (gpus)", f"{LLAMA} --dp 2 --gpus 4", PLAN,
      ("dp x tp x pp must equal gpus",)),
    C("predict", "divisibility (2d grid)", f"{LLAMA} --tp 8 --gpus 8 --tp-layout 2d", PLAN,
      ("tp_layout 2d needs tp = q^2",)),
    C("predict", "divisibility (model spec)", f"{PRED} --model {{d}}/model-indivisible.yaml",
      SPEC, ("hidden (250) must be divisible by heads (8)",)),
    C("predict", "divisibility (layer graph)", "predict --model alexnet --hardware dgx-v100 "
      "--pr 3 --pc 5 --gpus 16", PLAN, ("--pr 3 x --pc 5 must divide --gpus 16",)),
    C("predict", "divisibility (layer graph, a split short of the GPUs)", "predict --model "
      "alexnet --hardware dgx-v100 --pr 2 --pc 2 --gpus 8", PLAN,
      ("--pr x --pc must equal --gpus: 2 x 2 != 8",)),
    C("predict", "divisibility (plan cell)", f"{LLAMA} --batch {{d}}/plans-indivisible.csv", DATA,
      ("plans-indivisible.csv:2", "global_batch must be divisible")),
    C("predict", "option without its partner", f"{LLAMA} --out {{d}}/out.csv", USAGE,
      ("--out goes with --batch",)),
    C("predict", "profile of another version", "predict --model llama2-7b --profile "
      "{d}/profile-v2.json", SPEC, ("profile version 2 is not supported", "reads version 1")),
    C("predict", "wrong type (plan cell)", f"{LLAMA} --batch {{d}}/plans-wrong-type.csv", DATA,
      ("plans-wrong-type.csv:2", "column 'dp' must be a whole number, got 'abc'")),
    C("predict", "empty plans", f"{LLAMA} --batch {{d}}/plans-empty.csv", DATA,
      ("plans-empty.csv is empty", "header row")),
    C("predict", "unreadable (/dev/zero)", f"{PRED} --model /dev/zero", SPEC,
      ("model /dev/zero: is a character device, not a regular file",)),
    C("predict", "unreadable (/dev/zero hardware)", "predict --model llama2-7b --hardware "
      "/dev/zero", SPEC, ("hardware /dev/zero: is a character device",)),
    C("predict", "unreadable (a FIFO)", f"{PRED} --model {{d}}/fifo.yaml", SPEC,
      ("fifo.yaml: is a FIFO (named pipe), not a regular file",)),
    C("predict", "too large (a 16 MiB + 1 B model)", f"{PRED} --model {{d}}/huge.yaml", SPEC,
      ("huge.yaml: is 16 MiB, larger than the 16 MiB limit",)),
    C("predict", "too large (JSON model)", f"{PRED} --model {{d}}/huge.json", SPEC,
      ("huge.json: is 16 MiB, larger than the 16 MiB limit",)),
    C("predict", "YAML alias bomb", f"{PRED} --model {{d}}/model-alias-bomb.yaml", SPEC,
      ("model-alias-bomb.yaml holds more than 200,000 values with its aliases expanded",)),
    C("predict", "YAML alias bomb (hardware)", "predict --model llama2-7b --hardware "
      "{d}/hw-alias-bomb.yaml", SPEC, ("hw-alias-bomb.yaml holds more than 200,000 values",)),
    C("predict", "recursive YAML alias", f"{PRED} --model {{d}}/model-recursive-alias.yaml", SPEC,
      ("alias *loop (line 7) is inside the node it names",)),
    C("predict", "nested too deeply", f"{PRED} --model {{d}}/model-nested.yaml", SPEC,
      ("model-nested.yaml is nested too deeply to be a spec (more than 100 levels",)),
    C("predict", "unreadable plans (/dev/zero)", f"{LLAMA} --batch /dev/zero", DATA,
      ("plans file /dev/zero: is a character device",)),
    C("predict", "too large plans", f"{LLAMA} --batch {{d}}/huge.csv", DATA,
      ("plans file", "huge.csv: is 16 MiB, larger than the 16 MiB limit")),
    C("predict", "plan cell /dev/zero", f"{PRED} --batch {{d}}/plans-dev-zero.csv", DATA,
      ("plans-dev-zero.csv:2: model /dev/zero: is a character device",)),
    C("predict", "plan cell alias bomb", f"{PRED} --batch {{d}}/plans-alias-bomb.csv", DATA,
      ("plans-alias-bomb.csv:2", "holds more than 200,000 values")),
    C("predict", "unreadable profile (/dev/zero)", "predict --model llama2-7b --profile /dev/zero",
      SPEC, ("profile /dev/zero: is a character device",)),
    C("predict", "absurd bandwidth (1e-300 B/s)", "predict --model llama2-7b --hardware "
      "{d}/hw-tiny-bandwidth.yaml --dp 16 --gpus 16", SPEC,
      ("inter_node.bandwidth_bytes_per_s must be >= 1e+06 and <= 1e+15, got 1e-300",)),
    C("predict", "absurd FLOP rate (1e300)", "predict --model llama2-7b --hardware "
      "{d}/hw-huge-flops.yaml", SPEC, ("peak_flops_per_s.bf16 must be >= 1e+06 and <= 1e+17",)),
    C("predict", "absurd memory (1e-300 B)", "predict --model llama2-7b --hardware "
      "{d}/hw-tiny-memory.yaml", SPEC, ("memory_bytes must be >= 1e+06 and <= 1e+15",)),
    C("predict", "absurd overhead (1e300 s)", "predict --model llama2-7b --hardware "
      "{d}/hw-slow-kernels.yaml", SPEC, ("kernel_overhead_s must be >= 0 and <= 1",)),
    C("predict", "absurd GEMM fit", "predict --model llama2-7b --hardware "
      "{d}/hw-gemm-absurd.yaml", SPEC, ("gemm_efficiency.k_half_dim must be >= 0 and <= 1e+09",)),
    C("predict", "absurd collective fit", "predict --model llama2-7b --hardware "
      "{d}/hw-fit-absurd.yaml", SPEC,
      ("collectives.bus_bandwidth_bytes_per_s must be >= 1000 and <= 1e+30",)),
    C("predict", "layer graph: not a list", f"{PRED} --model {{d}}/graph-not-a-list.yaml", SPEC,
      ("'layers' must be a list",)),
    C("predict", "layer graph: wrong type", "predict --model {d}/graph-shape.yaml --hardware "
      "dgx-v100", SPEC, ("input_shape must be a list of positive whole numbers",)),
    # FP8 (issue 17): a GPU without an FP8 peak, a recipe its tensor cores do not run, FP8
    # options without dtype fp8, a layer graph
    C("predict", "fp8 on a GPU without FP8", "predict --model llama2-7b --hardware dgx-a100-80gb "
      "--dtype fp8", PLAN, ("dtype fp8: hardware 'dgx-a100-80gb'", "has no peak_flops_per_s.fp8",
                            "it has fp32, tf32, bf16, fp16")),
    C("predict", "mxfp8 on Hopper", f"{LLAMA} --dtype fp8 --fp8-recipe mxfp8", PLAN,
      ("fp8_recipe mxfp8: hardware 'dgx-h100' runs fp8_recipes delayed, current",
       "Blackwell")),
    C("predict", "fp8 recipe typo", f"{LLAMA} --dtype fp8 --fp8-recipe delay", USAGE,
      ("'delay'", "'delayed'")),
    C("predict", "fp8 recipe without fp8", f"{LLAMA} --fp8-recipe current", PLAN,
      ("fp8_recipe applies to dtype fp8, not bf16",)),
    C("predict", "fp8 output layer without fp8", f"{LLAMA} --fp8-output-layer", PLAN,
      ("fp8_output_layer applies to dtype fp8, not bf16",)),
    C("predict", "fp8 params with ZeRO-3 under MXFP8", f"{LLAMA.replace('dgx-h100', 'dgx-b200')} "
      "--dtype fp8 --fp8-params --dp 2 --zero 3", PLAN,
      ("fp8_params with zero 3 is modelled for the per-tensor FP8 recipes", "not mxfp8")),
    C("predict", "fp8 on a layer graph", "predict --model alexnet --hardware dgx-h100 --pr 2 "
      "--fp8-recipe delayed", USAGE, ("--fp8-recipe, --fp8-output-layer and --fp8-params apply "
                                      "to transformers",)),
    C("predict", "fp8 recipe in a hardware file", f"{LLAMA.replace('dgx-h100', '{d}/hw-fp8.yaml')}"
      " --dtype fp8", SPEC, ("fp8_recipes: unknown recipe 'mxfp4'", "allowed: delayed, current, "
                             "mxfp8")),
    # --- explain -------------------------------------------------------------------------------
    # multi-head latent attention on a 2d grid (its projections are split Megatron's way only)
    C("explain", "MLA on a grid", "explain --model {d}/model-mla.yaml --hardware dgx-h100 "
      "--gpus 4 --tp 4 --tp-layout 2d --micro-batch 2 --global-batch 2", PLAN,
      ("multi-head latent attention (MLA) is modelled with tp_layout 1d", "got tp_layout 2d")),
    C("explain", "preset typo", "explain --model tiny-gtp --hardware dgx-h100", SPEC,
      ("did you mean 'tiny-gpt'",)),
    C("explain", "term typo", f"{EXPL} --term comm/tpp", USAGE,
      ("no term 'comm/tpp'", "did you mean 'comm/tp'")),
    C("explain", "missing file", "explain --model llama2-7b --hardware {d}/nope.yaml", SPEC,
      ("hardware file not found",)),
    C("explain", "unreadable (a directory)", "explain --model {d}/a-directory.json --hardware "
      "dgx-h100", SPEC, ("is a directory",)),
    C("explain", "unreadable (/dev/zero)", "explain --model /dev/zero --hardware dgx-h100", SPEC,
      ("is a character device",)),
    C("explain", "YAML alias bomb", "explain --model llama2-7b --hardware {d}/hw-alias-bomb.yaml",
      SPEC, ("holds more than 200,000 values",)),
    C("explain", "absurd bandwidth (1e-300 B/s)", "explain --model llama2-7b --hardware "
      "{d}/hw-tiny-bandwidth.yaml --dp 16 --gpus 16", SPEC, ("got 1e-300",)),
    C("explain", "malformed TOML", "explain --model {d}/model-malformed.toml --hardware "
      "dgx-h100", SPEC, ("not valid TOML",)),
    C("explain", "wrong type", "explain --model {d}/model-wrong-bool.yaml --hardware dgx-h100",
      SPEC, ("gated_mlp must be true or false",)),
    C("explain", "missing field", "explain --model {d}/model-missing-field.yaml --hardware "
      "dgx-h100", SPEC, ("missing required field 'layers'",)),
    C("explain", "unknown field", "explain --model llama2-7b --hardware "
      "{d}/hw-unknown-field.yaml", SPEC, ("did you mean 'bandwidth_bytes_per_s'",)),
    C("explain", "zero", f"{EXPL} --seq-len 0", SPEC, ("seq_len must be > 0",)),
    C("explain", "NaN", "explain --model llama2-7b --hardware {d}/hw-nan.yaml", SPEC,
      ("must be a finite number",)),
    C("explain", "absurd", f"{EXPL} --seq-len 1000000000", SPEC,
      ("seq_len must be > 0 and <= 1e+08",)),
    C("explain", "divisibility", f"{EXPL} --tp 8 --gpus 8 --sequence-parallel --seq-len 4097",
      PLAN, ("seq_len (4097) must be divisible by tp (8)",)),
    C("explain", "profile of another version", "explain --model llama2-7b --profile "
      "{d}/profile-v2.json", SPEC, ("profile version 2 is not supported",)),
    # --- collective ----------------------------------------------------------------------------
    C("collective", "preset typo", f"{COLL} --hardware dgx-h10", SPEC,
      ("did you mean 'dgx-h100'",)),
    C("collective", "choice typo", "collective --op allreduce --bytes 1GiB --ranks 16 --hardware "
      "dgx-h100", USAGE, ("'allreduce' is not one of", "'all_reduce'")),
    C("collective", "missing file", f"{COLL} --profile {{d}}/nope.json", SPEC, ("file not found",)),
    C("collective", "unreadable (a directory)", f"{COLL} --hardware {{d}}/a-directory.yaml", SPEC,
      ("is a directory",)),
    C("collective", "unreadable (/dev/zero)", f"{COLL} --hardware /dev/zero", SPEC,
      ("hardware /dev/zero: is a character device",)),
    C("collective", "unreadable (a FIFO profile)", f"{COLL} --profile {{d}}/fifo.txt", SPEC,
      ("profile", "fifo.txt: is a FIFO",)),
    C("collective", "YAML alias bomb", f"{COLL} --hardware {{d}}/hw-alias-bomb.yaml", SPEC,
      ("holds more than 200,000 values",)),
    C("collective", "absurd bandwidth (1e-300 B/s)", f"{COLL} --hardware "
      "{d}/hw-tiny-bandwidth.yaml", SPEC, ("got 1e-300",)),
    C("collective", "malformed YAML", f"{COLL} --hardware {{d}}/hw-malformed.yaml", SPEC,
      ("not valid YAML",)),
    C("collective", "wrong type", f"{COLL.replace('1GiB', 'lots')} --hardware dgx-h100", USAGE,
      ("--bytes must be a size like",)),
    C("collective", "missing flag", COLL, USAGE, ("give --hardware",)),
    # click's message of a missing choice lists the choices on one line, no literal \n\t
    C("collective", "missing choice flag", "collective --bytes 1e6 --ranks 2", USAGE,
      ("Missing option '--op'. Choose from: all_reduce, all_gather, reduce_scatter",)),
    C("collective", "unknown field", f"{COLL} --hardware {{d}}/hw-unknown-field.yaml", SPEC,
      ("unknown field 'bandwith_bytes_per_s'",)),
    C("collective", "zero", f"{COLL.replace('1GiB', '0')} --hardware dgx-h100", PLAN,
      ("--bytes must be positive",)),
    C("collective", "negative", f"{COLL.replace('16', '-3')} --hardware dgx-h100", PLAN,
      ("--ranks must be between 1 and 1e8",)),
    C("collective", "NaN", f"{COLL.replace('1GiB', 'nan')} --hardware dgx-h100", USAGE,
      ("--bytes must be a finite number, got 'nan'",)),
    C("collective", "inf", f"{COLL.replace('1GiB', '1e400')} --hardware dgx-h100", USAGE,
      ("--bytes must be a finite number, got '1e400'",)),
    C("collective", "negative bytes", f"{COLL.replace('1GiB', '-1MiB')} --hardware dgx-h100",
      PLAN, ("--bytes must be positive",)),
    C("collective", "not whole bytes", f"{COLL.replace('1GiB', '1.5')} --hardware dgx-h100",
      USAGE, ("--bytes must be a whole number of bytes",)),
    C("collective", "absurd bytes", f"{COLL.replace('1GiB', '1e40')} --hardware dgx-h100", PLAN,
      ("--bytes must be at most 1 EiB",)),
    C("collective", "absurd ranks (1e9)", f"{COLL.replace('16', '1000000000')} --hardware "
      "dgx-h100", PLAN, ("--ranks must be between 1 and 1e8",)),
    C("collective", "divisibility", f"{COLL} --ranks-per-node 3 --hardware dgx-h100", PLAN,
      ("--ranks-per-node must divide --ranks (16)",)),
    C("collective", "profile of another version", f"{COLL} --profile {{d}}/profile-v2.json", SPEC,
      ("profile version 2 is not supported",)),
    # --- recommend -----------------------------------------------------------------------------
    C("recommend", "fp8 on a GPU without FP8", "recommend --model llama2-7b --hardware "
      "dgx-v100 --gpus 8 --global-batch 8 --dtype fp8", PLAN,
      ("has no peak_flops_per_s.fp8",)),
    C("recommend", "mxfp8 on Hopper", f"{REC} --dtype fp8 --fp8-recipe mxfp8", PLAN,
      ("fp8_recipe mxfp8: hardware 'dgx-h100' runs",)),
    C("recommend", "preset typo", f"{REC.replace('llama2-7b', 'llama2-7bb')}", SPEC,
      ("did you mean 'llama2-7b'",)),
    C("recommend", "missing file", "recommend --model {d}/nope.json --hardware dgx-h100 --gpus 8 "
      "--global-batch 8", SPEC, ("model file not found",)),
    C("recommend", "unreadable (a directory)", "recommend --model llama2-7b --hardware "
      "{d}/a-directory.yaml --gpus 8 --global-batch 8", SPEC, ("is a directory",)),
    C("recommend", "unreadable (/dev/zero)", "recommend --model /dev/zero --hardware dgx-h100 "
      "--gpus 8 --global-batch 8", SPEC, ("model /dev/zero: is a character device",)),
    C("recommend", "too large", "recommend --model {d}/huge.yaml --hardware dgx-h100 --gpus 8 "
      "--global-batch 8", SPEC, ("larger than the 16 MiB limit",)),
    C("recommend", "YAML alias bomb", "recommend --model {d}/model-alias-bomb.yaml --hardware "
      "dgx-h100 --gpus 8 --global-batch 8", SPEC, ("holds more than 200,000 values",)),
    C("recommend", "absurd bandwidth (1e-300 B/s)", "recommend --model llama2-7b --hardware "
      "{d}/hw-tiny-bandwidth.yaml --gpus 8 --global-batch 8", SPEC, ("got 1e-300",)),
    C("recommend", "absurd what-if (1e-300x)", f"{REC} --what-if "
      "inter_node.bandwidth_bytes_per_s=1e-300x", SPEC,
      ("inter_node.bandwidth_bytes_per_s must be >= 1e+06",)),
    C("recommend", "malformed JSON", "recommend --model {d}/model-malformed.json --hardware "
      "dgx-h100 --gpus 8 --global-batch 8", SPEC, ("not valid JSON",)),
    C("recommend", "wrong type", REC.replace("--gpus 8", "--gpus 8,x"), USAGE,
      ("--gpus must be whole numbers separated by commas",)),
    C("recommend", "missing field", "recommend --model {d}/hf-missing-field.json --hardware "
      "dgx-h100 --gpus 8 --global-batch 8 --seq-len 2048", SPEC,
      ("is missing 'intermediate_size'",)),
    C("recommend", "missing field (HF config: no training length)", f"recommend --model "
      f"{HF}/qwen3-0.6b --hardware dgx-h100 --gpus 8 --global-batch 8", SPEC,
      ("has no training sequence length: give --seq-len", "max_position_embeddings is 40960")),
    C("recommend", "ep pinned to divide no experts (HF mixture of experts)", f"recommend --model "
      f"{HF}/mixtral-8x7b-v0.1 --hardware dgx-h100 --gpus 8 --global-batch 8 --seq-len 4096 "
      "--ep 3", PLAN, ("no plan satisfies the pins ep 3 with 8 GPUs",
                       "ep must divide the experts (8) and tp x dp x cp")),
    C("recommend", "unknown field", f"{REC} --what-if inter_node.bandwith_bytes_per_s=2x", USAGE,
      ("unknown numeric hardware field 'inter_node.bandwith_bytes_per_s'",
       "did you mean 'inter_node.bandwidth_bytes_per_s'")),
    C("predict", "CUDA graphs on synchronous ranks", "predict --model llama2-7b --hardware "
      "{d}/hw-sync.yaml --gpus 8 --global-batch 8 --stack cuda-graphs", PLAN,
      ("stack cuda-graphs (--stack, or a job config's CUDA graphs)", "--stack eager")),
    C("recommend", "CUDA graphs on synchronous ranks", "recommend --model llama2-7b --hardware "
      "{d}/hw-sync.yaml --gpus 8 --global-batch 8 --stack cuda-graphs", PLAN,
      ("asynchronous_device false",)),
    C("recommend", "a factor for a yes-or-no field", f"{REC} --what-if asynchronous_device=2x",
      USAGE, ("asynchronous_device is true or false, got '2'",)),
    C("recommend", "true for a numeric field", f"{REC} --what-if memory_bytes=true", USAGE,
      ("memory_bytes is not a yes-or-no field",)),
    C("recommend", "not a number", f"{REC} --what-if memory_bytes=1e", USAGE,
      ("'1e' in 'memory_bytes=1e' is not a number",)),
    C("recommend", "a factor for a group of fields (an internal error before)",
      f"{REC} --what-if intra_node=2x", USAGE,
      ("intra_node is a group of fields; change one of them",)),
    C("recommend", "a factor for a field the hardware leaves unset",
      f"{REC} --what-if gpus_per_host=2x", PLAN,
      ("gpus_per_host is not set on hardware 'dgx-h100': give a value",)),
    C("recommend", "a what-if hardware the stack cannot run, before the search",
      f"{REC} --stack cuda-graphs --what-if asynchronous_device=false", PLAN,
      ("--what-if asynchronous_device=false: stack cuda-graphs",)),
    # a plan field out of its range is a plan error in every command (predict --dp 0's class)
    C("recommend", "zero", REC.replace("--gpus 8", "--gpus 0"), PLAN,
      ("--gpus must be between 1 and 1e+07",)),
    C("recommend", "zero (pin)", f"{REC} --tp 0", PLAN,
      ("--tp must be between 1 and 1e+07, got 0",)),
    C("recommend", "not a whole number (pin)", f"{REC} --tp 1.5", USAGE,
      ("'--tp'", "'1.5' is not a valid integer")),
    C("recommend", "out of range (ZeRO)", f"{REC} --zero 5", PLAN,
      ("--zero must be between 0 and 3, got 5",)),
    C("recommend", "negative (offloaded layers)", f"{REC} --cpu-offload-layers -1", PLAN,
      ("--cpu-offload-layers must be at least 0, got -1",)),
    C("recommend", "negative", REC.replace("--global-batch 8", "--global-batch -8"), PLAN,
      ("--global-batch must be between 1 and 1e+07, got -8",)),
    C("recommend", "NaN", f"{REC} --tokens nan", USAGE, ("'--tokens'", "must be a finite number")),
    C("recommend", "inf", f"{REC} --gpu-hour-price inf", USAGE,
      ("'--gpu-hour-price'", "must be a finite number")),
    C("recommend", "out of range", f"{REC} --memory-margin 1.5", USAGE, ("'--memory-margin'",)),
    C("recommend", "absurd GPUs (1e9)", REC.replace("--gpus 8", "--gpus 1000000000"), PLAN,
      ("--gpus must be between 1 and 1e+07",)),
    C("recommend", "absurd model", "recommend --model {d}/model-absurd.yaml --hardware dgx-h100 "
      "--gpus 8 --global-batch 8", SPEC, ("more than 1e16 is refused",)),
    C("recommend", "divisibility", f"{REC} --tp 3", PLAN,
      ("no plan satisfies the pins tp 3", "tp must divide heads")),
    C("recommend", "nothing fits", "recommend --model llama3-405b --hardware dgx-h100 --gpus 8 "
      "--global-batch 8", PLAN, ("no plan fits in memory",)),
    C("recommend", "profile of another version", "recommend --model llama2-7b --profile "
      "{d}/profile-v2.json --gpus 8 --global-batch 8", SPEC, ("profile version 2",)),
    # a sustained clock inside its own bound (<= 1.5) that lifts a GEMM ceiling over the peak:
    # refused naming it, not the fit's max_fraction the user never set (a fuzz, 2026-12-07)
    C("recommend", "sustained clock over the peak", f"{REC} --what-if "
      "sustained_clock_fraction=1.4x", SPEC,
      ("sustained_clock_fraction 1.2502 takes gemm_efficiency.bf16's GEMM ceiling",
       "must lie in")),
    # --- sweep ---------------------------------------------------------------------------------
    C("sweep", "sustained clock over the peak", "sweep --model resnet50 --gpus 8 --global-batch "
      "64 --hardware dgx-h100 --vary sustained_clock_fraction=1.5", SPEC,
      ("sustained_clock_fraction 1.5 takes gemm_efficiency.bf16's GEMM ceiling 0.803 to 1.205",)),
    C("sweep", "preset typo", f"{SWEEP.replace('alexnet', 'alexnett')} {VARY}", SPEC,
      ("did you mean 'alexnet'",)),
    C("sweep", "field typo", f"{SWEEP} --vary peak_flop_per_s=1e14", USAGE,
      ("--vary: unknown field 'peak_flop_per_s'", "did you mean 'peak_flops_per_s'")),
    C("sweep", "missing file", f"sweep --model {{d}}/nope.yaml --hardware dgx-v100 --gpus 16 "
      f"--global-batch 256 {VARY}", SPEC, ("model file not found",)),
    C("sweep", "unreadable (a directory)", f"{SWEEP} {VARY} --hardware {{d}}/a-directory.yaml",
      SPEC, ("is a directory",)),
    C("sweep", "unreadable (/dev/zero)", f"sweep --model /dev/zero --hardware dgx-v100 --gpus 16 "
      f"--global-batch 256 {VARY}", SPEC, ("model /dev/zero: is a character device",)),
    C("sweep", "YAML alias bomb", f"{SWEEP} {VARY} --hardware {{d}}/hw-alias-bomb.yaml", SPEC,
      ("holds more than 200,000 values",)),
    C("sweep", "absurd value (1e-300 B/s)", f"{SWEEP} --vary "
      "inter_node.bandwidth_bytes_per_s=1e-300", SPEC,
      ("inter_node.bandwidth_bytes_per_s must be >= 1e+06 and <= 1e+15, got 1e-300",)),
    C("sweep", "malformed YAML", f"sweep --model {{d}}/model-malformed.yaml --hardware dgx-v100 "
      f"--gpus 16 --global-batch 256 {VARY}", SPEC, ("not valid YAML",)),
    C("sweep", "wrong type", f"{SWEEP} --vary peak_flops_per_s=lots", USAGE,
      ("--vary must look like FIELD=V1,V2 with numbers",)),
    C("sweep", "wrong model kind", f"{SWEEP.replace('alexnet', 'llama2-7b')} {VARY}", USAGE,
      ("sweep takes a layer-graph model",)),
    C("sweep", "missing values", f"{SWEEP} --vary peak_flops_per_s", USAGE,
      ("give at least one value",)),
    C("sweep", "unknown field", f"sweep --model {{d}}/graph-kind.yaml --hardware dgx-v100 "
      f"--gpus 16 --global-batch 256 {VARY}", SPEC, ("kind must be one of",)),
    # a hardware field's value out of range: a spec error; a plan field's, a plan error
    C("sweep", "zero", f"{SWEEP} --vary peak_flops_per_s=0", SPEC,
      ("values must be > 0",)),
    C("sweep", "zero (pr)", f"{SWEEP} {VARY} --pr 0", PLAN, ("--pr must be between 1",)),
    C("sweep", "zero (GPUs)", SWEEP.replace("--gpus 16", "--gpus 0") + f" {VARY}", PLAN,
      ("--gpus must be between 1 and 1e+07, got 0",)),
    C("sweep", "negative", f"{SWEEP} --vary global_batch=-1", PLAN,
      ("whole numbers from 1 to 1e+07, got -1",)),
    C("sweep", "NaN", f"{SWEEP} --vary memory_bandwidth_bytes_per_s=nan", USAGE,
      ("values must be finite numbers",)),
    C("sweep", "inf", f"{SWEEP} --vary inter_node.bandwidth_bytes_per_s=inf", USAGE,
      ("values must be finite numbers",)),
    C("sweep", "absurd (1e9 GPUs)", f"{SWEEP} --vary gpus=1e9", PLAN,
      ("whole numbers from 1 to 1e+07",)),
    C("sweep", "not whole", f"{SWEEP} --vary gpus=3.5", USAGE, ("whole numbers",)),
    C("sweep", "divisibility", f"{SWEEP} {VARY} --pr 3", PLAN, ("--pr (3) must divide --gpus",)),
    C("sweep", "divisibility (batch)", f"{SWEEP.replace('256', '250')} {VARY}", PLAN,
      ("global_batch (250) must be divisible by pc (16)",)),
    C("sweep", "profile of another version", f"{SWEEP} {VARY} --profile {{d}}/profile-v2.json",
      SPEC, ("profile version 2",)),
    # --- presets -------------------------------------------------------------------------------
    C("presets", "option typo", "presets --jsn", USAGE, ("No such option '--jsn'",
                                                         "Did you mean '--json'")),
    C("presets", "extra argument", "presets llama2-7b", USAGE, ("unexpected extra argument",)),
    C("presets", "command typo", "preset", USAGE, ("No such command 'preset'",
                                                   "Did you mean one of", "'presets'")),
    # --- calibrate run -------------------------------------------------------------------------
    C("calibrate run", "zero", f"calibrate run {OUT} --nprocs 0", USAGE,
      ("'--nprocs'", "0 is not in the range x>=1")),
    C("calibrate run", "negative", f"calibrate run {OUT} --nprocs -2", USAGE, ("'--nprocs'",)),
    C("calibrate run", "wrong type", f"calibrate run {OUT} --nprocs two", USAGE,
      ("'two' is not a valid integer",)),
    C("calibrate run", "choice typo", f"calibrate run {OUT} --backend glo", USAGE,
      ("'glo' is not one of",)),
    C("calibrate run", "stage typo", f"calibrate run {OUT} --stages gem", USAGE,
      ("stages must be among gemm, memory, collectives, framework",)),
    C("calibrate run", "output is a directory (refused before the run)",
      "calibrate run --out {d}/a-directory", 7, ("refusing to write profile",
                                                 "a-directory: it is a directory")),
    # a directory given for a file: the class of the file it stands for (docs/cli.md), as a
    # device or a FIFO there (click's own check answered 2 for a directory alone)
    C("predict", "profile is a directory", f"{LLAMA} --gpus 8 --global-batch 8 --profile "
      "{d}/a-directory", SPEC, ("profile", "a-directory: is a directory")),
    C("predict", "plans file is a directory", f"{PRED} --batch {{d}}/a-directory", DATA,
      ("plans file", "a-directory: is a directory")),
    C("predict", "job config is a directory", "predict --from-config {d}/a-directory", SPEC,
      ("job config", "a-directory: is a directory")),
    C("predict", "plot is a directory", f"{LLAMA} --gpus 8 --global-batch 8 --plot "
      "{d}/a-directory", 7, ("refusing to write plot", "a-directory: it is a directory")),
    C("recommend", "plans CSV is a directory", f"{REC} --csv {{d}}/a-directory", 7,
      ("refusing to write plans CSV", "a-directory: it is a directory")),
    C("validate", "report is a directory (refused before the run)",
      f"{VAL} --gpus 2 --dp 2 --global-batch 4 --out {{d}}/a-directory", 7,
      ("refusing to write validation report", "a-directory: it is a directory")),
    C("validate", "trace in a missing directory (refused before the run)",
      f"{VAL} --gpus 2 --dp 2 --global-batch 4 --trace {{d}}/nope/t.json", 7,
      ("output directory does not exist",)),
    C("validate", "report under a file (refused before the run)",
      f"{VAL} --gpus 2 --dp 2 --global-batch 4 --out {{d}}/fifo.txt/sub/r.json", 7,
      ("cannot create the directory of validation report", "is not a directory")),
    C("validate", "history is a directory (refused before the run)",
      f"{VAL} --gpus 2 --dp 2 --global-batch 4 --history {{d}}/a-directory", 7,
      ("refusing to write validation history", "a-directory: it is a directory")),
    C("calibrate run", "output is a FIFO (refused before the run)",
      "calibrate run --out {d}/fifo.txt --quick", 7, ("refusing to write profile",
                                                     "fifo.txt: it is a FIFO")),
    C("calibrate run", "missing flag", "calibrate run --quick", USAGE, ("Missing option '--out'",)),
    C("calibrate run", "command typo", f"calibrate runn {OUT}", USAGE,
      ("No such command 'runn'", "Did you mean 'run'")),
    # --- calibrate import-nccl-tests -----------------------------------------------------------
    C("import-nccl-tests", "missing file", f"{NCCL} {{d}}/nope.txt {OUT}", DATA,
      ("nope.txt: file not found",)),
    C("import-nccl-tests", "unreadable (a directory)", f"{NCCL} {{d}}/a-directory {OUT}", DATA,
      ("a-directory: is a directory",)),
    C("import-nccl-tests", "unreadable (/dev/zero)", f"{NCCL} /dev/zero {OUT}", DATA,
      ("/dev/zero: is a character device",)),
    C("import-nccl-tests", "unreadable (a FIFO)", f"{NCCL} {{d}}/fifo.txt {OUT}", DATA,
      ("fifo.txt: is a FIFO",)),
    C("import-nccl-tests", "too large", f"{NCCL} {{d}}/huge.txt {OUT}", DATA,
      ("huge.txt: is 16 MiB, larger than the 16 MiB limit",)),
    C("import-nccl-tests", "empty log", f"{NCCL} {{d}}/log-empty.txt {OUT}", DATA,
      ("log-empty.txt: empty file, not an nccl-tests log",)),
    C("import-nccl-tests", "truncated log (between rows)", f"{NCCL} {{d}}/log-cut-between-rows.txt"
      f" {OUT}", DATA, ("log-cut-between-rows.txt:3", "truncated log", "--allow-truncated")),
    C("import-nccl-tests", "truncated log (mid-row)", f"{NCCL} {{d}}/log-cut-mid-row.txt {OUT}",
      DATA, (f"log-cut-mid-row.txt:{_FIRST_ROW + 4}", "truncated log?")),
    C("import-nccl-tests", "truncated log (header only)", f"{NCCL} {{d}}/log-header-only.txt "
      f"{OUT}", DATA, ("log-header-only.txt:3", "Rank")),
    C("import-nccl-tests", "log of another tool", f"{NCCL} {{d}}/log-osu.txt {OUT}", DATA,
      ("log-osu.txt", "not an nccl-tests log")),
    C("import-nccl-tests", "binary file", f"{NCCL} {{d}}/log-binary.txt {OUT}", DATA,
      ("binary file, not an nccl-tests log",)),
    C("import-nccl-tests", "wrong type (a number)", f"{NCCL} {{d}}/log-garbled.txt {OUT}", DATA,
      ("log-garbled.txt:", "algbw '18x.49' is not a number")),
    C("import-nccl-tests", "a GEMM table", f"{NCCL} {GEMM} {OUT}", DATA,
      ("not an nccl-tests log",)),
    C("import-nccl-tests", "preset typo", f"{NCCL} {LOG} {OUT} --base dgx-h10", SPEC,
      ("did you mean 'dgx-h100'",)),
    C("import-nccl-tests", "choice typo", f"{NCCL} {LOG} {OUT} --op allreduce", USAGE,
      ("'allreduce' is not one of",)),
    C("import-nccl-tests", "missing argument", f"{NCCL} {OUT}", USAGE,
      ("Missing argument 'LOGS...'",)),
    # --- calibrate import-gemm -----------------------------------------------------------------
    C("import-gemm", "missing file", f"{GEMMI} {{d}}/nope.csv {OUT}", DATA,
      ("nope.csv: file not found",)),
    C("import-gemm", "unreadable (a directory)", f"{GEMMI} {{d}}/a-directory {OUT}", DATA,
      ("a-directory: is a directory",)),
    C("import-gemm", "unreadable (/dev/zero)", f"{GEMMI} /dev/zero {OUT}", DATA,
      ("/dev/zero: is a character device",)),
    C("import-gemm", "too large", f"{GEMMI} {{d}}/huge.csv {OUT}", DATA,
      ("huge.csv: is 16 MiB, larger than the 16 MiB limit",)),
    C("import-gemm", "empty table", f"{GEMMI} {{d}}/gemm-empty.csv {OUT}", DATA,
      ("gemm-empty.csv: empty file",)),
    C("import-gemm", "header only", f"{GEMMI} {{d}}/gemm-header-only.csv {OUT}", DATA,
      ("gemm-header-only.csv: no GEMM shapes",)),
    C("import-gemm", "table of another tool", f"{GEMMI} {MAMF} {OUT}", DATA,
      ("not a GEMM sweep: need columns m, n, k, dtype and flops_per_s",)),
    C("import-gemm", "an nccl-tests log", f"{GEMMI} {LOG} {OUT}", DATA, ("not a GEMM sweep",)),
    C("import-gemm", "negative", f"{GEMMI} {{d}}/gemm-negative.csv {OUT}", DATA,
      ("gemm-negative.csv:2", "column 'flops_per_s' must be a positive number up to 1e18 "
                             "FLOP/s, got '-5'")),
    C("import-gemm", "NaN", f"{GEMMI} {{d}}/gemm-nan.csv {OUT}", DATA,
      ("gemm-nan.csv:2", "column 'flops_per_s' must be a positive number")),
    C("import-gemm", "too few shapes", f"{GEMMI} {{d}}/gemm-too-few.csv {OUT}", DATA,
      ("nothing to fit", "too few to fit (need 12)")),
    C("import-gemm", "device typo", f"{GEMMI} {GEMM} {OUT} --device sm_9", DATA,
      ("no rows for device 'sm_9'",)),
    C("import-gemm", "preset typo", f"{GEMMI} {GEMM} {OUT} --base dgx-h10", SPEC,
      ("did you mean 'dgx-h100'",)),
    C("import-gemm", "out of range", f"{GEMMI} {GEMM} {OUT} --folds 1", USAGE,
      ("'--folds'", "1 is not in the range x>=2")),
    # --- calibrate report ----------------------------------------------------------------------
    C("report", "missing file", "calibrate report {d}/nope.json", SPEC,
      ("nope.json: file not found",)),
    C("report", "unreadable (a directory)", "calibrate report {d}/a-directory.json", SPEC,
      ("a-directory.json: is a directory",)),
    C("report", "unreadable (/dev/zero)", "calibrate report /dev/zero", SPEC,
      ("profile /dev/zero: is a character device",)),
    C("report", "too large", "calibrate report {d}/huge.json", SPEC,
      ("profile", "huge.json: is 16 MiB, larger than the 16 MiB limit")),
    C("report", "malformed JSON (truncated)", "calibrate report {d}/profile-truncated.json", SPEC,
      ("profile-truncated.json: not valid JSON at line 1", "truncated")),
    C("report", "not a profile", "calibrate report {d}/profile-not-a-profile.json", SPEC,
      ("field 'format' must be 'perfmodel-profile'",)),
    C("report", "not JSON (a log)", "calibrate report {d}/log-osu.txt", SPEC,
      ("log-osu.txt: not valid JSON",)),
    C("report", "wrong type", "calibrate report {d}/profile-wrong-type.json", SPEC,
      ("field 'complete' must be true or false",)),
    C("report", "missing field", "calibrate report {d}/profile-missing-field.json", SPEC,
      ("missing required field 'fits'",)),
    C("report", "unknown field", "calibrate report {d}/profile-unknown-field.json", SPEC,
      ("unknown field 'extra'", ALLOWED)),
    C("report", "unknown hardware field", "calibrate report {d}/profile-hw-unknown-field.json",
      SPEC, ("unknown field 'memry_bytes'", "did you mean 'memory_bytes'")),
    C("report", "NaN", "calibrate report {d}/profile-nan.json", SPEC,
      ("params.alpha_s must be a finite number",)),
    C("report", "profile of another version", "calibrate report {d}/profile-v2.json", SPEC,
      ("profile version 2 is not supported", "re-run `perfmodel calibrate`")),
    # --- validate (a run) ----------------------------------------------------------------------
    C("validate", "layer-graph grid on a transformer (--emit)", "validate --model tiny-gpt "
      "--hardware dgx-h100 --tp-layout 2d --pr 2 --pc 2 --emit {d}/emitted", USAGE,
      ("--pr/--pc apply to layer-graph models",)),
    C("validate", "layer-graph grid on a transformer (--dry-run)",
      "validate --model tiny-gpt --pr 2 --dry-run", USAGE, ("--pr/--pc apply to layer-graph",)),
    C("validate", "MoE with tp > 1 and no sequence parallelism", "validate --model mixtral-8x7b "
      "--dry-run --dp 2 --tp 2", PLAN, ("a mixture of experts with tp > 1 (2) needs "
                                        "sequence_parallel",)),
    C("validate", "preset typo", f"{VAL.replace('tiny-gpt', 'tiny-gp')} --dp 2", SPEC,
      ("did you mean 'tiny-gpt'",)),
    C("validate", "missing file", "validate --model tiny-gpt --profile {d}/nope.json --dp 2",
      SPEC, ("file not found",)),
    C("validate", "unreadable (a directory)", "validate --model {d}/a-directory.yaml --hardware "
      "dgx-h100 --dp 2", SPEC, ("is a directory",)),
    C("validate", "unreadable (/dev/zero)", "validate --model /dev/zero --hardware dgx-h100 "
      "--dp 2", SPEC, ("model /dev/zero: is a character device",)),
    C("validate", "YAML alias bomb", "validate --model {d}/model-alias-bomb.yaml --hardware "
      "dgx-h100 --dp 2", SPEC, ("holds more than 200,000 values",)),
    C("validate", "collect: meta.json is a FIFO", "validate collect {d}/collect-fifo", DATA,
      ("meta.json: is a FIFO",)),
    C("validate", "malformed YAML", "validate --model tiny-gpt --hardware {d}/hw-malformed.yaml "
      "--dp 2", SPEC, ("not valid YAML",)),
    C("validate", "wrong type", f"{VAL} --steps many", USAGE, ("'many' is not a valid integer",)),
    C("validate", "missing flag", "validate --model tiny-gpt --dp 2", USAGE,
      ("give --hardware (a preset or file) or --profile",)),
    C("validate", "unknown field", "validate --model {d}/model-unknown-field.yaml --hardware "
      "dgx-h100", SPEC, ("did you mean 'hidden'",)),
    C("validate", "zero", f"{VAL} --nprocs 0", USAGE, ("'--nprocs'", "0 is not in the range")),
    # a model field's override out of range: a spec error, as --seq-len 0
    C("validate", "zero (override)", f"{VAL} --layers 0", SPEC,
      ("--layers must be between 1 and 1e+07, got 0",)),
    C("validate", "zero port", f"{VAL} --dp 2 --port 0", USAGE,
      ("'--port'", "0 is not in the range 1<=x<=65535")),
    C("validate", "negative", f"{VAL} --timeout -5", USAGE, ("'--timeout'",)),
    C("validate", "NaN", f"{VAL} --timeout nan", USAGE, ("'--timeout'", "must be a finite number")),
    C("validate", "absurd port", f"{VAL} --port 70000", USAGE, ("'--port'",)),
    C("validate", "absurd plan for this machine", f"{VAL} --dp 2 --hidden 16384 --heads 32 "
      "--layers 64", PLAN, ("the machine cannot hold this plan",)),
    C("validate", "divisibility", f"{VAL} --nprocs 3 --dp 2", PLAN,
      ("the plan needs dp x cp x tp x pp = 2 ranks, but --nprocs is 3",)),
    C("validate", "divisibility (override)", f"{VAL} --hidden 100 --heads 3", SPEC,
      ("hidden (100) must be divisible by heads (3)",)),
    C("validate", "divisibility (emit)", f"{VAL} --dp 2 --emit {{d}}/out/emit --nodes 3 "
      "--gpus-per-node 8", PLAN, ("nodes x gpus per node (3 x 8) must equal the plan's gpus",)),
    C("validate", "fault spec typo", f"{VAL} --inject-fault boom", USAGE,
      ("use crash:RANK:STEP or hang:RANK:STEP",)),
    C("validate", "profile of another version", "validate --model tiny-gpt --profile "
      "{d}/profile-v2.json --dp 2", SPEC, ("profile version 2 is not supported",)),
    C("validate", "collect: missing directory", "validate collect {d}/nope", USAGE,
      ("Directory", "does not exist")),
    C("validate", "collect: not an emitted run", "validate collect {d}/a-directory", DATA,
      ("no readable meta.json",)),
    # --- validate --dry-run --------------------------------------------------------------------
    C("validate --dry-run", "preset typo", "validate --model tiny-gtp --dry-run", SPEC,
      ("did you mean 'tiny-gpt'",)),
    C("validate --dry-run", "missing file", "validate --model {d}/nope.yaml --dry-run", SPEC,
      ("model file not found",)),
    C("validate --dry-run", "unreadable (a directory)", "validate --model {d}/a-directory.json "
      "--dry-run", SPEC, ("a-directory.json", "is a directory")),
    C("validate --dry-run", "unreadable (/dev/zero)", "validate --model /dev/zero --dry-run", SPEC,
      ("model /dev/zero: is a character device",)),
    C("validate --dry-run", "absurd bandwidth (1e-300 B/s)", f"{DRY} --hardware "
      "{d}/hw-tiny-bandwidth.yaml", SPEC, ("got 1e-300",)),
    C("validate --dry-run", "NaN", "validate --model {d}/model-nan.yaml --dry-run", SPEC,
      ("layers must be a finite number",)),
    C("validate --dry-run", "malformed TOML", "validate --model {d}/model-malformed.toml "
      "--dry-run", SPEC, ("not valid TOML",)),
    C("validate --dry-run", "wrong type", "validate --model {d}/model-wrong-type.yaml --dry-run",
      SPEC, ("layers must be a number",)),
    C("validate --dry-run", "wrong model kind", "validate --model alexnet --dry-run", USAGE,
      ("is a layer graph (CNN/MLP)",)),
    C("validate --dry-run", "missing field", "validate --model {d}/model-missing-field.yaml "
      "--dry-run", SPEC, ("missing required field 'layers'",)),
    C("validate --dry-run", "unknown field", "validate --model tiny-gpt --dry-run --hardware "
      "{d}/hw-unknown-field.yaml", SPEC, ("did you mean 'bandwidth_bytes_per_s'",)),
    C("validate --dry-run", "zero", f"{DRY} --dp 0", PLAN, ("dp must be between 1",)),
    C("validate --dry-run", "zero (override)", f"{DRY} --heads 0", SPEC, ("--heads must be",)),
    C("validate --dry-run", "negative", f"{DRY} --vocab -1", SPEC, ("--vocab must be",)),
    C("validate --dry-run", "not a whole number (override)", f"{DRY} --hidden abc", USAGE,
      ("'--hidden'", "'abc' is not a valid integer")),
    C("validate --dry-run", "absurd GPUs (1e9)", f"{DRY} --gpus 1000000000 --dp 1000000000",
      PLAN, ("dp must be between 1 and 1e+07",)),
    C("validate --dry-run", "absurd model", "validate --model {d}/model-absurd.yaml --dry-run",
      SPEC, ("more than 1e16 is refused",)),
    C("validate --dry-run", "divisibility", f"{DRY} --tp 3", PLAN,
      ("heads (8) must be divisible by tp (3)",)),
    C("validate --dry-run", "divisibility (grid)", f"{DRY} --tp 4 --tp-layout 2d", PLAN,
      ("micro_batch (1) must be a multiple of 2",)),
    C("validate --dry-run", "profile of another version", f"{DRY} --profile "
      "{d}/profile-v2.json", SPEC, ("profile version 2",)),
]

COMMANDS = ("predict", "explain", "collective", "recommend", "sweep", "presets", "calibrate run",
            "import-nccl-tests", "import-gemm", "report", "validate", "validate --dry-run")


def run_main(args: list[str]) -> tuple[int, str, str]:
    """perfmodel ARGS in this process, as the `perfmodel` script runs it: (exit code, out, err)."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


def _args(case: Case, d: Path) -> list[str]:
    return case.args.format(d=d).split()


def _check(case: Case, code: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert code == case.code, f"exit {code}, expected {case.code}: {err}"
    assert "Traceback" not in err
    assert len(lines) == case.lines, f"{len(lines)} lines on stderr: {err}"
    assert lines[0].startswith("error:"), err
    for needle in case.needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def test_the_matrix_covers_every_command_and_every_kind_of_bad_input():
    """Each command has rows for what it reads: presets, files, values, rules (no empty column)."""
    by_command: dict[str, set[str]] = {c: set() for c in COMMANDS}
    for case in CASES:
        by_command[case.command].add(case.kind)
    assert all(by_command.values()), [c for c, kinds in by_command.items() if not kinds]
    reads_specs = ("predict", "explain", "collective", "recommend", "sweep", "validate",
                   "validate --dry-run")
    for command in reads_specs:
        kinds = " ".join(by_command[command])
        for kind in ("preset typo", "missing", "unreadable", "malformed", "wrong type",
                     "unknown field", "zero", "NaN", "absurd", "divisibility",
                     "profile of another version"):
            assert kind in kinds, f"{command}: no '{kind}' row"
    for kind in ("empty log", "truncated log (between rows)", "truncated log (mid-row)",
                 "log of another tool"):
        assert kind in by_command["import-nccl-tests"]
    assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"
    assert len(CASES) >= 210


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_its_class_exit_code(case: Case, files: Path):
    code, _, err = run_main(_args(case, files))
    _check(case, code, err)
    assert not (files / "out" / "p.json").exists()  # nothing written on a refusal


# The same as a user runs it: a new process (`python -m perfmodel`), one per command.
SUBPROCESS = ["predict/preset typo", "collective/absurd bytes", "recommend/NaN",
              "sweep/field typo", "presets/option typo", "calibrate run/zero",
              "report/profile of another version", "validate/zero port",
              "validate --dry-run/divisibility"]


@pytest.mark.parametrize("case_id", SUBPROCESS)
def test_bad_input_from_a_new_process(case_id: str, files: Path, run_cli):
    case = next(c for c in CASES if c.id == case_id)
    out = run_cli(*_args(case, files))
    _check(case, out.returncode, out.stderr)


@pytest.mark.parametrize("case_id", ["predict/preset typo", "report/profile of another version",
                                     "validate --dry-run/divisibility"])
def test_debug_shows_the_traceback(case_id: str, files: Path, run_cli):
    case = next(c for c in CASES if c.id == case_id)
    out = run_cli("--debug", *_args(case, files))
    assert out.returncode != 0
    assert "Traceback" in out.stderr and case.needles[0] in out.stderr


@pytest.mark.parametrize("args,code,needle", [
    # an empty name given is refused, never read as the option left out (or, for an optional
    # option, as the default)
    ([*LLAMA.split(), "--attention-kernel", ""], PLAN, "--attention-kernel: an empty name"),
    ([*LLAMA.split(), "--attention-kernel", " "], PLAN, "--attention-kernel: an empty name"),
    ([*SWEEP.replace("--model alexnet", "").split(), *VARY.split(), "--model", ""], USAGE,
     "give --model"),
    ([*GEMMI.split(), str(GEMM), "--out", "{d}/p.json", "--base", ""], SPEC,
     "an empty name is not a preset or a file"),
])
def test_an_empty_name_is_refused(args: list[str], code: int, needle: str, tmp_path: Path):
    got, out, err = run_main([a.format(d=tmp_path) for a in args])
    assert got == code, err
    assert err.count("\n") == 1 and needle in err and not out
    assert not (tmp_path / "p.json").exists()


def test_a_plans_file_saved_by_a_spreadsheet_is_read(tmp_path):
    """A byte-order mark before the header (Excel's 'CSV UTF-8') is not part of the first column."""
    plans = tmp_path / "plans.csv"
    plans.write_bytes("\ufeffgpus,dp\n8,8\n".encode())
    code, out, err = run_main([*LLAMA.split(), "--batch", str(plans)])
    assert code == 0, err
    assert out.startswith("gpus,dp,step_time_s")


def test_an_internal_error_is_one_line_and_exit_code_1(files: Path, monkeypatch):
    """A bug (not the user's fault) still gives one line, says so, and asks for --debug."""
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(sys.modules["perfmodel.predict"], "predict", broken)
    code, _, err = run_main(LLAMA.split())
    assert code == 1 and "Traceback" not in err
    assert err.strip() == ("internal error: ZeroDivisionError: a bug (run with --debug for a "
                           "traceback)")


def test_a_bad_row_among_good_ones_is_one_line_per_bad_row(files: Path, tmp_path: Path):
    plans = tmp_path / "plans.csv"
    plans.write_text("gpus,dp,tp\n8,8,1\n8,abc,1\n8,1,8\n8,nan,1\n")
    code, out, err = run_main([*LLAMA.split(), "--batch", str(plans)])
    assert code == DATA and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"error: {plans}:3: column 'dp' must be a whole number, got 'abc'",
        f"error: {plans}:5: column 'dp' must be a whole number >= 1, got 'nan'"]
    assert len(out.strip().splitlines()) == 5  # header and every row, the bad ones with an error


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file anyway; the "
                    "directory-as-file rows cover unreadable input")
@pytest.mark.parametrize("args,code,needle", [
    ("predict --model {f} --hardware dgx-h100", SPEC, "cannot be read"),
    ("calibrate report {f}", SPEC, "cannot be read"),
    ("calibrate import-nccl-tests {f} --out {d}/p.json", DATA, "cannot be read"),
    ("calibrate import-gemm {f} --out {d}/p.json", DATA, "cannot be read"),
])
def test_an_unreadable_file_chmod_000(args: str, code: int, needle: str, tmp_path: Path):
    f = tmp_path / "secret.yaml"
    f.write_text(TINY)
    f.chmod(0)
    got, _, err = run_main(args.format(f=f, d=tmp_path).split())
    assert got == code and needle in err and "secret.yaml" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["import-nccl-tests", "import-gemm"])
def test_an_import_refused_its_output_writes_nothing_beside_it(command: str, tmp_path: Path):
    # the profile's measurements CSV is written beside it: a refused profile path (here a
    # directory) leaves no D.measurements.csv behind (it was written first)
    out = tmp_path / "D"
    out.mkdir()
    source = LOG if command == "import-nccl-tests" else GEMM
    extra = ["--base", "dgx-h100"] if command == "import-gemm" else []
    code, _, err = run_main(["calibrate", command, str(source), "--out", str(out), *extra])
    assert code == 7 and "refusing to write profile" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D"]


@pytest.mark.parametrize("field, value, hint", [
    ("cp_comm", "ring", "(ring attention is 'p2p')"),
    ("cp_comm", "Ulysses", "(Ulysses is 'a2a')"),
    ("ep_dispatcher", "hybridep", "is 'deepep')"),
    ("ep_dispatcher", "flex", "is 'deepep')"),
])
def test_an_option_value_other_tools_use_is_refused_naming_perfmodels(field, value, hint):
    """Another tool's name for an option's value is refused, the refusal naming the value that
    means it here (taken in its place, it would be a guess the caller never saw)."""
    with pytest.raises(PlanError) as raised:
        Plan(gpus=8, dp=4, cp=2, ep=2, global_batch=8, **{field: value})
    assert str(raised.value).startswith(f"{field} must be one of")
    assert str(raised.value).endswith(hint)
