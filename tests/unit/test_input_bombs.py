"""Inputs a few kB long that would expand to gigabytes or take hours (a probe's findings,
2026-12-07): a launch script whose variables repeat one another, a NeMo config whose
interpolations do; and output or cache paths whose inspection itself fails. Each is refused in
one line with its class's exit code, never run unbounded or reported as an internal error."""

from __future__ import annotations

import time
from pathlib import Path

from perfmodel.configs import interpolation
from tests.unit.test_bad_input import run_main

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _nested(name: str, levels: int, ref: str) -> list[str]:
    """name0 = 10 x's, name1 = ten name0s, ...: name{levels} is 10^(levels + 1) characters."""
    lines = [f"{name}0=xxxxxxxxxx"]
    lines += [f'{name}{i}="' + ref.format(f"{name}{i - 1}") * 10 + '"'
              for i in range(1, levels + 1)]
    return lines


def test_a_launch_script_whose_variables_multiply_is_refused(tmp_path):
    script = (CONFIGS / "megatron_gpt3_175b.sh").read_text().splitlines()
    bomb = script[:8] + _nested("A", 9, "${{{}}}") + script[8:]
    bomb = [line + " $A9" if line.strip().startswith("--num-layers") else line for line in bomb]
    path = tmp_path / "bomb.sh"
    path.write_text("\n".join(bomb) + "\n")
    start = time.perf_counter()
    code, out, err = run_main(["predict", "--from-config", str(path), "--model", "gpt3-175b",
                               "--hardware", "dgx-h100"])
    assert code == 3 and out == "", err
    assert "bomb.sh: line" in err and "more than 65,536 characters" in err, err
    assert len(err.strip().splitlines()) == 1
    assert time.perf_counter() - start < 60  # 10 GB and minutes before (a loaded CI is slow)
    # a variable grown by += past the bound, line by line, is refused alike
    grown = script[:8] + ['B="' + "y" * 60_000 + '"', 'C="$B"', 'C+="$B"'] + script[8:]
    path.write_text("\n".join(grown) + "\n")
    code, _, err = run_main(["predict", "--from-config", str(path), "--model", "gpt3-175b",
                             "--hardware", "dgx-h100"])
    assert code == 3 and "holds more than 65,536 characters" in err, err


def _nemo(tmp_path: Path, extra: dict[str, list[str]]) -> Path:
    text = (CONFIGS / "nemo1_nemotron4_15b.yaml").read_text().splitlines()
    out = []
    for line in text:
        out.append(line)
        for section, lines in extra.items():
            if line == f"{section}:":
                out += [f"  {x}" for x in lines]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_nemo_config_whose_numbers_square_at_each_level_is_refused(tmp_path):
    # ${multiply:${.m0},${.m0}} 27 times: a number of 134 million digits, minutes of arithmetic
    lines = ["m0: 10"] + [f"m{i}: ${{multiply:${{.m{i - 1}}},${{.m{i - 1}}}}}"
                          for i in range(1, 28)] + ["bomb: ${.m27}"]
    path = _nemo(tmp_path, {"model": lines})
    code, out, err = run_main(["predict", "--from-config", str(path), "--hardware", "dgx-h100",
                               "--gpus", "8"])
    assert code == 3 and out == "", err
    assert "bomb.yaml" in err and len(err.strip().splitlines()) == 1, err


def test_a_nemo_config_whose_strings_repeat_one_another_is_refused(tmp_path, monkeypatch):
    # s1 = ten s0s, ..., s8: OmegaConf resolves each reference anew, hours at 8 levels (25 s at
    # 5); the limit is lowered here so that the test's time is the limit's, not the bomb's
    monkeypatch.setattr(interpolation, "RESOLVE_LIMIT_S", 0.5)
    lines = _nested("s", 8, "${{.{}}}")
    path = _nemo(tmp_path, {"run": [x.replace("=", ": ", 1) for x in lines] + ['bomb: "${.s8}"']})
    code, out, err = run_main(["predict", "--from-config", str(path), "--hardware", "dgx-h100",
                               "--gpus", "8"])
    assert code == 3 and out == "", err
    assert "bomb.yaml" in err and "do not resolve in 0.5 s" in err, err


def test_an_output_path_that_cannot_be_looked_at_is_an_output_error(tmp_path):
    """ENAMETOOLONG (and EACCES, as a user without search permission meets it) from looking at an
    output's path was an internal error, exit 1."""
    long = tmp_path / ("a" * 300 + ".csv")
    code, _, err = run_main(["sweep", "--model", "alexnet", "--hardware", "dgx-h100", "--gpus",
                             "8", "--vary", "global_batch=64", "--csv", str(long)])
    assert code == 7, err
    assert "internal error" not in err and "the file name is too long" in err, err
    emit = tmp_path / ("e" * 300) / "job"
    code, _, err = run_main(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--global-batch", "8", "--emit-config", "megatron",
                             str(emit)])
    assert code == 7 and "internal error" not in err, err


def test_a_cache_directory_that_cannot_be_looked_into_only_costs_speed(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path / ("c" * 300)))
    code, out, err = run_main(["predict", "--model", "gpt2-small", "--hardware", "dgx-h100"])
    assert code == 0 and "step time" in out, err


def test_a_dash_for_an_output_is_refused_not_written_as_a_file(tmp_path, monkeypatch):
    """'-' is standard output to many tools; perfmodel wrote a file named '-' (a probe's)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["sweep", "--model", "alexnet", "--hardware", "dgx-h100", "--gpus",
                               "8", "--vary", "global_batch=64", "--csv", "-"])
    assert code == 7 and out == "" and "'-'" in err and "--json" in err, err
    assert not (tmp_path / "-").exists()
    code, _, err = run_main(["sweep", "--model", "alexnet", "--hardware", "dgx-h100", "--gpus",
                             "8", "--vary", "global_batch=64", "--csv", "./-"])
    assert code == 0 and (tmp_path / "-").is_file(), err
