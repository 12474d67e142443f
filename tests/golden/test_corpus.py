"""The golden corpus (tests/golden/corpus.py): every prediction, breakdown term, memory term and
ledger entry of 2,376 plans, and four `recommend` answers, as the model gave them when the corpus
was written. A restructuring must reproduce them to 1e-9 relative; a change to the model's numbers
rewrites the corpus in the same commit (python -m tests.golden.corpus) and says why."""

from __future__ import annotations

import pytest

from tests.golden import corpus


@pytest.fixture(scope="module")
def golden():
    return corpus.load()


def test_the_corpus_covers_every_layout_schedule_recompute_zero_and_placement(golden):
    plans = [r["plan"] for r in golden["predictions"]]
    assert len(plans) >= 2000
    for key, values in (("tp_layout", corpus.LAYOUTS), ("schedule", corpus.SCHEDULES),
                        ("recompute", corpus.RECOMPUTES), ("zero", (0, 1, 2, 3)),
                        ("placement", corpus.PLACEMENTS)):
        assert {p[key] for p in plans} == set(values), key
    models, hardware = corpus._presets()
    assert {r["model"] for r in golden["predictions"]} == set(models)
    assert {r["hardware"] for r in golden["predictions"]} == set(hardware)


def test_every_prediction_is_reproduced(golden):
    old = golden["predictions"]
    assert [(r["model"], r["hardware"], r["plan"]) for r in old] == corpus.plans()
    diffs = []
    for record in old:
        new = corpus._record(record["model"], record["hardware"], record["plan"])
        diffs += [f"{record['model']}/{record['hardware']}/{record['plan']}: {d}"
                  for d in corpus.differences(record, new)]
    assert diffs[:20] == [], f"{len(diffs)} differences"


@pytest.mark.parametrize("index", range(len(corpus.RECOMMEND)))
def test_recommend_gives_the_same_answers(golden, index):
    entry = golden["recommend"][index]
    assert entry["query"] == list(corpus.RECOMMEND[index])
    assert corpus.differences(entry["top"], corpus._recommend(*corpus.RECOMMEND[index])) == []
