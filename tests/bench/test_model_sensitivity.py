"""bench.model_sensitivity: its table, and the separation it exists to show."""

from __future__ import annotations

import sys

from bench import model_sensitivity
from hstu_replay.verify import DEFAULT_TOLERANCE


def test_the_table_shows_wrong_histories_beyond_the_tolerance_only_with_the_gains(capsys, monkeypatch):
    args = ["--configs", "small:60", "--gains", "1,1", "2,6", "--pairs", "1"]
    monkeypatch.setattr(sys, "argv", ["bench/model_sensitivity.py", *args])
    model_sensitivity.main(args)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-5] == "python -m bench.model_sensitivity " + " ".join(args)
    assert lines[-4].split(" | ")[3:8] == ["another history", "stale first half", "shuffled", "32 tokens",
                                          "bf16 rounding"]
    rows = {cells[2]: [float(c) for c in cells[3:9]]
            for cells in (line.strip("| ").split(" | ") for line in lines[-2:])}
    assert set(rows) == {"1, 1", "2, 6"} and all(row[5] == DEFAULT_TOLERANCE for row in rows.values())
    another, stale, shuffled, _, rounding, tolerance = rows["2, 6"]
    assert min(another, stale, shuffled) > tolerance > 4 * rounding
    # PyTorch's defaults: each wrong history moves the answers less than half as far
    assert all(scaled > 2 * default for scaled, default in zip(rows["2, 6"][:3], rows["1, 1"][:3]))
