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
  only near the tokenizer's; a shape that could be a windowed model's too: SLIDING_WINDOW_SHAPES)
  with the row's own columns over either (`bias`, `norm`, `position_embedding`, `dropout`,
  `fused_qkv`), a
  GPU its preset (HARDWARE; A100, H100 and V100 names read by their words, the others' with
  their vendors', nodes' and parts' words: OTHER_PARTS; and a hardware note's part, memory and
  network: hardware_of, network_stated), features in Megatron's,
  DeepSpeed's, PyTorch's and Composer's words too (GENERIC_FEATURES and generic_feature's
  patterns: recompute, FSDP, TP overlap, flash-attention versions, SDPA, FP8 recipes, degrees
  and gradient accumulation checked against the columns, precision, biases and dropout;
  matched whatever their case, hyphens, underscores, spaces or a trailing 'optimization'; a
  feature's parenthetical read with it, and the row refused where it is not (it may narrow the
  feature); commas inside parentheses do not split features); features that disagree with each
  other or with the row's columns refuse the row, and so do features of runs the model does not
  have (HSDP, torchao's float8, offloading to the host) and a feature naming ZeRO or FSDP that
  is not read; the file's headers are read whatever their case and spaces, its dtype in
  PyTorch's and Lightning's words too ('bfloat16', 'bf16-mixed') and an FP8 dtype with its
  recipe ('FP8-CS', 'MXFP8': DTYPE_RECIPES), its boolean columns in yes/no or 1/0, an empty pp
  or cp as 1 and an empty kv_heads as the heads; an empty published_step_s as published_value
  in its published_unit where that is seconds, milliseconds, tokens or samples a second (all
  GPUs', or per GPU: step_from_value), and where both are stated they must agree within 2%
  (published_step); a degree or count that is not a whole number of at
  least 1, or a published time that is not a positive number, refuses its row; optional
  columns give a mixture of experts (`model`: a preset, named in any case, whose sizes and MoE
  columns must agree with the row's; or `experts`, `top_k`, `moe_ffn_hidden`, `shared_experts`,
  `mtp_layers`) and `ep`, `etp`, `vp` (VP_COLUMNS: the features' VP=n); a column or feature
  it does not read is named in the row's `not modelled`, and so are the defaults its plan takes
  where the row states nothing ('assumed: ...') and a network other than its preset's; each
  source's summary line counts its rows with features not read and those predicted not to fit
  (all in its MAPE, and the MAPE of the others beside it); a row it cannot know is refused in
  its row with the reason (published_row: no row stops the benchmark), and the others are
  still predicted. A source is compared whatever its case ('TorchTitan'); one naming DeepSpeed
  with pp > 1 runs DeepSpeed's pipeline engine.
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

from perfmodel.configs.megatron import TORCH_DDP_BUCKET_MIB
from perfmodel.configs.nemo import NEMO2_BUCKET_PARAMS
from perfmodel.configs.nemo1 import APEX_BUCKET_MIB, apex_bucket_params
from perfmodel.costs.precision import megatron_master_weights
from perfmodel.strategy import RECOMPUTE_MODULES

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
# The preset each GPU of the CSV's `gpu` column is predicted on (the DGX/HGX node of that GPU, as
# the rows' hardware notes state); a GPU without one is refused in its row, never taken for another
HARDWARE = {"H100": "dgx-h100", "A100": "dgx-a100-80gb", "H200": "hgx-h200", "B200": "dgx-b200",
            "GB200": "gb200-nvl72", "V100": "dgx-v100", "MI300X": "mi300x", "MI325X": "mi325x",
            "MI355X": "mi355x"}


# the words a GPU's name may add to HARDWARE's key and still name its preset's part: its form
# factor, memory type and memory (B200: 180 GB usable of the 192 GB its datasheet names; GB200
# the same part, 186 GB)
OTHER_PARTS = {"H200": ("SXM5", "SXM", "HBM3E", "141GB"),
               "GB200": ("NVL72", "HBM3E", "186GB", "192GB"),
               "B200": ("SXM6", "SXM", "HBM3E", "180GB", "192GB"),
               "MI300X": ("OAM", "HBM3", "192GB"), "MI325X": ("OAM", "HBM3E", "256GB"),
               "MI355X": ("OAM", "HBM3E", "288GB")}


def hardware_of(row: dict[str, Any]) -> str:
    """The preset of a row's GPU: HARDWARE by its `gpu` column, an A100's, H100's or V100's name
    read by its words (_a100, _h100, _v100: 'A100-SXM4-40GB', 'A100-80G', 'H100 SXM5 80GB',
    'HGX H100', 'H100 (SXM5)', nvidia-smi's 'NVIDIA H100 80GB HBM3'), where the `hardware_note`
    tells an A100 40GB or an H100 PCIe card apart from the SXM parts (_form_factor); a part no
    preset has (an A100 PCIe card, an H100 of other memory and clocks, a V100 16GB) is refused,
    and so is a note whose memory is not its preset's. ValueError names an unknown GPU."""
    gpu = _text(row, "gpu")
    if not gpu:
        raise ValueError(f"gpu: empty (known: {', '.join(HARDWARE)})")
    note = _text(row, "hardware_note").upper().replace(" ", "")
    key = re.sub(r"[\s\-_()\[\]]", "", gpu.upper()).removeprefix("NVIDIA").removeprefix("TESLA")
    # 'HGX H100', 'DGX A100', 'DGX-1 V100': the node names the SXM part of its GPU
    node = re.match(r"(?:HGX|DGX1?)(?=[AHV]100)", key)
    key = key[node.end():] if node else key
    # 'A100-80G': the memory's G without its B
    key = re.sub(r"(?<=\d)G(?=$|[A-Z])(?!B|IB)", "GB", key)
    if key.startswith("A100"):
        return _a100(row, gpu, key, note, bool(node))
    if key.startswith("H100"):
        return _h100(row, gpu, key, note, bool(node))
    if key.startswith("V100"):
        return _v100(row, gpu, key, note)
    # the other GPUs' names in their vendors' and nodes' words ('AMD Instinct MI300X', 'HGX
    # B200', 'DGX-GB200') and with their part's own words (OTHER_PARTS: 'H200 SXM 141GB', 'GB200
    # NVL72'); another part of the name (the H200 NVL card, a PCIe card) has no preset
    key = re.sub(r"^(?:AMD)?(?:INSTINCT)?(?:HGX|DGX)?", "", key)
    key = next((part for part, words in OTHER_PARTS.items() if key.startswith(part)
                and re.fullmatch(f"(?:{'|'.join(words)})*", key[len(part):])), key)
    preset = {k.upper(): v for k, v in HARDWARE.items()}.get(key)
    if preset is None:
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    return preset


# A memory size as a row states it: GB or GiB, with or without a space, whole or not ('80GB',
# '95 GiB', 'a100_40gb'); never Gb, a rate's bits, nor a bandwidth ('40 Gb/s', '900 GB/s',
# '50 GBps'), nor a host's memory or disks ('2048 GB DDR5', '30 TB NVMe' is not GB)
_MEMORY = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?) ?(?:GB|gb|GiB|GIB|gib)(?![A-Za-z]|\s*/)"
                     r"(?!\s*(?i:of\s+)?(?i:host|system|cpu|ram|ddr|dram|nvme|ssd|disk|storage)"
                     r"(?![A-Za-z]))")


_HOST = re.compile(r"(?i:host|system|cpu|ram|ddr\d?|dram|nvme|ssd|disk|storage)\b[^,;]*$")


def _memory_sizes(row: dict[str, Any]) -> set[float]:
    """The memory sizes (GB or GiB, as the number stated) a row's gpu column and hardware note
    state; not a host's ('host memory 2048 GB': its words before the size, in its clause)."""
    text = f"{_text(row, 'gpu')} {_text(row, 'hardware_note')}"
    return {float(found.group(1)) for found in _MEMORY.finditer(text)
            if not _HOST.search(text[max(found.start() - 30, 0):found.start()])}


def _size(gb: float) -> str:
    return f"{gb:g} GB"


def _form_factor(note: str, card_named: bool, sxm_named: bool, part: str) -> str:
    """'pcie' or 'sxm': the part a gpu column and its upper-case hardware note (spaces removed)
    name. The PCIe card where the column or the note names it as a card ('H100 PCIe', 'PCIe
    card', 'H100 80GB PCIe'), the SXM part where either names it (SXM, HBM3, a DGX or HGX node,
    NVSwitch, NVLink other than a PCIe card's bridge: _sxm); a note's PCIe that names neither
    (its host's or NICs' links: 'ConnectX-7 on PCIe Gen5') does not make the card. Both, or PCIe
    in a note that names neither part, could be either: ValueError; '' where nothing is said."""
    flat = note.replace("-", "").replace("_", "")
    card = card_named or re.search(r"(?:[AH]100|V100)(?:\d+GB)?PCIE|PCIE(?:CARD|FORMFACTOR"
                                   r"|ADDINCARD|GPU|VERSION)", flat) is not None
    sxm = sxm_named or _sxm(flat)
    if card and sxm:
        raise ValueError(f"names both the PCIe card and the {part} part (state one)")
    if card:
        return "pcie"
    if sxm:
        return "sxm"
    if "PCIE" in flat:
        raise ValueError("the hardware note names PCIe but neither the PCIe card ('PCIe card', "
                         "'H100 PCIe') nor the SXM part (SXM, DGX, HGX, NVLink, NVSwitch): "
                         "state which")
    return ""


def _h100(row: dict[str, Any], gpu: str, key: str, note: str, node: bool) -> str:
    """The preset of an H100 as hardware_of reads it: the DGX H100's SXM5 part (80 GB HBM3,
    700 W: dgx-h100) or the PCIe card (80 GB HBM2e, 350 W: h100-pcie); a part of other memory
    and clocks (the 94 GB NVL card, Grand Teton's 96 GB HBM2e at 500 W; any memory stated but
    80 GB, or a DGX H100's 640) is refused, and so is a name of other words."""
    words = re.findall(r"SXM5|SXM|\d+GB|\d+GIB|HBM3|HBM2E|PCIE|NVL", key.removeprefix("H100"))
    if "".join(words) != key.removeprefix("H100"):
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    given = f" with hardware note '{row.get('hardware_note')}'" if note else ""
    # the memory either states: 80 GB (a DGX H100's 640 GB is its eight), else another part.
    # 141 GB is an H200's (its own preset); 94 GB the NVL card; Meta's Grand Teton runs 96 GB
    # HBM2e parts at 500 W, as torchtitan's H100 benchmarks state: another memory, bandwidth
    # and sustained clock, which no preset has and no shared measurement gives (a spec file
    # with base: dgx-h100 can state them)
    other_memory = sorted(_memory_sizes(row) - {80.0, 640.0})
    if 141.0 in other_memory:
        raise ValueError(f"gpu '{gpu}'{given}: 141 GB is the H200's memory, not an H100's (gpu "
                         "H200: hgx-h200)")
    if other_memory:
        raise ValueError(f"gpu '{gpu}'{given}: {', '.join(map(_size, other_memory))} stated: not "
                         "the DGX H100 (SXM5 80 GB HBM3, 700 W) nor the PCIe card, and no "
                         "preset has its memory, bandwidth and sustained clock")
    # HBM2e in the name without PCIe is one of them (the PCIe card's name says PCIe)
    other = next((w for w in words if w == "NVL" or (w == "HBM2E" and "PCIE" not in words)),
                 None)
    sxm = bool({"SXM", "SXM5", "HBM3"} & set(words)) or node
    try:
        form = _form_factor(note, "PCIE" in words, sxm, "SXM5")
    except ValueError as exc:
        raise ValueError(f"gpu '{gpu}'{given}: {exc}") from None
    if not other and form == "pcie":
        return "h100-pcie"
    # (and the H800, the export part whose NVLink runs 400 GB/s, named in a note beside 'H100')
    other = other or next((s for s in ("HBM2E", "500W", "GRANDTETON", "H100NVL", "H800")
                           if s in note), None)
    if other:
        raise ValueError(f"gpu '{gpu}'{given}: not the DGX H100 (SXM5 80 GB HBM3, 700 W) nor "
                         "the PCIe card, and no preset has its memory, bandwidth and sustained "
                         "clock")
    return "dgx-h100"


def _a100(row: dict[str, Any], gpu: str, key: str, note: str, node: bool) -> str:
    """The preset of an A100 as hardware_of reads it: the DGX A100's SXM4 part, 80 GB
    (dgx-a100-80gb) or 40 GB (dgx-a100-40gb); the PCIe card is refused (A100 datasheet: 250-300 W,
    PCIe Gen4 between cards, NVLink bridges joining pairs at most, no NVSwitch; no preset has
    it), and so is a name of other words (A100X, the converged card)."""
    rest = key.removeprefix("A100")
    words = re.findall(r"SXM4|SXM|80GB|40GB|80GIB|40GIB|PCIE", rest)
    if "".join(words) != rest:
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    given = f" with hardware note '{row.get('hardware_note')}'" if note else ""
    # the card's form factor: PCIe in its name, or a note that names the card (a DGX's note may
    # name its PCIe switches and NICs: _form_factor)
    try:
        form = _form_factor(note, "PCIE" in words, bool({"SXM", "SXM4"} & set(words)) or node,
                            "SXM4")
    except ValueError as exc:
        raise ValueError(f"gpu '{gpu}'{given}: {exc}") from None
    if form == "pcie":
        raise ValueError(f"gpu '{gpu}'{given}: the A100 PCIe card (250-300 W, PCIe between "
                         "cards, NVLink bridges join pairs at most), not the DGX A100's SXM4 "
                         "part; no preset has it (a spec file with base: dgx-a100-80gb can state "
                         "it)")
    # the memory, each stated size a whole number ('640GB' is not '40GB'): a GPU's 40 or 80 GB,
    # or a DGX A100's eight (DGX A100 datasheet: 320 GB = 8 x 40 GB, 640 GB = 8 x 80 GB)
    memory = _a100_memory(row)
    if len(memory) > 1:
        raise ValueError(f"gpu '{gpu}' with hardware note '{row.get('hardware_note')}': the gpu "
                         f"column and the note disagree on its memory ({', '.join(sorted(memory))} "
                         "per GPU)")
    return "dgx-a100-40gb" if memory == {"40GB"} else "dgx-a100-80gb"


def _a100_memory(row: dict[str, Any]) -> set[str]:
    """The memory per GPU an A100's row states, '40GB' or '80GB' (a DGX A100's 320 GB or 640 GB
    its eight); other sizes are not an A100's (a host's memory)."""
    per_gpu = {40.0: "40GB", 80.0: "80GB", 320.0: "40GB", 640.0: "80GB"}
    return {per_gpu[size] for size in _memory_sizes(row) if size in per_gpu}


def _v100(row: dict[str, Any], gpu: str, key: str, note: str) -> str:
    """The preset of a V100 as hardware_of reads it: the DGX-1's SXM2 part, 32 GB (dgx-v100);
    the 16 GB part (a DGX-1 of 2017: 128 GB for eight) and the PCIe card have no preset and are
    refused."""
    rest = key.removeprefix("V100")
    words = re.findall(r"SXM2|SXM|\d+GB|PCIE", rest)
    if "".join(words) != rest:
        raise ValueError(f"gpu '{gpu}' has no preset (known: {', '.join(HARDWARE)})")
    given = f" with hardware note '{row.get('hardware_note')}'" if note else ""
    if other := sorted(_memory_sizes(row) - {32.0, 256.0}):
        raise ValueError(f"gpu '{gpu}'{given}: {', '.join(map(_size, other))} stated: dgx-v100 "
                         "is the DGX-1's V100 SXM2 32 GB, and no preset has another V100")
    try:
        form = _form_factor(note, "PCIE" in words, "SXM" in rest, "SXM2")
    except ValueError as exc:
        raise ValueError(f"gpu '{gpu}'{given}: {exc}") from None
    if form == "pcie":
        raise ValueError(f"gpu '{gpu}'{given}: the V100 PCIe card, not the DGX-1's SXM2 part; no "
                         "preset has it")
    return "dgx-v100"


def _sxm(note: str) -> bool:
    """Whether an upper-case hardware note names the SXM part: a DGX or HGX node, NVSwitch, SXM
    itself, HBM3, or NVLink other than the bridge that joins two PCIe cards (a DGX's note may name
    the PCIe links of its NICs and switches; 'not a DGX' does not count)."""
    note = re.sub(r"NOT ?A ?DGX|NON-?DGX", "", note)
    return re.search(r"DGX|HGX|NVSWITCH|SXM|HBM3|NVLINK(?![\s\-\d.]*BRIDGE)", note) is not None


# Words of a hardware note that name a node or network other than the presets' DGX/HGX nodes
# and InfiniBand (the presets' files say theirs): the row is predicted on its preset's, and says so.
# A cloud instance named by its type is its provider's network, whether or not the note names it
# (the providers' instance pages): AWS p4d/p4de (EFA, 4 x 100 Gb/s) and p5/p5e/p5en (EFA,
# 3200 Gb/s); Google Cloud a3-highgpu/a3-megagpu (GPUDirect-TCPX/TCPXO), a3-ultragpu (RoCE,
# ConnectX-7) and a2-highgpu/a2-ultragpu/a2-megagpu (Ethernet, 100 Gb/s)
OTHER_FABRICS = {"Omni-Path": r"OMNI[- ]?PATH|\bOPA\b",
                 "RoCE": r"\bROCE|\bA3-ULTRAGPU",
                 "Ethernet": r"ETHERNET|\bA2-(?:HIGH|ULTRA|MEGA)GPU",
                 "GPUDirect-TCPX": r"TCPX|\bA3-(?:HIGH|MEGA|EDGE)GPU",
                 "EFA": r"\bEFA\b|\bP4DE?\b|\bP5(?:E|EN)?\.\d*XLARGE\b",
                 "Slingshot": r"SLINGSHOT", "Spectrum-X": r"\bSPECTRUM",
                 "not a DGX": r"NOT A DGX|NON-DGX"}
# The presets' networks between nodes, as their files state them (inter_node): NICs per node,
# each one's rate in Gb/s, and its InfiniBand generation ('' where their files name none)
NETWORKS: dict[str, tuple[int, int, str]] = {
    **dict.fromkeys(("dgx-h100", "h100-pcie", "hgx-h200", "dgx-b200"), (8, 400, "NDR")),
    **dict.fromkeys(("dgx-a100-80gb", "dgx-a100-40gb"), (8, 200, "HDR")),
    "dgx-v100": (4, 100, "EDR"), "gb200-nvl72": (72, 400, "NDR"),
    **dict.fromkeys(("mi300x", "mi325x", "mi355x"), (8, 400, ""))}
# InfiniBand's generations by their rate per port in Gb/s (HDR100 and NDR200: split ports)
IB_RATES = {"EDR": 100, "HDR": 200, "NDR": 400, "XDR": 800}
# A network rate in bits as a note writes it, with the NICs it counts where stated ('8 x 400
# Gb/s', '8x400 Gbit/s', '1600 Gbps', '3.2 Tbps', '400G InfiniBand'); bytes ('50 GB/s') are a
# link's of any kind (NVLink's, PCIe's) and not read
_RATE = re.compile(r"(?<![\w.\-])(?:(\d+) ?[x×*] ?)?(\d+(?:\.\d+)?) ?(?:([Tt]b(?:/s|ps|its?/s))"
                   r"|[Gg]b(?:/s|ps|its?/s|E\b)|G(?= ?(?:IB|InfiniBand|Ethernet|E\b|RoCE|NICs?|NDR"
                   r"|HDR|EDR|XDR|network|links?|ports?)\b|$|[;,)]))")


def network_stated(note: str, preset: str) -> list[str]:
    """The network a hardware note states between nodes that its preset's is not (NETWORKS): a
    rate in bits per NIC or per node other than the preset's (with the NICs it counts: their
    total against the preset's per node), an InfiniBand generation of another rate."""
    if preset not in NETWORKS:
        return []
    nics, rate, _ = NETWORKS[preset]
    out = []
    for count, number, tera in _RATE.findall(note):
        gbps = float(number) * (1000 if tera else 1)
        per_node = int(count) * gbps if count else None
        if (per_node is not None and per_node != nics * rate) or (
                per_node is None and gbps not in (rate, nics * rate)):
            unit = "Tb/s" if tera else "Gb/s"
            out.append(f"{count} x {number} {unit}" if count else f"{number} {unit}")
    for generation, split in re.findall(r"\b(EDR|HDR|NDR|XDR)(100|200)?\b", note.upper()):
        if (int(split) if split else IB_RATES[generation]) != rate:
            out.append(f"{generation}{split} InfiniBand")
    return out


def hardware_notes(row: dict[str, Any], preset: str) -> list[str]:
    """The row's not-modelled notes of its hardware: a node or network its hardware_note names
    that is not its preset's (OTHER_FABRICS), listed with the preset's inter-node bandwidth, or
    else a network rate or InfiniBand generation other than its preset's (network_stated)."""
    note = _text(row, "hardware_note")
    found = [name for name, pattern in OTHER_FABRICS.items() if re.search(pattern, note.upper())]
    # a fabric named is another network whatever its rate; else the rate may say so
    stated = [] if found else network_stated(note, preset)
    if not found and not stated:
        return part_assumed(row, preset)
    from perfmodel import load_hardware

    per_node = load_hardware(preset).inter_node.bandwidth_bytes_per_s
    if found:
        return [f"hardware note names {', '.join(found)}: predicted on {preset}'s node and "
                f"network ({per_node / 1e9:.0f} GB/s per node between nodes; a spec file with "
                f"base: {preset} can state this one)"] + part_assumed(row, preset)
    nics, rate, generation = NETWORKS[preset]
    return [f"hardware note states a network of {', '.join(stated)}: predicted on {preset}'s "
            f"({nics} x {rate} Gb/s{' ' + generation if generation else ''}, "
            f"{per_node / 1e9:.0f} GB/s per node between nodes; a spec file with base: {preset} "
            "can state this one)"] + part_assumed(row, preset)


def part_assumed(row: dict[str, Any], preset: str) -> list[str]:
    """The 'assumed:' notes of an A100 or H100 whose row does not say which part it is: the SXM
    part where neither the gpu column nor the note names it (SXM, HBM3, a DGX or HGX node,
    NVSwitch or NVLink: the PCIe cards' bridges join pairs at most: _sxm), and an A100's 80 GB
    where neither states its memory (hardware_of takes both; the other parts have presets of
    their own, or none)."""
    stated = (str(row.get("gpu", "")) + " " + _text(row, "hardware_note")).upper()
    out = []
    if preset in ("dgx-h100", "dgx-a100-80gb", "dgx-a100-40gb") and not _sxm(stated):
        gpu, card = ("H100", "h100-pcie") if preset == "dgx-h100" else ("A100", "no preset")
        out.append(f"{gpu} part not stated: the SXM part ({preset}; the PCIe card: {card})")
    if preset.startswith("dgx-a100") and not _a100_memory(row):
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
# Shapes of models that attend over a sliding window, which the tables above cannot tell from
# one that does not: (hidden, layers, ffn_hidden, kv_heads, base vocabulary) -> (model, window).
# Mistral 7B v0.1 (Jiang et al. 2023, arXiv 2310.06825, Table 1: window 4096) has the shape of
# v0.2 (mistralai/Mistral-7B-Instruct-v0.2 config.json: sliding_window null), which has none:
# a row that does not say is read without one, named as assumed (architecture_assumed)
SLIDING_WINDOW_SHAPES = {(4096, 32, 14336, 8, 32000): ("Mistral 7B v0.1", 4096)}
# architecture fields a row may state in columns of its own (they win over the tables), and its
# dropout rates (`dropout`: both)
ARCH_COLUMNS = ("gated_mlp", "tied_embeddings", "bias", "norm", "position_embedding")
# how the model's code builds its attention, where a row states it (TransformerSpec.fused_qkv:
# MPT's Wqkv; without the column q, k and v are projected apart, as Llama's and torchtitan's
# code does); it matters to the element-wise ops a layer run op by op adds (kernels eager)
STRUCTURE_COLUMNS = ("fused_qkv",)
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
                 "head_dim": "head_dim", "sliding_window": "sliding_window"}
