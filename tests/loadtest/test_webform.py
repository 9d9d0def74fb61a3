"""What a submitted web form may change (checked before Locust's /swarm applies it)."""

from __future__ import annotations

import argparse
import os

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.webform import FormPolicy, check_form

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
