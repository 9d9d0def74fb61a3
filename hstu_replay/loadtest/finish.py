"""The end of a run: merged report on disk, the latency table on the terminal, CI verdict."""

from __future__ import annotations

import sys
from pathlib import Path

from hstu_replay.plan.over_limit import accounts_line
from hstu_replay.loadtest.faults import LOST_EXIT_CODE
from hstu_replay.loadtest.interrupts import INTERRUPTED_EXIT_CODE
from hstu_replay.loadtest.roles import LIMIT_EXIT_CODE
from hstu_replay.loadtest.server_limits import server_limits_section
from hstu_replay.report.fleet_section import fleet_section, fleet_table, gateway_section, with_fleet_flags
from hstu_replay.report.tier_section import shows_tiers, tier_table
from hstu_replay.output.files import jsonable
from hstu_replay.output.text import format_table
from hstu_replay.report.outcome import cause_lines, outcome_line
from hstu_replay.report.summary import build_report, flagged_stages, latency_table
from hstu_replay.report.thresholds import evaluate, verdict
from hstu_replay.report.interruption import interruption_line, with_interruption
from hstu_replay.report.worker_events import loss_lines, with_workers
from hstu_replay.report.writers import write_reports

THRESHOLD_EXIT_CODE = 3


def run_metadata(environment) -> dict:
    runtime = environment.hstu
    run = runtime.run
    prepared, figures = run.prepared, run.figures
    c, binding = prepared.config, prepared.binding
    return {
        "model": c.target.model, "interface": binding.interface.name,
        "caches": binding.interface.uses_cache, "reports_hits": binding.reports_hits,
        "reports_tiers": binding.reports_tiers,
        "url": c.target.address, "protocol": c.target.protocol.value, "workload": c.data.workload,
        "source": c.data.path,
        "users": max(figures.users, environment.runner.user_count if environment.runner else 0),
        "workers": runtime.role.worker_count, "role": runtime.role.name, "started": run.live.clock.started_epoch,
        "history_caps": prepared.history_caps(),
        "server_limits": server_limits_section(binding.limits, prepared.caps),
        "stopped": figures.stopped,
        "options": dict(c.options),
    }


def current_report(environment) -> dict:
    runtime = environment.hstu
    run = runtime.run
    figures, c = run.figures, run.prepared.config
    report = build_report(figures.stats, run_metadata(environment), figures.server_stages, c.checks.tolerance,
                          requested_rps=c.sweep.request_rate if c.sweep.arrival.open else None, rules=c.report.rules)
    fleet = (fleet_section(figures.stats, c.target.addresses, c.target.routing.value)
             or gateway_section(figures.backend_stages, run.prepared.fleet_names, figures.stats))
    if fleet is not None:
        report["fleet"] = jsonable(fleet)
        with_fleet_flags(report)
    story = runtime.role.workers_story()
    if story is not None:  # a master: the workers it lost or gained, and the stages a loss overlapped
        losses, joins = story
        with_workers(report, jsonable(losses), jsonable(joins), runtime.role.worker_count - len(losses) + len(joins))
    with_interruption(report, None if figures.interruption is None else jsonable(figures.interruption.section()))
    return report


def write_report(environment) -> dict:
    """The run's report as it stands, on disk: at test stop (each run of the web UI gets one)
    and again, with what arrived since, at quitting (`write_final_report`)."""
    return _written(environment)[0]


def _written(environment) -> tuple[dict, dict]:
    run = environment.hstu.run
    c, figures = run.prepared.config, run.figures
    report = current_report(environment)
    thresholds = c.report.thresholds
    report["thresholds"] = None if thresholds.empty else verdict(evaluate(report, thresholds), thresholds.described())
    out = Path(c.report.report_dir)
    if figures.rows is not None:  # a natural replay: the hit ratio each request met
        from hstu_replay.report.natural import natural_section, write_natural_csv

        records = figures.rows.records()
        report["natural"] = natural_section(records, c.data.policy)
        write_natural_csv(records, out)
    paths = write_reports(report, out)
    figures.report = report
    return report, paths


def write_final_report(environment) -> dict:
    """At quitting: the report written once more, then its summary on the terminal and the
    process's exit code (the CI verdict)."""
    report, paths = _written(environment)
    c = environment.hstu.run.prepared.config
    print(format_table(latency_table(report)), flush=True)
    if shows_tiers(report):
        print("hstu-replay: cache tiers (token hit ratio per tier, users by tier):", flush=True)
        print(format_table(tier_table(report)), flush=True)
    if report.get("fleet"):
        routing = report["fleet"]["routing"]
        source = "each server's own counters" if routing == "gateway" else f"--routing {routing}"
        print(f"hstu-replay: the fleet's servers ({source}):", flush=True)
        print(format_table(fleet_table(report)), flush=True)
    html = paths.get("html")
    print(f"hstu-replay: report written to {Path(c.report.report_dir).resolve()}"
          + (f" (open {Path(html).resolve()})" if html else ""), flush=True)
    natural = report.get("natural")
    if natural and natural["requests"]:
        print(f"hstu-replay: natural replay: emergent hit ratio {natural['hit_ratio']:.4f} "
              f"({natural['hit_source']}) over {natural['requests']} measured requests", flush=True)
        print(f"hstu-replay: natural replay: {accounts_line(natural['visit_kinds'])}", flush=True)
        failed = natural["failed"]
        if failed["requests"]:
            print(f"hstu-replay: natural replay: {failed['requests']} requests failed; {failed['keys_replaced']} "
                  "keys replaced (those users continue on fresh keys)", flush=True)
    lost = sum(s["hits_lost"] for s in report["stages"])
    if lost:
        print(f"hstu-replay: warning: {lost} requests found less cached than predicted "
              "(server restarted, cache emptied or evicted beyond the capacity model)", file=sys.stderr, flush=True)
    for line in loss_lines(report):
        print(f"hstu-replay: warning: {line}", file=sys.stderr, flush=True)
    for stage in flagged_stages(report):
        reasons = "; ".join(f"{f['flag']}: {f['reason']}" for f in stage["flags"])
        print(f"hstu-replay: warning: stage {stage['name']} is not solid ({reasons})", file=sys.stderr, flush=True)
    for line in cause_lines(report):
        print(f"hstu-replay: {line}", file=sys.stderr, flush=True)
    if not report["run"]["reports_hits"] and report["run"]["caches"]:
        print("hstu-replay: note: the server does not report its cache hits; achieved hit ratios are the "
              "client's cache model (predicted)", file=sys.stderr, flush=True)
    outcome = report["thresholds"]
    summary = outcome_line(report)  # the FAIL line below says why where there is none
    if summary is not None:
        print(f"hstu-replay: {summary}", flush=True)
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
    if report.get("workers_lost") and report["run"].get("workers_end") == 0 \
            and environment.process_exit_code != THRESHOLD_EXIT_CODE:
        environment.process_exit_code = LOST_EXIT_CODE  # every worker was lost: the run did not finish
    interrupted = interruption_line(report)
    if interrupted is not None:  # whatever the thresholds say: the flags the interruption raised among them
        print(f"hstu-replay: FAIL: {interrupted} (exit {INTERRUPTED_EXIT_CODE})", file=sys.stderr, flush=True)
        environment.process_exit_code = INTERRUPTED_EXIT_CODE
    if environment.hstu.run.figures.stopped is not None:  # said when it stopped: a limit the server refused
        environment.process_exit_code = LIMIT_EXIT_CODE
    return report
