"""The client's checks on what comes back: a malformed answer is a failed request, in one line."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.client.triton import _output
from hstu_replay.errors import ServerError
from hstu_replay.interface import INTERFACES, KVCACHE


class _Result:
    """The one method of tritonclient's InferResult the check reads."""

    def __init__(self, **outputs):
        self.outputs = outputs

    def as_numpy(self, name):
        return self.outputs.get(name)


def test_an_answer_of_the_implied_shape_passes():
    logits = np.zeros((12, 8), np.float32)
    assert _output(_Result(OUTPUT__0=logits), "OUTPUT__0", (12, 8)) is logits


@pytest.mark.parametrize("outputs, message", [
    ({}, "response lacks output OUTPUT__0"),
    ({"OUTPUT__0": np.zeros((11, 8), np.float32)}, "has shape [11, 8]; the request implies [12, 8]"),
    ({"OUTPUT__0": np.zeros(96, np.float32)}, "has shape [96]"),
])
def test_a_missing_or_misshapen_output_is_a_server_error(outputs, message):
    with pytest.raises(ServerError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _output(_Result(**outputs), "OUTPUT__0", (12, 8))


def test_only_the_kvcache_model_is_treated_as_cached():
    # The Python-backend model takes user ids but keeps no cache.
    assert {name for name, i in INTERFACES.items() if i.uses_cache} == {KVCACHE.name}


def test_a_server_that_is_not_there_is_told_apart_from_a_failed_request():
    from tritonclient.utils import InferenceServerException

    from hstu_replay.client.triton import _unavailable

    assert _unavailable(ConnectionRefusedError(111, "Connection refused"))  # HTTP, nothing listening
    assert _unavailable(InferenceServerException("failed to connect", status="StatusCode.UNAVAILABLE"))
    assert _unavailable(InferenceServerException("Request for unknown model: 'm' is not found",
                                                 status="StatusCode.NOT_FOUND"))  # back, model loading
    assert not _unavailable(InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED"))
    assert not _unavailable(InferenceServerException("model failed", status="StatusCode.INTERNAL"))
