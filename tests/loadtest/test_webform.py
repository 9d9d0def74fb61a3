"""What a submitted web form may change (checked before Locust's /swarm applies it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.webform import FormPolicy, check_form
from tests.conftest import LOCUSTFILE, ROOT, free_ports, locust_command
from tests.loadtest.test_webaccess import interrupt
from tests.conftest import wait_until

HOST = "grpc://127.0.0.1:8001"


class Form(dict):
    """The part of werkzeug's form a check reads (keys, get)."""


def options(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(workload="dumps", dump_dir=str(tmp_path / "dumps"), report_dir=str(tmp_path / "r"),
                              store="", triton_url="", triton_protocol="grpc", triton_ssl=False, triton_headers="",
                              hit_ratios="0,1.0", stage_seconds=10.0, host=HOST, csv=None, web_host="127.0.0.1")


def check(form: dict, tmp_path, root=None, edit_target=False, host=HOST):
    base = {"user_count": "1", "spawn_rate": "1", "host": HOST}
    check_form(Form({**base, **form}), options(tmp_path), host, FormPolicy(root, edit_target), {})


def test_the_fields_the_form_shows_are_accepted(tmp_path):
    check({"hit_ratios": "0,0.5", "stage_seconds": "3", "run_time": "", "profile": ""}, tmp_path)


@pytest.mark.parametrize("form, message", [
    ({"report_dir": "/tmp/elsewhere"}, "--report-dir: paths are fixed"),
    ({"store": "/etc"}, "--store: paths are fixed"),
    ({"triton_root_cert": "/etc/ssl/x.pem"}, "--triton-root-cert: paths are fixed"),
    ({"triton_headers": "a=b"}, "triton_headers is secret"),
    ({"triton_url": "10.0.0.1:8001"}, "the target address is the Host field"),
    ({"triton_ssl": "true"}, "the target address is the Host field"),
    ({"csv": "/tmp/x"}, "csv: not an option the web form may set"),  # a Locust option the form does not show
    ({"web_host": "0.0.0.0"}, "web_host: not an option"),
    ({"host": "grpc://10.0.0.1:8001"}, "the target address is fixed to grpc://127.0.0.1:8001"),
    ({"hit_ratios": "half"}, "--hit-ratios 'half'"),
    ({"stage_seconds": "soon"}, "--stage-seconds 'soon': expected a float"),
])
def test_what_the_form_may_not_set_is_refused(form, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        check(form, tmp_path)


def test_an_unchanged_path_is_not_an_edit(tmp_path):
    check({"report_dir": str(tmp_path / "r"), "dump_dir": str(tmp_path / "dumps")}, tmp_path)


def test_paths_below_the_root_only_after_resolving(tmp_path):
    root = (tmp_path / "root").resolve()
    (root / "inside").mkdir(parents=True)
    os.symlink("/etc", root / "escape")
    check({"report_dir": str(root / "inside" / "new")}, tmp_path, root=root)
    check({"report_dir": str(root / "inside" / ".." / "other")}, tmp_path, root=root)
    for outside in (str(root / ".." / "sibling"), str(root / "escape" / "x"), "/tmp", str(root) + "-twin"):
        with pytest.raises(ConfigError, match="outside --web-paths-root"):
            check({"report_dir": outside}, tmp_path, root=root)


def test_the_host_field_changes_the_target_only_when_opted_in(tmp_path):
    check({"host": "https://127.0.0.1:8443"}, tmp_path, edit_target=True)
    with pytest.raises(ConfigError, match="use grpc://, grpcs://"):
        check({"host": "ftp://127.0.0.1:1"}, tmp_path, edit_target=True)
    check({"host": HOST}, tmp_path)  # the form sends the shown address back: not an edit


def test_an_option_the_form_renames_is_checked_and_applied(tmp_path):
    from hstu_replay.loadtest.webform import apply_renamed, form_name

    # what Locust's page submits for --max-p99-ms (seen from a real browser: tests/loadtest/test_browser.py)
    assert form_name("max_p99_ms") == "max_p9_9ms" and form_name("hit_ratios") == "hit_ratios"
    check({"max_p9_9ms": "250"}, tmp_path)
    with pytest.raises(ConfigError, match="max-p99-ms"):
        check({"max_p9_9ms": "soon"}, tmp_path)
    opts = argparse.Namespace(max_p99_ms="", hit_ratios="0,1.0")
    apply_renamed(Form({"max_p9_9ms": "0:300,1.0:120", "hit_ratios": "0,0.5"}), opts)
    assert (opts.max_p99_ms, opts.hit_ratios) == ("0:300,1.0:120", "0,1.0")  # /swarm itself sets hit_ratios


# -- real runs: a secret never leaves the process it was given to --------------------------------------------

SENTINEL = "SENTINEL-9d41c7"
SPY = Path(__file__).with_name("options_spy.py")


def spied_locust(tmp_path: Path, name: str, *args: str, secret: str | None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HSTU_OPTIONS_SPY=str(tmp_path / f"{name}.spy.jsonl"))
    env.pop("LOCUST_TRITON_HEADERS", None)
    if secret is not None:
        env["LOCUST_TRITON_HEADERS"] = f"x-hstu-probe={secret}"
    with (tmp_path / f"{name}.log").open("w") as log:
        return subprocess.Popen(locust_command("-f", f"{LOCUSTFILE},{SPY}", "--loglevel", "DEBUG", *args),
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def spied(tmp_path: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / f"{name}.spy.jsonl").read_text().splitlines()]


def leaks(texts: dict[str, str], directory: Path, secret: str) -> list[str]:
    where = [name for name, text in texts.items() if secret in text]
    return where + [str(p) for p in directory.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.integration
def test_a_secret_never_reaches_the_page_the_api_the_reports_or_the_log(triton_server, reference_dumps, tmp_path):
    (port,) = free_ports(1)
    base, report = f"http://127.0.0.1:{port}", tmp_path / "report"
    process = spied_locust(tmp_path, "local", "--web-port", str(port), "--host", f"grpc://{triton_server.grpc_url}",
                           "--workload", "dumps", "--dump-dir", str(reference_dumps), "--hit-ratios", "0,1.0",
                           "--stage-seconds", "2", "--warmup-seconds", "0.5", "--max-history", "256",
                           "--report-dir", str(report), secret=SENTINEL)
    texts = {}

    def fetch(path: str, form: dict | None = None) -> str:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        with urllib.request.urlopen(urllib.request.Request(base + path, data=data), timeout=10) as response:
            texts[f"{'POST' if data else 'GET'} {path} #{len(texts)}"] = text = response.read().decode(errors="replace")
        return text

    try:
        wait_until(lambda: json.loads(fetch("/stats/requests"))["state"] == "ready", 60, "the web UI")
        fetch("/")
        refused = json.loads(fetch("/swarm", {"user_count": 1, "spawn_rate": 1, "triton_headers": "x=y"}))
        assert not refused["success"] and "secret" in refused["message"]
        assert json.loads(fetch("/swarm", {"user_count": 2, "spawn_rate": 2,
                                           "host": f"grpc://{triton_server.grpc_url}"}))["success"]
        wait_until(lambda: json.loads(fetch("/stats/requests"))["state"] == "running", 30, "the run")
        fetch("/hstu/report.html")
        wait_until(lambda: json.loads(fetch("/stats/requests"))["state"] == "stopped", 90, "the run's end")
        wait_until(lambda: (report / "report.json").is_file(), 10, "the report")
        for path in ("/", "/stats/report", "/stats/requests/csv", "/stats/failures/csv", "/exceptions/csv", "/logs",
                     "/hstu/report.html"):
            fetch(path)
    finally:
        interrupt(process)
    texts["log"] = (tmp_path / "local.log").read_text()
    assert leaks(texts, report, SENTINEL) == []
    (seen,) = spied(tmp_path, "local")
    assert seen["headers"] == f"x-hstu-probe={SENTINEL}"  # the run used it...
    assert SENTINEL not in json.dumps(seen["options"])  # ...from outside Locust's options
    data = json.loads((report / "report.json").read_text())
    assert sum(b["requests"] for b in data["bins"]) > 0 and not data["errors"]


@pytest.mark.integration
def test_a_worker_uses_its_own_secret_and_never_receives_the_masters(triton_server, reference_dumps, tmp_path):
    (port,) = free_ports(1)
    report = tmp_path / "report"
    master = spied_locust(tmp_path, "master", "--master", "--headless", "-u", "2", "-r", "2", "--expect-workers", "1",
                          "--expect-workers-max-wait", "90", "--master-bind-port", str(port),
                          "--host", f"grpc://{triton_server.grpc_url}", "--workload", "dumps", "--dump-dir",
                          str(reference_dumps), "--hit-ratios", "0", "--stage-seconds", "3", "--warmup-seconds", "0.5",
                          "--max-history", "256", "--report-dir", str(report), secret=SENTINEL)
    worker = spied_locust(tmp_path, "worker", "--worker", "--master-port", str(port), "--report-dir", str(report),
                          secret="worker-own")
    try:
        assert master.wait(180) == 0, (tmp_path / "master.log").read_text()[-3000:]
        worker.wait(60)
    finally:
        for p in (master, worker):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    (on_worker,) = spied(tmp_path, "worker")
    assert on_worker["headers"] == "x-hstu-probe=worker-own"
    assert on_worker["host"] == f"grpc://{triton_server.grpc_url}"  # the target did come from the master
    texts = {"worker spy": json.dumps(on_worker), "worker log": (tmp_path / "worker.log").read_text(),
             "master log": (tmp_path / "master.log").read_text()}
    assert leaks(texts, report, SENTINEL) == []
    assert spied(tmp_path, "master")[0]["headers"] == f"x-hstu-probe={SENTINEL}"


def test_with_an_editable_target_the_host_field_takes_a_fleet_but_never_a_file_to_read(tmp_path):
    (tmp_path / "dumps").mkdir()
    check({"host": "grpc://127.0.0.1:8001,grpc://127.0.0.1:8011", "routing": "round-robin"}, tmp_path,
          edit_target=True)
    listed = tmp_path / "fleet.txt"
    listed.write_text("127.0.0.1:8001\n")
    with pytest.raises(ConfigError, match="not an @file to read"):
        check({"host": f"@{listed}"}, tmp_path, edit_target=True)
    with pytest.raises(ConfigError, match="is given twice"):
        check({"host": "127.0.0.1:8001,127.0.0.1:8001"}, tmp_path, edit_target=True)
    with pytest.raises(ConfigError, match="the target address is fixed"):
        check({"host": "grpc://127.0.0.1:8001,grpc://127.0.0.1:8011"}, tmp_path)
