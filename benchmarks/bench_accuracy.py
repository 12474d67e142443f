"""Accuracy on published runs: predicted against published step times, with the breakdown that
explains each error, then the mean absolute percentage error per source.

Run: python benchmarks/bench_accuracy.py [--data DIR] [--markdown FILE] [--csv FILE]

Three sets, none of them used to set a parameter (they measure the model; see DEVELOPERS' rule):
- published-steps.csv (../shared/data/accuracy, or tests/data/accuracy): NeMo DGX H100 recipes
  (bf16 and their FP8 twins) and torchtitan on A100, 32 runs; each row's features (sequence
  parallelism, TP-communication overlap, the distributed optimizer and its overlaps, interleaving,
  recompute, FSDP2, flash attention) mapped to plan options; a feature the model does not have
  yet is listed in the row's `not modelled` column, never silently dropped. Another file of the
  same schema (--data DIR: held-out runs) is read the same way: a model outside ARCHITECTURES
  takes its tokenizer's architecture (VOCABULARIES; named as assumed where its vocabulary is
  only near the tokenizer's) or the row's own columns (`dropout` too), a GPU its preset
  (HARDWARE; A100 and H100 names read by their words: hardware_of), features in Megatron's,
  DeepSpeed's, PyTorch's and Composer's words too (GENERIC_FEATURES and generic_feature's
  patterns: recompute, FSDP, TP overlap, flash-attention versions, SDPA, FP8 recipes, degrees
  and gradient accumulation checked against the columns, precision, biases and dropout;
  matched whatever their case, hyphens, underscores, spaces or a trailing 'optimization'; a
  feature's parenthetical read with it; commas inside parentheses do not split features);
  features that disagree with each other or with the row's columns refuse the row, and so do
  features of runs the model does not have (HSDP, torchao's float8); optional columns give a
  mixture of experts (`model`: a preset whose sizes must agree with the row's; or `experts`,
  `top_k`, `moe_ffn_hidden`, `shared_experts`) and `ep`, `etp`; a column or feature it does not
  read is named in the row's `not modelled`, and so are the defaults its plan takes where the
  row states nothing ('assumed: ...') and a network other than its preset's; each source's
  summary line counts its rows with features not read and those predicted not to fit (all in
  its MAPE, and the MAPE of the others beside it); a row it cannot know is refused in its row
  with the reason, and the others are still predicted.
- Korthikanti et al. 2022, Table 5 (eight iterations on DGX A100 80GB).
- The shared nccl-tests logs: each log's bus bandwidth per size against `perfmodel collective` on
  the preset of its GPU.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfmodel.costs.precision import megatron_master_weights

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
# The preset each GPU of the CSV's `gpu` column is predicted on (the DGX/HGX node of that GPU, as
# the rows' hardware notes state); a GPU without one is refused in its row, never taken for another
HARDWARE = {"H100": "dgx-h100", "A100": "dgx-a100-80gb", "H200": "hgx-h200", "B200": "dgx-b200",
            "GB200": "gb200-nvl72", "V100": "dgx-v100", "MI300X": "mi300x", "MI325X": "mi325x",
            "MI355X": "mi355x"}


def hardware_of(row: dict[str, Any]) -> str:
    """The preset of a row's GPU: HARDWARE by its `gpu` column, an A100's or H100's name read by
    its words (_a100, _h100: 'A100-SXM4-40GB', 'H100 SXM5 80GB', nvidia-smi's 'NVIDIA H100 80GB
    HBM3'), where the `hardware_note` tells an A100 40GB or an H100 PCIe card apart from the SXM
    parts; a part no preset has (an A100 PCIe card, an H100 of other memory and clocks) is
    refused. ValueError names an unknown GPU."""
    gpu = str(row.get("gpu", "")).strip()
    note = str(row.get("hardware_note", "") or "").upper().replace(" ", "")
    key = gpu.upper().replace(" ", "").replace("-", "").replace("_", "").removeprefix("NVIDIA")
    if key.startswith("A100"):
        return _a100(row, gpu, key, note)
    if key.startswith("H100"):
        return _h100(row, gpu, key, note)
    preset = {k.upper(): v for k, v in HARDWARE.items()}.get(key)
    if preset is None:
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    return preset


def _h100(row: dict[str, Any], gpu: str, key: str, note: str) -> str:
    """The preset of an H100 as hardware_of reads it: the DGX H100's SXM5 part (80 GB HBM3,
    700 W: dgx-h100) or the PCIe card (80 GB HBM2e, 350 W: h100-pcie); a part of other memory
    and clocks (the 94 GB NVL card, Grand Teton's 96 GB HBM2e at 500 W) is refused, and so is a
    name of other words."""
    words = re.findall(r"SXM5|SXM|80GB|94GB|96GB|HBM3|HBM2E|PCIE|NVL", key.removeprefix("H100"))
    if "".join(words) != key.removeprefix("H100"):
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    # H100s that are neither the DGX's SXM5 80 GB HBM3 at 700 W nor the PCIe card (Meta's Grand
    # Teton: 96 GB HBM2e, 2.4 TB/s, run at 500 W, as torchtitan's H100 benchmarks state; the
    # 94 GB NVL card): another memory, bandwidth and sustained clock, which no preset has and no
    # shared measurement gives (a spec file with base: dgx-h100 can state them). HBM2e in the
    # name without PCIe is one of them (the PCIe card's name says PCIe)
    other = next((w for w in words if w in ("NVL", "94GB", "96GB")
                  or (w == "HBM2E" and "PCIE" not in words)), None)
    sxm = {"SXM", "SXM5", "HBM3"} & set(words)
    if "PCIE" in words and sxm:
        raise ValueError(f"gpu '{gpu}': names both the PCIe card and the SXM5 part")
    # the PCIe card where the name says so, or the note names PCIe and no SXM part (a DGX's
    # note may name the PCIe links of its NICs and switches: _sxm)
    if not other and ("PCIE" in words or (not sxm and "PCIE" in note and not _sxm(note))):
        return "h100-pcie"
    other = other or next((s for s in ("96GB", "HBM2E", "500W", "GRANDTETON", "H100NVL", "94GB")
                           if s in note), None)
    if other:
        given = f" with hardware note '{row.get('hardware_note')}'" if note else ""
        raise ValueError(f"gpu '{gpu}'{given}: not the DGX H100 (SXM5 80 GB HBM3, 700 W) nor "
                         "the PCIe card, and no preset has its memory, bandwidth and sustained "
                         "clock")
    return "dgx-h100"


def _a100(row: dict[str, Any], gpu: str, key: str, note: str) -> str:
    """The preset of an A100 as hardware_of reads it: the DGX A100's SXM4 part, 80 GB
    (dgx-a100-80gb) or 40 GB (dgx-a100-40gb); the PCIe card is refused (A100 datasheet: 250-300 W,
    PCIe Gen4 between cards, NVLink bridges joining pairs at most, no NVSwitch; no preset has
    it), and so is a name of other words (A100X, the converged card)."""
    rest = key.removeprefix("A100")
    words = re.findall(r"SXM4|SXM|80GB|40GB|PCIE", rest)
    if "".join(words) != rest:
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    stated = (key + note.replace("-", "")).upper()
    # the card's form factor: PCIe in its name, or in a note that names no SXM part (a DGX's
    # note may name its PCIe switches and NICs: _sxm)
    if "PCIE" in key or ("PCIE" in stated and not _sxm(stated)):
        given = f" with hardware note '{row.get('hardware_note')}'" if note else ""
        raise ValueError(f"gpu '{gpu}'{given}: the A100 PCIe card (250-300 W, PCIe between "
                         "cards, NVLink bridges join pairs at most), not the DGX A100's SXM4 "
                         "part; no preset has it (a spec file with base: dgx-a100-80gb can state "
                         "it)")
    # the memory, each stated size a whole number ('640GB' is not '40GB'): a GPU's 40 or 80 GB,
    # or a DGX A100's eight (DGX A100 datasheet: 320 GB = 8 x 40 GB, 640 GB = 8 x 80 GB)
    per_gpu = {"40": "40GB", "80": "80GB", "320": "40GB", "640": "80GB"}
    written = str(row.get("hardware_note", "") or "").upper()
    memory = {w for w in words if w.endswith("GB")} | {
        per_gpu[gb] for gb in re.findall(r"(?<![\d.])(40|80|320|640)\s*GB\b", written)}
    if len(memory) > 1:
        raise ValueError(f"gpu '{gpu}' with hardware note '{row.get('hardware_note')}': the gpu "
                         f"column and the note disagree on its memory ({', '.join(sorted(memory))} "
                         "per GPU)")
    return "dgx-a100-40gb" if memory == {"40GB"} else "dgx-a100-80gb"


def _sxm(note: str) -> bool:
    """Whether an upper-case hardware note names the SXM part: a DGX or HGX node, NVSwitch, or
    SXM itself (a DGX's note may name the PCIe links of its NICs and switches; 'not a DGX' does
    not count)."""
    return re.search(r"DGX|HGX|NVSWITCH|SXM", re.sub(r"NOT ?A ?DGX|NON-?DGX", "", note)) is not None


# Words of a hardware note that name a node or network other than the presets' DGX/HGX nodes
# and InfiniBand (the presets' files say theirs): the row is predicted on its preset's, and says so
OTHER_FABRICS = {"Omni-Path": r"OMNI[- ]?PATH|\bOPA\b", "RoCE": r"\bROCE", "Ethernet": r"ETHERNET",
                 "GPUDirect-TCPX": r"TCPX", "EFA": r"\bEFA\b", "Slingshot": r"SLINGSHOT",
                 "not a DGX": r"NOT A DGX|NON-DGX"}


def hardware_notes(row: dict[str, Any], preset: str) -> list[str]:
    """The row's not-modelled notes of its hardware: a node or network its hardware_note names
    that is not its preset's (OTHER_FABRICS), listed with the preset's inter-node bandwidth."""
    note = str(row.get("hardware_note", "") or "")
    found = [name for name, pattern in OTHER_FABRICS.items() if re.search(pattern, note.upper())]
    if not found:
        return part_assumed(row, preset)
    from perfmodel import load_hardware

    per_node = load_hardware(preset).inter_node.bandwidth_bytes_per_s
    return [f"hardware note names {', '.join(found)}: predicted on {preset}'s node and network "
            f"({per_node / 1e9:.0f} GB/s per node between nodes; a spec file with base: {preset} "
            "can state this one)"] + part_assumed(row, preset)


def part_assumed(row: dict[str, Any], preset: str) -> list[str]:
    """The 'assumed:' notes of an A100 or H100 whose row does not say which part it is: the SXM
    part where neither the gpu column nor the note names it (SXM, HBM3, a DGX or HGX node,
    NVSwitch or NVLink: the PCIe cards' bridges join pairs at most), and an A100's 80 GB where
    neither states its memory (hardware_of takes both; the other parts have presets of their
    own, or none)."""
    stated = (str(row.get("gpu", "")) + " " + str(row.get("hardware_note", "") or "")).upper()
    out = []
    if preset in ("dgx-h100", "dgx-a100-80gb", "dgx-a100-40gb") and not (
            _sxm(stated) or re.search(r"HBM3|NVLINK", stated)):
        gpu, card = ("H100", "h100-pcie") if preset == "dgx-h100" else ("A100", "no preset")
        out.append(f"{gpu} part not stated: the SXM part ({preset}; the PCIe card: {card})")
    if preset.startswith("dgx-a100") and not re.search(r"(?<![\d.])(40|80|320|640) ?GB",
                                                       stated.replace("-", " ")):
        out.append("A100 memory not stated: 80 GB (dgx-a100-80gb; the 40 GB part, or a DGX A100 "
                   "320GB, is dgx-a100-40gb)")
    return [f"assumed: {text}" for text in out]

# The architecture the CSV does not state, per model (identified by its shape), with its source.
# Dropout (TransformerSpec.hidden_dropout, attention_dropout; only 0 or not matters): as each
# source trains the model: dgxc's Nemotron-4 without (v24.11.1 nemotron/nemotron4-15b-synth.yaml
# and -340b-synth.yaml: hidden_dropout, attention_dropout 0.0; v25.04's NeMo 2 Nemotron4Config
# the same), its GPT-3 175B with 0.1 (nemo_megatron/gpt3_175b_hydra.yaml at both releases);
# Llama without (torchtitan's model has none; NeMo's and Megatron-Bridge's Llama configs 0.0);
# Megatron-LM's GPT with its default 0.1; BLOOM without (bigscience/bloom config.json).
NO_DROPOUT = dict(hidden_dropout=0.0, attention_dropout=0.0)
ARCHITECTURES: dict[tuple[int, int], dict[str, Any]] = {
    # Nemotron-4 15B / 340B (Parmar et al. 2024, arXiv 2402.16819, Sec. 2; NVIDIA 2024, arXiv
    # 2406.11704): squared-ReLU MLP (not gated), rotary positions over half of each head
    # (NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_15b.yaml and
    # nemotron_340b.yaml: rotary_percentage 0.5; NeMo 2's Nemotron4Config rotary_percent 0.5),
    # no biases, untied embeddings
    (6144, 256000): dict(name="nemotron4-15b", gated_mlp=False, bias=False,
                         position_embedding="rotary", rotary_fraction=0.5, norm="layernorm",
                         tied_embeddings=False, **NO_DROPOUT),
    (18432, 256000): dict(name="nemotron4-340b", gated_mlp=False, bias=False,
                          position_embedding="rotary", rotary_fraction=0.5, norm="layernorm",
                          tied_embeddings=False, **NO_DROPOUT),
    # GPT-3 175B as NeMo's gpt3_175b config trains it: learned absolute positions, biases, LayerNorm
    (12288, 50688): dict(name="gpt3-175b-nemo", gated_mlp=False, bias=True,
                         position_embedding="learned", norm="layernorm", tied_embeddings=True,
                         hidden_dropout=0.1, attention_dropout=0.1),
    # Llama 2 (Touvron et al. 2023, arXiv 2307.09288) and Llama 3 (Dubey et al. 2024, arXiv
    # 2407.21783): SwiGLU, rotary, RMSNorm, no biases, untied
    (4096, 128256): dict(name="llama3-8b", **NO_DROPOUT, gated_mlp=True, bias=False,
                         position_embedding="rotary", norm="rmsnorm", tied_embeddings=False),
    (8192, 128256): dict(name="llama3-70b", **NO_DROPOUT, gated_mlp=True, bias=False,
                         position_embedding="rotary", norm="rmsnorm", tied_embeddings=False),
    (5120, 32000): dict(name="llama2-13b", **NO_DROPOUT, gated_mlp=True, bias=False,
                        position_embedding="rotary", norm="rmsnorm", tied_embeddings=False),
    (8192, 32000): dict(name="llama2-70b", **NO_DROPOUT, gated_mlp=True, bias=False,
                        position_embedding="rotary", norm="rmsnorm", tied_embeddings=False),
}

# Each entry's depth: a row of another depth is another model of the family (Nemotron-3 22B has
# Nemotron-4 15B's width and tokenizer), known by its tokenizer below
ARCHITECTURE_LAYERS = {"nemotron4-15b": 32, "nemotron4-340b": 96, "gpt3-175b-nemo": 96,
                       "llama3-8b": 32, "llama3-70b": 80, "llama2-13b": 40, "llama2-70b": 80}

# A model the table above does not name is known by its tokenizer: the models trained with one
# vocabulary share an architecture (base vocabulary, the architecture, its source). A row's vocab
# may be the base padded up (Megatron pads it to a multiple of 128 x tp, NeMo's GPT-3 50257 ->
# 50688 or 51200): it matches a base within 1024 x tp above it. The row's gated_mlp and
# tied_embeddings, where stated, must agree with the entry (Gemma's 256000 is not Nemotron-4's);
# a vocabulary no entry has, or two entries that disagree, refuse the row.
_LLAMA = dict(gated_mlp=True, bias=False, position_embedding="rotary", norm="rmsnorm",
              tied_embeddings=False, **NO_DROPOUT)
VOCABULARIES: list[tuple[int, dict[str, Any], str]] = [
    (50257, dict(gated_mlp=False, bias=True, position_embedding="learned", norm="layernorm",
                 tied_embeddings=True, hidden_dropout=0.1, attention_dropout=0.1),
     "GPT-2 BPE: GPT-2/GPT-3 (Radford et al. 2019; Brown et al. 2020) and Megatron-LM's and "
     "Megatron-DeepSpeed's GPT (GeLU MLP, learned positions, biases, LayerNorm, tied; dropout "
     "0.1, Megatron-LM's default)"),
    (32000, _LLAMA,
     "Llama / Llama 2 SentencePiece (Touvron et al. 2023) and Mistral 7B (Jiang et al. 2023): "
     "SwiGLU, rotary, RMSNorm, no biases, untied"),
    (128256, _LLAMA,
     "Llama 3 tiktoken (Dubey et al. 2024, arXiv 2407.21783): SwiGLU, rotary, RMSNorm, no biases "
     "(untied from 8B up; Llama 3.2 1B/3B tie, which the row's tied_embeddings states)"),
    (256000, dict(gated_mlp=False, bias=False, position_embedding="rotary", norm="layernorm",
                  tied_embeddings=False, **NO_DROPOUT),
     "Nemotron-4 (arXiv 2402.16819): squared-ReLU MLP, rotary, LayerNorm, no biases, untied"),
    (250680, dict(gated_mlp=False, bias=True, position_embedding="alibi", norm="layernorm",
                  tied_embeddings=True, **NO_DROPOUT),
     "BLOOM's tokenizer (BigScience 2022, arXiv 2211.05100: 250,680 tokens; padded to 250,880): "
     "GeLU MLP, ALiBi, biases, LayerNorm, tied"),
]
# Tokenizers of other architectures whose vocabulary Megatron's padding takes to one of the above's
# padded sizes (base, name, what their models state that a row may state too): a row that does
# not tell them apart has its architecture guessed, named as assumed. GPT-NeoX-20B's 50,277
# (GPT-NeoX-20B, Pythia: Biderman et al. 2023, arXiv 2304.01373; rotary on a quarter of each
# head, parallel attention, untied embeddings) pads to 50,304 at tp 1 (Pythia's vocab_size),
# 50,432 at tp 2 (GPT-NeoX-20B's) and 51,200 at tp 8, as GPT-2's 50,257 does; a row that states
# tied embeddings is not one of them
OTHER_TOKENIZERS: list[tuple[int, str, dict[str, Any]]] = [
    (50277, "GPT-NeoX-20B's tokenizer (GPT-NeoX-20B, Pythia)", dict(tied_embeddings=False)),
]
# architecture fields a row may state in columns of its own (they win over the tables), and its
# dropout rates (`dropout`: both)
ARCH_COLUMNS = ("gated_mlp", "tied_embeddings", "bias", "norm", "position_embedding")
DROPOUT_COLUMNS = ("dropout", "hidden_dropout", "attention_dropout")
# published-steps.csv's columns (SOURCES.md)
COLUMNS = ("source", "gpu", "hardware_note", "gpus", "tp", "pp", "dp", "cp", "micro_batch",
           "global_batch", "seq_len", "dtype", "features", "layers", "hidden", "heads",
           "kv_heads", "ffn_hidden", "vocab", "gated_mlp", "tied_embeddings", "published_step_s",
           "published_value", "published_unit", "conversion", "published_peak_mem_gib", "note",
           "source_ref")
# columns another file may add: a mixture of experts' fields, the expert-parallel degrees, and
# `model`, a perfmodel preset whose spec the row's run trained (its sizes must agree with the row's)
MODEL_COLUMNS = {"experts": "experts", "top_k": "top_k", "expert_ffn_hidden": "expert_ffn_hidden",
                 "moe_ffn_hidden": "expert_ffn_hidden", "shared_experts": "shared_experts",
                 "head_dim": "head_dim"}
PLAN_COLUMNS = ("ep", "etp")
# the experts' dispatcher, as a column: its value in Megatron-Core's, torchtitan's or AutoModel's
# words (perfmodel.strategy.EPDispatcher)
DISPATCHER_COLUMNS = ("dispatcher", "ep_dispatcher")
# every pipeline stage's layers, in Megatron's --pipeline-model-parallel-layout syntax
# (Plan.pipeline_layout): a split the stages' even share cannot give (126 layers over 64)
LAYOUT_COLUMNS = ("pipeline_layout",)
DISPATCHERS = {"alltoall": "alltoall", "all-to-all": "alltoall", "standard": "alltoall",
               "deepep": "deepep", "hybridep": "deepep", "flex": "deepep"}


def _stated(row: dict[str, Any], key: str) -> Any:
    """A row's value of an optional column, None where absent or empty (NaN); true/false text as
    booleans."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        return {"true": True, "false": False}.get(text.lower(), text)
    return value


def architecture_of(row: dict[str, Any]) -> dict[str, Any]:
    """The architecture of a row's model: ARCHITECTURES by (hidden, vocab, its padding; layers),
    else the tokenizer's (VOCABULARIES), with what the row's own columns state over either
    (ARCH_COLUMNS, DROPOUT_COLUMNS). ValueError, naming the vocabulary, where neither knows the
    model."""
    return _architecture(row)[0]


def _architecture(row: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(architecture_of's architecture, the tokenizer it was guessed from, in words; '' where
    an ARCHITECTURES entry (with its source), the row's columns, or its tokenizer's vocabulary
    as it is padded give it)."""
    hidden, vocab, tp = int(row["hidden"]), int(row["vocab"]), int(row.get("tp", 1) or 1)
    stated = {k: _stated(row, k) for k in ARCH_COLUMNS}
    stated = {k: v for k, v in stated.items() if v is not None}
    dropout = _dropout_columns(row)
    # an entry's vocabulary as its rows give it, or padded up (to a multiple of 128 x tp), of
    # the entry's depth
    known = next((arch for (width, base), arch in ARCHITECTURES.items()
                  if width == hidden and base <= vocab < base + 128 * max(tp, 1)), None)
    if known is not None and int(row["layers"]) == ARCHITECTURE_LAYERS.get(known["name"],
                                                                           int(row["layers"])):
        arch = dict(known)
        for key in ("tied_embeddings", "gated_mlp"):  # where the row states it, it must agree
            if key in stated and bool(stated[key]) != arch[key]:
                raise ValueError(f"{arch['name']}: the row says {key}={stated[key]}, its source "
                                 f"{arch[key]}")
        return dict(arch, **dropout), ""
    name = str(_stated(row, "model") or f"{row['layers']}x{hidden}-v{vocab}")
    if all(k in stated for k in ARCH_COLUMNS):
        return dict(stated, **dropout, name=name), ""
    matches = [(base, arch, source) for base, arch, source in VOCABULARIES
               if base <= vocab < base + 1024 * max(tp, 1)
               and all(bool(stated[k]) == arch[k] for k in ("gated_mlp", "tied_embeddings")
                       if k in stated)]
    if not matches:
        raise ValueError(f"vocab {vocab}: no known architecture for this tokenizer (state "
                         f"{', '.join(ARCH_COLUMNS)} in the row, or add it to ARCHITECTURES)")
    if any(m[1] != matches[0][1] for m in matches):
        raise ValueError(f"vocab {vocab}: tokenizers of different architectures match; state "
                         f"{', '.join(ARCH_COLUMNS)} in the row")
    base, arch, source = matches[0]
    arch = dict(arch, **stated, **dropout, name=name)
    # the tokenizer's vocabulary as Megatron-LM and NeMo pad it (a multiple of 128 x tp, tp a
    # power of two) is what its entry's source describes; one merely near it may be another
    # tokenizer's (MPT's GPT-NeoX 50,277 padded to 50,368 is not GPT-2's 50,257 padded), so the
    # architecture is a guess, which the row names (architecture_assumed)
    tokenizer = re.split(r" \(|:", source, maxsplit=1)[0]  # its name: up to a parenthesis
    if _pads(base, vocab):
        others = [name for other, name, says in OTHER_TOKENIZERS
                  if other != base and _pads(other, vocab)
                  and all(bool(stated[k]) == v for k, v in says.items() if k in stated)]
        if not others:
            return arch, ""
        return arch, (f"vocab {vocab}, {tokenizer}'s {base} padded and {' and '.join(others)}'s "
                      "too: its")
    return arch, f"vocab {vocab}, near {tokenizer}'s {base} but not its padding: its"


def _pads(base: int, vocab: int) -> bool:
    """`vocab` is the tokenizer's `base` or Megatron-LM's and NeMo's padding of it (a multiple of
    128 x tp, tp a power of two up to 64)."""
    return vocab == base or any(vocab == -(-base // (128 << j)) * (128 << j) for j in range(7))


def _dropout_columns(row: dict[str, Any]) -> dict[str, float]:
    """The dropout rates a row's columns state (DROPOUT_COLUMNS): `dropout` both, `hidden_dropout`
    and `attention_dropout` their own."""
    out: dict[str, float] = {}
    for column in DROPOUT_COLUMNS:
        if (value := _stated(row, column)) is not None:
            fields = ("hidden_dropout", "attention_dropout") if column == "dropout" else (column,)
            out.update(dict.fromkeys(fields, float(value)))
    return out


def architecture_assumed(row: dict[str, Any], origin: dict[str, str]) -> list[str]:
    """The 'assumed:' note of what a row's architecture takes that neither its columns nor its
    features (`origin`: the model fields features set) state: the fields of the tokenizer entry
    its vocabulary is near but not a padding of (VOCABULARIES; MPT's 50368 reads as GPT-2's,
    with biases and dropout 0.1), and the dropout TransformerSpec defaults to (0.1) where
    nothing gives one. None for a model preset (the `model` column), an ARCHITECTURES entry, or
    a tokenizer's own vocabulary, whose sources state them."""
    name = _stated(row, "model")
    if name is not None:
        from perfmodel.specs.presets import MODELS_DIR, preset_names

        if str(name) in preset_names(MODELS_DIR):
            return []
    arch, tokenizer = _architecture(row)
    stated = {k for k in ARCH_COLUMNS if _stated(row, k) is not None} | set(
        _dropout_columns(row)) | set(origin)
    out = []
    if tokenizer:
        taken = [f"{k} {arch[k]}" for k in ARCH_COLUMNS if k not in stated]
        if "hidden_dropout" not in stated:
            taken.append(f"dropout {arch['hidden_dropout']}")
        if taken:
            out.append(f"architecture not stated: {tokenizer} entry's {', '.join(taken)} "
                       "(columns or features state them: 'no bias', 'no dropout', ...)")
    elif "hidden_dropout" not in arch and "hidden_dropout" not in stated:
        out.append("dropout not stated: 0.1 (TransformerSpec's default)")
    return [f"assumed: {text}" for text in out]

# What the published dgxc runs' configs state beyond the CSV's features, by release and model (the
# release is in the row's source_ref: "...: v24.11.1 nemotron/README_340b.md"), from
# github NVIDIA/dgxc-benchmarking at those releases and the NeMo they ran:
STACK_OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    # v24.11.1 nemotron/nemotron4-340b-synth.yaml, optim distributed_fused_adam: dtype bf16,
    # grad_sync_dtype bf16 (NeMo then stores no fp32 master weights: megatron_base_model.py);
    # v24.11.1 nemotron/configure.sh: 340b exports NVTE_FUSED_ATTN=0, so Transformer Engine
    # runs FlashAttention-2 (the flash-attn package), not cuDNN's kernel: the preset's fa2
    ("v24.11.1", "nemotron4-340b"): dict(grad_dtype="bf16", optimizer_dtype="bf16",
                                         attention_kernel="fa2"),
    # v24.11.1 nemotron/nemotron4-15b-synth.yaml and nemo_megatron/gpt3_175b_hydra.yaml (v25.04:
    # nemo_megatron/cfg/gpt3_175b_hydra.yaml), optim distributed_fused_adam: grad_sync_dtype
    # bf16 (Apex's gradient buffer and its reduce-scatter in bf16), their optimizer states fp32
    ("v24.11.1", "nemotron4-15b"): dict(grad_dtype="bf16"),
    ("v24.11.1", "gpt3-175b-nemo"): dict(grad_dtype="bf16"),
    ("v25.04", "gpt3-175b-nemo"): dict(grad_dtype="bf16"),
    # v25.04 (NeMo 25.02) scripts/performance: pretrain_recipe(performance_mode=True), whose
    # pretrain_performance_optimizations set trainer.plugins.grad_reduce_in_fp32 = False; NeMo 2's
    # NemotronConfig sets cross_entropy_loss_fusion True (nemo/collections/llm/gpt/model/
    # nemotron.py at v2.2.0; the recipes set it False for fine-tuning only): Megatron-Core's
    # native fusion, where the NeMo 1 runs (v24.11.1, and GPT-3 175B's hydra config at v25.04,
    # which NeMo 1's build_transformer_config reads: no such key) leave Megatron-Core's default,
    # the unfused loss
    ("v25.04", "nemotron4-15b"): dict(grad_dtype="bf16", cross_entropy="native"),
    ("v25.04", "nemotron4-340b"): dict(grad_dtype="bf16", cross_entropy="native"),
}
# ... and what they ran that the model takes otherwise (listed as not modelled)
STACK_NOT_MODELLED: dict[tuple[str, str], list[str]] = {}
# Where NeMo 1's DistributedFusedAdam (v24.11.1 runs megatron_gpt_pretraining.py) keeps the
# master weights as their 16-bit remainders (store_param_remainders: fp32 states, bf16 weights,
# fp8_params off; megatron_base_model.py setup_optimization, the same from NeMo v1.23.0 to
# v2.0.0, the NeMo of the 24.05 and 24.09 containers those runs used): the bf16 runs of
# Nemotron-4 15B (nemotron/configure.sh sets +model.fp8_params=${FP8_ENABLED}); not GPT-3 175B,
# whose gpt3_175b_hydra.yaml sets fp8_params: true in its bf16 runs too (store_params: fp32
# master weights), nor Nemotron-4 340B (its optimizer's dtype bf16: none)
NEMO1_REMAINDERS = {("v24.11.1", "nemotron4-15b")}


def release_of(row: dict[str, Any]) -> str:
    """The dgxc release a row's source_ref names last ('v24.11.1', 'v25.04'), or ''."""
    found = re.findall(r"(v\d+\.\d+(?:\.\d+)?) \S+\.md", str(row.get("source_ref", "")))
    return found[-1] if found else ""


# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
# Table 5, DGX A100 80GB (Selene), data parallel 1: model, tp, pp, global batch, micro-batch,
# schedule, virtual stages, seconds with full recompute, seconds with SP + selective recompute.
TABLE5 = [
    ("gpt-22b", 8, 1, 4, 4, "1f1b", 1, 1.42, 1.10),
    ("gpt3-175b", 8, 8, 64, 1, "interleaved", 3, 18.13, 13.75),
    ("gpt-530b", 8, 35, 280, 1, "interleaved", 3, 49.05, 37.83),
    ("gpt-1t", 8, 64, 512, 1, "1f1b", 1, 94.42, 71.49),
]


@dataclass(frozen=True)
class MemoryCase:
    """A published peak memory per GPU, with the run's model and plan."""

    label: str
    model: dict[str, Any]
    hardware: str
    plan: dict[str, Any]
    published_bytes: float
    measured_by: str  # "max_allocated" or "max_reserved" (torch.cuda's peak statistics)
    source: str


# Megatron-LM's GPT defaults where a functional test's model_config.yaml leaves them: GeLU MLP of
# 4 h, biases, LayerNorm, learned absolute positions, dropout 0.1; the vocabulary padded to a
# multiple of 128 x tp (--make-vocab-size-divisible-by 128)
_MCORE_7B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=16384, seq_len=8192,
                 gated_mlp=False, bias=True, norm="layernorm", position_embedding="learned",
                 tied_embeddings=False)
