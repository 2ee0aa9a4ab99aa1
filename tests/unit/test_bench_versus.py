"""bench/versus.py's table and verdict, from given figures (nothing timed)."""

from __future__ import annotations

import pytest

from bench.versus import CONTROL, render, summarize


def test_each_row_its_medians_their_ratio_and_the_paired_rounds_range() -> None:
    old = {"latency, replay: effectq / floor (GET)": [1.0, 1.2, 1.1]}
    new = {"latency, replay: effectq / floor (GET)": [1.3, 1.2, 1.1]}
    (row,) = summarize(old, new)
    assert row["old"] == pytest.approx(1.1)
    assert row["new"] == pytest.approx(1.2)
    assert row["ratio"] == pytest.approx(1.2 / 1.1)
    assert row["spread"] == pytest.approx((1.0, 1.3))  # 1.2/1.2 .. 1.3/1.0, round by round


def test_the_verdict_names_the_rows_worse_than_the_limit_by_the_median() -> None:
    old = {"a": [1.0, 1.0], "b": [2.0, 2.0], "c": [1.0, 1.0]}
    new = {"a": [1.05, 1.05], "b": [2.3, 2.1], "c": [0.5, 0.5]}
    text = render(summarize(old, new), "old-rev", "new-rev")
    verdict = next(line for line in text.splitlines() if line.startswith("Verdict"))
    assert verdict == "Verdict: 1 of 3 rows worse than 5% by the median: b (1.100)."  # a: 1.05, not worse
    b = next(line for line in text.splitlines() if line.startswith("| b "))
    assert [cell.strip() for cell in b.split("|")[2:-1]] == ["2.000", "2.200", "1.100", "1.050–1.150"]


def test_none_worse_controls_left_out_of_the_verdict_one_sided_rows_said() -> None:
    old = {"a": [1.0], f"{CONTROL}Powertools / floor": [1.0]}
    new = {"a": [1.01], f"{CONTROL}Powertools / floor": [1.2], "only new": [3.0]}
    text = render(summarize(old, new), "old-rev", "new-rev")
    assert "Verdict: none of 1 rows is worse than 5% by the median." in text
    assert "Controls (identical code in both trees) moved 1.200–1.200." in text
    assert "Measured on one side only (the other's API lacks it): only new." in text
    only_new = next(line for line in text.splitlines() if line.startswith("| only new"))
    assert only_new.split("|")[2].strip() == "—"
