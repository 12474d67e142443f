"""mkdocs hook: pages generated from the code, so that they cannot go stale.

- `<!-- generated: cli-reference -->` becomes the reference of every command and option, walked
  from the click tree of `perfmodel` (perfmodel.cli.cli), including the command groups that
  register themselves as entry points (calibrate, validate).
- `<!-- generated: presets -->` becomes the list of presets: a summary of each and its file as it
  ships, whose comments give the source of every number.

mkdocs loads this file through `hooks:` in mkdocs.yml; the tests import it too (tests/docs/).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import click
import yaml

MARKERS = {
    "<!-- generated: cli-reference -->": "cli_reference",
    "<!-- generated: presets -->": "presets_page",
    "<!-- generated: gemm-efficiency -->": "gemm_efficiency_doc",
    "<!-- generated: physical-ranges -->": "physical_ranges",
}


# --- mkdocs -------------------------------------------------------------------------------------
def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None,
                     **_: Any) -> str:
    for marker, fn in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[fn]())
    return markdown


# --- the CLI reference --------------------------------------------------------------------------
def walk(command: click.Command | None = None, ctx: click.Context | None = None,
         name: str = "perfmodel") -> list[tuple[click.Context, click.Command]]:
    """Every (context, command) of the tree, depth first, groups before their subcommands."""
    if command is None:
        from perfmodel.cli import cli

        command = cli
    ctx = click.Context(command, info_name=name, parent=ctx, **command.context_settings)
    out = [(ctx, command)]
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None:
                out += walk(child, ctx, sub)
    return out


def anchor(path: str) -> str:
    """The heading id of a command path ('perfmodel calibrate run' -> 'perfmodel-calibrate-run')."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _param_line(param: click.Parameter, ctx: click.Context) -> str:
    if isinstance(param, click.Argument):
        metavar = param.make_metavar(ctx)
        what = "required" if param.required else "optional"
        many = ", one or more" if param.nargs == -1 else ""
        kind = getattr(param.type, "name", "text").upper()
        return f"- `{metavar}` (argument, {what}{many}; {kind})"
    record = param.get_help_record(ctx)
    if record is None:  # a hidden option: shown, and said to be for tests
        opts = " / ".join(param.opts + param.secondary_opts)
        help_text = getattr(param, "help", "") or ""
        return f"- `{opts}` (hidden, for tests): {_escape(help_text)}"
    names, help_text = record
    return f"- `{names}`" + (f": {_escape(help_text)}" if help_text else "")


def command_section(ctx: click.Context, command: click.Command) -> str:
    path = ctx.command_path
    level = "#" * min(2 + path.count(" "), 4)
    usage = f"{path} {' '.join(command.collect_usage_pieces(ctx))}"
    lines = [f"{level} `{path}` {{#{anchor(path)}}}", "", "```text", usage, "```", ""]
    help_text = inspect.cleandoc(command.help or "").replace("\b\n", "")
    if help_text:
        lines += [_escape(help_text), ""]
    params = command.get_params(ctx)
    arguments = [p for p in params if isinstance(p, click.Argument)]
    options = [p for p in params if not isinstance(p, click.Argument)]
    if arguments:
        lines += ["Arguments:", ""] + [_param_line(p, ctx) for p in arguments] + [""]
    if options:
        lines += ["Options:", ""] + [_param_line(p, ctx) for p in options] + [""]
    if isinstance(command, click.Group):
        subs = command.list_commands(ctx)
        lines += ["Commands: " + ", ".join(f"[`{s}`](#{anchor(f'{path} {s}')})" for s in subs), ""]
    return "\n".join(lines)


def cli_reference() -> str:
    return "\n".join(command_section(ctx, command) for ctx, command in walk())


def gemm_efficiency_doc() -> str:
    """The docstring of the GEMM cost model, as it is in the code."""
    import perfmodel.costs.gemm_efficiency as gemm

    return "```{.text .wrap}\n" + inspect.cleandoc(gemm.__doc__ or "") + "\n```\n"


def physical_ranges() -> str:
    """The tables of physical ranges that the specs check their numbers against, as in the code
    (perfmodel.specs.hardware.BOUNDS, perfmodel.specs.layers.BOUNDS,
    perfmodel.specs.profile.FIT_BOUNDS)."""
    from perfmodel.specs import hardware, layers, profile

    out = []
    for title, table in (("hardware spec (`link.`: both `intra_node` and `inter_node`)",
                          hardware.BOUNDS), ("layer of a layer graph", layers.BOUNDS),
                         ("fit of a calibration profile", profile.FIT_BOUNDS)):
        out += [f"**{title}**", "", "| field | allowed | why |", "|---|---|---|"]
        out += [f"| `{key}` | {b.describe()}{' (whole)' if b.integer else ''} | "
                f"{_escape(b.reason)} |" for key, b in table.items()]
        out.append("")
    return "\n".join(out)


# --- presets ------------------------------------------------------------------------------------
def _presets_dir() -> Path:
    from perfmodel.specs.presets import PRESETS_DIR

    return PRESETS_DIR