_MCORE_TESTS = ("NVIDIA/Megatron-LM tests/functional_tests/test_cases/gpt/{}/model_config.yaml and "
                "golden_values_dev_dgx_h100.json (mem-max-allocated-bytes, steps 2-25; "
                "6e091e1b68, 2026-05-29); 8 GPUs")
# torchtitan's Llama 3.1 8B (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: FSDP,
# eager, local batch 2, sequence 8192, selective (per-op) AC; H100 96GB HBM2e; torchtitan logs
# max_reserved_gib)
_LLAMA31_8B = dict(name="llama3.1-8b", **NO_DROPOUT, layers=32, hidden=4096, heads=32, kv_heads=8,
                   ffn_hidden=14336, vocab=128256, seq_len=8192, gated_mlp=True, bias=False,
                   norm="rmsnorm", position_embedding="rotary", tied_embeddings=False)
_TORCHTITAN = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan "
               "9dec370, 2024-12-26), Table {}, FSDP (eager)")
MEMORY: list[MemoryCase] = [
    MemoryCase("Megatron-Core 7B tp1 pp4 vp8 mb1 dist-opt", dict(_MCORE_7B, name="mcore-7b",
               vocab=131200), "dgx-h100",
               dict(gpus=8, dp=2, pp=4, schedule="interleaved", virtual_stages=8, micro_batch=1,
                    global_batch=8, zero=1, overlap_grad_sync=True),
               60720852992, "max_allocated",
               _MCORE_TESTS.format("gpt3_7b_tp1_pp4_memory_speed")),
    MemoryCase("Megatron-Core 7B tp4 pp1 mb2 dist-opt", dict(_MCORE_7B, name="mcore-7b",
               vocab=131584), "dgx-h100",
               dict(gpus=8, dp=2, tp=4, micro_batch=2, global_batch=8, zero=1,
                    overlap_grad_sync=True),
               57143791616, "max_allocated",
               _MCORE_TESTS.format("gpt3_7b_tp4_pp1_memory_speed")),
    # --attention-backend unfused: the s^2 scores in memory; tied embeddings (Megatron's default)
    MemoryCase("Megatron-Core GPT 12 x 512 unfused attention dist-opt",
               dict(name="mcore-tiny", layers=12, hidden=512, heads=8, seq_len=1024, vocab=50304,
                    bias=True, tied_embeddings=True), "dgx-h100",
               dict(gpus=8, dp=8, micro_batch=4, global_batch=32, zero=1,
                    flash_attention=False),
               4702430720, "max_allocated",
               _MCORE_TESTS.format("gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files")),
    MemoryCase("torchtitan Llama 3.1 8B FSDP 8 mb2 op AC", _LLAMA31_8B, "dgx-h100",
               dict(gpus=8, dp=8, zero=3, micro_batch=2, global_batch=16, recompute="op",
                    flash_attention=True, kernels="eager"),
               82.4 * 2**30, "max_reserved", _TORCHTITAN.format(1)),
    MemoryCase("torchtitan Llama 3.1 8B FSDP 128 mb2 op AC", _LLAMA31_8B, "dgx-h100",
               dict(gpus=128, dp=128, zero=3, micro_batch=2, global_batch=256, recompute="op",
                    flash_attention=True, kernels="eager"),
               67.0 * 2**30, "max_reserved", _TORCHTITAN.format(3)),
]


