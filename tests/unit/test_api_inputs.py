"""The Python API's recommend, sensitivities and explain_text take their inputs as predict does.

A probe of the API as a notebook uses it (2026-12-07) found predict taking preset names, files,
dict plans and numpy integers, and its siblings not: recommend("llama3-8b", "dgx-h100", ...)
raised AttributeError ('str' object has no attribute 'require_costed'), sensitivities and
explain_text likewise; SearchRequest(gpus=8, ...) a TypeError ('int' object is not iterable), a
string global batch or pin a TypeError deep in the search, a misspelt field a bare dataclass
TypeError; recommend(top=0) an IndexError, top=2.5 a TypeError, top=-1 every plan. Each is now
read as predict reads it or refused in one line naming the field (PlanError); each test failed
before.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from perfmodel import load_hardware, load_model, predict
from perfmodel.errors import PlanError
from perfmodel.explain import explain_text
from perfmodel.recommend import recommend, sensitivities
from perfmodel.search import SearchRequest

PLAN = {"gpus": 8, "tp": 8, "global_batch": 8}


def test_names_and_dicts_are_taken_as_predict_takes_them():
    by_name = recommend("tiny-gpt", "dgx-h100", {"gpus": np.int64(8), "global_batch": 8}, top=1)
    by_spec = recommend(load_model("tiny-gpt"), load_hardware("dgx-h100"),
                        SearchRequest(gpus=(8,), global_batch=8), top=1)
    assert by_name.top[0].step_time_s == by_spec.top[0].step_time_s
    assert by_name.top[0].plan == by_spec.top[0].plan
    assert sensitivities("llama3-8b", "dgx-h100", PLAN) == sensitivities(
        load_model("llama3-8b"), load_hardware("dgx-h100"), predict(
            "llama3-8b", "dgx-h100", PLAN).plan)
    text = explain_text("llama3-8b", "dgx-h100", PLAN, only="comm/tp")
    assert text == explain_text("llama3-8b", "dgx-h100", PLAN, only=("comm/tp",))
    assert "comm/tp" in text


@pytest.mark.parametrize("fields, message", [
    ({"gpus": 8, "global_batch": "8"}, "global_batch must be a whole number, got '8'"),
    ({"gpus": (8,), "global_bach": 8}, "unknown search request field 'global_bach' "
                                       "(did you mean 'global_batch'?)"),
    ({"gpus": (8,), "global_batch": 8, "tp": "8"}, "tp must be a whole number, got '8'"),
    ({"gpus": "8", "global_batch": 8}, "gpus must be one or more positive whole numbers"),
    ({"gpus": (8,), "global_batch": 8, "sequence_parallel": "yes"},
     "sequence_parallel must be true or false, got 'yes'"),
])
def test_a_malformed_request_is_refused_by_field(fields, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        recommend("tiny-gpt", "dgx-h100", fields, top=1)


@pytest.mark.parametrize("top", [0, -1, 2.5, True, "3"])
def test_top_must_be_a_count_of_plans(top):
    with pytest.raises(PlanError, match="top must be a whole number >= 1"):
        recommend("tiny-gpt", "dgx-h100", {"gpus": 8, "global_batch": 8}, top=top)


def test_a_prediction_shows_itself_in_one_line():
    """A notebook or a REPL shows a prediction by its summary (the generated repr printed every
    field with the model and hardware specs: 8.8 KB), and Jupyter by its breakdown too."""
    p = predict("llama3-8b", "dgx-h100", dict(gpus=16, dp=2, tp=8, global_batch=16))
    shown = repr(p)
    assert shown.startswith("<Prediction llama3-8b on 16 x dgx-h100 (dp=2 tp=8 pp=1 mb=1): step ")
    assert f"{p.step_time_s:.4g} s" in shown and f"MFU {p.mfu:.1%}" in shown
    assert shown.endswith(f"per GPU: {p.memory_verdict}>") and len(shown) < 300
    page = p._repr_html_()
    assert all(f"<td>{term}</td>" in page for term in p.breakdown_s)


def test_a_recommendation_shows_its_counts_and_best_plans():
    rec = recommend("llama3-8b", "dgx-h100", dict(gpus=16, global_batch=64), top=4)
    shown = repr(rec)
    r = rec.result
    assert shown.startswith(f"<Recommendation: {r.enumerated:,} plans searched, "
                            f"{r.evaluated:,} evaluated, {r.feasible:,} fit; best: "
                            f"{rec.top[0].summary()}; then: ")
    assert shown.endswith("(and 1 more)>") and len(shown) < 1000
    assert rec._repr_html_().count("<li>") == 4
