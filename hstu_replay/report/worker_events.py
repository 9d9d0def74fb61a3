"""The processes a distributed run lost or gained on the way, in the report's words.

A master reports each worker it lost (`loss` entries: which worker, when, in which stage, how
many users it held, and the measured requests it sent that never reached the master) and each
worker that joined after the sweep had started. Every stage a loss overlapped is flagged
`worker-lost`: it ran with fewer users than asked for from that moment on.
"""

from __future__ import annotations

from hstu_replay.output.page import table

WORKER_LOST = "worker-lost"


def loss(index: int, client_id: str, at_s: float | None, stage: str | None, users: int, users_before: int,
         stages: list[str], sent: int | None, received: int) -> dict:
    """One lost worker, as report.json's "workers_lost" lists it; `sent` is None when its records
    file could not be read (then what the master missed is unknown)."""
    return {"index": index, "client_id": client_id, "lost_at_s": at_s, "stage": stage, "users": users,
            "users_before": users_before, "users_after": max(users_before - users, 0), "stages": stages,
            "measured_sent": sent, "measured_received": received,
            "measured_unreceived": None if sent is None else max(sent - received, 0)}


def joined(index: int, client_id: str, at_s: float | None, stage: str | None) -> dict:
    """One worker that joined once the sweep ran, as report.json's "workers_joined" lists it."""
    return {"index": index, "client_id": client_id, "joined_at_s": at_s, "stage": stage}


def with_workers(report: dict, losses: list[dict], joins: list[dict], workers_end: int) -> dict:
    """`report` with its workers' story: the lists, the run's worker count at the end, and the
    `worker-lost` flag on every stage a loss overlapped (stages and bins alike)."""
    report["workers_lost"] = losses
    report["workers_joined"] = joins
    report["run"]["workers_end"] = workers_end
    bins = {b["name"]: b for b in report["bins"]}
    for stage in report["stages"]:
        for lost in (x for x in losses if stage["name"] in x["stages"]):
            stage["flags"].append({"flag": WORKER_LOST, "reason": f"worker {lost['index']} lost "
                                   f"{_at(lost['lost_at_s'])}: users {lost['users_before']} -> {lost['users_after']}"})
            if stage["name"] in bins and WORKER_LOST not in bins[stage["name"]]["flags"]:
                bins[stage["name"]]["flags"].append(WORKER_LOST)
    return report


def _at(seconds: float | None) -> str:
    return "before the sweep" if seconds is None else f"at {seconds:.1f} s"


def _unreceived(x: dict) -> str:
    if x["measured_unreceived"] is None:
        return f"{x['measured_received']} measured requests received; how many more it sent is unknown (no records file)"
    return f"{x['measured_unreceived']} of its {x['measured_sent']} measured requests never reached the master"


def loss_lines(report: dict) -> list[str]:
    """One line per lost or joined worker (the terminal's and the page's words)."""
    lines = [f"worker {x['index']} ({x['client_id']}) lost {_at(x['lost_at_s'])}"
             + (f" in stage {x['stage']}" if x["stage"] else "")
             + f", holding {x['users']} users (users {x['users_before']} -> {x['users_after']}); {_unreceived(x)}"
             for x in report.get("workers_lost", ())]
    lines += [f"worker {x['index']} ({x['client_id']}) joined {_at(x['joined_at_s'])}"
              + (f" in stage {x['stage']}" if x["stage"] else "") + ": its users started with an empty cache"
              for x in report.get("workers_joined", ())]
    return lines


def workers_html(report: dict) -> list[str]:
    """The page's section on workers lost or joined; nothing when the run kept its workers."""
    lost, joins = report.get("workers_lost") or [], report.get("workers_joined") or []
    if not lost and not joins:
        return []
    rows = [[str(x["index"]), x["client_id"], "lost", _at(x["lost_at_s"]), x["stage"] or "-",
             str(x["users"]), f"{x['users_before']} -> {x['users_after']}",
             "unknown" if x["measured_unreceived"] is None else str(x["measured_unreceived"])] for x in lost]
    rows += [[str(x["index"]), x["client_id"], "joined", _at(x["joined_at_s"]), x["stage"] or "-",
              "-", "-", "-"] for x in joins]
    header = ["worker", "client id", "event", "run clock", "stage", "users held", "users", "measured never received"]
    return ["<h2>Workers lost or joined</h2>", table(header, rows, text_cols=5)]