def allocator_view(p: Any, measured_by: str) -> float:
    """What torch.cuda's peak statistic would read of a prediction: max_allocated the tensors
    (without the "reserved" terms), max_reserved also the allocator's fragmentation (the CUDA
    context and NCCL's buffers lie outside PyTorch's allocator)."""
    skip = {"reserved", "reserved/nccl_buffers"}
    if measured_by == "max_allocated":
        skip.add("reserved/fragmentation")
    return float(sum(v for k, v in p.memory_breakdown_bytes.items() if k not in skip))


def memory_rows() -> list[tuple[MemoryCase, float]]:
    from perfmodel import TransformerSpec, predict

    return [(c, allocator_view(predict(TransformerSpec(**c.model), c.hardware, c.plan,
                                       refuse_idle=False), c.measured_by)) for c in MEMORY]


@dataclass
class Row:
    source: str
    label: str
    published_s: float
    predicted_s: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_gib: float | None = None
    capacity_gib: float | None = None
    # fits, tight (only the allocator's fragmentation margin over) or does not fit
    # (perfmodel.predict.memory_verdict)
    memory_verdict: str = ""
    published_memory_gib: float | None = None
    not_modelled: list[str] = field(default_factory=list)
    error: str = ""
    dtype: str = "bf16"

    @property
    def signed_error(self) -> float | None:
        if self.predicted_s is None:
            return None
        return (self.predicted_s - self.published_s) / self.published_s


def data_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    shared = SHARED / "accuracy"
    return shared if shared.is_dir() else ROOT / "tests" / "data" / "accuracy"


_THOUSANDS = re.compile(r"\d,\d{3}(?!\d)")  # '1,024': a comma that groups a number's digits


