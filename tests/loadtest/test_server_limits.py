"""A run's limits against the ones the server publishes (`loadtest.server_limits`): defaults capped,
values given beyond them refused in one line, hand-worked."""

from __future__ import annotations

import argparse

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.server_limits import Cap, caps_line, fit_to_server, server_limits_section

#: the reference server's small model: 8 users of 6 + 2 x (256 + 32) values
SMALL = Limits(max_batch=8, max_values=4656, max_candidates=32, max_history=256)


def config(tmp_path, **given) -> LoadTestConfig:
    return LoadTestConfig.from_options(argparse.Namespace(workload="dumps", dump_dir=str(tmp_path), **given))


def test_defaults_beyond_the_server_are_capped_to_its_limits(tmp_path):
    fitted, caps = fit_to_server(config(tmp_path, batch_sizes="1,8"), SMALL)
    assert caps == (Cap("--max-history", 4096, 256), Cap("--max-values", 40_000, 4656))
    assert (fitted.data.max_history, fitted.data.max_values) == (256, 4656)
    assert (fitted.options["max_history"], fitted.options["max_values"]) == (256, 4656)  # report.json's options
    # batch 8, 16 candidates: (4656 // 8 - 6) // 2 - 16 = 272 items, above 256: the history limit holds
    assert fitted.data.limits.history_cap(8, 16) == 256
    assert caps_line(caps) == ("the server's model publishes its limits: --max-history 256 instead of the default "
                               "4,096, --max-values 4,656 instead of the default 40,000")
    assert server_limits_section(SMALL, caps) == {
        "published": {"max_batch": 8, "max_values": 4656, "max_candidates": 32, "max_history": 256},
        "caps": [{"option": "--max-history", "asked": 4096, "used": 256},
                 {"option": "--max-values", "asked": 40_000, "used": 4656}]}


def test_values_within_the_limits_are_kept(tmp_path):
    given = config(tmp_path, max_history=200, max_values=3000)
    assert fit_to_server(given, SMALL) == (given, ())
    assert fit_to_server(config(tmp_path), None) == (config(tmp_path), ())  # a server that publishes none
    assert server_limits_section(None, ()) is None


def test_a_default_within_a_large_server_s_limit_is_kept(tmp_path):
    roomy = Limits(max_batch=8, max_values=67_184, max_candidates=100, max_history=4096)
    fitted, caps = fit_to_server(config(tmp_path), roomy)
    assert caps == () and (fitted.data.max_history, fitted.data.max_values) == (4096, 40_000)


@pytest.mark.parametrize("given, line", [
    ({"max_history": 1000}, "--max-history 1000: the server's model takes at most 256 history items (it publishes "
                            "hstu_max_history_items); give --max-history 256 or less, or leave it out to take the "
                            "server's limit"),
    ({"max_values": 5000}, "--max-values 5000: the server's model takes at most 4,656 values per request (it "
                           "publishes hstu_max_values); give --max-values 4656 or less"),
    ({"candidates": 40}, "--candidates 40: the server's model takes at most 32 candidates per user (it publishes "
                         "hstu_max_candidates); give --candidates 32 or less"),
])
def test_a_value_given_beyond_the_server_is_refused_in_one_line(tmp_path, given, line):
    with pytest.raises(ConfigError) as caught:
        fit_to_server(config(tmp_path, **given), SMALL)
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_batch_sizes_beyond_the_server_are_refused(tmp_path):
    four = Limits(max_batch=4, max_values=40_000, max_candidates=100, max_history=4096)
    with pytest.raises(ConfigError, match=r"--batch-sizes 1,8: the server's model takes at most 4 users per request "
                                          r"\(it publishes hstu_max_batch\); give batch sizes of 4 or less"):
        fit_to_server(config(tmp_path, batch_sizes="1,8"), four)