PLAN_COLUMNS = ("ep", "etp")
# the experts' dispatcher, as a column: its value in Megatron-Core's, torchtitan's or AutoModel's
# words (perfmodel.strategy.EPDispatcher)
DISPATCHER_COLUMNS = ("dispatcher", "ep_dispatcher")
# every pipeline stage's layers, in Megatron's --pipeline-model-parallel-layout syntax
# (Plan.pipeline_layout): a split the stages' even share cannot give (126 layers over 64)
LAYOUT_COLUMNS = ("pipeline_layout",)
# the virtual stages per pipeline rank, as a column (the features' VP=n: _virtual_stages)
VP_COLUMNS = ("vp", "vpp", "virtual_stages")
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


def _empty(value: Any) -> bool:
    """Whether a cell is empty: absent, NaN (pandas' empty cell) or blank text."""
    return value is None or (isinstance(value, float) and value != value) or (
        isinstance(value, str) and not value.strip())


def _scalar(value: Any) -> Any:
    """A cell's value as Python's: a numpy scalar (a pandas cell) as its int, float or bool."""
    return value.item() if hasattr(value, "item") else value


def _text(row: dict[str, Any], key: str) -> str:
    """A row's text in a column, without surrounding spaces; '' where absent or empty (never
    'nan')."""
    value = row.get(key)
    return "" if _empty(value) else str(value).strip()


