"""What a server says of its model's limits: the parameters of its model configuration, and the
refusals that name a limit (`hstu_replay.client.limits`), read from texts written out by hand."""

from __future__ import annotations

import pytest

from hstu_replay.client.limits import limit_refusal, published_limits
from hstu_replay.errors import ServerError
from hstu_replay.interface import Limits

SMALL = {"hstu_max_batch": {"string_value": "8"}, "hstu_max_values": {"string_value": "4656"},
         "hstu_max_candidates": {"string_value": "32"}, "hstu_max_history_items": {"string_value": "256"}}


def test_the_parameters_are_read_from_grpc_and_http_configurations():
    expected = Limits(max_batch=8, max_values=4656, max_candidates=32, max_history=256)
    other = {"workspace-path": {"string_value": "/tmp/w"}}
    assert published_limits({"config": {"name": "m", "parameters": {**SMALL, **other}}}) == expected  # gRPC
    assert published_limits({"name": "m", "parameters": {**other, **SMALL}}) == expected  # HTTP


def test_a_configuration_without_them_publishes_none():
    assert published_limits({"config": {"name": "m", "parameters": {"workspace-path": {"string_value": "/w"}}}}) is None
    assert published_limits({"name": "m"}) is None


@pytest.mark.parametrize("parameters, says", [
    ({k: v for k, v in SMALL.items() if k != "hstu_max_values"}, "publishes some of its limits but not hstu_max_values"),
    ({**SMALL, "hstu_max_history_items": {"string_value": "many"}}, "hstu_max_history_items 'many': not a whole number"),
    ({**SMALL, "hstu_max_batch": {"string_value": "0"}}, "hstu_max_batch '0': not a whole number of at least 1"),
])
def test_a_malformed_set_is_one_line(parameters, says):
    with pytest.raises(ServerError, match=says) as caught:
        published_limits({"name": "m", "parameters": parameters})
    assert "\n" not in str(caught.value)


# the error a real tritonserver sent for a history of 300 items to the small model (pytriton's frontend)
PYTRITON = ("INTERNAL: Failed to process the request(s) for model 'hstu_gr_ranking_kvcache_0_0', message: "
            "TritonModelException: Model execute error: Traceback (most recent call last):\n  File ...\n"
            "hstu_replay.errors.LimitError: user 5: history of 300 items exceeds 256\n\nAt:\n  model.py(501): execute")


@pytest.mark.parametrize("error, line", [
    (PYTRITON, "the server refused a history of 300 items: its limit is 256; set --max-history 256 or less"),
    ("user 7: history of 2481 items exceeds 2000", "the server refused a history of 2,481 items: its limit is 2,000; "
                                                    "set --max-history 2000 or less"),
    ("user 3: 40 candidates exceed 32", "the server refused 40 candidates per user: its limit is 32; set --candidates "
                                        "32 or less"),
    ("batch of 9 users; the model takes at most 8", "the server refused a batch of 9 users: its limit is 8; set "
                                                    "--batch-sizes 8 or less"),
])
def test_a_refusal_naming_a_limit_names_the_option(error, line):
    assert limit_refusal(error).line() == line


@pytest.mark.parametrize("error", ["UNAVAILABLE: failed to connect", "response lacks output OUTPUT__0",
                                   "user 5: history shorter than the 86 held", ""])
def test_other_failures_name_no_limit(error):
    assert limit_refusal(error) is None


def test_a_refusal_without_the_limit_says_it_is_below():
    from hstu_replay.client.limits import RefusedLimit

    assert RefusedLimit("a history of 2,481 items", "--max-history", None).line() == (
        "the server refused a history of 2,481 items: its limit is below that; set --max-history")