def _features(text: str) -> list[str]:
    """The features of a row: 'bf16; SP, TP comm overlap (...), ...' -> ['bf16', 'SP', ...].
    Split on the semicolons and commas outside parentheses and brackets: 'full activation
    recompute (uniform, 1 layer per checkpoint)' is one feature; so is '1,024-way data
    parallelism' (a comma between a digit and three more is a thousands separator: feature_key
    reads the number whole)."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == "," and i and _THOUSANDS.match(text, i - 1):
            continue
        elif char in ",;" and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    return [t.strip() for t in pieces if t.strip()]


def _parenthetical(feature: str) -> tuple[str, list[str]] | None:
    """(the feature without its parenthetical or bracketed parts, the features those parts
    state) of a feature that has any: 'DeepSpeed pipeline parallelism (1F1B)' ->
    ('DeepSpeed pipeline parallelism', ['1F1B']); None for one without."""
    base, inner, depth, start = [], [], 0, 0
    for i, char in enumerate(feature):
        if char in "([{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
            if depth == 0:
                inner += _features(feature[start:i])
        elif depth == 0:
            base.append(char)
    if depth or (not inner and "".join(base).strip() == feature.strip()):
        return None  # unbalanced, or nothing in parentheses
    return " ".join("".join(base).split()), inner


# Features as other published runs state them (Megatron-LM's and DeepSpeed's flag names in
# words), by their lower-case text: the plan options they are. A feature neither these nor
# plan_of's own names know is listed as not modelled.
GENERIC_FEATURES: dict[str, dict[str, Any]] = {
    **dict.fromkeys(("bf16", "fp16", "fp32", "tf32", "fp8"), {}),  # the row's dtype column
    **dict.fromkeys(("sequence parallel", "sequence parallelism", "sequence-parallel"),
                    {"sequence_parallel": True}),
    **dict.fromkeys(("no recompute", "recompute none", "no activation checkpointing"),
                    {"recompute": "none"}),
    # Megatron's --recompute-granularity selective (the attention core)
    **dict.fromkeys(("selective recompute", "recompute selective",
                     "selective activation recompute"), {"recompute": "selective"}),
    **dict.fromkeys(("full recompute", "recompute full", "full activation checkpointing",
                     "full activation recompute", "activation checkpointing",
                     "checkpoint activations", "checkpoint-activations",
                     "deepspeed activation checkpointing"), {"recompute": "full"}),
    # Hugging Face's gradient_checkpointing (and Composer's activation_checkpointing) wrap every
    # layer: full recompute. Other orders of the words ('activation checkpointing: none',
    # 'AC full') are generic_feature's (RECOMPUTE_WORDS)
    **dict.fromkeys(("gradient checkpointing", "gradient_checkpointing"), {"recompute": "full"}),
    # Megatron-LM's 2021-22 scatter-gather of pipeline sends over tp (pp_scatter_gather), and
    # DeepSpeed's pipeline engine, which partitions its sends likewise and runs 1F1B: where the
    # plan has them (pp > 1, tp > 1, no sequence parallelism; plan_of); the engine reduces the
    # gradients after the last micro-batch (perfmodel.configs.megatron_deepspeed)
    **dict.fromkeys(("scatter-gather", "pp scatter-gather", "scatter/gather",
                     "pipeline scatter-gather", "scatter-gather-tensors-in-pipeline"),
                    {"pp_scatter_gather": "where it applies"}),
    **dict.fromkeys(("deepspeed pipeline", "deepspeed pipeline engine",
                     "deepspeed pipeline parallelism"),
                    {"schedule": "1f1b", "pp_scatter_gather": "where it applies",
                     "overlap_grad_sync": False, "_deepspeed_pipeline": True}),
    # DeepSpeed's BF16_Optimizer (bf16 at ZeRO stage 0): its own stage 1, its fp32 gradients
    # all-reduced after the backward (perfmodel.configs.megatron_deepspeed, _zero)
    **dict.fromkeys(("bf16_optimizer", "bf16 optimizer", "deepspeed bf16 optimizer"),
                    {"zero": 1, "bf16_optimizer": True, "overlap_grad_sync": False}),
    # PyTorch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF=
    # expandable_segments:True in the run's environment: Plan.expandable_segments)
    **dict.fromkeys(("expandable segments", "expandable_segments", "expandable_segments:true",
                     "pytorch_cuda_alloc_conf=expandable_segments:true"),
                    {"expandable_segments": True}),
    # flash attention on the preset's default kernel, where the row does not name one
    **dict.fromkeys(("flash attention", "flashattention", "fused attention", "flash-attn",
                     "flash attn"), {"flash_attention": True}),
    # PyTorch's F.scaled_dot_product_attention picks its backend per call (flash, cuDNN's,
    # memory-efficient or the math one, by GPU, dtype, head size, mask and torch version): the
    # plan's auto attention (flash_attention None: the preset's flash kernel where it runs the
    # dtype and head size), which assumed_defaults names with the kernel it takes
    **dict.fromkeys(("sdpa", "torch sdpa", "pytorch sdpa", "scaled dot product attention",
                     "f.scaled_dot_product_attention", "scaled_dot_product_attention"),
                    {"flash_attention": None}),
    # ... and where it does, that kernel (Plan.attention_kernel: the preset's measurement of it;
    # a preset without one refuses the row, never another kernel's rate): FlashAttention-2 (the
    # flash-attn 2 package), FlashAttention-3, cuDNN's (Transformer Engine's FusedAttention).
    # Not NVTE_FUSED_ATTN=0: it turns TE's cuDNN backend off, and which flash-attn TE then runs
    # depends on its version and what is installed (a row names the kernel)
    **dict.fromkeys(("flashattention-2", "flash-attn 2", "fa2", "flash-attn v2",
                     "flashattention v2", "flash attention v2", "fa v2"),
                    {"flash_attention": True, "attention_kernel": "fa2"}),
    **dict.fromkeys(("flashattention-3", "flash-attn 3", "fa3", "flash-attn v3",
                     "flashattention v3", "flash attention v3", "fa v3"),
                    {"flash_attention": True, "attention_kernel": "fa3"}),
    **dict.fromkeys(("cudnn attention", "cudnn fused attention", "te fused attention"),
                    {"flash_attention": True, "attention_kernel": "cudnn"}),
    **dict.fromkeys(("unfused attention", "no flash attention"), {"flash_attention": False}),
    # Megatron-LM's --use-distributed-optimizer: the optimizer states sharded (ZeRO-1); its
    # overlaps are flags of their own (off by default)
    # (NeMo 1's model.optim.name distributed_fused_adam is Megatron's distributed optimizer
    # through Apex; its overlaps are its overlap_grad_sync / overlap_param_sync keys)
    **dict.fromkeys(("distributed optimizer", "use-distributed-optimizer",
                     "distributed_fused_adam", "distributed fused adam"), {"zero": 1}),
    **dict.fromkeys(("overlap grad reduce", "overlap-grad-reduce", "overlap grad sync",
                     "overlap_grad_sync", "overlap_grad_reduce"),
                    {"overlap_grad_sync": True}),
    **dict.fromkeys(("overlap_param_sync", "overlap param sync", "overlap_param_gather"),
                    {"overlap_param_gather": True}),
    # NeMo 1's names of Megatron's options (megatron_gpt_config.yaml)
    "sequence_parallel": {"sequence_parallel": True},
    "ub_tp_comm_overlap": {"tp_comm_overlap": True},
    **dict.fromkeys(("fp8_hybrid", "fp8 hybrid", "fp8 delayed"), {"fp8_recipe": "delayed"}),
    **dict.fromkeys(("async tp", "async tensor parallel", "async tensor parallelism",
                     "enable_async_tensor_parallel"), {"tp_comm_overlap": True}),
    # Megatron-LM's --DDP-impl (before 2023-08): torch's DistributedDataParallel all-reduces the
    # gradients in buckets during the (last micro-batch's) backward, its local DDP (the default)
    # after it, as perfmodel.configs.megatron maps them; torch's with a pipeline is refused
    # (plan_of: its schedules all-reduced in every micro-batch then)
    **dict.fromkeys(("torch ddp", "pytorch ddp", "torch distributeddataparallel",
                     "pytorch distributeddataparallel"),
                    {"overlap_grad_sync": True, "_ddp_impl": "torch"}),
    **dict.fromkeys(("local ddp", "megatron local ddp"), {"overlap_grad_sync": False}),
    # PyTorch FSDP (FSDP1, Hugging Face's fsdp full_shard): ZeRO 3, the gradients' reduce-scatter
    # during the backward; its forward gathers the next unit unprefetched (forward_prefetch off by
    # default). torchtitan's "FSDP2" (prefetching) is plan_of's own
    # (other orders of its words, 'FULL_SHARD FSDP', 'PyTorch FSDP full shard': FSDP_WORDS)
    **dict.fromkeys(("fsdp", "fsdp1", "pytorch fsdp", "full_shard", "full shard",
                     "fully sharded data parallel"), {"zero": 3, "overlap_grad_sync": True}),
    # FSDP's ShardingStrategy.SHARD_GRAD_OP (ZeRO 2 in its docs' words): each unit's weights
    # gathered for its forward stay gathered until its backward has run (Plan.fsdp_reshard
    # backward); gradients and optimizer states sharded as under FULL_SHARD
    **dict.fromkeys(("shard_grad_op", "shard grad op", "fsdp shard_grad_op"),
                    {"zero": 3, "overlap_grad_sync": True, "fsdp_reshard": "backward"}),
    # Megatron-Core's own FSDP (--use-megatron-fsdp, formerly --use-custom-fsdp): its user guide
    # (Megatron-LM docs/discussions/megatron-fsdp-user-guide) requires
    # --data-parallel-sharding-strategy optim_grads_params, ZeRO 3; its overlaps are Megatron's
    # --overlap-grad-reduce / --overlap-param-gather flags, off unless stated
    **dict.fromkeys(("megatron fsdp", "megatron-fsdp", "use-megatron-fsdp", "custom fsdp",
                     "use-custom-fsdp", "mcore fsdp"), {"zero": 3}),
    # what every plan already is (their stacks' defaults in perfmodel): read, nothing to set
    **dict.fromkeys(("megatron_amp_o2", "transformer engine", "transformer_engine", "te",
                     "mcore", "megatron-core", "mcore models", "apex", "bucketing"), {}),
    # Megatron-Core's --overlap-param-gather-with-optimizer-step needs --overlap-param-gather
    # (its argument checks; Megatron-Bridge's CommOverlapConfig turns both on with dp > 1): the
    # same overlap here, the first bucket's gather behind the optimizer step rather than exposed
    # before the first forward (1/layers of the gather: not modelled)
    **dict.fromkeys(("overlap param gather", "overlap-param-gather",
                     "overlap param gather with optimizer step",
                     "overlap-param-gather-with-optimizer-step"),
                    {"overlap_param_gather": True}),
    # Transformer Engine's userbuffers are what Megatron's --tp-comm-overlap runs
    **dict.fromkeys(("tp comm overlap", "tp-comm-overlap", "tp overlap",
                     "tp communication overlap", "tensor parallel overlap",
                     "tensor parallel comm overlap", "tensor parallel communication overlap",
                     "tensor parallelism communication overlap", "userbuffers",
                     "te userbuffers", "userbuffers overlap", "ub overlap"),
                    {"tp_comm_overlap": True}),
    **dict.fromkeys(("torch.compile", "compiled", "compile"), {"stack": "compiled"}),
    **dict.fromkeys(("cuda graphs", "cuda-graphs", "cuda graph"), {"stack": "cuda-graphs"}),
    **dict.fromkeys(("fp8 delayed scaling", "fp8 (te delayed scaling)"),
                    {"fp8_recipe": "delayed"}),
    # current scaling in Megatron-LM's (--fp8-recipe tensorwise) and Megatron-Bridge's words
    # (its recipes' fp8_cs); torchao's float8 (torchtitan's) is another implementation:
    # REFUSED_FEATURES
    **dict.fromkeys(("fp8 current scaling", "fp8 (te current scaling)", "fp8cs", "fp8 cs",
                     "fp8 current", "fp8 tensorwise", "fp8 recipe tensorwise",
                     "fp8-recipe tensorwise", "fp8 tensorwise scaling"),
                    {"fp8_recipe": "current"}),
    **dict.fromkeys(("fp8 recipe delayed", "fp8-recipe delayed"),
                    {"fp8_recipe": "delayed"}),
    "mxfp8": {"fp8_recipe": "mxfp8"},
    **dict.fromkeys(("fp8 params", "fp8_params", "fp8 weights"), {"fp8_params": True}),
    # Megatron FSDP's --fp8-param-gather: the FP8 weights sharded and gathered in FP8 (zero 3)
    "fp8 param all-gather under megatron fsdp (fp8_param_gather)": {"fp8_params": True},
    # the main gradients kept and reduced in bf16 (NeMo / Megatron-Bridge grad_reduce_in_fp32
    # False, Megatron-LM --grad-reduce-in-bf16)
    **dict.fromkeys(("bf16 gradient reduce", "bf16 grad reduce", "grad_reduce_in_fp32 false",
                     "grad-reduce-in-bf16", "grad_sync_dtype bf16"), {"grad_dtype": "bf16"}),
    # Transformer Engine's fused cross entropy (Megatron-Core --cross-entropy-loss-fusion
    # --cross-entropy-fusion-impl te; Plan.cross_entropy)
    **dict.fromkeys(("te cross-entropy fusion", "te cross entropy", "te fused cross entropy",
                     "cross-entropy-fusion-impl te"), {"cross_entropy": "te"}),
    # Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer): the master
    # weights as their 16-bit remainders (store_param_remainders, its default; fp32 under an
    # FP8 recipe other than delayed or beside FP8 weights: plan_of), with its dtypes where stated
    **dict.fromkeys(("precision-aware optimizer", "use-precision-aware-optimizer"),
                    {"master_weights": "remainders"}),
    # Apex's DistributedFusedAdam as NeMo 1 sets it up for bf16 weights and fp32 states without
    # FP8 weights (store_param_remainders; nemo/collections/nlp/models/language_modeling/
    # megatron_base_model.py, setup_optimization, v1.23.0): the same remainders
    **dict.fromkeys(("store_param_remainders", "store param remainders",
                     "master weights as remainders"), {"master_weights": "remainders"}),
    # ... and with dtype bf16: the moments in bf16 and no master weights (store_params False:
    # the states in the weights' dtype)
    **dict.fromkeys(("optim dtype bf16", "distributed_fused_adam dtype bf16"),
                    {"optimizer_dtype": "bf16"}),
    # flash-attn's fused cross entropy (llm-foundry's loss_fn fused_crossentropy;
    # Plan.cross_entropy flash-attn)
    **dict.fromkeys(("flash-attn cross entropy", "flash-attn fused cross entropy",
                     "fused_crossentropy", "fused cross entropy (flash-attn)"),
                    {"cross_entropy": "flash-attn"}),
    # Megatron-Core's native fused cross entropy (cross_entropy_loss_fusion without TE's impl)
    **dict.fromkeys(("cross_entropy_loss_fusion", "native cross-entropy fusion"),
                    {"cross_entropy": "native"}),
    "precision-aware optimizer (bf16 moments and main grads)": {
        "master_weights": "remainders", "optimizer_dtype": "bf16", "grad_dtype": "bf16"},
    "1f1b": {"schedule": "1f1b"},
    # Megatron's interleaved 1F1B (its virtual stages stated beside it: plan_of refuses the
    # schedule without them), and the schedule that says it is not
    **dict.fromkeys(("interleaved", "interleaved schedule", "interleaved 1f1b",
                     "interleaved pipeline", "interleaved pipeline schedule"),
                    {"schedule": "interleaved"}),
    **dict.fromkeys(("non-interleaved 1f1b", "non-interleaved", "non-interleaved schedule",
                     "1f1b non-interleaved", "non interleaved 1f1b"), {"schedule": "1f1b"}),
    "gpipe": {"schedule": "gpipe"},
    # the experts' dispatcher (Plan.ep_dispatcher; Megatron-Core's --moe-token-dispatcher-type,
    # flex with DeepEP or HybridEP) and its combined 1F1B overlap
    **dict.fromkeys(("deepep", "hybridep", "hybrid-ep", "flex dispatcher", "flex token dispatcher",
                     "moe-token-dispatcher-type flex", "moe-enable-deepep", "deepep dispatcher"),
                    {"ep_dispatcher": "deepep"}),
    **dict.fromkeys(("alltoall dispatcher", "all-to-all dispatcher", "alltoall token dispatcher",
                     "moe-token-dispatcher-type alltoall"), {"ep_dispatcher": "alltoall"}),
    **dict.fromkeys(("ep comm overlap", "moe a2a overlap", "a2a overlap",
                     "overlap-moe-expert-parallel-comm", "overlap moe expert parallel comm",
                     "combined 1f1b"), {"ep_comm_overlap": True}),
    # Megatron-LM's attention before flash kernels: two GEMMs around its fused scale-mask-softmax
    # kernel (megatron/model/fused_softmax.py FusedScaleMaskSoftmax; table5_rows): unfused
    **dict.fromkeys(("fused scale-mask-softmax", "fusedscalemasksoftmax", "fused softmax",
                     "no flashattention", "without flash attention", "without flashattention"),
                    {"flash_attention": False}),
    # ZeRO-powered data parallelism (ZeRO-DP: Rajbhandari et al. 2020, stages 1-3) names no stage;
    # beside a pipeline it is stage 1 (plan_of: DeepSpeed's pipeline engine refuses 2 and 3, as
    # perfmodel.configs.megatron_deepspeed says; MT-NLG's system paper, arXiv 2201.11990)
    **dict.fromkeys(("zero-powered data parallelism", "zero-dp", "zero data parallelism"),
                    {"_zero_powered": True}),
    # the precision, stated in words: the row's dtype column says which (plan_of checks that a
    # named one agrees with it)
    **dict.fromkeys(("mixed precision", "mixed precision training", "amp",
                     "automatic mixed precision"), {}),
    **{f"{dtype} mixed precision": {"_dtype": dtype} for dtype in ("bf16", "fp16")},
    # ... in autocast's words: Composer's precision amp_bf16 / amp_fp16, 'BF16 AMP'
    **{words: {"_dtype": dtype} for dtype in ("bf16", "fp16")
       for words in (f"amp_{dtype}", f"{dtype} amp", f"amp {dtype}", f"{dtype} autocast")},
}
# the precisions a feature may name: the row's dtype column, or beside fp8 the 16-bit format its
# other operations run in (Transformer Engine's FP8 autocast inside bf16 or fp16)
DTYPE_WORDS = {"bf16": ("bf16", "fp8"), "fp16": ("fp16", "fp8"), "fp32": ("fp32",),
               "tf32": ("tf32", "fp32"), "fp8": ("fp8",)}
GENERIC_FEATURES.update({d: {"_dtype": d} for d in DTYPE_WORDS})


# Features that name the model's positions (TransformerSpec.position_embedding), over what its
# architecture's entry says
POSITION_FEATURES = {"alibi": "alibi", "rope": "rotary", "rotary": "rotary",
                     "rotary positions": "rotary", "learned positions": "learned",
                     "learned absolute positions": "learned",
                     **dict.fromkeys(("alibi positions", "alibi position embeddings",
                                      "alibi position embedding", "position embedding type alibi"),
                                     "alibi"),
                     **dict.fromkeys(("rotary position embeddings", "rotary position embedding",
                                      "rotary embeddings", "position embedding type rope"),
                                     "rotary"),
                     **dict.fromkeys(("learned position embeddings",
                                      "learned absolute position embeddings"), "learned")}


# Features that set how a mixture of experts routes (TransformerSpec.routing,
# routing_imbalance): NeMo AutoModel's fake balanced gate sends token t to experts t k ..
# t k + k - 1; Megatron-Core's --moe-router-force-load-balancing routes on random logits
# (experts at random, every expert the same tokens in expectation)
ROUTING_FEATURES: dict[str, dict[str, Any]] = {
    **dict.fromkeys(("fake balanced gate", "fake_balanced_gate", "fakebalancedgate"),
                    {"routing": "round_robin", "routing_imbalance": 1.0}),
    **dict.fromkeys(("force load balancing", "moe-router-force-load-balancing",
                     "moe_router_force_load_balancing", "forced load balancing"),
                    {"routing": "learned", "routing_imbalance": 1.0}),
}


# Features that state the model's biases and dropout (TransformerSpec.bias, hidden_dropout and
# attention_dropout), over what its architecture's entry or tokenizer says (a rate, 'dropout
# 0.1', is feature_options')
ARCHITECTURE_FEATURES: dict[str, dict[str, Any]] = {
    **dict.fromkeys(("no bias", "no biases", "without bias", "without biases", "bias false",
                     "disable bias linear", "no linear bias", "no linear biases", "bias-free"),
                    {"bias": False}),
    **dict.fromkeys(("biases", "with bias", "with biases", "linear biases", "bias true",
                     "add bias linear"), {"bias": True}),
    **dict.fromkeys(("no dropout", "without dropout", "dropout none", "dropout off"),
                    NO_DROPOUT),
}


def feature_key(feature: str) -> str:
    """A feature as GENERIC_FEATURES and ROUTING_FEATURES name it: lower case, single spaces,
    numbers without their thousands separators ('DP=1,024' is dp=1024)."""
    return " ".join(re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", feature.lower()).split())


def loose_key(feature: str) -> str:
    """A feature as it is matched where its exact words are not: feature_key without a leading
    '--', hyphens and underscores as spaces ('Scatter_Gather' and 'scatter-gather' alike)."""
    return " ".join(re.sub(r"[-_]", " ", feature_key(feature).removeprefix("--")).split())


def compact_key(feature: str) -> str:
    """A feature as it is matched where neither its words nor its loose words are: loose_key
    without its spaces ('FlashAttention2' and 'flash attention 2' alike). Safe where the words
    of one table read alike only when they mean the same (_loosely checks it)."""
    return loose_key(feature).replace(" ", "")


def _loosely(table: dict[str, Any]) -> dict[str, Any]:
    """A table of features by loose_key and by compact_key; two entries that read alike must
    mean the same."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        for alike in (loose_key(key), compact_key(key)):
            if out.setdefault(alike, value) != value:
                raise ValueError(f"feature '{key}' reads as another with other options")
    return out


