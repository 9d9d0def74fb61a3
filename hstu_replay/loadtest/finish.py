"""The end of a run: merged report on disk, the latency table on the terminal, CI verdict."""

from __future__ import annotations

import sys
from pathlib import Path

from hstu_replay.errors import HstuReplayError
from hstu_replay.report.summary import RATIO_TOLERANCE, build_report, format_table, latency_table, off_target_stages
from hstu_replay.report.thresholds import evaluate, parse_thresholds, verdict
from hstu_replay.report.writers import write_reports

THRESHOLD_EXIT_CODE = 3


def run_metadata(environment) -> dict:
    runtime = environment.hstu
    c = runtime.config
    return {
        "model": c.triton_model, "interface": runtime.binding.interface.name if runtime.binding else None,
        "url": c.triton_url, "protocol": c.triton_protocol, "workload": c.workload,
        "source": c.store if c.workload == "sessions" else c.dump_dir,
        "users": environment.runner.user_count if environment.runner else None,
        "workers": runtime.worker_count, "role": runtime.role, "started": runtime.started_epoch,
        "options": {k: v for k, v in vars(c).items() if k != "triton_headers"},
    }


def current_report(environment) -> dict:
    runtime = environment.hstu
    c = runtime.config
    return build_report(runtime.stats, run_metadata(environment), runtime.server_stages, c.tolerance,
                        requested_rps=c.request_rate if c.arrival != "closed" else None)


def write_final_report(environment, final: bool = False) -> dict:
    runtime = environment.hstu
    c = runtime.config
    report = current_report(environment)
    try:
        thresholds = parse_thresholds(
            None if c.max_mismatches < 0 else c.max_mismatches,
            None if c.max_error_ratio < 0 else c.max_error_ratio, c.max_p99_ms, c.min_speedup,
        )
    except HstuReplayError as exc:
        report["thresholds"] = verdict([str(exc)])
    else:
        report["thresholds"] = None if thresholds.empty else verdict(evaluate(report, thresholds))
    paths = write_reports(report, Path(c.report_dir))
    if final:
        print(format_table(latency_table(report)), flush=True)
        html = paths.get("html")
        print(f"hstu-replay: report written to {Path(c.report_dir).resolve()}"
              + (f" (open {Path(html).resolve()})" if html else ""), flush=True)
        lost = sum(s["hits_lost"] for s in report["stages"])
        if lost:
            print(f"hstu-replay: warning: {lost} requests found less cached than predicted "
                  "(server restarted, cache emptied or evicted beyond the capacity model)", file=sys.stderr, flush=True)
        for stage in off_target_stages(report):
            print(f"hstu-replay: warning: stage {stage['name']} achieved hit ratio {stage['achieved_ratio']:.3f}, "
                  f"more than {RATIO_TOLERANCE} from its target {stage['target_ratio']:g}", file=sys.stderr, flush=True)
        outcome = report["thresholds"]
        if not any(b["requests"] for b in report["bins"]):
            print("hstu-replay: error: no request was measured (see the errors above)", file=sys.stderr, flush=True)
            environment.process_exit_code = 1
        elif outcome is not None:
            if outcome["passed"]:
                environment.process_exit_code = 0
            else:
                print(f"hstu-replay: FAIL: {outcome['violations'][0]}"
                      + (f" (+{len(outcome['violations']) - 1} more)" if len(outcome["violations"]) > 1 else ""),
                      file=sys.stderr, flush=True)
                environment.process_exit_code = THRESHOLD_EXIT_CODE
    return report