def _source(row: dict[str, Any]) -> str:
    """A row's source as the benchmark compares it: lower case, without surrounding spaces
    ('TorchTitan ' is torchtitan's)."""
    return _text(row, "source").lower()


def _integer(row: dict[str, Any], key: str, default: int | None = None, minimum: int = 1) -> int:
    """A row's whole number in a column ('2.0' is 2), at least `minimum`; `default` where the
    cell is empty. ValueError naming the column for an empty cell without a default, a fraction
    (1.5 is never truncated), a word, or too small a number (a degree or a count of 0)."""
    value = _scalar(row.get(key))
    if _empty(value):
        if default is None:
            raise ValueError(f"{key}: empty (a whole number)")
        return default
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} '{value}': not a whole number") from None
    if isinstance(value, bool) or not math.isfinite(number) or number != int(number):
        raise ValueError(f"{key} {value}: not a whole number")
    if number < minimum:
        raise ValueError(f"{key} {int(number)}: at least {minimum}")
    return int(number)


# A boolean column's words, any case (bool('no') is True: never read as Python would)
FLAGS = {**dict.fromkeys(("true", "yes", "y", "1", "1.0", "t"), True),
         **dict.fromkeys(("false", "no", "n", "0", "0.0", "f"), False)}


def _flag(row: dict[str, Any], key: str) -> bool | None:
    """A row's boolean column: true/false, yes/no, y/n or 1/0 in any case; None where empty.
    ValueError naming the column for any other value."""
    value = _scalar(row.get(key))
    if _empty(value):
        return None
    found = FLAGS.get(str(value).strip().lower())
    if found is None:
        raise ValueError(f"{key} '{value}': true or false (yes/no, 1/0)")
    return found


def _positive(row: dict[str, Any], key: str, unit: str) -> float | None:
    """A row's positive finite number in a column (published_step_s, published_peak_mem_gib);
    None where empty. ValueError naming the column for any other value ('1.5 s', 'N/A', 0, a
    negative number, NaN as text)."""
    value = _scalar(row.get(key))
    if _empty(value):
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise ValueError(f"{key} '{value}': a positive number of {unit}")
    return number


# The precisions of the dtype column in the words other files write them ('BF16', 'bfloat16')
# ... and Lightning's / NeMo 2's precision plugin names: 'bf16-mixed' (NeMo 2's
# MegatronMixedPrecision default for its Megatron models: bf16 compute, fp32 main weights, as the
# plan's bf16), '16-mixed' (fp16 with a loss scale); not 'bf16-true' (bf16 weights without fp32
# master weights: another run)
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
               "float": "fp32", "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
               "bf16-mixed": "bf16", "16-mixed": "fp16", "fp16-mixed": "fp16"}
DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
# ... and an FP8 dtype column that names its Transformer Engine recipe, as Megatron-Bridge's
# performance tables write their precision column (FP8-CS: current scaling, Megatron-LM's
# --fp8-recipe tensorwise; FP8-DS: delayed; FP8-MX and MXFP8: the block-scaled MXFP8): fp8 with
# that recipe (Plan.fp8_recipe), which a feature naming another refuses. Blockwise (FP8-SS,
# DeepSeek's 128-block scaling) and NVFP4 are other recipes, not the model's: refused as a dtype
DTYPE_RECIPES = {**dict.fromkeys(("fp8-cs", "fp8 cs", "fp8_cs", "fp8cs", "fp8 (current scaling)",
                                  "fp8 current scaling", "fp8-tensorwise", "fp8 tensorwise"),
                                 "current"),
                 **dict.fromkeys(("fp8-ds", "fp8 ds", "fp8_ds", "fp8ds", "fp8 (delayed scaling)",
                                  "fp8 delayed scaling", "fp8-delayed"), "delayed"),
                 **dict.fromkeys(("fp8-mx", "fp8 mx", "fp8_mx", "mxfp8", "fp8 (mxfp8)",
                                  "fp8-mxfp8"), "mxfp8")}