GENERIC_LOOSE = _loosely(GENERIC_FEATURES)
POSITION_LOOSE = _loosely(POSITION_FEATURES)
ROUTING_LOOSE = _loosely(ROUTING_FEATURES)
ARCHITECTURE_LOOSE = _loosely(ARCHITECTURE_FEATURES)
# the options a feature's trailing 'optimizer' may name ('distributed fused adam optimizer'; not
# 'fp32 optimizer', a precision's, nor 'bf16 optimizer', which is DeepSpeed's BF16_Optimizer)
OPTIMIZER_OPTIONS = {"zero", "bf16_optimizer", "master_weights", "optimizer_dtype"}


def _lookup(table: dict[str, Any], loose: dict[str, Any], feature: str) -> Any:
    """A feature's entry in a table by its exact words, else loosely, else compactly; None where
    none."""
    for found in (table.get(feature_key(feature)), loose.get(loose_key(feature)),
                  loose.get(compact_key(feature))):
        if found is not None:
            return found
    return None


# Activation recompute in the words of other stacks and papers, any order: 'activation
# checkpointing: none', 'AC full', 'full activation recomputation' (Korthikanti et al. 2022),
# 'selective activation checkpointing' (NeMo's activations_checkpoint_granularity selective),
# Megatron's 'recompute granularity full'; as Plan.recompute names them. torchtitan's selective AC
# is per op or per N layers ('selective op AC', 'selective layer AC': feature_options), which
# plan_of asks a torchtitan row to say
RECOMPUTE_WORDS = (r"(?:activations? (?:checkpointing|checkpoints?|recompute|recomputation)"
                   r"|gradient checkpointing|recompute|recomputation|ac)")
RECOMPUTE_LEVELS = {"full": "full", "selective": "selective", "no": "none", "none": "none",
                    "off": "none", "disabled": "none", "false": "none"}
# PyTorch FSDP's names in any order: 'FULL_SHARD FSDP', 'PyTorch FSDP full shard', 'fully
# sharded data parallelism'
FSDP_WORDS = (r"(?:(?:pytorch|torch) )?(?:fsdp1?|fully sharded data parallel(?:ism)?)")
# Features that name a run the model does not have, refused in their row with why: HSDP (FSDP
# shards replicated over groups; perfmodel.configs.torchtitan and automodel refuse it too), and
# torchao's float8 training (torchtitan's model.converters float8: its own casts and scaling,
# not Transformer Engine's recipes; perfmodel.configs.torchtitan refuses it)
REFUSED_FEATURES = {
    r"\bhsdp\b|\bhybrid ?shard": "HSDP (FSDP shards replicated over groups) is not modelled",
    r"\btorchao\b|^(?:torchtitan )?float8(?: (?:training|linear(?: layers)?|converter"
    r"|tensorwise|rowwise(?: with gw hp)?|dynamic(?: scaling)?))*$":
        "torchao's float8 training (torchtitan's float8 converter) is not modelled: its casts "
        "and scaling are not Transformer Engine's FP8 recipes, which the model has",
}


def generic_feature(feature: str) -> dict[str, Any] | None:
    """The plan options of a feature GENERIC_FEATURES names (in its words, or loosely:
    loose_key), or of `VP=N` / `virtual pipeline N` / `k layers per virtual stage`
    (interleaved), `ZeRO-N` / `ZeRO stage N` / `zero-stage N`, `selective recompute of a+b`
    (Megatron-Core's --recompute-modules a b), `N-way tensor slicing`, `--DDP-impl torch`,
    `--pp-partition-method M`, or any of these with a trailing 'optimization' (or 'optimizer',
    where it names an optimizer's options), activation recompute in any order of its words
    (RECOMPUTE_WORDS), PyTorch FSDP's names (FSDP_WORDS), `grad accumulation N`, the overlaps of
    the gradients' reduction and the parameters' gather in words ('overlapped grad reduce'), and
    'A with B and C' of such features; None for any other. Keys that start with '_' are what
    plan_of checks against the row's columns or resolves with its other features; `_refuse`
    says why the row cannot be predicted (REFUSED_FEATURES)."""
    text, loose = feature_key(feature), loose_key(feature)
    for pattern, why in REFUSED_FEATURES.items():
        if re.search(pattern, loose):
            return {"_refuse": why}
    if (known := _lookup(GENERIC_FEATURES, GENERIC_LOOSE, feature)) is not None:
        return dict(known)
    # the parallel degrees in words ('8-way tensor slicing', 'TP=8', 'context parallel 2'): the
    # row's columns give them; plan_of checks that they agree
    if way := re.fullmatch(r"(\d+) way (tensor|pipeline|data|context)(?: slicing| parallelism"
                           r"| parallel| model parallelism)?", loose):
        return {f"_{way.group(2)[0]}p": int(way.group(1))}
    if degree := re.fullmatch(r"(tp|pp|dp|cp) ?[=:]? ?(\d+)", loose):
        return {f"_{degree.group(1)}": int(degree.group(2))}
    if degree := re.fullmatch(r"(tensor|pipeline|data|context) parallel(?:ism)?(?: size| degree)?"
                              r" ?[=:]? ?(\d+)", loose):
        return {f"_{degree.group(1)[0]}p": int(degree.group(2))}
    # the micro-batches a step accumulates: the row's global_batch / (dp x micro_batch), which
    # plan_of checks it against
    if steps := (re.fullmatch(r"(?:grad(?:ient)? accumulation(?: steps)?|accumulation steps|ga)"
                              r" ?[=:]? ?(\d+)", loose)
                 or re.fullmatch(r"(\d+) ?x? (?:grad(?:ient)? )?accumulation(?: steps?)?", loose)):
        return {"_grad_accumulation": int(steps.group(1))}
    levels = "|".join(RECOMPUTE_LEVELS)
    if ac := (re.fullmatch(rf"(full|selective|no) {RECOMPUTE_WORDS}", loose)
              or re.fullmatch(rf"{RECOMPUTE_WORDS}(?: granularity)? ?[:=]? ?({levels})", loose)):
        return {"recompute": RECOMPUTE_LEVELS[ac.group(1)]}
    if re.fullmatch(rf"{FSDP_WORDS}(?: (?:with )?full shard(?:ing)?)?"
                    rf"|full shard(?:ing)? {FSDP_WORDS}", loose):
        return dict(GENERIC_FEATURES["fsdp"])
    if flash := re.fullmatch(r"(?:flash ?(?:attn|attention)|fa) ?v?([23])", loose):
        return dict(GENERIC_FEATURES[f"fa{flash.group(1)}"])
    # the distributed optimizer's (or FSDP's) overlaps in words: 'overlapped grad reduce',
    # 'overlapping parameter all-gather'
    overlap = r"overlap(?:ped|ping)?(?: of)?(?: the)? "
    if re.fullmatch(rf"{overlap}(?:grad(?:ient)?s?|dp) (?:reduce(?: scatters?)?|reductions?"
                    r"|sync|all reduces?)", loose):
        return {"overlap_grad_sync": True}
    if re.fullmatch(rf"{overlap}param(?:eter)?s? (?:gathers?|all gathers?|sync)", loose):
        return {"overlap_param_gather": True}
    if compound := re.fullmatch(r"(.+?) with (.+)", loose):
        return _with(compound.group(1), compound.group(2))
    # the virtual stages (model chunks) per pipeline rank: VP=3, virtual pipeline 3, 3 virtual
    # stages, Megatron's --virtual-pipeline-model-parallel-size 3 and
    # --num-virtual-stages-per-pipeline-rank 3
    if vp := (re.fullmatch(r"(?:--)?(?:vpp?|virtual[-_ ]pipeline(?:[-_ ]stages)?|virtual[-_ ]stages"
                           r"|virtual[-_ ]pipeline[-_ ]model[-_ ]parallel[-_ ]size"
                           r"|num[-_ ]virtual[-_ ]stages[-_ ]per[-_ ]pipeline[-_ ]rank)"
                           r"\s*[=: ]\s*(\d+)", text)
              or re.fullmatch(r"(\d+) virtual (?:pipeline )?stages", text)):
        return {"schedule": "interleaved", "virtual_stages": int(vp.group(1))}
    # ... or the layers of each: Megatron's --num-layers-per-virtual-pipeline-stage k, 'k layers
    # per virtual stage' (virtual stages = layers / (pp k): plan_of)
    if per := (re.fullmatch(r"(?:--)?(?:num[-_ ])?layers[-_ ]per[-_ ]virtual[-_ ]pipeline[-_ ]stage"
                            r"\s*[=: ]\s*(\d+)", text)
               or re.fullmatch(r"(\d+) layers? per virtual (?:pipeline )?(?:stage|chunk)", text)):
        return {"schedule": "interleaved", "_layers_per_virtual_stage": int(per.group(1))}
    # ZeRO-1, ZeRO stage 1, zero-stage 1, --zero-stage=1, DeepSpeed ZeRO stage: 1
    if zero := re.fullmatch(r"(?:--)?(?:deepspeed )?zero[-_ ]?(?:stage[-_ ]?)?[=:]? ?([0-3])",
                            text):
        return {"zero": int(zero.group(1))}
    # DeepSpeed's partition of the layers over the pipeline stages (Megatron-DeepSpeed's
    # --pp-partition-method type:<regex> or uniform; plan_of splits them as
    # perfmodel.configs.megatron_deepspeed.stage_split does)
    if part := re.fullmatch(r"(?:--)?(?:pp[-_ ])?partition[-_ ]method[=: ]+['\"]?([^'\"\s]+)['\"]?",
                            text):
        return {"_pp_partition": part.group(1)}
    if ddp := re.fullmatch(r"(?:--)?ddp[-_ ]impl[=: ]+(local|torch)", text):
        return dict(GENERIC_FEATURES[f"{ddp.group(1)} ddp"])
    # Megatron-LM's --checkpoint-activations --checkpoint-num-layers n (2021-22): every layer
    # recomputed, checkpointed in chunks of n (perfmodel.configs.megatron OLDER_RECOMPUTE). The
    # number of layers only: the method is what the row's other words say ('block'), else the
    # plan's default, uniform (Plan.recompute_method; Megatron-LM's --recompute-method)
    if chunk := re.fullmatch(r"(\d+) layers? per checkpoint|checkpoint num layers (\d+)", text):
        return {"recompute": "full", "recompute_num_layers": int(chunk.group(1) or chunk.group(2))}
    if modules := re.fullmatch(r"selective recompute of ([a-z_]+(?:\+[a-z_]+)*)", text):
        return {"recompute": "selective",
                "recompute_modules": ",".join(modules.group(1).split("+"))}
    # a trailing 'optimization' or 'optimizer' word where what it follows says the same:
    # 'scatter-gather optimization'; an optimizer only of an optimizer's options
    if trailing := re.fullmatch(r"(.+) (optimi[sz]ations?|optimi[sz]er)", loose):
        options = generic_feature(trailing.group(1)) or {}
        if OPTIMIZER_OPTIONS & set(options) or ("ation" in trailing.group(2) and [
                key for key in options if not key.startswith("_")]):
            return options
    return None


def _with(base: str, rest: str) -> dict[str, Any] | None:
    """The options of 'A with B and C' (Megatron-Bridge's 'distributed optimizer with overlapped
    grad reduce and param gather'): A's, B's and C's together, where each reads as a feature and
    none contradicts another; a part after an 'overlapped' one is overlapped too ('... and param
    gather'). None where any does not read."""
    options = generic_feature(base)
    if options is None:
        return None
    verb = ""
    for part in re.split(r",? and |, ", rest):
        said = re.match(r"overlap(?:ped|ping)? ", part)
        found = generic_feature(part if said or not verb else verb + part)
        if found is None or any(options.get(k, v) != v for k, v in found.items()):
            return None
        options.update(found)
        verb = said.group(0) if said else verb
    return options


def model_of(row: dict[str, Any]) -> dict[str, Any]:
    """The TransformerSpec fields of a row's model: the preset its `model` column names (its sizes
    checked against the row's), else the row's sizes on its architecture (architecture_of) with
    the experts its optional columns give. ValueError where they disagree."""
    sizes = {k: int(row[k]) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                                       "vocab")}
    name = _stated(row, "model")
    if name is not None:
        from perfmodel.specs.presets import MODELS_DIR, preset_names

        if str(name) in preset_names(MODELS_DIR):
            from perfmodel import load_model

            spec = load_model(str(name)).to_dict()
            spec.pop("kind", None)
            # the vocabulary may be padded (Megatron: a multiple of 128 x tp)
            wrong = [f"{k} {v} (preset {spec[k]})" for k, v in sizes.items()
                     if v != spec[k] and not (k == "vocab" and 0 <= v - spec[k] < 1024 * 8)]
            if wrong:
                raise ValueError(f"model {name}: the row's {', '.join(wrong)} differ")
            # the run's own choices: its sequence, its dropout where a column states it, and
            # the MTP modules it trains (a recipe may drop the model's)
            spec["seq_len"] = int(row["seq_len"])
            spec.update(_dropout_columns(row))
            if (mtp := _stated(row, "mtp_layers")) is not None:
                spec["mtp_layers"] = int(mtp)
            return spec
    model = dict(architecture_of(row), **sizes, seq_len=int(row["seq_len"]))
    for column, field_name in MODEL_COLUMNS.items():
        if (value := _stated(row, column)) is not None:
            model[field_name] = int(value)
    return model


