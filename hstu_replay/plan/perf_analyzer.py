"""A planned trace as perf_analyzer's `--input-data` JSON, so both tools replay the same requests.

perf_analyzer's real-input format (perf_analyzer docs/input_data.md) is one object,
`{"data": [entry, ...]}`, where each entry names every model input as
`{"content": [row-major values], "shape": [dims]}`. It sends the entries round-robin, in order,
on one stream at concurrency 1, so priming requests are written just before the request they
prime. The file is written one request at a time: a long trace never sits in memory whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from hstu_replay.errors import InputError
from hstu_replay.interface import ModelInterface
from hstu_replay.plan.workloads import StepSource
from hstu_replay.request import RequestTensors


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace, in send order; primes are sent but not measured."""

    request: RequestTensors
    is_prime: bool


@dataclass(frozen=True)
class TraceSummary:
    entries: int
    primes: int
    users: int  # user slots over every entry (sum of batch sizes)
    bytes_written: int

    @property
    def measured(self) -> int:
        return self.entries - self.primes


def plan_trace(source: StepSource, interface: ModelInterface, target: float, batch_size: int,
               requests: int) -> Iterator[TraceEntry]:
    """`requests` measured requests from a DumpSource/SessionSource, each after its prime.

    As in the load test, a model without a KV cache gets target 0 and no primes.
    """
    if not interface.uses_cache:
        target = 0.0
    for _ in range(requests):
        step = source.next_step(target, batch_size)
        if step.prime is not None and interface.uses_cache:
            yield TraceEntry(step.prime, True)
        yield TraceEntry(step.request, False)
        source.settle(step, True)  # a trace replays in order, every request answered


def entry_json(request: RequestTensors, interface: ModelInterface) -> bytes:
    """One `data` entry: exactly the model's inputs, int64 content as JSON numbers."""
    entry = {name: {"content": np.ascontiguousarray(array, dtype=np.int64), "shape": list(array.shape)}
             for name, array in request.inputs(interface).items()}
    return orjson.dumps(entry, option=orjson.OPT_SERIALIZE_NUMPY)


def write_trace(entries: Iterable[TraceEntry], interface: ModelInterface, out: str | Path) -> TraceSummary:
    """Stream `entries` to `out` (via a temporary file, renamed when complete)."""
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    count = primes = users = 0
    try:
        with partial.open("wb") as f:
            f.write(b'{"data":[\n')
            for entry in entries:
                if count:
                    f.write(b",\n")
                f.write(entry_json(entry.request, interface))
                count += 1
                primes += entry.is_prime
                users += entry.request.batch_size
            f.write(b"\n]}\n")
            size = f.tell()
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return TraceSummary(count, primes, users, size)


def read_trace(path: str | Path, interface: ModelInterface) -> list[RequestTensors]:
    """Parse a trace back into requests (checks shapes and the jagged layout)."""
    try:
        document = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror})") from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise InputError(f"{path}: no top-level \"data\" list")
    requests = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise InputError(f"{path}: entry {i} is not an object of input tensors")
        inputs = {}
        for name in interface.input_names:
            tensor = entry.get(name)
            if not isinstance(tensor, dict) or "content" not in tensor:
                raise InputError(f"{path}: entry {i} lacks {name} as {{\"content\", \"shape\"}}")
            try:
                array = np.asarray(tensor["content"], dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise InputError(f"{path}: entry {i} {name}: content is not a list of integers") from None
            if list(array.shape) != tensor.get("shape", list(array.shape)):
                raise InputError(f"{path}: entry {i} {name}: shape {tensor['shape']} but {array.size} values")
            inputs[name] = array
        requests.append(RequestTensors.from_inputs(inputs, interface))
    return requests
