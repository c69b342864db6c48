"""The scale benchmark's floor against its frozen baseline (bench/planner_scale.py): the saved run
is read back line by line, and an instance misses the floor when its cost is more than 1 % above
the baseline's or its gap more than 1 point wider."""

from __future__ import annotations

import pytest

from bench.planner_scale import BASELINE, below_floor, load_baseline


def test_the_frozen_baseline_reads_back():
    baseline = load_baseline(BASELINE)
    assert len(baseline) == 24  # Mixed, BL, RH, TH at 100 and 300 jobs, seeds 1-3
    assert baseline["Mixed-100 s1"] == (2214.08, 1.50)
    assert baseline["TH-300 s1"] == (11350.96, 0.25)


def test_the_floor_allows_one_percent_in_cost_and_one_point_in_gap():
    baseline = {"RH-300 s2": (5682.48, 1.52)}
    assert below_floor("RH-300 s2", 5682.48 * 1.01, 2.52, baseline) == []
    assert below_floor("Hetero-300 s2", 9999.0, 9.9, baseline) == []  # no baseline: no floor
    dearer = below_floor("RH-300 s2", 5792.24, 2.00, baseline)
    assert len(dearer) == 1 and "+1.93%" in dearer[0]
    wider = below_floor("RH-300 s2", 5737.36, 2.63, baseline)
    assert len(wider) == 1 and "gap 2.63% against the baseline's 1.52%" in wider[0]


def test_a_missing_or_empty_baseline_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no such baseline file"):
        load_baseline(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing saved\n")
    with pytest.raises(SystemExit, match="no result lines"):
        load_baseline(empty)
