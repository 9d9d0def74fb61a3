"""The real-data commands of datasets/README.md ("A natural replay of the real KuaiRand-1K"), run as
written on the KuaiRand-schema sample in the real file layout: only the paths, the time scale, the
run's length and the server change (the session's target stands in for the GPU server line)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from hstu_replay import cli
from hstu_replay.data.store import SequenceStore
from tests.conftest import ROOT, SAMPLE, run_locust

pytestmark = pytest.mark.integration

README = ROOT / "datasets" / "README.md"
REAL = "datasets/KuaiRand-1K/data"
TIME_SCALE = 500_000  # the sample's month in about 5 s
# the session's target is the small config: its limits (the README's CPU note), in both lines
SMALL = {"--max-history": "256", "--candidates": "16"}


def readme_commands() -> list[list[str]]:
    """The command lines of the section's bash block, split into words."""
    section = README.read_text().split("## A natural replay of the real KuaiRand-1K", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def replaced(words: list[str], tmp: Path, **values: str) -> list[str]:
    out = [str(SAMPLE) if w == REAL else str(tmp / w.removeprefix("runs/")) if w.startswith("runs/") else w
           for w in words]
    for name, value in values.items():
        out[out.index(name) + 1] = value
    return out


def test_the_commands_are_those_of_the_readme():
    prepare, curve, serve, replay = readme_commands()
    assert prepare[:4] == ["hstu-replay", "data", "prepare", REAL]
    assert curve[:3] == ["hstu-replay", "plan", "cache-curve"] and "--over-limit" not in curve  # the default: skip
    assert serve[:3] == ["hstu-replay", "server", "serve"]
    assert replay[:4] == ["locust", "-f", "locustfiles/hstu.py", "--headless"]
    assert option(replay, "--workload") == "timeline" and option(replay, "--time-scale") == "144"
    assert option(replay, "--store") == option(curve, "--store") == option(prepare, "--out")
    for name in ("--max-history", "--candidates"):
        assert option(replay, name) == option(curve, name)
    assert option(replay, "--cache-budget-tokens") == option(serve, "--cache-budget-tokens")
    assert option(serve, "--cache-budget-tokens") in option(curve, "--budgets").split(",")
    # the run's length: the log's 31 days (04-08 to 05-08) at 144x
    assert int(option(replay, "--stage-seconds")) == 31 * 86_400 // 144 == 18_600
    assert "--include-random" in README.read_text()


def test_the_readme_commands_on_the_sample(triton_server, tmp_path, capsys):
    prepare, curve, _serve, replay = readme_commands()
    assert cli.main(replaced(prepare, tmp_path)[1:]) == 0
    assert cli.main([*replaced(prepare, tmp_path)[1:-1], str(tmp_path / "random-store"), "--include-random"]) == 0
    store = Path(option(replaced(prepare, tmp_path), "--out"))
    plain, with_random = SequenceStore.open(store), SequenceStore.open(tmp_path / "random-store")
    assert len(plain) == len(with_random) == 22 and (plain.num_events, with_random.num_events) == (2_596, 2_634)

    capsys.readouterr()
    assert cli.main(replaced(curve, tmp_path, **SMALL)[1:]) == 0
    printed = capsys.readouterr().out
    assert "over the limit: skip;" in printed and "a replay at --time-scale 144 takes" in printed
    summary = json.loads((Path(option(replaced(curve, tmp_path), "--out")) / "curve.json").read_text())
    assert summary["trace"]["visit_kinds"]["over_limit"] == "skip"
    assert summary["trace"]["visit_kinds"]["kinds"]["skipped"]["visits"] > 0  # some sample users pass 256 items
    budget = int(option(replay, "--cache-budget-tokens"))
    (at_budget,) = [b for b in summary["budgets"] if b["budget_tokens"] == budget]

    words = replaced(replay, tmp_path, **SMALL,
                     **{"--time-scale": str(TIME_SCALE), "--stage-seconds": "15"})
    words = words[4:]  # run_locust runs `locust -f locustfiles/hstu.py --headless` into its own report dir
    i = words.index("--report-dir")
    del words[i:i + 2]
    result = run_locust(tmp_path / "report", *words, "--triton-url", triton_server.grpc_url)
    assert result.returncode == 0, result.stderr[-3000:]
    natural = result.report["natural"]
    assert natural["visit_kinds"]["over_limit"] == "skip"
    assert natural["visit_kinds"]["visits"] == summary["trace"]["visit_kinds"]["visits"]  # the whole log was sent
    # the session's target holds 3,276,800 tokens: every return hits, as the curve says at that budget
    assert natural["hit_ratio"] == pytest.approx(at_budget["hit_ratio"], abs=0.01)
