"""Freed request buffers stay in the heap: a request's half-megabyte buffers, freed and allocated
again, are not faulted in anew. Measured in fresh processes (the setting is process-wide), by
page-fault counts."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import numpy as np
if sys.argv[1] == "kept":
    from hstu_replay.client.heap import keep_freed_memory
    assert keep_freed_memory()
def request():  # a full-length request's values (537 KB), its encoded message, its answer: all freed
    values = np.ones(67_184, dtype=np.int64)
    message = values.tobytes() + b"header"
    answer = np.ones(2 * 67_184, dtype=np.int64)
    return len(message) + len(answer)
for _ in range(5):
    request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    request()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""


def faults_per_request(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_request_buffers_are_reused_without_page_faults():
    assert faults_per_request("default") > 50  # glibc hands the freed top of the heap back each time
    assert faults_per_request("kept") < 1