def header_comment(text: str) -> str:
    """The comment lines at the top of a preset file, joined."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def numbers_without_comment(text: str) -> list[str]:
    """Keys of lines that hold a number with no comment on their line, on an enclosing key's line
    or at the head of an enclosing block (comment lines right under the key)."""
    missing, stack = [], []  # stack: (indent, key, has_comment)
    for line in text.splitlines():
        if re.match(r"^\s+#", line) and stack:  # a comment at the head of the open block
            indent = len(line) - len(line.lstrip())
            if indent > stack[-1][0]:
                stack[-1] = (stack[-1][0], stack[-1][1], True)
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_]+):\s*([^#]*?)\s*(#.*)?$", line)
        if not match:
            continue
        indent, key, value, comment = len(match[1]), match[2], match[3], match[4]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([s[1] for s in stack] + [key])
        if value and re.fullmatch(r"[-+0-9.eE]+", value) and not comment and not any(
            s[2] for s in stack
        ):
            missing.append(path)
        if not value:
            stack.append((indent, key, bool(comment)))
    return missing


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _hardware_row(name: str) -> str:
    from perfmodel.specs.hardware import load_hardware

    hw = load_hardware(name)
    peak = hw.peak_flops_per_s
    bf16 = peak.get("bf16", peak.get("fp16", 0.0))
    return (f"| [`{name}`](#{anchor('hardware ' + name)}) | {hw.gpu_name} | {hw.gpus_per_node} | "
            f"{hw.memory_bytes / 2**30:.0f} GiB | {_si(bf16, 'FLOP/s')} | "
            f"{_si(hw.memory_bandwidth_bytes_per_s, 'B/s')} | "
            f"{_si(hw.intra_node.bandwidth_bytes_per_s, 'B/s')} | "
            f"{_si(hw.inter_node.bandwidth_bytes_per_s, 'B/s')} |")


def _model_row(name: str) -> str:
    from perfmodel.params import parameter_counts
    from perfmodel.specs.model import load_model

    m = load_model(name)
    counts = parameter_counts(m)
    size = f"{counts.total / 1e9:.2f}B"
    if counts.sparse:  # as the model's card counts it, marked as `perfmodel presets` marks it
        from perfmodel.render import _ACTIVE_MARKS, _ACTIVE_NOTES

        mark = _ACTIVE_MARKS[m.active_count]
        note = f", {_ACTIVE_NOTES[mark]}" if mark else ""
        size += f" ({counts.reported / 1e9:.2f}B active{note})"
    if counts.mtp:
        size += f" + {counts.mtp / 1e9:.2f}B MTP"
    return (f"| [`{name}`](#{anchor('model ' + name)}) | {m.layers} | {m.hidden} | {m.heads} | "
            f"{m.kv_heads} | {m.ffn_hidden} | {m.seq_len} | {m.vocab} | {size} | "
            f"{_escape(m.source)} |")


def _preset_file_section(kind: str, path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    lines = [f"### `{path.stem}` {{#{anchor(kind + ' ' + path.stem)}}}", ""]
    about = header_comment(text)
    if about:
        lines += [_escape(about), ""]
    if data.get("source"):
        lines += [f"Source: {_escape(str(data['source']))}.", ""]
    if data.get("base"):
        lines += [f"Every field not given here is the preset "
                  f"[`{data['base']}`](#{anchor(kind + ' ' + data['base'])})'s.", ""]
    missing = numbers_without_comment(text) if kind == "hardware" else []
    if missing:
        lines += ["Numbers with no comment on their line nor on an enclosing key's: "
                  + ", ".join(f"`{m}`" for m in missing) + ". Read them with the comments "
                  "around them; where none applies, only the file's source covers them.", ""]
    rel = path.relative_to(_presets_dir().parents[2])
    lines += [f"`{rel}`:", "", "```{.yaml .wrap}", text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def presets_page() -> str:
    from perfmodel.specs.cnn import BUILDERS
    from perfmodel.specs.presets import HARDWARE_DIR, MODELS_DIR, preset_names

    hardware, models = preset_names(HARDWARE_DIR), preset_names(MODELS_DIR)
    out = [
        "## Hardware", "",
        "| preset | GPU | GPUs per node | memory | bf16 peak (dense) | memory bandwidth | "
        "intra-node per GPU | inter-node per node |",
        "|---|---|---|---|---|---|---|---|",
        *[_hardware_row(n) for n in hardware], "",
        "Bandwidths are one direction. Each file below is the preset as it ships; the comment on a "
        "line is the source of its number (a comment on a parent key, such as "
        "`peak_flops_per_s`, covers the lines under it).", "",
        *[_preset_file_section("hardware", HARDWARE_DIR / f"{n}.yaml") for n in hardware],
        "## Transformer models", "",
        "| preset | layers | hidden | heads | kv heads | ffn hidden | sequence | vocabulary "
        "| parameters | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[_model_row(n) for n in models], "",
        "The numbers of a model preset are those of the paper or configuration its file names "
        "(the comment at its top and `source`); a comment on a line adds to it. Parameters are "
        "perfmodel's count of the spec (`perfmodel.params`): for a mixture of experts, also those "
        "one token uses, the embedding table included (DeepSeek-V3's multi-token-prediction "
        "module apart); the files' comments give the published counts.", "",
        *[_preset_file_section("model", MODELS_DIR / f"{n}.yaml") for n in models],
        "## Layer graphs (CNNs and MLPs)", "",
        "Built from the networks' definitions in `perfmodel/specs/cnn.py` (no file; FLOPs count a "
        "multiply-add as 2).", "",
        "| preset | layers | parameters | forward GFLOPs per sample | input | source |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(BUILDERS):
        g = BUILDERS[name]()
        shape = " x ".join(str(d) for d in g.input_shape) or "-"
        out.append(f"| `{name}` | {len(g.layers)} | {g.parameters:,.0f} | "
                   f"{g.flops_per_sample / 1e9:.3f} | {shape} | {_escape(g.source)} |")
    return "\n".join(out) + "\n"
