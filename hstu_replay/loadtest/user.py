"""The Locust user: plan a step, prime if needed, send, verify, account. One key in flight each."""

from __future__ import annotations

import random
import time

import gevent
from locust import User, constant, task

from hstu_replay.errors import HstuReplayError
from hstu_replay.loadtest.runtime import LoadTestRuntime, Outcome
from hstu_replay.plan.arrivals import ArrivalClock
from hstu_replay.plan.dumps import DumpSource
from hstu_replay.plan.sessions import SessionSource
from hstu_replay.plan.step import PlannedStep
from hstu_replay.verify import compare


class MismatchError(Exception):
    """A response whose logits differ from the reference beyond the tolerance."""


def _sessions(runtime: LoadTestRuntime, index: int):
    store, config = runtime.store, runtime.config
    order = list(range(len(store)))
    random.Random(config.seed).shuffle(order)
    start = (runtime.worker_index * 4096 + index) % len(order)
    users = order[start:] + order[:start]
    return SessionSource(store, users, runtime.keys_for(index), config.candidates, config.limits)


def _dumps(runtime: LoadTestRuntime, index: int):
    pool = runtime.dump_pool
    offset = (runtime.worker_index * 4096 + index) % len(pool)
    return DumpSource(pool[offset:] + pool[:offset], runtime.keys_for(index), runtime.config.limits)


#: --workload name -> source factory
SOURCES = {"sessions": _sessions, "dumps": _dumps}


class HstuUser(User):
    """Replays one stream of HSTU requests against Triton (closed loop, no think time)."""

    wait_time = constant(0)

    def on_start(self):
        self.runtime: LoadTestRuntime = self.environment.hstu
        self.index = self.runtime.new_user_index()
        self.client = self.runtime.open_client()
        self.source = SOURCES[self.runtime.config.workload](self.runtime, self.index)
        self.rng = random.Random(self.runtime.config.seed * 7919 + self.index)
        self.clock = self._arrival_clock()

    def _arrival_clock(self) -> ArrivalClock | None:
        config = self.runtime.config
        if config.arrival == "closed":
            return None
        options = self.environment.parsed_options  # the master's -u reaches workers as hstu_total_users
        users = int(getattr(options, "hstu_total_users", 0) or getattr(options, "num_users", 0) or 1)
        return ArrivalClock(config.arrival, config.request_rate / max(users, 1), time.monotonic(), self.rng)

    def on_stop(self):
        self.client.close()

    @task
    def replay(self):
        intended = None
        if self.clock is not None:  # open loop: wait for this request's intended send time
            intended = self.clock.next()
            gevent.sleep(min(max(intended - time.monotonic(), 0.0), self.runtime.schedule.duration_s))
        position = self.runtime.position()
        if position is None:  # the sweep is over: idle until the runner stops us
            gevent.sleep(0.2)
            return
        target = position.stage.key.target_ratio if self.runtime.binding.interface.uses_cache else 0.0
        step = self.source.next_step(target, position.stage.key.batch_size)
        if step.prime is not None and self.runtime.binding.interface.uses_cache:
            self._send("prime", step, step.prime, position)
        self._send("warmup" if position.warming_up else "measure", step, step.request, position, intended)

    def _send(self, kind: str, step: PlannedStep, request, position, intended: float | None = None) -> None:
        runtime = self.runtime
        predicted = runtime.predict_hits(request) if runtime.binding.interface.uses_cache else (0,) * request.batch_size
        start = time.monotonic()
        try:
            response = self.client.infer(request)
            outcome = Outcome(time.monotonic() - start, response.logits, response.cached_tokens)
        except HstuReplayError as exc:
            outcome = Outcome(time.monotonic() - start, error=str(exc))
        if intended is not None:
            outcome.lag_s = max(start - intended, 0.0)
            if runtime.binding.interface.uses_cache:
                runtime.forget(request)
        exception = RuntimeError(outcome.error) if outcome.error else None
        if kind != "prime" and not outcome.error and step.reference is not None:
            if self.rng.random() < runtime.config.verify_fraction:
                outcome.verdict = compare(outcome.logits, step.reference, request.num_candidates,
                                          runtime.config.tolerance)
                if not outcome.verdict.ok:
                    v = outcome.verdict
                    user = int(request.users()[v.worst_user].user_id) if v.worst_user >= 0 else -1
                    outcome.mismatch = (f"mismatch in {step.label}: user {user} max |diff| {v.max_abs_diff:.4g} "
                                        f"> {runtime.config.tolerance} {v.reason}").rstrip()
                    exception = MismatchError(outcome.mismatch)
        runtime.account(kind, step if kind != "prime" else _as_step(step, request),
                        position, predicted, outcome, self.index)
        key = position.stage.key
        name = f"b{key.batch_size} h{key.target_ratio:.2f}" + {"measure": "", "warmup": " warm-up", "prime": " prime"}[kind]
        self.environment.events.request.fire(
            request_type=runtime.config.triton_protocol, name=name, response_time=outcome.latency_s * 1e3,
            response_length=0 if outcome.logits is None else outcome.logits.nbytes, exception=exception,
            context={"label": step.label},
        )


def _as_step(step: PlannedStep, request) -> PlannedStep:
    return PlannedStep(request=request, expected_hits=(0,) * request.batch_size, label=step.label + " (prime)")