def feature_options(feature: str, model: dict[str, Any],
                    plan: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(plan options, model options) of one feature of a row, in the development set's words
    (below, whatever their case: 'sp', 'Full AC') or another run's (generic_feature,
    POSITION_FEATURES, ROUTING_FEATURES, ARCHITECTURE_FEATURES, a dropout rate); None for a
    feature none of them knows. `plan` is what the row's columns give (its pipeline_layout)."""
    name = feature_key(feature)
    vp = re.fullmatch(r"vp=(\d+)", name)
    if name == "fp8 (te hybrid)":
        # the row's dtype column (fp8); Transformer Engine's delayed scaling with the weights
        # held in FP8: v24.11.1's configs set fp8_hybrid, fp8_amax_history_len 1024 and
        # fp8_amax_compute_algo max (TE's DelayedScaling) and FP8 weights
        # (nemotron/configure.sh: +model.fp8_params=${FP8_ENABLED};
        # nemo_megatron/gpt3_175b_hydra.yaml: fp8_params: true); v25.04's NeMo 2
        # bf16_with_fp8_mixed() the same (fp8_recipe "delayed", fp8_params /
        # fp8_param_gather True)
        return dict(fp8_recipe="delayed", fp8_params=True), {}
    if name == "sp":
        return {"sequence_parallel": True}, {}
    if vp:
        return dict(schedule="interleaved", virtual_stages=int(vp.group(1))), {}
    if name == "distributed_fused_adam + overlap grad/param sync":
        # Megatron's distributed optimizer shards the optimizer states (ZeRO-1), reduces the
        # gradients during backward and gathers the parameters during the next forward
        return dict(zero=1, overlap_grad_sync=True, overlap_param_gather=True), {}
    if name == "tp comm overlap (ub_tp_comm_overlap)":
        return {"tp_comm_overlap": True}, {}  # Transformer Engine's userbuffers
    if name == "flash/cudnn attention":
        return {"flash_attention": True}, {}
    if name in ("recompute none", "no ac"):
        return {"recompute": "none"}, {}
    if name == "recompute selective":
        return {"recompute": "selective"}, {}
    if name == "full ac":
        return {"recompute": "full"}, {}
    if name == "fsdp2":
        # torchtitan: FSDP2 shards parameters, gradients and optimizer states, reduce-scatters
        # on its own stream during the backward and prefetches the next unit's all-gather
        # (implicit prefetching): both overlaps are its defaults; its attention is
        # F.scaled_dot_product_attention, whose flash backend (FlashAttention-2) runs bf16 on
        # A100
        return dict(zero=3, flash_attention=True, overlap_grad_sync=True,
                    overlap_param_gather=True), {}
    if (block := re.fullmatch(r"full recompute of (\d+) of \d+ layers "
                              r"\(recompute_method block\)", name)):
        # Megatron's --recompute-granularity full --recompute-method block: the first k
        # layers of each chunk (Plan.recompute_method)
        return dict(recompute="full", recompute_method="block",
                    recompute_num_layers=int(block.group(1))), {}
    if (offload := re.fullmatch(r"activation cpu offload of (\d+) layers", name)):
        # Megatron-Core's --cpu-offloading-num-layers k (Transformer Engine's offload of the
        # first k layers' activations; Plan.cpu_offload_layers)
        return {"cpu_offload_layers": int(offload.group(1))}, {}
    if name == "selective op ac":
        return {"recompute": "op"}, {}  # torchtitan selective_ac_option 'op'
    if name == "selective layer ac":
        # torchtitan selective_ac_option '2' (the train configs' value): every second layer
        return dict(recompute="full", recompute_every=2), {}
    if name.startswith(("pipeline split counts", "pipeline layout")) \
            and plan.get("pipeline_layout"):
        return {}, {}  # the split the row's pipeline_layout column writes out (LAYOUT_COLUMNS)
    if (generic := generic_feature(feature)) is not None:
        return generic, {}
    if (position := _lookup(POSITION_FEATURES, POSITION_LOOSE, feature)) is not None:
        return {}, {"position_embedding": position}
    if (routing := _lookup(ROUTING_FEATURES, ROUTING_LOOSE, feature)) is not None:
        return {}, dict(routing)
    if (stated := _lookup(ARCHITECTURE_FEATURES, ARCHITECTURE_LOOSE, feature)) is not None:
        return {}, dict(stated)
    # a dropout rate: both ('dropout 0.1'), or the hidden or the attention one
    if rate := re.fullmatch(r"(hidden |attention )?dropout ?[=:]? ?(\d*\.?\d+)",
                            loose_key(feature)):
        fields = [f"{rate.group(1).strip()}_dropout"] if rate.group(1) else [
            "hidden_dropout", "attention_dropout"]
        return {}, dict.fromkeys(fields, float(rate.group(2)))
    return None


# Words a parenthetical qualifies its feature with, by the option the feature sets (... for any
# value of it), in loose_key's words: the method of a full recompute ('full activation recompute
# (uniform, 1 layer per checkpoint)': Megatron-LM's --recompute-method, RecomputeMethod), FP8's
# scaling recipe ('FP8 (current scaling)'), context parallelism's exchange ('context parallel 2
# (p2p)': Megatron-Core's default cp_comm_type, the ring the plan models), the attention's kernel
# ('SDPA (cuDNN)', 'flash attention (cuDNN)'; 'math' is unfused, against flash a disagreement),
# and Megatron FSDP's sharding strategy its user guide requires
_CURRENT, _DELAYED = {"fp8_recipe": "current"}, {"fp8_recipe": "delayed"}
QUALIFIERS: dict[tuple[str, Any], dict[str, dict[str, Any]]] = {
    ("recompute", "full"): {"uniform": {"recompute_method": "uniform"},
                            "block": {"recompute_method": "block"},
                            # another granularity: _merge refuses it as a disagreement
                            # ('activation checkpointing (selective)')
                            "selective": {"recompute": "selective"}},
    ("_dtype", "fp8"): {**dict.fromkeys(("current scaling", "current", "tensorwise", "cs",
                                         "te current scaling", "tensorwise scaling"), _CURRENT),
                        **dict.fromkeys(("delayed scaling", "delayed", "te delayed scaling"),
                                        _DELAYED)},
    ("_cp", ...): dict.fromkeys(("p2p", "ring", "ring attention", "cp comm type p2p"), {}),
    ("flash_attention", ...): {
        **dict.fromkeys(("flash", "flash backend"), {"flash_attention": True}),
        **dict.fromkeys(("cudnn", "cudnn backend"),
                        {"flash_attention": True, "attention_kernel": "cudnn"}),
        **dict.fromkeys(("math", "math backend"), {"flash_attention": False})},
    ("zero", 3): dict.fromkeys(("optim grads params", "full shard"), {}),
}
# A parenthetical that reverses its feature ('flash attention (disabled)'): the row is refused,
# naming the feature, rather than the feature applied
NEGATIONS = {"disabled", "disable", "off", "not used", "unused", "none", "no"}


def _qualifier(options: dict[str, Any], piece: str) -> dict[str, Any] | None:
    """The plan options a word in a feature's parenthetical gives in that feature's context
    (QUALIFIERS), or None."""
    for (key, value), words in QUALIFIERS.items():
        if key in options and value in (..., options[key]) and loose_key(piece) in words:
            return dict(words[loose_key(piece)])
    return None


# Features a source states whose cost the model does not have, with what it leaves out
NOT_MODELLED: dict[str, str] = {
    # perfmodel.configs.megatron_deepspeed (the same words for its --embed-layernorm)
    **dict.fromkeys(("embed-layernorm", "embedding layernorm", "embed layernorm",
                     "embedding layer norm"),
                    "a LayerNorm on the embedding's output (Megatron-DeepSpeed --embed-layernorm): "
                    "its 2 h parameters and its one norm a micro-batch"),
    "cuda_launch_blocking=1": "every kernel launch waits for the kernel before the host goes on "
                              "(CUDA_LAUNCH_BLOCKING): the host's launches no longer hide behind "
                              "the GPU",
}
NOT_MODELLED_LOOSE = _loosely(NOT_MODELLED)


def _unread(piece: str, feature: str = "") -> str:
    """A row's not-modelled entry for a feature (or a piece of one's parenthetical) no reading
    maps: what it leaves out where NOT_MODELLED knows it, else 'unknown feature'."""
    where = f"in '{feature}'; " if feature else ""
    if (why := _lookup(NOT_MODELLED, NOT_MODELLED_LOOSE, piece)) is not None:
        return f"feature '{piece}': {why} ({where}not modelled)"
    return f"unknown feature '{piece}' ({where}not mapped)"


def _merge(options: dict[str, Any], into: dict[str, Any], origin: dict[str, str],
           feature: str) -> None:
    """One feature's options into the plan (or model) the row's other features built, whatever
    their order: an option two features set to different values refuses the row (ValueError
    naming both), unless one reading contains the other (_reconcile)."""
    for key, value in options.items():
        if key in origin and into[key] != value:
            value = _reconcile(key, into[key], value, origin[key], feature,
                               {**into, **options})
            if value == into[key]:
                continue  # the earlier feature's reading holds: it stays the option's origin
        into[key] = value
        origin[key] = feature


def option_name(key: str) -> str:
    """An option as a message names it: a key plan_of checks against the row's columns or
    resolves ('_dtype', '_tp') as that column or its words ('dtype', 'tp')."""
    return key[1:].replace("_", " ") if key.startswith("_") else key


def _reconcile(key: str, old: Any, new: Any, old_feature: str, feature: str,
               options: dict[str, Any]) -> Any:
    """The value of an option two features state differently, where both are true of the run;
    else ValueError naming the features."""
    # DeepSpeed's BF16_Optimizer runs at its ZeRO stage 0 and is its own stage 1 (fp32 master
    # weights and Adam states sharded over dp): perfmodel.configs.megatron_deepspeed, _zero
    if key == "zero" and {old, new} == {0, 1} and options.get("bf16_optimizer"):
        return 1
    # SDPA's backend, where another feature names it ('SDPA, flash attention'): that one
    if key == "flash_attention" and None in (old, new):
        return new if old is None else old
    # a 1F1B that does not say non-interleaved is the interleaved schedule's too (Megatron's
    # interleaved 1F1B)
    plain = {f for f, value in ((old_feature, old), (feature, new)) if value == "1f1b"
             and feature_key(f) == "1f1b"}
    if key == "schedule" and {old, new} == {"1f1b", "interleaved"} and plain:
        return "interleaved"
    # two precisions a row may name together: FP8 training keeps bf16 (or fp16) for its other
    # operations and weights (DTYPE_WORDS), so 'fp8; bf16' is an fp8 run: the word that allows
    # only the row dtypes both allow (plan_of checks it against the dtype column)
    if key == "_dtype":
        both = set(DTYPE_WORDS.get(old, (old,))) & set(DTYPE_WORDS.get(new, (new,)))
        narrowest = [d for d in (old, new) if set(DTYPE_WORDS.get(d, (d,))) == both]
        if both and narrowest:
            return narrowest[0]
    raise ValueError(f"features '{old_feature}' and '{feature}' disagree: {option_name(key)} "
                     f"{old} against {new}")


