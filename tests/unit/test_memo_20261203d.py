"""The process-level memos added for speed hand out what an uncached read gives: a preset's
mapping read once a process (perfmodel.specs.loading._PRESET_MEMO), and the finiteness memo of
perfmodel.costs.lattice keyed by identity."""

from __future__ import annotations

import os

import sympy as sp

from perfmodel.costs import lattice
from perfmodel.specs import loading
from perfmodel.specs.presets import HARDWARE_DIR


def test_a_presets_mapping_is_a_fresh_copy_each_read():
    path = HARDWARE_DIR / "dgx-h100.yaml"
    first = loading.read_mapping(path, "hardware")
    assert first
    first.clear()
    again = loading.read_mapping(path, "hardware")
    assert again and again == loading._read_mapping(path, "hardware")  # as read from the file


def test_a_preset_edited_on_disk_is_read_again(tmp_path, monkeypatch):
    """Keyed by the file's modification time and size: an edited file is not served stale."""
    monkeypatch.setattr(loading, "_PRESETS", tmp_path)
    spec = tmp_path / "toy.yaml"
    spec.write_text("name: one\n")
    assert loading.read_mapping(spec, "hardware") == {"name": "one"}
    spec.write_text("name: two, longer\n")
    os.utime(spec, ns=(1, 1))  # a different mtime whatever the clock's resolution
    assert loading.read_mapping(spec, "hardware") == {"name": "two, longer"}


def test_a_user_file_is_not_memoised(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\n")
    loading.read_mapping(spec, "hardware")
    assert not [k for k in loading._PRESET_MEMO if k[0] == str(spec.resolve())]


def test_equal_but_distinct_sums_get_the_same_finiteness_answer():
    """Keyed by identity: a sum equal to a known one but built anew is walked itself, and a sum
    holding an infinity is still found infinite."""
    x, y = sp.symbols("x y", positive=True)
    a = x + 2 * y
    b = sp.Add._from_args(a.args)  # not through sympy's cache: another object
    assert a == b and a is not b
    assert lattice._no_infinity(a) and lattice._no_infinity(b)
    assert not lattice._no_infinity(sp.Add(x, sp.oo, evaluate=False))
