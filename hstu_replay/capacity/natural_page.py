"""The page of `hstu-replay capacity natural`: every step, combined and shard by shard."""

from __future__ import annotations

from hstu_replay.output.page import escape, page, table
from hstu_replay.output.text import cell, fmt

HTML_NAME = "capacity_natural.html"


def _range(spread: dict | None, spec: str) -> str:
    return "" if spread is None else f"{spread['min']:{spec}}..{spread['max']:{spec}}"


def _step_row(step: dict) -> list[str]:
    m, c = step["measured"], step["computed"]
    return [f"{step['budget_tokens']:,}", step["servers"], f"{step['shards_measured']} of {step['servers']}",
            cell(c["hit_ratio"]), cell(c["window_hit_ratio"]), cell(m["hit_ratio"]),
            _range(step["spread"]["curve_ratio"], ".4f"), fmt(m["p99_ms"], ".1f"),
            _range(step["spread"]["measured_p99_ms"], ".1f"), cell(m["error_ratio"]), cell(m["throughput_rps"]),
            step["failed"]["requests"], step["failed"]["keys_replaced"],
            "meets" if step["passed"] else "; ".join(step["breaches"])]


def _shard_rows(step: dict) -> list[list[str]]:
    return [[f"{step['budget_tokens']:,}", step["servers"], s["shard"], cell(s["computed"]["hit_ratio"]),
             cell(s["computed"]["window_hit_ratio"]), cell(s["measured"]["hit_ratio"]),
             fmt(s["measured"]["p99_ms"], ".1f"), cell(s["measured"]["error_ratio"]),
             cell(s["measured"]["throughput_rps"]), s["failed"]["requests"], s["failed"]["keys_replaced"]]
            for s in step["shards"]]


def render_html(result: dict) -> str:
    answer = result["answer"]
    if answer is None:
        verdict = '<p class="verdict fail">No budget measured meets the SLO</p>'
    else:
        shards = (f", measured on {answer['shards_measured']} of {answer['servers']} shards"
                  if answer["servers"] > 1 else "")
        verdict = (f'<p class="verdict pass">{answer["budget_tokens"]:,} tokens per server x '
                   f"{escape(answer['servers'])} server(s){escape(shards)}</p>")
    sections = [
        "<h1>hstu-replay capacity natural</h1>", verdict,
        f"<p>SLO: p99 &lt;= {escape(result['slo']['p99_ms'])} ms, error ratio &lt;= "
        f"{escape(result['slo']['error_ratio'])}, at {escape(result['request_rate'])} req/s over all servers. "
        f"{escape(result['labels']['measured'])}.</p>",
        "<h2>Steps</h2>",
        table(["budget", "servers", "shards measured", "curve (log)", "curve (window)", "measured",
               "curve ratio over shards", "p99 ms (worst)", "p99 ms over shards", "error ratio", "requests/s",
               "failed", "keys replaced", "verdict"], (_step_row(s) for s in result["steps"]), text_last=True),
        "<h2>Each shard</h2>",
        table(["budget", "servers", "shard", "curve (log)", "curve (window)", "measured", "p99 ms",
               "error ratio", "requests/s", "failed", "keys replaced"],
              (row for s in result["steps"] for row in _shard_rows(s))),
    ]
    return page("hstu-replay capacity natural", sections)