def deepspeed_split(method: str, layers: int, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan fields of DeepSpeed's partition `method` (--pp-partition-method) of the layers
    over the row's pp stages: perfmodel.configs.megatron_deepspeed.stage_split's split, set as
    its fix_split sets it (first_stage_layers / last_stage_layers where an end differs from the
    even stages between, else a pipeline layout); where the row's pipeline_layout column gives
    the split too, the two must agree. ValueError where DeepSpeed's split cannot be modelled."""
    from perfmodel.configs.megatron_deepspeed import stage_split
    from perfmodel.errors import PerfmodelError
    from perfmodel.pipeline_layout import PipelineLayout

    pp = plan["pp"]
    if plan.get("virtual_stages", 1) > 1:
        raise ValueError(f"pp-partition-method {method}: DeepSpeed's pipeline engine has no "
                         f"virtual stages (virtual_stages {plan['virtual_stages']})")
    try:
        split = stage_split(method, layers, pp, plan["dtype"] in ("bf16", "fp16"), "row",
                            "pp-partition-method")
    except PerfmodelError as exc:
        raise ValueError(str(exc)) from None
    if 0 in split:
        raise ValueError(f"pp-partition-method {method}: leaves a stage without layers: {split}")
    if plan.get("pipeline_layout"):
        try:
            given = [stage.count("t") for stage in
                     PipelineLayout.parse(plan["pipeline_layout"], pp).stages]
        except PerfmodelError as exc:
            raise ValueError(str(exc)) from None
        if given != split:
            raise ValueError(f"pp-partition-method {method} splits the layers {split}, the "
                             f"pipeline_layout column {given}")
        return {}
    if pp == 1:
        return {}
    if len(set(split[1:-1])) <= 1:
        middle = split[1] if pp > 2 else None
        return {f"{end}_stage_layers": n for end, n in (("first", split[0]), ("last", split[-1]))
                if n != middle}
    stages = ["t" * n for n in split]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return {"pipeline_layout": "|".join(stages)}


def plan_of(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(model fields, plan fields, features not modelled) of a published run. Every feature the
    source states is either mapped to a plan option or named as not modelled."""
    model, plan, missing, _ = read_row(row)
    return model, plan, missing


def read_row(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str],
                                             dict[str, str]]:
    """plan_of's (model, plan, not modelled), and the feature (or column) that set each option
    of the plan and the model, by its key."""
    model = model_of(row)
    plan: dict[str, Any] = dict(gpus=int(row["gpus"]), tp=int(row["tp"]), pp=int(row["pp"]),
                                dp=int(row["dp"]), micro_batch=int(row["micro_batch"]),
                                global_batch=int(row["global_batch"]), dtype=row["dtype"])
    for key in PLAN_COLUMNS:
        if (value := _stated(row, key)) is not None and int(value) > 1:
            plan[key] = int(value)
    for key in DISPATCHER_COLUMNS:
        if (value := _stated(row, key)) is not None:
            if str(value).strip().lower() not in DISPATCHERS:
                raise ValueError(f"{key} {value}: one of {', '.join(DISPATCHERS)}")
            plan["ep_dispatcher"] = DISPATCHERS[str(value).strip().lower()]
    known = set(COLUMNS) | set(ARCH_COLUMNS) | set(DROPOUT_COLUMNS) | set(MODEL_COLUMNS) | set(
        PLAN_COLUMNS) | {
        "model", "mtp_layers", *DISPATCHER_COLUMNS, *LAYOUT_COLUMNS}
    missing: list[str] = [f"column {key}={value} (not read)" for key, value in row.items()
                          if key not in known and _stated(row, key) is not None]
    for key in LAYOUT_COLUMNS:
        if (value := _stated(row, key)) is not None:
            plan["pipeline_layout"] = str(value).strip()
    cp = int(row.get("cp", 1) or 1)
    if cp > 1:  # Megatron-Core's default cp_comm_type, p2p (ring attention); gpus = dp cp tp pp
        plan["cp"] = cp
    # the feature that set each option; a column's options are the column's, so that a feature
    # stating another value disagrees with it rather than overriding it
    origin: dict[str, str] = {key: f"{key} column" for key in (*PLAN_COLUMNS, *LAYOUT_COLUMNS)
                              if key in plan}
    for key in DISPATCHER_COLUMNS:
        if _stated(row, key) is not None:
            origin["ep_dispatcher"] = f"{key} column"
    interleaving: list[str] = []  # the features that state the interleaved schedule outright
    for feature in _features(str(row["features"])):
        # unbalanced brackets: an unclosed '(' swallows the features after it into one (whose
        # options would go unread): refused, naming it, rather than guessed closed
        if sum(map(feature.count, "([{")) != sum(map(feature.count, ")]}")):
            raise ValueError(f"feature '{feature}': unbalanced parentheses (close them)")
        # a feature as it is stated, else without its parenthetical, whose own words are read
        # too ('DeepSpeed pipeline parallelism (1F1B)'); one no reading knows is named, whole
        # Each reading is merged under its own words (the base, each piece), so that two
        # of one feature's readings are two features to _merge and _reconcile ('1F1B
        # (interleaved)': the 1F1B is the interleaved schedule's)
        reads: list[tuple[str, tuple[dict[str, Any], dict[str, Any]]]] = []
        if (found := feature_options(feature, model, plan)) is not None:
            reads.append((feature, found))
        parts = _parenthetical(feature) if not reads else None
        if parts and (found := feature_options(parts[0], model, plan)) is not None:
            reads.append((parts[0], found))
            for piece in parts[1]:
                if feature_key(piece) in NEGATIONS:
                    raise ValueError(f"feature '{feature}': its parenthetical '{piece}' reverses "
                                     "it (state what the run does instead)")
                if (found := feature_options(piece, model, plan)) is not None:
                    reads.append((piece, found))
                elif (qualifies := _qualifier(reads[0][1][0], piece)) is not None:
                    reads.append((piece, (qualifies, {})))
                else:
                    missing.append(_unread(piece, feature))
        if not reads:
            missing.append(_unread(feature))
        for name, (plan_options, model_options) in reads:
            if (why := plan_options.get("_refuse")) is not None:
                raise ValueError(f"feature '{feature}': {why}")
            if "routing" in model_options and not model.get("experts"):
                missing.append(f"feature '{feature}' on a model without experts (not mapped)")
                continue
            _merge(plan_options, plan, origin, name)
            _merge(model_options, model, origin, name)
            if plan_options.get("schedule") == "interleaved" \
                    and "_layers_per_virtual_stage" not in plan_options:
                interleaving.append(name)
    if model.get("experts") and "routing_imbalance" not in origin:  # the preset's, unstated
        missing.append("assumed: routing not stated: even (routing_imbalance 1, the model's "
                       "default; a learned router routes unevenly early in a run, its busiest "
                       "expert the slowest rank's)")
    if (per := plan.pop("_layers_per_virtual_stage", None)) is not None:
        # Megatron-LM's --num-layers-per-virtual-pipeline-stage (perfmodel.configs.megatron)
        layers, pp = int(model["layers"]), plan["pp"]
        if layers % (pp * per):
            raise ValueError(f"{per} layers per virtual stage: the layers ({layers}) must split "
                             f"into pp ({pp}) x whole chunks of {per}")
        chunks = layers // (pp * per)
        if plan.get("virtual_stages", chunks) != chunks:
            raise ValueError(f"{per} layers per virtual stage are {chunks} virtual stages "
                             f"(layers {layers} / (pp {pp} x {per})); another feature says "
                             f"{plan['virtual_stages']}")
        if chunks == 1 and interleaving:
            raise ValueError(f"features '{interleaving[0]}' and "
                             f"'{origin['_layers_per_virtual_stage']}' disagree: the "
                             f"interleaved schedule, but {per} layers per virtual stage are "
                             f"one chunk (layers {layers} / (pp {pp} x {per}))")
        plan.update(virtual_stages=chunks, schedule="interleaved" if chunks > 1 else "1f1b")
    if plan.get("schedule") == "interleaved" and "virtual_stages" not in plan \
            and not plan.get("pipeline_layout"):
        raise ValueError(f"the interleaved schedule ('{origin['schedule']}') without its virtual "
                         "stages: state VP=n or k layers per virtual stage")
    for axis in ("tp", "pp", "dp", "cp"):
        if (stated := plan.pop(f"_{axis}", None)) is not None and stated != plan.get(axis, 1):
            raise ValueError(f"feature '{origin[f'_{axis}']}' says {axis} {stated}, the row's "
                             f"{axis} column {plan.get(axis, 1)}")
    if (steps := plan.pop("_grad_accumulation", None)) is not None:
        batch, dp, micro = plan["global_batch"], plan["dp"], plan["micro_batch"]
        if steps * dp * micro != batch:
            raise ValueError(f"feature '{origin['_grad_accumulation']}' says {steps} micro-batches "
                             f"a step, the row's global_batch / (dp x micro_batch) "
                             f"{batch} / ({dp} x {micro}) = {batch / (dp * micro):g}")
    if "torchtitan" in str(row.get("source", "")).lower() and plan.get("recompute") == "selective":
        # torchtitan's selective AC keeps per-op outputs or checkpoints every Nth layer; it has
        # no policy of Megatron's (the attention core alone)
        raise ValueError(f"feature '{origin['recompute']}' in a torchtitan run: its selective AC "
                         "is per op or per N layers, not Megatron's selective recompute (state "
                         "'selective op AC' or 'selective layer AC')")
    if (dtype := plan.pop("_dtype", None)) is not None and plan["dtype"] not in DTYPE_WORDS.get(
            dtype, (dtype,)):
        raise ValueError(f"feature '{origin['_dtype']}' says {dtype}, the row's dtype column "
                         f"{plan['dtype']}")
    if plan.pop("_zero_powered", None):
        if plan.get("zero", 1) == 0:
            raise ValueError(f"features '{origin['_zero_powered']}' and '{origin['zero']}' "
                             "disagree: ZeRO-powered data parallelism against ZeRO stage 0")
        if "zero" not in plan and plan["pp"] == 1:
            raise ValueError(f"'{origin['_zero_powered']}' names no ZeRO stage (1-3 without a "
                             "pipeline): state ZeRO-N")
        plan.setdefault("zero", 1)  # DeepSpeed's pipeline engine runs ZeRO stage 1 at most
    if (plan.pop("_deepspeed_pipeline", None) or "_zero_powered" in origin) and plan["pp"] > 1 \
            and plan.get("zero", 0) > 1:
        # DeepSpeed's PipelineEngine asserts zero_optimization_stage() < 2 (deepspeed/runtime/
        # pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
        raise ValueError(f"'{origin['zero']}' with DeepSpeed's pipeline (pp {plan['pp']}): its "
                         f"pipeline engine refuses ZeRO stages 2 and 3")
    if (method := plan.pop("_pp_partition", None)) is not None:
        plan.update(deepspeed_split(method, int(model["layers"]), plan))
    if plan.pop("_ddp_impl", None) == "torch" and plan["pp"] > 1:
        # perfmodel.configs.megatron: Megatron-LM's schedules used no_sync only without a pipeline
        raise ValueError(f"torch DDP with pp {plan['pp']}: Megatron-LM's torch DDP all-reduced "
                         "the gradients in every micro-batch with a pipeline (not modelled)")
    if plan.get("pp_scatter_gather") == "where it applies":
        applies = plan["pp"] > 1 and plan["tp"] > 1 and not plan.get("sequence_parallel")
        plan["pp_scatter_gather"] = applies
        if not applies:
            del plan["pp_scatter_gather"]
    if plan.get("master_weights") == "remainders":  # where Megatron-Core keeps them
        recipe = plan.get("fp8_recipe") if plan["dtype"] == "fp8" else None
        plan["master_weights"] = megatron_master_weights(True, recipe,
                                                         bool(plan.get("fp8_params")))
    if row.get("source") == "torchtitan" and plan.get("stack", "eager") == "eager":
        # the A100 runs were eager: train_configs/llama*_*.toml at 015ccb237 set compile = false
        # (and norm_type = "rmsnorm"), so every element-wise op of the layer is its own kernel
        # (perfmodel.strategy.Kernels.EAGER; torchtitan/models/llama/model.py, models/norms.py)
        plan["kernels"] = "eager"
    if row.get("source") == "llm-foundry" and plan["dtype"] != "fp8" \
            and plan.get("stack", "eager") == "eager":
        # Composer runs MPT's modules as written (no torch.compile in the benchmark yamls):
        # LayerNorm, GeLU and the residual adds op by op, each linear's bias gradient reduced
        # apart. The FP8 rows' Transformer Engine linears fuse their bias gradients into the
        # GEMMs: they keep the fused kernels' count
        plan["kernels"] = "eager"
    if row.get("source") == "dgxc":
        key = (release_of(row), model["name"])
        plan.update(STACK_OPTIONS.get(key, {}))
        if key in NEMO1_REMAINDERS and plan["dtype"] == "bf16":
            plan["master_weights"] = "remainders"
        missing += STACK_NOT_MODELLED.get(key, [])
    return model, plan, missing, origin


def assumed_defaults(model: dict[str, Any], plan: dict[str, Any], hardware: str) -> list[str]:
    """What a row's plan takes where its features state nothing and the choice moves the step:
    the attention (Plan.flash_attention None: the preset's flash kernel where it runs the dtype
    and head size; SDPA's backend too, which PyTorch picks by GPU, dtype, head size and
    version), recompute (none), ZeRO (0) and the gradients' reduction (after the backward) with
    dp > 1, and FP8's scaling recipe (the preset's first); each said as 'assumed: ...' in the
    row's not-modelled column."""
    from perfmodel import PerfmodelError, TransformerSpec, load_hardware
    from perfmodel.encode import compute_dtype, resolve_flash

    out = []
    sdpa = "flash_attention" in plan and plan["flash_attention"] is None
    if ("flash_attention" not in plan or sdpa) and not plan.get("attention_kernel"):
        try:
            hw = load_hardware(hardware)
            flash = resolve_flash(None, TransformerSpec(**model), hw, plan["dtype"])
            kernel = hw.flash_kernel(compute_dtype(plan["dtype"]))
        except PerfmodelError:  # predict refuses the row with its reason
            flash, kernel = False, None
        out.append(("SDPA's backend not stated: " if sdpa else "attention not stated: ") + (
            f"flash ({kernel.name or kernel.kernel}, the preset's default kernel)"
            if flash and kernel
            else "unfused (the preset has no flash kernel for its dtype and head size)"))
    if "recompute" not in plan:
        out.append("recompute not stated: none (the plan's default)")
    if plan["dp"] > 1 and "zero" not in plan:
        out.append("ZeRO not stated: 0, the optimizer states and gradients replicated over dp "
                   "(the plan's default)")
    if plan["dp"] > 1 and "overlap_grad_sync" not in plan:
        out.append("gradient reduction not stated: after the backward, not overlapped (the "
                   "plan's default)")
    if plan["dtype"] == "fp8" and not plan.get("fp8_recipe"):
        try:
            recipe = load_hardware(hardware).fp8_recipe()
        except PerfmodelError:  # predict refuses the row with its reason
            recipe = None
        if recipe:
            out.append(f"FP8 recipe not stated: {recipe} scaling (the preset's default)")
    return [f"assumed: {text}" for text in out]


def published_rows(directory: Path) -> list[Row]:
    import pandas as pd

    from perfmodel import PerfmodelError, TransformerSpec, predict

    rows = []
    frame = pd.read_csv(directory / "published-steps.csv")
    for _, r in frame.iterrows():
        record = r.to_dict()
        try:  # a row the benchmark cannot read is reported as refused, with why
            model, plan, missing, origin = read_row(record)
            name, hardware, error = model["name"], hardware_of(record), ""
            missing += (hardware_notes(record, hardware) + architecture_assumed(record, origin)
                        + assumed_defaults(model, plan, hardware))
        except (KeyError, TypeError, ValueError) as exc:
            model, plan, missing, hardware = {}, {}, [], ""
            name = str(_stated(record, "model") or f"{r['layers']}x{r['hidden']}")
            error = f"not read: {exc}"
        # (a flash kernel the row's stack names beyond the features: STACK_OPTIONS)
        kernel = f", {plan['attention_kernel']} kernel" if plan.get("attention_kernel") else ""
        cp = r.get("cp")
        cp_text = f" cp{int(cp)}" if cp is not None and not pd.isna(cp) and int(cp) > 1 else ""
        label = (f"{name} {r['gpu']} x{r['gpus']} tp{r['tp']} pp{r['pp']} "
                 f"dp{r['dp']}{cp_text} mb{r['micro_batch']} {r['dtype']} "
                 f"[{str(r['features']).split('; ', 1)[-1]}{kernel}]")
        row = Row(str(r["source"]), label, float(r["published_step_s"]), dtype=str(r["dtype"]),
                  not_modelled=missing, error=error)
        mem = r.get("published_peak_mem_gib")
        row.published_memory_gib = None if pd.isna(mem) else float(mem)
        if not error:
            try:
                p = predict(TransformerSpec(**model), hardware, plan, refuse_idle=False)
            except PerfmodelError as exc:
                row.error = str(exc)
            else:
                _fill(row, p)
        rows.append(row)
    return rows


def _tight(r: Row) -> str:
    """A memory cell's mark: over only with the allocator's fragmentation margin."""
    return " (tight)" if r.memory_verdict == "tight" else ""


def _fill(row: Row, p: Any) -> None:
    row.predicted_s = p.step_time_s
    row.breakdown = dict(p.breakdown_s)
    row.memory_gib = p.memory_per_gpu_bytes / 2**30
    row.capacity_gib = p.memory_capacity_bytes / 2**30
    row.memory_verdict = p.memory_verdict


def table5_rows() -> list[Row]:
    from perfmodel import Plan, predict

    rows = []
    for name, tp, pp, batch, micro, schedule, v, full, selective in TABLE5:
        # Megatron-LM in 2022 ran the attention unfused (two GEMMs around its fused
        # scale-mask-softmax kernel)
        base = dict(gpus=tp * pp, tp=tp, pp=pp, global_batch=batch, micro_batch=micro,
                    schedule=schedule, virtual_stages=v, flash_attention=False)
        # and it split its pipeline sends over tp where sequence parallelism does not
        # (scatter_gather_tensors_in_pipeline, on by default then: Plan.pp_scatter_gather)
        full_plan = dict(recompute="full", pp_scatter_gather=pp > 1)
        for extra, seconds, what in ((full_plan, full, "full recompute"),
                                     (dict(recompute="selective", sequence_parallel=True),
                                      selective, "SP + selective")):
            row = Row("korthikanti", f"{name} tp{tp} pp{pp} B{batch} {what}", seconds)
            _fill(row, predict(name, "dgx-a100-80gb", Plan(**base, **extra), refuse_idle=False))
            rows.append(row)
    return rows


# Each shared nccl-tests log, by file-name prefix: the preset of its GPU it is compared with, and
# why the preset is not held to it (tests/unit/test_collective_presets.py holds the others: median
# |error| <= 15% over sizes from 1 MiB). Every log is printed either way. See SOURCES.md.
NCCL_LOGS: dict[str, tuple[str, str]] = {
    "h100x8-": ("dgx-h100", ""),  # one HGX H100 node: NVLink4 + NVSwitch, as the preset's
    "h100x80-10node-": ("dgx-h100", "fabric unknown: the 10-node cluster's network is not "
                        "documented (the preset's: DGX H100, 8 x 400 Gb/s NDR InfiniBand)"),
    "h100x16-2node-a3mega-": ("dgx-h100", "another fabric: GCP A3 Mega, GPUDirect-TCPXO over "
                              "8 x 200 Gb/s Ethernet (the preset's: 8 x 400 Gb/s InfiniBand)"),
    "a100x16-2node-roce-": ("dgx-a100-80gb", "another fabric, untuned: OCI RoCE whose source "
                            "reports 72 GB/s busbw untuned, 172 GB/s tuned (the preset's: DGX "
                            "A100, 8 x 200 Gb/s HDR InfiniBand)"),
}
NCCL_MIN_BYTES = 2**20  # the sizes a log is held to: from 1 MiB (below: launch-bound)


def nccl_preset(name: str) -> tuple[str | None, str]:
    """(preset, why not held) of an nccl-tests log, by its file name: NCCL_LOGS's entry, else the
    preset of the GPU the name starts with (`<gpu>x<ranks>-...`), not held (its fabric is not
    documented here); (None, why) where the name names no GPU with a preset."""
    for prefix, entry in NCCL_LOGS.items():
        if name.startswith(prefix):
            return entry
    gpu = re.match(r"([a-z0-9]+?)x\d+-", name.lower())
    preset = next((v for k, v in HARDWARE.items() if gpu and k.lower() == gpu.group(1)), None)
    if preset is None:
        return None, (f"no preset for this log's GPU (its name should start <gpu>x<ranks>-, "
                      f"gpu one of {', '.join(HARDWARE)})")
    return preset, "not in NCCL_LOGS: its fabric is not documented here"


def nccl_predicted_s(run: Any, nbytes: float, hw: Any) -> float:
    """The time nccl-tests would print for one size of a run, as the preset predicts it.

    The collective's device time (`perfmodel collective`), in the algorithm the log forced (a
    `-ring-` log ran with NCCL_ALGO=RING: SOURCES.md), and no less than the host's launches: with
    -g G (one thread drives G GPUs) every iteration launches G kernels from one thread, so a small
    collective takes G x kernel_overhead_s (nccl-tests times back-to-back iterations: the device
    hides behind the host, or the host behind the device).
    """
    from perfmodel.collective import predict_collective

    per_node = run.ranks // max(run.nodes, 1)
    algorithm = "ring" if "-ring-" in run.path.name else "auto"
    device = predict_collective(str(run.op), nbytes, run.ranks, hw, per_node,
                                algorithm)["time_s"]
    host = run.gpus_per_thread * hw.kernel_overhead_s if run.gpus_per_thread > 1 else 0.0
    return max(device, host)


def nccl_rows(directory: Path) -> list[dict[str, Any]]:
    """Per shared nccl-tests log: its preset, whether the preset is held to it (and why not), and
    the median and worst relative error of the predicted time over its sizes (all, and from
    1 MiB)."""
    from calibration.nccl_tests import parse_nccl_tests
    from perfmodel.specs.hardware import load_hardware

    out = []
    for path in sorted(directory.glob("*.txt")):
        preset, excluded = nccl_preset(path.name)
        if preset is None:
            out.append({"log": path.name, "op": "", "ranks": 0, "preset": "", "held": False,
                        "why_not_held": excluded, "median_all": math.nan,
                        "median_1mib_up": math.nan, "median_abs_1mib_up": math.nan,
                        "worst": math.nan})
            continue
        hw = load_hardware(preset)
        for run in parse_nccl_tests(path):
            errors, big = [], []
            for rec in run.records.itertuples():
                if rec.nbytes == 0:  # a count of 0 per rank (all_gather of 8 B on 8 ranks): NCCL
                    continue  # returns without a kernel; `perfmodel collective` takes > 0 bytes
                err = (nccl_predicted_s(run, float(rec.nbytes), hw) - rec.time_s) / rec.time_s
                errors.append(err)
                if rec.nbytes >= NCCL_MIN_BYTES:
                    big.append(err)
            out.append({"log": path.name, "op": str(run.op), "ranks": run.ranks,
                        "preset": preset, "held": not excluded, "why_not_held": excluded,
                        "median_all": statistics.median(errors),
                        "median_1mib_up": statistics.median(big) if big else math.nan,
                        "median_abs_1mib_up": (statistics.median(abs(e) for e in big)
                                               if big else math.nan),
                        "worst": max(errors, key=abs)})
    return out


def shares(row: Row) -> str:
    """The breakdown in a few groups, as shares of the predicted step."""
    if not row.breakdown or not row.predicted_s:
        return ""
    groups = {"compute": ("compute/",), "comm": ("comm/", "pipeline/p2p"),
              "bubble": ("pipeline/bubble",), "overhead": ("overhead/",),
              "optimizer": ("optimizer/",)}
    parts = []
    for name, prefixes in groups.items():
        total = sum(v for k, v in row.breakdown.items() if k.startswith(prefixes))
        if total > 0:
            parts.append(f"{name} {total / row.predicted_s:.0%}")
    return ", ".join(parts)


def mape(rows: list[Row]) -> float:
    errors = [abs(r.signed_error) for r in rows if r.signed_error is not None]
    return sum(errors) / len(errors) if errors else math.nan


def _sets(rows: list[Row]) -> dict[str, list[Row]]:
    """The rows by set: source and dtype."""
    keys: dict[str, list[Row]] = {}
    for r in rows:
        keys.setdefault(f"{r.source} {r.dtype}", []).append(r)
    return keys


def summary(rows: list[Row]) -> list[tuple[str, int, int, float, float]]:
    """(set, rows predicted, rows refused, MAPE, worst |error|) per source and dtype."""
    out = []
    for key, group in _sets(rows).items():
        done = [r for r in group if r.signed_error is not None]
        worst = max((abs(r.signed_error) for r in done), default=math.nan)  # type: ignore[arg-type]
        out.append((key, len(done), len(group) - len(done), mape(group), worst))
    return out


def has_unread(row: Row) -> bool:
    """Whether a row names a feature or a column the benchmark did not read (_unread, a column
    outside the schema): its plan took the defaults in their place."""
    return any(n.endswith(("not mapped)", "(not read)")) for n in row.not_modelled)


def caveats(rows: list[Row]) -> dict[str, str]:
    """Per set (as summary's), what its MAPE counts beside the runs read whole: the predicted
    rows with features not read (named in their rows) and those predicted not to fit where they
    ran (named in the memory line), with the MAPE over the others; '' for a set of none. The
    MAPE keeps them all."""
    out = {}
    for key, group in _sets(rows).items():
        done = [r for r in group if r.signed_error is not None]
        unread = [r for r in done if has_unread(r)]
        unfit = [r for r in done if r.memory_verdict == "does not fit"]
        parts = ([f"{len(unread)} with features not read"] if unread else []) + (
            [f"{len(unfit)} predicted not to fit where {'it' if len(unfit) == 1 else 'they'} "
             "ran"] if unfit else [])
        rest = [r for r in done if not has_unread(r) and r.memory_verdict != "does not fit"]
        others = f"; MAPE of the other {len(rest)}: {_pct(mape(rest))}" if rest else ""
        out[key] = f"{', '.join(parts)}{others}" if parts else ""
    return out


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


GENERATED_PAGE = Path("docs/accuracy-runs.md")  # written by --markdown, checked by tests/docs


def markdown(rows: list[Row], nccl: list[dict[str, Any]]) -> str:
    """The benchmark's tables as the markdown page docs/accuracy-runs.md (no date, no timing:
    the same model and data give the same page, which tests/docs/test_accuracy_page.py checks)."""
    lines = ["# Accuracy on published runs (generated)", "",
             "Written by `python benchmarks/bench_accuracy.py --markdown docs/accuracy-runs.md`; "
             "do not edit. Published against predicted step time per run (error: predicted / "
             "published - 1), MAPE per source, and each GPU preset against the shared "
             "nccl-tests logs. docs/accuracy.md explains the errors.", "",
             "| set | run | published [s] | predicted [s] | error | breakdown | memory [GiB] | "
             "not modelled |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = f"{r.predicted_s:.3f}" if r.predicted_s is not None else f"refused: {r.error}"
        err = f"{r.signed_error:+.1%}" if r.signed_error is not None else ""
        mem = (f"{r.memory_gib:.1f} of {r.capacity_gib:.0f}{_tight(r)}"
               if r.memory_gib is not None else "")
        lines.append(f"| {r.source} | {r.label} | {r.published_s:.3f} | {pred} | {err} | "
                     f"{shares(r)} | {mem} | {'; '.join(r.not_modelled)} |")
    lines += ["", "| set | predicted | refused | MAPE | worst |", "|---|---|---|---|---|"]
    notes = caveats(rows)
    for key, n, refused, m, worst in summary(rows):
        counted = f"{n} ({notes[key]})" if notes[key] else f"{n}"
        lines.append(f"| {key} | {counted} | {refused} | {_pct(m)} | {_pct(worst)} |")
    lines += ["", "| published peak memory per GPU | measured by | published [GiB] | "
              "predicted [GiB] | error |", "|---|---|---|---|---|"]
    for case, predicted in memory_rows():
        lines.append(f"| {case.label} | {case.measured_by} | "
                     f"{case.published_bytes / 2**30:.1f} | {predicted / 2**30:.1f} | "
                     f"{predicted / case.published_bytes - 1:+.1%} |")
    lines += ["", "| nccl-tests log | op | ranks | preset | median error (all sizes) | "
              "median (>= 1 MiB) | median abs (>= 1 MiB) | worst | held (15%) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for n in nccl:
        held = "yes" if n["held"] else f"no: {n['why_not_held']}"
        lines.append(f"| {n['log']} | {n['op']} | {n['ranks']} | {n['preset']} | "
                     f"{n['median_all']:+.1%} | {n['median_1mib_up']:+.1%} | "
                     f"{n['median_abs_1mib_up']:.1%} | {n['worst']:+.1%} | {held} |")
    return "\n".join(lines) + "\n"


def print_report(rows: list[Row], nccl: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    table = Table(title="published runs: predicted against published step time")
    for col in ("set", "run", "published s", "predicted s", "error", "breakdown", "memory GiB",
                "not modelled"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.source, r.label, f"{r.published_s:.3f}",
                      f"{r.predicted_s:.3f}" if r.predicted_s is not None else "refused",
                      f"{r.signed_error:+.1%}" if r.signed_error is not None else r.error[:60],
                      shares(r),
                      f"{r.memory_gib:.1f}/{r.capacity_gib:.0f}{_tight(r)}" if r.memory_gib
                      else "",
                      "; ".join(r.not_modelled))
    con.print(table)
    notes = caveats(rows)
    for key, n, refused, m, worst in summary(rows):
        # the rows whose plans took defaults for what they state, or that would not fit where
        # they ran, are counted in the MAPE and named here
        counted = f" ({notes[key]})" if notes[key] else ""
        con.print(f"{key}: {n} predicted{counted}, {refused} refused, MAPE {_pct(m)}, worst "
                  f"{_pct(worst)}")
    unfit = [r for r in rows if r.memory_verdict == "does not fit"]
    tight = [r for r in rows if r.memory_verdict == "tight"]
    con.print(f"memory: {len(unfit)} of {sum(r.memory_gib is not None for r in rows)} runs that "
              f"ran are predicted not to fit" + (": " + "; ".join(r.label for r in unfit)
                                                 if unfit else "")
              + (f"; {len(tight)} tight (over only with the allocator's fragmentation margin): "
                 + "; ".join(r.label for r in tight) if tight else ""))
    pub = [r for r in rows if r.published_memory_gib and r.memory_gib]
    for r in pub:
        con.print(f"  peak memory {r.label}: published {r.published_memory_gib:.1f} GiB, "
                  f"predicted {r.memory_gib:.1f} GiB")
    for case, predicted in memory_rows():
        con.print(f"  published peak memory, {case.label} ({case.measured_by}): "
                  f"{case.published_bytes / 2**30:.1f} GiB, predicted {predicted / 2**30:.1f} "
                  f"GiB ({predicted / case.published_bytes - 1:+.1%})")
    nt = Table(title="nccl-tests logs against the presets (predicted time / measured - 1)")
    for col in ("log", "op", "ranks", "preset", "median (all)", "median (>= 1 MiB)",
                "median |e| (>= 1 MiB)", "worst", "held"):
        nt.add_column(col)
    for n in nccl:
        nt.add_row(n["log"], n["op"], str(n["ranks"]), n["preset"], f"{n['median_all']:+.1%}",
                   f"{n['median_1mib_up']:+.1%}", f"{n['median_abs_1mib_up']:.1%}",
                   f"{n['worst']:+.1%}", "yes" if n["held"] else "no")
    con.print(nt)
    for n in nccl:
        if not n["held"]:
            con.print(f"  not held: {n['log']}: {n['why_not_held']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="directory of published-steps.csv")
    parser.add_argument("--nccl-tests", default=None, help="directory of nccl-tests logs")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    parser.add_argument("--csv", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    rows = published_rows(data_dir(args.data)) + table5_rows()
    logs = Path(args.nccl_tests) if args.nccl_tests else (
        SHARED / "nccl-tests" if (SHARED / "nccl-tests").is_dir()
        else ROOT / "tests" / "data" / "nccl-tests")
    nccl = nccl_rows(logs)
    print_report(rows, nccl)
    from perfmodel.files import write_atomic

    if args.markdown:
        write_atomic(args.markdown, markdown(rows, nccl), what="accuracy tables")
    if args.csv:
        import pandas as pd

        frame = pd.DataFrame([{"source": r.source, "run": r.label, "dtype": r.dtype,
                               "published_s": r.published_s, "predicted_s": r.predicted_s,
                               "error": r.signed_error, "breakdown": shares(r),
                               "memory_gib": r.memory_gib, "capacity_gib": r.capacity_gib,
                               "not_modelled": "; ".join(r.not_modelled), "refused": r.error}
                              for r in rows])
        write_atomic(args.csv, frame.to_csv(index=False), what="accuracy CSV")
    return 0


if __name__ == "__main__":
    sys.exit(main())
