"""bench.protocol_runs: runs of NVIDIA's protocol grouped by their hardware line, each figure's range."""

from __future__ import annotations

import json

from bench import protocol_runs

NVIDIA = [{"layers": 3, "hit_ms": 0.423, "speedup": 4.47, "no_cache_ms_derived": 1.89}]


def report(path, hardware: str, cold8: float, hit8: float, mismatches: int = 0, complete: bool = True):
    rows = [{"batch_size": 1, "no_cache_ms": 2.0, "hit_ms": 1.0, "speedup": 2.0, "mismatches": 0, "nvidia": []},
            {"batch_size": 8, "no_cache_ms": cold8, "hit_ms": hit8, "speedup": cold8 / hit8, "mismatches": mismatches,
             "nvidia": NVIDIA}]
    path.mkdir(parents=True)
    (path / "protocol.json").write_text(json.dumps({"run": {"hardware": hardware, "complete": complete},
                                                    "batch_scaling": {"rows": rows}}))


def test_runs_of_one_server_give_each_figures_low_median_and_high(tmp_path, capsys):
    for i, (cold, hit) in enumerate([(1.0, 0.25), (0.9, 0.2), (1.2, 0.3)]):
        report(tmp_path / f"3l-run{i}", "H200; 3 layers, grpc", cold, hit, mismatches=int(i == 2))
    report(tmp_path / "3l-run0-http", "H200; 3 layers, http", 0.8, 0.2, complete=False)
    assert protocol_runs.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:6]]
    # by hand: three gRPC runs at batch 8, cold 0.9 / 1.0 / 1.2, cached 0.2 / 0.25 / 0.3, speed-ups 4.5 / 4.0 / 4.0
    assert rows[1] == ["H200; 3 layers, grpc", "8", "3", "0.900 / 1.000 / 1.200", "0.200 / 0.250 / 0.300",
                       "4.000x / 4.000x / 4.500x", "1", "3 layers 0.423 ms, 4.47x"]
    assert rows[0][:4] == ["H200; 3 layers, grpc", "1", "3", "2.000 / 2.000 / 2.000"] and rows[0][-1] == ""
    assert rows[3][:3] == ["H200; 3 layers, http", "8", "1"] and rows[3][6] == "1"  # the incomplete run counted
    assert lines[-1].startswith("4 runs;")


def test_no_report_or_an_unreadable_one_exits_2_with_one_line(tmp_path, capsys):
    assert protocol_runs.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"protocol_runs: no protocol.json under {tmp_path}"
    (tmp_path / "protocol.json").write_text("{")
    assert protocol_runs.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"protocol_runs: {tmp_path / 'protocol.json'}: ")
    (tmp_path / "protocol.json").write_text("{}")
    assert protocol_runs.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "protocol_runs: a report lacks 'run'"