def dtype_of(row: dict[str, Any]) -> str:
    """A row's dtype column as the plan names it (DTYPES): any case, surrounding spaces, and
    bfloat16, float16, float32 read. ValueError naming the column for another."""
    text = _text(row, "dtype").lower()
    dtype = "fp8" if text in DTYPE_RECIPES else DTYPE_NAMES.get(text, text)
    if dtype not in DTYPES:
        given = f" '{_text(row, 'dtype')}'" if text else ": empty"
        raise ValueError(f"dtype{given} (one of {', '.join(DTYPES)}; fp8 with its recipe: "
                         "FP8-CS, FP8-DS, FP8-MX or MXFP8)")
    return dtype


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
    hidden, vocab, tp = _integer(row, "hidden"), _integer(row, "vocab"), _integer(row, "tp", 1)
    layers = _integer(row, "layers")
    stated = arch_columns(row)
    dropout = _dropout_columns(row)
    # an entry's vocabulary as its rows give it, or padded up (to a multiple of 128 x tp), of
    # the entry's depth
    known = next((arch for (width, base), arch in ARCHITECTURES.items()
                  if width == hidden and base <= vocab < base + 128 * max(tp, 1)), None)
    if known is not None and layers == ARCHITECTURE_LAYERS.get(known["name"], layers):
        arch = dict(known)
        for key in ("tied_embeddings", "gated_mlp"):  # where the row states it, it must agree
            if key in stated and stated[key] != arch[key]:
                raise ValueError(f"{arch['name']}: the row says {key}={stated[key]}, its source "
                                 f"{arch[key]}")
        # the row's own columns over the entry's (its biases, norm, positions, dropout: a run
        # may train the shape otherwise)
        return dict(arch, **stated, **dropout), ""
    name = str(_stated(row, "model") or f"{layers}x{hidden}-v{vocab}")
    if all(k in stated for k in ARCH_COLUMNS):
        return dict(stated, **dropout, name=name), ""
    matches = [(base, arch, source) for base, arch, source in VOCABULARIES
               if base <= vocab < base + 1024 * max(tp, 1)
               and all(stated[k] == arch[k] for k in ("gated_mlp", "tied_embeddings")
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
                  and all(stated[k] == v for k, v in says.items() if k in stated)]
        if not others:
            return arch, ""
        return arch, (f"vocab {vocab}, {tokenizer}'s {base} padded and {' and '.join(others)}'s "
                      "too: its")
    return arch, f"vocab {vocab}, near {tokenizer}'s {base} but not its padding: its"


# a norm as a column may write it
NORM_NAMES = {"rms norm": "rmsnorm", "rms_norm": "rmsnorm", "rmsnorm": "rmsnorm",
              "layer norm": "layernorm", "layer_norm": "layernorm", "layernorm": "layernorm"}


def arch_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The architecture fields a row's own columns state (ARCH_COLUMNS, STRUCTURE_COLUMNS):
    gated_mlp, tied_embeddings, bias and fused_qkv as booleans in any of their words (_flag),
    the norm and the positions as TransformerSpec names them ('RMSNorm', 'RoPE':
    POSITION_FEATURES)."""
    out: dict[str, Any] = {}
    for key in ("gated_mlp", "tied_embeddings", "bias", *STRUCTURE_COLUMNS):
        if (flag := _flag(row, key)) is not None:
            out[key] = flag
    if norm := _text(row, "norm"):
        out["norm"] = NORM_NAMES.get(norm.lower(), norm.lower())
    if position := _text(row, "position_embedding"):
        found = _lookup(POSITION_FEATURES, POSITION_LOOSE, position)
        out["position_embedding"] = found if found is not None else position.lower()
    return out


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
            try:
                rate = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{column} '{value}': a rate from 0 to 1") from None
            out.update(dict.fromkeys(fields, rate))
    return out


def architecture_assumed(row: dict[str, Any], origin: dict[str, str]) -> list[str]:
    """The 'assumed:' note of what a row's architecture takes that neither its columns nor its
    features (`origin`: the model fields features set) state: the fields of the tokenizer entry
    its vocabulary is near but not a padding of (VOCABULARIES; MPT's 50368 reads as GPT-2's,
    with biases and dropout 0.1), and the dropout TransformerSpec defaults to (0.1) where
    nothing gives one. None for a model preset (the `model` column), an ARCHITECTURES entry, or
    a tokenizer's own vocabulary, whose sources state them."""
    if preset_of(row) is not None:
        return []
    arch, tokenizer = _architecture(row)
    stated = set(arch_columns(row)) | set(_dropout_columns(row)) | set(origin) | {
        field_name for column, field_name in MODEL_COLUMNS.items()
        if _stated(row, column) is not None}
    out = []
    # the sizes a row leaves empty: multi-head attention, and the MLP TransformerSpec derives
    # (model_of refuses a gated one, whose width has no rule)
    if _empty(row.get("kv_heads")):
        out.append("kv_heads not stated: heads (multi-head attention)")
    if _empty(row.get("ffn_hidden")):
        out.append("ffn_hidden not stated: 4 x hidden (TransformerSpec's default for an MLP "
                   "not gated)")
    window = next((found for (hidden, layers, ffn, kv, vocab), found
                   in SLIDING_WINDOW_SHAPES.items()
                   if (hidden, layers, ffn, kv) == (_integer(row, "hidden"),
                                                    _integer(row, "layers"),
                                                    _integer(row, "ffn_hidden", 0, 0),
                                                    _integer(row, "kv_heads", 0, 0))
                   and _pads(vocab, _integer(row, "vocab"))), None)
    if window and "sliding_window" not in stated and _integer(row, "seq_len") > window[1]:
        out.append(f"sliding window not stated: none, every layer attends over the whole "
                   f"sequence (the shape of {window[0]}, which attends over {window[1]} tokens; "
                   f"'sliding window {window[1]}' or a sliding_window column states it)")
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

def apex_buckets(mib: float, grad_sync_dtype: str) -> dict[str, Any]:
    """Apex's DistributedFusedAdam (NeMo 1's distributed_fused_adam) buckets: bucket_cap_mb MiB
    of its gradient-sync dtype, running through every parameter, as NeMo 1's reader takes them
    (perfmodel.configs.nemo1.apex_bucket_params)."""
    size = {"bf16": 2, "fp16": 2, "fp32": 4}[grad_sync_dtype]
    return {"dp_bucket_size": apex_bucket_params(mib, size), "dp_bucketing": "all"}


def torch_ddp_buckets(dtype: str) -> dict[str, Any]:
    """PyTorch DDP's buckets: bucket_cap_mb 25 MiB of the gradients it reduces (the model's own,
    16-bit under fp16 or bf16 training), over every parameter (its first bucket, 1 MiB, counted
    as one of the others; perfmodel.configs.megatron reads --DDP-impl torch so)."""
    size = 4 if dtype == "fp32" else 2
    return {"dp_bucket_size": TORCH_DDP_BUCKET_MIB * 2**20 // size, "dp_bucketing": "all"}


# What the published dgxc runs' configs state beyond the CSV's features, by release and model (the
# release is in the row's source_ref: "...: v24.11.1 nemotron/README_340b.md"), from
# github NVIDIA/dgxc-benchmarking at those releases and the NeMo they ran:
STACK_OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    # v24.11.1 nemotron/nemotron4-340b-synth.yaml, optim distributed_fused_adam: dtype bf16,
    # grad_sync_dtype bf16 (NeMo then stores no fp32 master weights: megatron_base_model.py);
    # v24.11.1 nemotron/configure.sh: 340b exports NVTE_FUSED_ATTN=0, so Transformer Engine
    # runs FlashAttention-2 (the flash-attn package), not cuDNN's kernel: the preset's fa2
    ("v24.11.1", "nemotron4-340b"): dict(grad_dtype="bf16", optimizer_dtype="bf16",
                                         attention_kernel="fa2",
                                         **apex_buckets(50, "bf16")),
    # v24.11.1 nemotron/nemotron4-15b-synth.yaml and nemo_megatron/gpt3_175b_hydra.yaml (v25.04:
    # nemo_megatron/cfg/gpt3_175b_hydra.yaml), optim distributed_fused_adam: grad_sync_dtype
    # bf16 (Apex's gradient buffer and its reduce-scatter in bf16), their optimizer states fp32
    # Their optimizer buckets: bucket_cap_mb 100 (15b), 50 (340b), 220 (gpt3_175b_hydra.yaml,
    # both releases), MiB of the gradient-sync dtype, over every parameter (apex_buckets)
    ("v24.11.1", "nemotron4-15b"): dict(grad_dtype="bf16", **apex_buckets(100, "bf16")),
    ("v24.11.1", "gpt3-175b-nemo"): dict(grad_dtype="bf16", **apex_buckets(220, "bf16")),
    ("v25.04", "gpt3-175b-nemo"): dict(grad_dtype="bf16", **apex_buckets(220, "bf16")),
    # v25.04 (NeMo 25.02) scripts/performance: pretrain_recipe(performance_mode=True), whose
    # pretrain_performance_optimizations set trainer.plugins.grad_reduce_in_fp32 = False; NeMo 2's
    # NemotronConfig sets cross_entropy_loss_fusion True (nemo/collections/llm/gpt/model/
    # nemotron.py at v2.2.0; the recipes set it False for fine-tuning only): Megatron-Core's
    # native fusion, where the NeMo 1 runs (v24.11.1, and GPT-3 175B's hydra config at v25.04,
    # which NeMo 1's build_transformer_config reads: no such key) leave Megatron-Core's default,
    # the unfused loss
    # ... and whose MegatronCommOverlapCallback (the performance recipes add it) sets
    # Megatron-Core's DDP bucket_size to 128 x 1024 x 1024 parameters wherever dp > 1
    # (nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py at v2.2.0,
    # _get_optimizer_overlap_cfgs)
    # (Megatron-Core's DDP, not Apex's optimizer, whatever the table's feature names)
    ("v25.04", "nemotron4-15b"): dict(grad_dtype="bf16", cross_entropy="native",
                                      dp_bucket_size=NEMO2_BUCKET_PARAMS, dp_bucketing="megatron"),
    ("v25.04", "nemotron4-340b"): dict(grad_dtype="bf16", cross_entropy="native",
                                       dp_bucket_size=NEMO2_BUCKET_PARAMS, dp_bucketing="megatron"),
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
    Split on the semicolons, commas and line breaks outside parentheses and brackets: 'full
    activation recompute (uniform, 1 layer per checkpoint)' is one feature; so is '1,024-way data
    parallelism' (a comma between a digit and three more is a thousands separator: feature_key
    reads the number whole). A feature in quotes is its words."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == "," and i and _THOUSANDS.match(text, i - 1):
            continue
        elif char in ",;\n" and depth == 0:  # (a line break between features too)
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    # a feature in quotes ('"ZeRO-1"') is its words
    unquoted = (re.sub(r"""^(['"`])(.*)\1$""", r"\2", t.strip()).strip() for t in pieces)
    return [t for t in unquoted if t]


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
    **dict.fromkeys(("sequence parallel", "sequence parallelism", "sequence-parallel",
                     "megatron sequence parallel", "megatron sequence parallelism",
                     "megatron sp"), {"sequence_parallel": True}),
    **dict.fromkeys(("no recompute", "recompute none", "no activation checkpointing"),
                    {"recompute": "none"}),
    # Megatron's --recompute-granularity selective (the attention core); its older flag
    # --recompute-activations is the same (megatron/training/arguments.py: it sets
    # recompute_granularity 'selective')
    **dict.fromkeys(("selective recompute", "recompute selective",
                     "selective activation recompute", "recompute-activations",
                     "recompute activations"), {"recompute": "selective"}),
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
    # (Megatron-DeepSpeed's --use-flash-attn: flash-attn's kernel, its version not said)
    **dict.fromkeys(("flash attention", "flashattention", "fused attention", "flash-attn",
                     "flash attn", "use-flash-attn"), {"flash_attention": True}),
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
    # (microsoft's Megatron-DeepSpeed --use-flash-attn-v2: the flash-attn 2 package)
    **dict.fromkeys(("flashattention-2", "flash-attn 2", "fa2", "flash-attn v2",
                     "flashattention v2", "flash attention v2", "fa v2", "use-flash-attn-v2"),
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
    **dict.fromkeys(("distributed optimizer", "use-distributed-optimizer"), {"zero": 1}),
    # (Apex's optimizer buckets every parameter, bucket_cap_mb MiB of its gradient-sync dtype:
    # read_row takes Apex's default, 100, where the row states none)
    **dict.fromkeys(("distributed_fused_adam", "distributed fused adam"),
                    {"zero": 1, "dp_bucketing": "all"}),
    **dict.fromkeys(("overlap grad reduce", "overlap-grad-reduce", "overlap grad sync",
                     "overlap_grad_sync", "overlap_grad_reduce"),
                    {"overlap_grad_sync": True}),
    **dict.fromkeys(("overlap_param_sync", "overlap param sync", "overlap_param_gather"),
                    {"overlap_param_gather": True}),
    # NeMo 1's names of Megatron's options (megatron_gpt_config.yaml)
    "sequence_parallel": {"sequence_parallel": True},
    "ub_tp_comm_overlap": {"tp_comm_overlap": True},
    # (NeMo's fp8_hybrid, the HYBRID format of Transformer Engine's DelayedScaling: E4M3 in the
    # forward, E5M2 in the backward)
    **dict.fromkeys(("fp8_hybrid", "fp8 hybrid", "fp8 delayed", "te fp8 hybrid"),
                    {"fp8_recipe": "delayed"}),
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
    **dict.fromkeys(("torch.compile", "compiled", "compile", "torch compile", "torch_compile"),
                    {"stack": "compiled"}),
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
    # context parallelism's exchange (Plan.cp_comm) in Megatron-Core's words (--cp-comm-type p2p,
    # all_gather, a2a; Transformer Engine's context-parallel attention) and its papers': ring
    # attention is p2p, DeepSpeed-Ulysses the all-to-alls (a2a). Its hierarchical a2a+p2p is not
    # the plan's: named as not mapped. With cp 1, predict refuses cp_comm, saying so
    **dict.fromkeys(("cp comm type p2p", "cp-comm-type p2p", "cp_comm_type p2p", "ring attention"),
                    {"cp_comm": "p2p"}),
    **dict.fromkeys(("cp comm type all_gather", "cp-comm-type all_gather",
                     "cp_comm_type all_gather", "cp comm type allgather",
                     "all-gather context parallelism", "allgather context parallelism"),
                    {"cp_comm": "allgather"}),
    **dict.fromkeys(("cp comm type a2a", "cp-comm-type a2a", "cp_comm_type a2a",
                     "a2a context parallelism"), {"cp_comm": "a2a"}),
    **dict.fromkeys(("ulysses", "deepspeed ulysses", "deepspeed-ulysses",
                     "ulysses context parallelism"), {"cp_comm": "a2a", "_ulysses": True}),
    # the experts' dispatcher (Plan.ep_dispatcher; Megatron-Core's --moe-token-dispatcher-type,
    # flex with DeepEP or HybridEP) and its combined 1F1B overlap
    **dict.fromkeys(("deepep", "hybridep", "hybrid-ep", "flex dispatcher", "flex token dispatcher",
                     "moe-token-dispatcher-type flex", "moe-enable-deepep", "deepep dispatcher"),
                    {"ep_dispatcher": "deepep"}),
    **dict.fromkeys(("alltoall dispatcher", "all-to-all dispatcher", "alltoall token dispatcher",
                     "moe-token-dispatcher-type alltoall"), {"ep_dispatcher": "alltoall"}),
    **dict.fromkeys(("ep comm overlap", "moe a2a overlap", "a2a overlap", "ep a2a overlap",
                     "ep all-to-all overlap", "moe all-to-all overlap",
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
# the options of a feature that restates the row's columns (plan_of checks them against them)
COLUMN_CHECKS = {"_dtype", "_tp", "_pp", "_dp", "_cp", "_ep", "_etp", "_grad_accumulation"}
# FSDP's NO_SHARD (generic_feature)
NO_SHARD = {"zero": 0, "overlap_grad_sync": True}
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
    # ZeRO-Offload and ZeRO-Infinity, FSDP's CPUOffload: the optimizer step (or the weights)
    # on the host, which perfmodel.configs.megatron_deepspeed refuses too
    r"\b(?:zero|fsdp\d?|deepspeed|optimi[sz]er|param(?:eter)?s?)\b.*\boffload"
    r"|\boffload\w*\b.*\b(?:zero|fsdp\d?|optimi[sz]er|param(?:eter)?s?)\b|\bzero infinity\b":
        "offloading to the host (ZeRO-Offload, FSDP's CPU offload) is not modelled",
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
    # ... and the experts' ('EP 8, ETP 1', 'EP8', 'expert parallel 8', '8-way expert
    # parallelism', 'expert tensor parallel size 1': Megatron-Bridge's tables' EP and ETP
    # columns, Megatron-LM's --expert-model-parallel-size / --expert-tensor-parallel-size in
    # words), checked against the ep and etp columns (empty: 1) as the others are: unread, an
    # EP the columns do not carry would price every expert on every rank
    if degree := (re.fullmatch(r"(ep|etp) ?[=:]? ?(\d+)", loose)
                  or re.fullmatch(r"expert (tensor |model )?parallel(?:ism)?(?: size| degree)?"
                                  r" ?[=:]? ?(\d+)", loose)):
        axis = degree.group(1) or ""
        return {"_etp" if axis.startswith(("etp", "tensor")) else "_ep": int(degree.group(2))}
    if way := re.fullmatch(r"(\d+) way expert (tensor )?parallel(?:ism)?", loose):
        return {"_etp" if way.group(2) else "_ep": int(way.group(1))}
    # the micro-batches a step accumulates: the row's global_batch / (dp x micro_batch), which
    # plan_of checks it against
    if steps := (re.fullmatch(r"(?:grad(?:ient)? accum(?:ulation)?(?: steps)?|accumulation steps"
                              r"|ga|gas) ?[=:]? ?(\d+)", loose)
                 or re.fullmatch(r"(\d+) ?x? (?:grad(?:ient)? )?accumulation(?: steps?)?", loose)):
        return {"_grad_accumulation": int(steps.group(1))}
    levels = "|".join(RECOMPUTE_LEVELS)
    if ac := (re.fullmatch(rf"(full|selective|no) {RECOMPUTE_WORDS}", loose)
              or re.fullmatch(rf"{RECOMPUTE_WORDS}(?: granularity)? ?[:=]? ?({levels})", loose)):
        return {"recompute": RECOMPUTE_LEVELS[ac.group(1)]}
    if re.fullmatch(rf"{FSDP_WORDS}(?: (?:with )?full shard(?:ing)?)?"
                    rf"|full shard(?:ing)? {FSDP_WORDS}", loose):
        return dict(GENERIC_FEATURES["fsdp"])
    # FSDP's ShardingStrategy.NO_SHARD: nothing sharded, the gradients all-reduced during the
    # backward, as DDP does (ZeRO 0)
    if re.fullmatch(rf"{FSDP_WORDS} no shard|no shard {FSDP_WORDS}", loose):
        return dict(NO_SHARD)
    # (a release of either: 'flash-attn v2.5', 'FlashAttention 2.6.3')
    if flash := re.fullmatch(r"(?:flash ?(?:attn|attention)|fa) ?v?([23])(?:\.\d+)*", loose):
        return dict(GENERIC_FEATURES[f"fa{flash.group(1)}"])
    # the distributed optimizer's (or FSDP's) overlaps in words: 'overlapped grad reduce',
    # 'overlapping parameter all-gather'
    overlap = r"overlap(?:ped|ping)?(?: of)?(?: the)? "
    if re.fullmatch(rf"{overlap}(?:grad(?:ient)?s?|dp) (?:reduce(?: scatters?)?|reductions?"
                    r"|sync|all reduces?)", loose):
        return {"overlap_grad_sync": True}
    if re.fullmatch(rf"{overlap}param(?:eter)?s? (?:gathers?|all gathers?|sync)", loose):
        return {"overlap_param_gather": True}
    # the gradient sync's buckets: Apex's (NeMo 1's distributed_fused_adam) bucket_cap_mb, MiB of
    # its gradient-sync dtype, read_row turns into parameters; Megatron-Core's
    # --ddp-bucket-size, parameters
    if cap := re.fullmatch(r"bucket cap mb ?[=:]? ?(\d+(?:\.\d+)?)", loose):
        return {"_bucket_cap_mb": float(cap.group(1))}
    if size := re.fullmatch(r"ddp bucket size ?[=:]? ?(\d+)", loose):
        return {"dp_bucket_size": int(size.group(1))}
    if compound := re.fullmatch(r"(.+?) with (.+)", loose):
        return _with(compound.group(1), compound.group(2))
    # the virtual stages (model chunks) per pipeline rank: VP=3, virtual pipeline 3, 3 virtual
    # stages, Megatron's --virtual-pipeline-model-parallel-size 3 and
    # --num-virtual-stages-per-pipeline-rank 3
    if vp := (re.fullmatch(r"(?:--)?(?:vpp?|virtual[-_ ]pipeline(?:[-_ ]stages)?|virtual[-_ ]stages"
                           r"|virtual[-_ ]pipeline[-_ ]model[-_ ]parallel[-_ ]size"
                           r"|num[-_ ]virtual[-_ ]stages[-_ ]per[-_ ]pipeline[-_ ]rank)"
                           r"\s*[=: ]\s*(\d+)", text)
              or re.fullmatch(r"(\d+) virtual (?:pipeline )?stages?", text)):
        return _virtual_stages(int(vp.group(1)))
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
    # ... and the modules in Megatron-Bridge's tables' and Megatron-LM's words ('recompute
    # moe_act', 'recompute modules moe_act+layernorm', '--recompute-modules mla_up_proj
    # moe_act'): Megatron-Core's names only (RECOMPUTE_MODULES, and 'moe', which the plan
    # refuses saying why)
    names = "|".join((*RECOMPUTE_MODULES, "moe"))
    if modules := re.fullmatch(rf"(?:--)?(?:selective )?recompute(?:[ _-]modules?)?[ =:]*"
                               rf"((?:{names})(?:(?:[ +/&]|, ?)+(?:{names}))*)", text):
        return {"recompute": "selective",
                "recompute_modules": ",".join(re.split(r"(?:[ +/&]|, ?)+", modules.group(1)))}
    # a trailing 'optimization' or 'optimizer' word where what it follows says the same:
    # 'scatter-gather optimization'; an optimizer only of an optimizer's options
    if trailing := re.fullmatch(r"(.+) (optimi[sz]ations?|optimi[sz]er)", loose):
        options = generic_feature(trailing.group(1)) or {}
        if OPTIMIZER_OPTIONS & set(options) or ("ation" in trailing.group(2) and [
                key for key in options if not key.startswith("_")]):
            return options
    return None


def _virtual_stages(n: int) -> dict[str, Any]:
    """The schedule of n virtual stages per pipeline rank: interleaved from 2; one is the plain
    1F1B (NeMo's tables write VP=1 for their runs without interleaving)."""
    if n < 1:
        return {"_refuse": f"{n} virtual stages: at least 1"}
    if n == 1:
        return {"schedule": "1f1b"}
    return {"schedule": "interleaved", "virtual_stages": n}


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


def preset_of(row: dict[str, Any]) -> str | None:
    """The perfmodel preset a row's `model` column names, whatever its case and surrounding
    spaces ('Qwen3-30B-A3B' is qwen3-30b-a3b); None where it names none."""
    name = _stated(row, "model")
    if name is None:
        return None
    from perfmodel.specs.presets import MODELS_DIR, preset_names

    return {n.lower(): n for n in preset_names(MODELS_DIR)}.get(str(name).strip().lower())


def model_of(row: dict[str, Any]) -> dict[str, Any]:
    """The TransformerSpec fields of a row's model: the preset its `model` column names (its sizes
    checked against the row's), else the row's sizes on its architecture (architecture_of) with
    the experts its optional columns give. ValueError where they disagree."""
    sizes = {k: _integer(row, k) for k in ("layers", "hidden", "heads", "vocab")}
    # kv_heads and ffn_hidden may be left empty: multi-head attention, and the MLP's 4 x hidden
    # where it is not gated (a gated one is refused below); a preset's own where it names one
    sizes.update({k: _integer(row, k) for k in ("kv_heads", "ffn_hidden")
                  if not _empty(row.get(k))})
    name = preset_of(row)
    if name is not None:
        from perfmodel import load_model

        spec = load_model(name).to_dict()
        spec.pop("kind", None)
        # the vocabulary may be padded (Megatron: a multiple of 128 x tp)
        wrong = [f"{k} {v} (preset {spec[k]})" for k, v in sizes.items()
                 if v != spec[k] and not (k == "vocab" and 0 <= v - spec[k] < 1024 * 8)]
        # ... and so must the experts and heads its optional columns state (the preset's
        # would otherwise be predicted for them, silently); an MLA head is its q/k's or v's
        for column, field_name in MODEL_COLUMNS.items():
            if _empty(row.get(column)):
                continue
            value, preset = _integer(row, column, minimum=0), spec.get(field_name)
            allowed = {preset or 0}
            if field_name == "head_dim" and spec.get("qk_nope_head_dim"):
                allowed |= {spec["qk_nope_head_dim"], spec.get("v_head_dim"),
                            spec["qk_nope_head_dim"] + (spec.get("qk_rope_head_dim") or 0)}
            if value not in allowed:
                wrong.append(f"{column} {value} (preset {preset})")
        if wrong:
            raise ValueError(f"model {name}: the row's {', '.join(wrong)} differ")
        # the run's own choices: its sequence, its dropout where a column states it, and
        # the MTP modules it trains (a recipe may drop the model's)
        spec["seq_len"] = _integer(row, "seq_len")
        spec.update(_dropout_columns(row))
        if not _empty(row.get("mtp_layers")):
            spec["mtp_layers"] = _integer(row, "mtp_layers", minimum=0)
        return spec
    model = dict(architecture_of(row), **sizes, seq_len=_integer(row, "seq_len"))
    model.setdefault("kv_heads", sizes["heads"])
    if "ffn_hidden" not in model and model.get("gated_mlp"):
        raise ValueError("ffn_hidden: empty, and a gated MLP's width has no default (state it)")
    for column, field_name in MODEL_COLUMNS.items():
        if not _empty(row.get(column)):
            model[field_name] = _integer(row, column, minimum=0)
    if not _empty(row.get("mtp_layers")):  # the MTP modules the run trains, as a preset's
        model["mtp_layers"] = _integer(row, "mtp_layers", minimum=0)
    return model


def feature_options(feature: str, model: dict[str, Any],
                    plan: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(plan options, model options) of one feature of a row, in the development set's words
    (below, whatever their case: 'sp', 'Full AC') or another run's (generic_feature,
    POSITION_FEATURES, ROUTING_FEATURES, ARCHITECTURE_FEATURES, a dropout rate); None for a
    feature none of them knows. `plan` is what the row's columns give (its pipeline_layout)."""
    name = feature_key(feature)
    vp = re.fullmatch(r"vp=(\d+)", name)
    window = re.fullmatch(r"(?:sliding window(?: attention)?|swa)(?: (?:window|size|of))? ?[=:]? ?"
                          r"(\d+)(?: tokens)?", " ".join(re.sub(r"[()\[\]]", " ",
                                                                  loose_key(feature)).split()))
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
        return _virtual_stages(int(vp.group(1))), {}
    if window:  # every layer's attention over the window (Mistral 7B v0.1's 4096)
        return {}, {"sliding_window": int(window.group(1))}
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
                                        _DELAYED),
                        # the HYBRID format (E4M3 forward, E5M2 backward), which either recipe
                        # runs: the recipe is what other words say, else named as assumed
                        **dict.fromkeys(("hybrid", "hybrid format", "e4m3 e5m2"), {})},
    ("_cp", ...): dict.fromkeys(("p2p", "ring", "ring attention", "cp comm type p2p"), {}),
    ("flash_attention", ...): {
        **dict.fromkeys(("flash", "flash backend"), {"flash_attention": True}),
        **dict.fromkeys(("cudnn", "cudnn backend"),
                        {"flash_attention": True, "attention_kernel": "cudnn"}),
        **dict.fromkeys(("math", "math backend"), {"flash_attention": False}),
        # flash-attn's kernel in Triton (llm-foundry's attn_impl triton, a copy of
        # flash_attn_triton.py): the preset's measurement of it where it has one, else
        # unmeasured_kernel names what the row is priced with
        **dict.fromkeys(("triton", "triton kernel"),
                        {"flash_attention": True, "attention_kernel": "triton"})},
    ("zero", 3): dict.fromkeys(("optim grads params", "full shard"), {}),
}
# Words in a feature's parenthetical that make it another feature, by the option the feature
# sets: FSDP's NO_SHARD is DDP (nothing sharded, ZeRO 0); DeepSpeed-Ulysses' "sequence
# parallelism" is context parallelism by all-to-alls (Jacobs et al. 2023; its degree the cp
# column's: read_row), not Megatron's sequence parallelism
REPLACING: dict[tuple[str, Any], dict[str, dict[str, Any]]] = {
    ("zero", 3): dict.fromkeys(("no shard", "noshard"), NO_SHARD),
    ("sequence_parallel", True): dict.fromkeys(("ulysses", "deepspeed ulysses", "ds ulysses"),
                                               {"_ulysses": True}),
}
# A parenthetical that reverses its feature ('flash attention (disabled)'): the row is refused,
# naming the feature, rather than the feature applied
NEGATIONS = {"disabled", "disable", "off", "not used", "unused", "none", "no"}


def _qualifier(options: dict[str, Any], piece: str,
               table: dict[tuple[str, Any], Any] = QUALIFIERS) -> dict[str, Any] | None:
    """The plan options a word in a feature's parenthetical gives in that feature's context
    (QUALIFIERS; REPLACING: those that replace the feature's), or None."""
    for (key, value), words in table.items():
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
    # torch.compile beside CUDA graphs: the compiled stack replayed as graphs (Stack.CUDA_GRAPHS
    # is compiled kernels captured in CUDA graphs)
    if key == "stack" and {old, new} == {"compiled", "cuda-graphs"}:
        return "cuda-graphs"
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
    # every degree and count a whole number of at least 1 (a fraction is never truncated, a 0
    # never divided by); an empty pp or cp is 1
    plan: dict[str, Any] = dict(gpus=_integer(row, "gpus"), tp=_integer(row, "tp"),
                                pp=_integer(row, "pp", 1), dp=_integer(row, "dp"),
                                micro_batch=_integer(row, "micro_batch"),
                                global_batch=_integer(row, "global_batch"), dtype=dtype_of(row))
    for key in PLAN_COLUMNS:
        if (value := _integer(row, key, 1)) > 1:
            plan[key] = value
    for key in DISPATCHER_COLUMNS:
        if (value := _stated(row, key)) is not None:
            if str(value).strip().lower() not in DISPATCHERS:
                raise ValueError(f"{key} {value}: one of {', '.join(DISPATCHERS)}")
            plan["ep_dispatcher"] = DISPATCHERS[str(value).strip().lower()]
    known = set(COLUMNS) | set(ARCH_COLUMNS) | set(STRUCTURE_COLUMNS) | set(DROPOUT_COLUMNS) \
        | set(MODEL_COLUMNS) | set(PLAN_COLUMNS) | {
        "model", "mtp_layers", *DISPATCHER_COLUMNS, *LAYOUT_COLUMNS, *VP_COLUMNS}
    missing: list[str] = [f"column {key}={value} (not read)" for key, value in row.items()
                          if key not in known and _stated(row, key) is not None]
    for key in LAYOUT_COLUMNS:
        if (value := _stated(row, key)) is not None:
            plan["pipeline_layout"] = str(value).strip()
    cp = _integer(row, "cp", 1)
    if cp > 1:  # Megatron-Core's default cp_comm_type, p2p (ring attention); gpus = dp cp tp pp
        plan["cp"] = cp
    # the feature that set each option; a column's options are the column's, so that a feature
    # stating another value disagrees with it rather than overriding it
    origin: dict[str, str] = {key: f"{key} column" for key in (*PLAN_COLUMNS, *LAYOUT_COLUMNS)
                              if key in plan}
    if (recipe := DTYPE_RECIPES.get(_text(row, "dtype").lower())) is not None:
        plan["fp8_recipe"] = recipe  # the dtype column's recipe ('FP8-CS'), a column's option
        origin["fp8_recipe"] = f"dtype column '{_text(row, 'dtype')}'"
    for key in DISPATCHER_COLUMNS:
        if _stated(row, key) is not None:
            origin["ep_dispatcher"] = f"{key} column"
    for key in VP_COLUMNS:  # (a feature's VP=n that differs disagrees with it)
        if not _empty(row.get(key)):
            _merge(_virtual_stages(_integer(row, key)), plan, origin, f"{key} column")
    # ... and so are the model's fields its columns state (they win over the architecture's
    # tables; a feature that says otherwise disagrees with the column)
    columns = {**arch_columns(row), **_dropout_columns(row), **{
        field_name: model.get(field_name) for column, field_name in MODEL_COLUMNS.items()
        if not _empty(row.get(column))}}
    origin.update({key: f"{key} column" for key, value in columns.items()
                   if key in model and model[key] == value})
    interleaving: list[str] = []  # the features that state the interleaved schedule outright
    unread_zero: list[str] = []  # features that name ZeRO or FSDP and are not read
    for feature in _features(_text(row, "features")):
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
            # (a feature refused whatever its parenthetical says is refused for itself)
            for piece in parts[1] if "_refuse" not in found[0] else []:
                base = reads[0][1][0]
                if feature_key(piece) in NEGATIONS:
                    raise ValueError(f"feature '{feature}': its parenthetical '{piece}' reverses "
                                     "it (state what the run does instead)")
                # (a replacing word first: 'Ulysses' is a feature of its own too, context
                # parallelism by all-to-alls, but inside 'sequence parallelism (Ulysses)' it
                # replaces Megatron's sequence parallelism rather than joining it)
                if (replaces := _qualifier(base, piece, REPLACING)) is not None:
                    reads[0] = (feature, (replaces, {}))  # 'FSDP (NO_SHARD)' is DDP
                elif (found := feature_options(piece, model, plan)) is not None:
                    reads.append((piece, found))
                elif (qualifies := _qualifier(base, piece)) is not None:
                    reads.append((piece, (qualifies, {})))
                elif _lookup(NOT_MODELLED, NOT_MODELLED_LOOSE, piece) is not None or set(
                        base) <= COLUMN_CHECKS:
                    # (a feature that only restates the row's columns, 'fp16 (static loss
                    # scale 8192)', applies nothing its parenthetical could narrow)
                    missing.append(_unread(piece, feature))
                else:
                    # words that may narrow or reverse the feature ('activation checkpointing
                    # (4 of 32 layers)'): the feature applied in full would misread the run
                    raise ValueError(f"feature '{feature}': its parenthetical '{piece}' is not "
                                     "read (state the feature without it, or in words the "
                                     "benchmark reads)")
        if not reads:
            missing.append(_unread(feature))
            if re.search(r"\bzero\b(?! bubble)|\bfsdp\d?\b|fully sharded|\bshard",
                         loose_key(feature)):
                unread_zero.append(feature)
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
    if unread_zero and "zero" not in plan:
        # the plan would take ZeRO 0 (replicated states) for a run that names its sharding
        raise ValueError(f"feature '{unread_zero[0]}' names ZeRO or FSDP but is not read (its "
                         "stage unknown: state it as 'ZeRO-N', 'FSDP', 'SHARD_GRAD_OP')")
    if plan.pop("_ulysses", None):
        # DeepSpeed-Ulysses: the sequence split over the cp column's ranks, all-to-alled to heads
        # for the attention (perfmodel.configs.megatron_deepspeed: cp_comm a2a)
        if plan.get("cp", 1) == 1:
            raise ValueError(f"feature '{origin['_ulysses']}': DeepSpeed-Ulysses is context "
                             "parallelism by all-to-alls, its degree the cp column's (cp 1 here)")
        plan["cp_comm"] = "a2a"
    if "cp_comm" in plan and plan.get("cp", 1) == 1:
        # an exchange of context parallelism on a row without it: its degree is elsewhere than
        # the cp column (predict, told refuse_idle=False, would price it as no exchange at all)
        raise ValueError(f"feature '{origin['cp_comm']}' names context parallelism's exchange "
                         f"({plan['cp_comm']}), the row's cp column 1")
    if re.search(r"deep[-_ ]?speed", _source(row)) and plan["pp"] > 1 \
            and "_deepspeed_pipeline" not in plan:
        # a Megatron-DeepSpeed run with a pipeline runs GPTModelPipe on DeepSpeed's pipeline
        # engine (perfmodel.configs.megatron_deepspeed: bigscience's always, microsoft's unless
        # --no-pipeline-parallel, which has no pipeline); DeepSpeed pipelines with no other
        _merge(dict(GENERIC_FEATURES["deepspeed pipeline"]), plan, origin,
               f"source {_text(row, 'source')} with pp {plan['pp']}")
    if _source(row) == "torchtitan" and plan["dtype"] == "fp8":
        # torchtitan's FP8 is torchao's float8 training (REFUSED_FEATURES), whatever its words
        raise ValueError("dtype fp8 in a torchtitan run: torchtitan's FP8 is torchao's float8 "
                         "training (its float8 converter), not Transformer Engine's FP8 recipes, "
                         "which the model has")
    if model.get("experts") and "routing_imbalance" not in origin:  # the preset's, unstated
        missing.append("assumed: routing not stated: even (routing_imbalance 1, the model's "
                       "default; a learned router routes unevenly early in a run, its busiest "
                       "expert the slowest rank's)")
    if (per := plan.pop("_layers_per_virtual_stage", None)) is not None:
        # Megatron-LM's --num-layers-per-virtual-pipeline-stage (perfmodel.configs.megatron)
        layers, pp = int(model["layers"]), plan["pp"]
        if per < 1:
            raise ValueError(f"feature '{origin['_layers_per_virtual_stage']}': {per} layers per "
                             "virtual stage: at least 1")
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
    expert_axes = set()  # the experts' degrees a feature states (checked like the columns)
    for axis in ("tp", "pp", "dp", "cp", "ep", "etp"):
        if (stated := plan.pop(f"_{axis}", None)) is not None and stated != plan.get(axis, 1):
            raise ValueError(f"feature '{origin[f'_{axis}']}' says {axis} {stated}, the row's "
                             f"{axis} column {plan.get(axis, 1)}")
        if stated is not None:
            expert_axes.add(axis)
    if model.get("experts"):
        # the experts' degrees where neither a column nor a feature states them: 1, the plan's
        # default, said so. Megatron-Core's expert_tensor_parallel_size, unset, is the attention's
        # tp (ModelParallelConfig.__post_init__; megatron/training/arguments.py: "if
        # args.expert_tensor_parallel_size is None: ... = args.tensor_model_parallel_size"),
        # not 1: with tp > 1 the row's experts may be split over tp ranks the plan keeps whole
        if "ep" not in expert_axes and _empty(row.get("ep")):
            missing.append("assumed: ep not stated: 1 (every expert on every rank of its stage, "
                           "the plan's default and Megatron-Core's)")
        if "etp" not in expert_axes and _empty(row.get("etp")) and plan["tp"] > 1:
            missing.append(f"assumed: etp not stated: 1 (each expert whole on its rank, the "
                           f"plan's default; Megatron-Core's default is the tp, {plan['tp']})")
    if (steps := plan.pop("_grad_accumulation", None)) is not None:
        batch, dp, micro = plan["global_batch"], plan["dp"], plan["micro_batch"]
        if steps * dp * micro != batch:
            raise ValueError(f"feature '{origin['_grad_accumulation']}' says {steps} micro-batches "
                             f"a step, the row's global_batch / (dp x micro_batch) "
                             f"{batch} / ({dp} x {micro}) = {batch / (dp * micro):g}")
    if "torchtitan" in _source(row) and plan.get("recompute") == "selective":
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
    if (ddp_impl := plan.pop("_ddp_impl", None)) == "torch" and plan["pp"] > 1:
        # perfmodel.configs.megatron: Megatron-LM's schedules used no_sync only without a pipeline
        raise ValueError(f"torch DDP with pp {plan['pp']}: Megatron-LM's torch DDP all-reduced "
                         "the gradients in every micro-batch with a pipeline (not modelled)")
    if ddp_impl == "torch":  # PyTorch DDP's buckets: bucket_cap_mb 25 MiB of the gradients
        # (the model's 16-bit gradients: torch's DDP reduces the 16-bit model's own)
        plan.update(torch_ddp_buckets(plan["dtype"]))
    if plan.get("pp_scatter_gather") == "where it applies":
        applies = plan["pp"] > 1 and plan["tp"] > 1 and not plan.get("sequence_parallel")
        plan["pp_scatter_gather"] = applies
        if not applies:
            del plan["pp_scatter_gather"]
    if plan.get("master_weights") == "remainders":  # where Megatron-Core keeps them
        recipe = plan.get("fp8_recipe") if plan["dtype"] == "fp8" else None
        plan["master_weights"] = megatron_master_weights(True, recipe,
                                                         bool(plan.get("fp8_params")))
    if _source(row) == "torchtitan" and plan.get("stack", "eager") == "eager":
        # the A100 runs were eager: train_configs/llama*_*.toml at 015ccb237 set compile = false
        # (and norm_type = "rmsnorm"), so every element-wise op of the layer is its own kernel
        # (perfmodel.strategy.Kernels.EAGER; torchtitan/models/llama/model.py, models/norms.py)
        plan["kernels"] = "eager"
    if _source(row) == "llm-foundry" and plan["dtype"] != "fp8" \
            and plan.get("stack", "eager") == "eager":
        # Composer runs MPT's modules as written (no torch.compile in the benchmark yamls):
        # LayerNorm, GeLU and the residual adds op by op, each linear's bias gradient reduced
        # apart. The FP8 rows' Transformer Engine linears fuse their bias gradients into the
        # GEMMs: they keep the fused kernels' count
        plan["kernels"] = "eager"
    if _source(row) == "dgxc":
        key = (release_of(row), model["name"])
        plan.update(STACK_OPTIONS.get(key, {}))
        if key in NEMO1_REMAINDERS and plan["dtype"] == "bf16":
            plan["master_weights"] = "remainders"
        missing += STACK_NOT_MODELLED.get(key, [])
    if (cap := plan.pop("_bucket_cap_mb", None)) is not None:
        if plan.get("dp_bucketing") != "all":
            raise ValueError(f"feature '{origin['_bucket_cap_mb']}': Apex's buckets "
                             "(distributed_fused_adam), which the row's features do not name")
        plan.update(apex_buckets(cap, plan.get("grad_dtype") or "fp32"))
    if plan.get("dp_bucketing") == "all" and "dp_bucket_size" not in plan \
            and plan.get("overlap_grad_sync"):
        # Apex's default bucket_cap_mb (apex_buckets), in the gradient-sync dtype: NeMo 1's
        # grad_sync_dtype, the main gradients' (fp32 unless stated)
        plan.update(apex_buckets(APEX_BUCKET_MIB, plan.get("grad_dtype") or "fp32"))
        missing.append(f"assumed: optimizer buckets not stated: Apex's default bucket_cap_mb "
                       f"{APEX_BUCKET_MIB:g} MiB ({plan['dp_bucket_size']:,} parameters)")
    return model, plan, missing, origin


# Flash kernels a row may name that no preset of its GPU measures, where pricing the row with
# the preset's default flash kernel, named in its not-modelled column, is kept rather than the row
# refused: flash-attn's Triton kernel has a published benchmark on A100 only (the FlashAttention-2
# figure the A100 presets fit), and llm-foundry ran it on H100 too (204 of its 216 rows). By name:
# what the kernel is, and a preset that measures it, whose spec says what the kernel runs at all
# (its dtypes, and max_head_dim: flash_attn_triton.py asserts fp16/bf16 and d <= 128): a row
# outside that is refused as it is on that preset, not priced with another kernel
UNMEASURED_KERNELS = {"triton": ("flash-attn's flash attention in Triton", "dgx-a100-80gb")}


def unmeasured_kernel(plan: dict[str, Any], origin: dict[str, str], hardware: str,
                      model: dict[str, Any] | None = None) -> list[str]:
    """A kernel of UNMEASURED_KERNELS the row names and its preset does not measure: taken out
    of the plan (the preset's default flash kernel prices the attention) and said so; a dtype or
    head size the kernel does not run (as the preset that measures it states) is refused
    (ValueError), on any GPU, as the kernel's own preset refuses it."""
    from perfmodel import PerfmodelError, TransformerSpec, load_hardware
    from perfmodel.encode import compute_dtype

    name = plan.get("attention_kernel")
    if name not in UNMEASURED_KERNELS:
        return []
    try:
        hw = load_hardware(hardware)
    except PerfmodelError:  # predict refuses the row with its reason
        return []
    if name in hw.flash_attention_names():
        return []
    what, measured_on = UNMEASURED_KERNELS[name]
    feature = origin.get("attention_kernel", name)
    kernel = load_hardware(measured_on).named_flash_kernel(name)
    dtype = compute_dtype(plan.get("dtype", "bf16"))
    if not kernel.runs(dtype):
        raise ValueError(f"feature '{feature}': {what} runs {', '.join(kernel.dtypes)} "
                         f"({measured_on}'s spec of it), not the row's {dtype}")
    head_dim = TransformerSpec(**model).attention_head_dim if model is not None else 0
    if head_dim > kernel.max_head_dim:
        raise ValueError(f"feature '{feature}': {what} runs head sizes up to "
                         f"{kernel.max_head_dim} ({measured_on}'s spec of it), not the row's "
                         f"{head_dim}")
    del plan["attention_kernel"]
    default = hw.flash_kernel(dtype)  # what auto prices the attention with in this dtype
    priced = (f"priced as its default flash kernel, {default.name or default.kernel}"
              if default is not None else
              f"priced as fused attention at its {dtype} GEMM efficiency (no flash kernel of "
              f"{hardware} is measured for {dtype})")
    # (has_unread counts it: the row's plan took a default in its place)
    return [f"feature '{feature}': {what} has no measurement on {hardware}: {priced} (the "
            "kernel not mapped)"]


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


# the columns every row reads (published-steps.csv's schema: SOURCES.md); the others may be
# absent or empty (pp and cp 1, kv_heads the heads, features none, ...)
REQUIRED_COLUMNS = ("source", "gpu", "gpus", "tp", "dp", "micro_batch", "global_batch",
                    "seq_len", "dtype", "layers", "hidden", "heads", "vocab", "published_step_s")


def published_rows(directory: Path) -> list[Row]:
    """The rows of a directory's published-steps.csv, each predicted or refused in its row with
    why: its headers read whatever their case and surrounding spaces, and a column every row
    needs that the file lacks refuses every row, naming it."""
    import pandas as pd

    frame = pd.read_csv(directory / "published-steps.csv", skipinitialspace=True)
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    twice = sorted({c for c in frame.columns if list(frame.columns).count(c) > 1})
    absent = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    problem = (f"the file has no {', '.join(absent)} column{'s' if len(absent) > 1 else ''} "
               "(published-steps.csv's schema: SOURCES.md)" if absent else "") or (
        f"the file names column{'s' if len(twice) > 1 else ''} {', '.join(twice)} twice"
        if twice else "")
    frame = frame.loc[:, ~frame.columns.duplicated()]
    return [published_row(r.to_dict(), problem) for _, r in frame.iterrows()]


# published_unit's words for a step time and a throughput in tokens, where published_step_s is
# empty (lower case, spaces dropped; what follows them, a parenthesis or a comma, is the source's
# own name for it): TFLOP/s is not among them (its FLOPs per step are the source's own count, the
# conversion column's formula). Also the words of the logs a held-out row is transcribed from:
# Megatron-LM's and Megatron-DeepSpeed's 'elapsed time per iteration (ms)' (milliseconds,
# MS_STEP_UNITS), their 'samples per second' (sequences of seq_len each: global_batch / value;
# Megatron-DeepSpeed's 'samples/sec'), 'sec'/'seconds' spelled out and 'per' written as words
STEP_UNITS = ("s", "s/step", "s/it", "s/iter", "seconds", "sec", "sec/step", "sec/it", "sec/iter",
              "s/iteration", "sec/iteration", "seconds/step", "seconds/iteration", "seconds/iter",
              "secondsperstep", "secondsperiteration", "sperstep", "speriteration")
MS_STEP_UNITS = ("ms", "ms/step", "ms/it", "ms/iter", "ms/iteration", "msperstep",
                 "msperiteration", "milliseconds", "milliseconds/step", "milliseconds/iteration",
                 "millisecondsperstep", "millisecondsperiteration")
TOKENS_PER_GPU_UNITS = ("tokens/s/gpu", "tok/s/gpu", "t/s/gpu", "tokens/gpu/s", "tokens/sec/gpu",
                        "tok/sec/gpu", "tokens/gpu/sec", "tokens/spergpu", "tokens/secpergpu",
                        "tokenspersecondpergpu", "tokens/second/gpu")
TOKENS_UNITS = ("tokens/s", "tok/s", "t/s", "tokens/sec", "tok/sec", "tokenspersecond",
                "tokens/second")
SAMPLES_UNITS = ("samples/s", "samples/sec", "samplespersecond", "sequences/s", "sequences/sec",
                 "seq/s", "seqs/s")
SAMPLES_PER_GPU_UNITS = ("samples/s/gpu", "samples/sec/gpu", "samples/spergpu",
                         "samplespersecondpergpu", "sequences/s/gpu", "seq/s/gpu")
# how far published_step_s may lie from what published_value in its unit gives (both stated):
# the rounding of a published figure (3 or 4 significant digits: 0.5% at most); a step time
# transcribed in milliseconds, or a throughput converted over the wrong GPUs, is off by far more
STEP_AGREEMENT = 0.02


def step_from_value(record: dict[str, Any]) -> float:
    """The step time of a row whose published_step_s is empty, from published_value and
    published_unit: seconds as they are, milliseconds / 1000; tokens a second (all GPUs)
    global_batch x seq_len / value; tokens a second per GPU, the same over the GPUs
    (Megatron-Bridge's and torchtitan's tokens/s/GPU alike); samples (sequences) a second
    global_batch / value, per GPU over the GPUs too. ValueError naming the columns otherwise."""
    value = _positive(record, "published_value", "its unit")
    unit = _text(record, "published_unit")
    if value is None or not unit:
        raise ValueError("published_step_s: empty (a positive number of seconds; or "
                         "published_value with published_unit s, ms, tokens/s, tokens/s/GPU or "
                         "samples/s)")
    word = re.split(r"[(,;]", unit, maxsplit=1)[0].lower().replace(" ", "")
    if word in STEP_UNITS:
        return value
    if word in MS_STEP_UNITS:
        return value / 1000
    if word in SAMPLES_UNITS:
        return _integer(record, "global_batch") / value
    if word in SAMPLES_PER_GPU_UNITS:
        return _integer(record, "global_batch") / (value * _integer(record, "gpus"))
    tokens = _integer(record, "global_batch") * _integer(record, "seq_len")
    if word in TOKENS_PER_GPU_UNITS:
        return tokens / (value * _integer(record, "gpus"))
    if word in TOKENS_UNITS:
        return tokens / value
    raise ValueError(f"published_unit '{unit}': with published_step_s empty, s, ms, tokens/s, "
                     "tokens/s/GPU or samples/s (a FLOP rate or an MFU counts the source's own "
                     "FLOPs: give published_step_s, as the conversion column says)")


def published_step(record: dict[str, Any]) -> float:
    """A row's published step time: published_step_s, else step_from_value's. Where both are
    stated and published_unit reads (step_from_value), they must agree (STEP_AGREEMENT): a
    published_step_s written in milliseconds ('elapsed time per iteration (ms)') or converted
    with other GPUs or another batch than the row's would otherwise be compared silently.
    ValueError naming both."""
    step = _positive(record, "published_step_s", "seconds")
    if step is None:
        return step_from_value(record)
    try:
        derived = step_from_value(record)
    except ValueError:  # no published_value, or a unit only the conversion column reads
        return step
    if abs(derived / step - 1) > STEP_AGREEMENT:
        raise ValueError(f"published_step_s {step:g} and published_value "
                         f"{_shown(record.get('published_value'))} "
                         f"{_text(record, 'published_unit')} "
                         f"(a step of {derived:.4g} s with the row's global_batch, seq_len and "
                         "gpus) disagree: correct either")
    return step


def published_row(record: dict[str, Any], problem: str = "") -> Row:
    """One row of published_rows: predicted, or refused with why (`problem`: the file's). Every
    step that reads the row's text is under the refusal: a row never stops the benchmark."""
    from perfmodel import PerfmodelError, TransformerSpec, predict

    published = math.nan
    source = _text(record, "source") or "(no source)"
    try:
        if problem:
            raise ValueError(problem)
        if not _text(record, "source"):
            raise ValueError("source: empty (the run's source names its set)")
        published = published_step(record)
        memory = _positive(record, "published_peak_mem_gib", "GiB")
        model, plan, missing, origin = read_row(record)
        hardware = hardware_of(record)
        missing += (unmeasured_kernel(plan, origin, hardware, model)
                    + hardware_notes(record, hardware) + architecture_assumed(record, origin)
                    + assumed_defaults(model, plan, hardware))
    except Exception as exc:  # a row the benchmark cannot read is reported as refused, with why
        try:
            dtype = dtype_of(record)
        except ValueError:
            dtype = _text(record, "dtype") or "?"
        # labelled by its text as it stands (what was read of it may be what is wrong); an
        # exception other than the readers' refusals is the benchmark's defect, said as one
        why = str(exc) if isinstance(exc, (KeyError, TypeError, ValueError)) \
            else f"{type(exc).__name__}: {exc} (a defect of the benchmark)"
        return Row(source, _label(record, {}, {}), published, error=f"not read: {why}",
                   dtype=dtype)
    row = Row(source, _label(record, model, plan), published, dtype=plan["dtype"],
              not_modelled=missing, published_memory_gib=memory)
    try:
        p = predict(TransformerSpec(**model), hardware, plan, refuse_idle=False)
    except PerfmodelError as exc:
        row.error = str(exc)
    else:
        _fill(row, p)
    return row


def _shown(value: Any) -> str:
    """A cell as a label shows it: a whole float as its integer ('4.0' is 4), '?' where empty."""
    value = _scalar(value)
    if _empty(value):
        return "?"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _label(record: dict[str, Any], model: dict[str, Any], plan: dict[str, Any]) -> str:
    """A row's run as the tables name it: model, GPU, degrees, micro-batch, dtype and features,
    from what was read (the plan's), else the row's text as it stands."""
    def cell(key: str) -> str:
        return str(plan[key]) if key in plan else _shown(record.get(key))

    name = model.get("name") or _text(record, "model") or (
        f"{_shown(record.get('layers'))}x{_shown(record.get('hidden'))}")
    cp = plan.get("cp", 1) if plan else record.get("cp")
    cp_text = f" cp{_shown(cp)}" if _shown(cp) not in ("?", "1") else ""
    # (a flash kernel the row's stack names beyond the features: STACK_OPTIONS)
    kernel = f", {plan['attention_kernel']} kernel" if plan.get("attention_kernel") else ""
    pp = cell("pp") if plan or not _empty(record.get("pp")) else "1"
    return (f"{name} {_shown(record.get('gpu'))} x{cell('gpus')} tp{cell('tp')} pp{pp} "
            f"dp{cell('dp')}{cp_text} mb{cell('micro_batch')} {cell('dtype')} "
            f"[{_text(record, 'features').split('; ', 1)[-1]}{kernel}]")


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
    """The rows by set: source (whatever its case: named as its first row writes it) and
    dtype."""
    keys: dict[str, list[Row]] = {}
    names: dict[str, str] = {}
    for r in rows:
        name = names.setdefault(f"{r.source.lower()} {r.dtype}", f"{r.source} {r.dtype}")
        keys.setdefault(name, []).append(r)
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


def _seconds(x: float) -> str:
    """A published time as printed: '-' where the row was refused before it was read."""
    return "-" if math.isnan(x) else f"{x:.3f}"


GENERATED_PAGE = Path("docs/accuracy-runs.md")  # written by --markdown, checked by tests/docs


def _md(text: Any) -> str:
    """Text as a markdown table's cell: its '|' escaped, its line breaks spaces (a feature may
    hold both: BLOOM's --pp-partition-method 'type:transformer|embedding')."""
    return " ".join(str(text).replace("|", "\\|").splitlines())


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
        lines.append(f"| {_md(r.source)} | {_md(r.label)} | {_seconds(r.published_s)} | "
                     f"{_md(pred)} | {err} | {shares(r)} | {mem} | "
                     f"{_md('; '.join(r.not_modelled))} |")
    lines += ["", "| set | predicted | refused | MAPE | worst |", "|---|---|---|---|---|"]
    notes = caveats(rows)
    for key, n, refused, m, worst in summary(rows):
        counted = f"{n} ({notes[key]})" if notes[key] else f"{n}"
        lines.append(f"| {_md(key)} | {_md(counted)} | {refused} | {_pct(m)} | {_pct(worst)} |")
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
        lines.append(f"| {_md(n['log'])} | {n['op']} | {n['ranks']} | {n['preset']} | "
                     f"{n['median_all']:+.1%} | {n['median_1mib_up']:+.1%} | "
                     f"{n['median_abs_1mib_up']:.1%} | {n['worst']:+.1%} | {_md(held)} |")
    return "\n".join(lines) + "\n"


def print_report(rows: list[Row], nccl: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(width=200)
    table = Table(title="published runs: predicted against published step time")
    for col in ("set", "run", "published s", "predicted s", "error", "breakdown", "memory GiB",
                "not modelled"):
        table.add_column(col)
    for r in rows:
        # the rows' text is other people's: rich's markup ('[/ none]', a label's '[...]')
        # escaped
        table.add_row(escape(r.source), escape(r.label), _seconds(r.published_s),
                      f"{r.predicted_s:.3f}" if r.predicted_s is not None else "refused",
                      f"{r.signed_error:+.1%}" if r.signed_error is not None
                      else escape(r.error[:60]),
                      shares(r),
                      f"{r.memory_gib:.1f}/{r.capacity_gib:.0f}{_tight(r)}" if r.memory_gib
                      else "",
                      escape("; ".join(r.not_modelled)))
    con.print(table)
    notes = caveats(rows)
    for key, n, refused, m, worst in summary(rows):
        # the rows whose plans took defaults for what they state, or that would not fit where
        # they ran, are counted in the MAPE and named here
        counted = f" ({notes[key]})" if notes[key] else ""
        con.print(escape(f"{key}: {n} predicted{counted}, {refused} refused, MAPE {_pct(m)}, "
                         f"worst {_pct(worst)}"))
    unfit = [r for r in rows if r.memory_verdict == "does not fit"]
    tight = [r for r in rows if r.memory_verdict == "tight"]
    ran = sum(r.memory_gib is not None for r in rows)
    con.print(escape(f"memory: {len(unfit)} of {ran} runs that ran are predicted not to fit"
                     + (": " + "; ".join(r.label for r in unfit) if unfit else "")
                     + (f"; {len(tight)} tight (over only with the allocator's fragmentation "
                        "margin): " + "; ".join(r.label for r in tight) if tight else "")))
    pub = [r for r in rows if r.published_memory_gib and r.memory_gib]
    for r in pub:
        con.print(escape(f"  peak memory {r.label}: published {r.published_memory_gib:.1f} GiB, "
                         f"predicted {r.memory_gib:.1f} GiB"))
    for case, predicted in memory_rows():
        con.print(f"  published peak memory, {case.label} ({case.measured_by}): "
                  f"{case.published_bytes / 2**30:.1f} GiB, predicted {predicted / 2**30:.1f} "
                  f"GiB ({predicted / case.published_bytes - 1:+.1%})")
    nt = Table(title="nccl-tests logs against the presets (predicted time / measured - 1)")
    for col in ("log", "op", "ranks", "preset", "median (all)", "median (>= 1 MiB)",
                "median |e| (>= 1 MiB)", "worst", "held"):
        nt.add_column(col)
    for n in nccl:
        nt.add_row(escape(n["log"]), n["op"], str(n["ranks"]), n["preset"],
                   f"{n['median_all']:+.1%}",
                   f"{n['median_1mib_up']:+.1%}", f"{n['median_abs_1mib_up']:.1%}",
                   f"{n['worst']:+.1%}", "yes" if n["held"] else "no")
    con.print(nt)
    for n in nccl:
        if not n["held"]:
            con.print(escape(f"  not held: {n['log']}: {n['why_not_held']}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="directory of published-steps.csv")
    parser.add_argument("--nccl-tests", default=None, help="directory of nccl-tests logs")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    parser.add_argument("--csv", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    directory = data_dir(args.data)
    try:
        published = published_rows(directory)
    except (OSError, ValueError) as exc:  # no file, or none pandas can read as a CSV
        print(f"bench_accuracy: {directory / 'published-steps.csv'}: {exc}", file=sys.stderr)
        return 2
    rows = published + table5_rows()
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
                               "published_s": None if math.isnan(r.published_s) else r.published_s,
                               "predicted_s": r.predicted_s,
                               "error": r.signed_error, "breakdown": shares(r),
                               "memory_gib": r.memory_gib, "capacity_gib": r.capacity_gib,
                               "not_modelled": "; ".join(r.not_modelled), "refused": r.error}
                              for r in rows])
        write_atomic(args.csv, frame.to_csv(index=False), what="accuracy CSV")
    return 0


if __name__ == "__main__":
    sys.exit(main())
