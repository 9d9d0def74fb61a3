"""The Locust user: plan a step, prime if needed, send, verify, account. One key in flight each."""

from __future__ import annotations

import random
import time

import gevent
from locust import User, constant, task

from hstu_replay.client.limits import limit_refusal
from hstu_replay.errors import HstuReplayError, ServerUnavailable
from hstu_replay.loadtest.runtime import ActiveRun
from hstu_replay.loadtest.schedule import StagePosition
from hstu_replay.plan.arrivals import ArrivalClock
from hstu_replay.plan.keys import route_key
from hstu_replay.plan.step import PlannedStep
from hstu_replay.request import RequestTensors
from hstu_replay.stats.accounting import Outcome, Sent
from hstu_replay.stats.causes import cause_of
from hstu_replay.verify import compare

IDLE_S = 0.05  # before the sweep starts (users still spawning) and after it ends
PLAN_BACKOFF_S = 1.0  # after a step that could not be planned
BACKOFF_S = (0.05, 1.0)  # while the server refuses requests: first wait, doubling up to the last


class MismatchError(Exception):
    """A response whose logits differ from the reference beyond the tolerance."""


class HstuUser(User):
    """Replays one stream of HSTU requests against Triton (closed loop, no think time)."""

    wait_time = constant(0)

    def on_start(self):
        self.run: ActiveRun | None = self.environment.hstu.run
        if self.run is None:  # the run failed to prepare and is being stopped: send nothing
            return
        self.index = self.run.new_user_index()
        self.clients: dict = {}  # server index -> its client, opened at the first request to it
        self.source = self.run.source_for(self.index)
        self.rng = random.Random(self.run.config.data.seed * 7919 + self.index)
        self.arrivals: ArrivalClock | None = None
        self.epoch = self.run.fleet.epoch  # of the servers' caches, as this user planned for them
        self.backoff = 0.0

    def _arrival_clock(self) -> ArrivalClock | None:
        """Open loop: this user's share of the rate, from the sweep's start."""
        sweep = self.run.config.sweep
        if not sweep.arrival.open:
            return None
        options = self.environment.parsed_options  # the master's -u reaches workers as hstu_total_users
        users = int(getattr(options, "hstu_total_users", 0) or getattr(options, "num_users", 0) or 1)
        return ArrivalClock(sweep.arrival.value, sweep.request_rate / max(users, 1), self.run.clock.started_at,
                            self.rng)

    def on_stop(self):
        for client in getattr(self, "clients", {}).values():
            client.close()

    def _client(self, server: int):
        if server not in self.clients:
            self.clients[server] = self.run.open_client(server)
        return self.clients[server]

    @task
    def replay(self):
        run = self.run
        if run is None or not run.clock.started or run.clock.over() or self.source.exhausted:
            gevent.sleep(IDLE_S)
            return
        intended = None
        if run.prepared.paced_by_arrivals:
            self.arrivals = self.arrivals or self._arrival_clock()
            intended = self.arrivals.next()
        position = run.clock.position(intended)
        if position is None:
            gevent.sleep(IDLE_S)
            return
        if self.epoch != run.fleet.epoch:  # a server came back empty: plan afresh
            self.source.reset()
            self.epoch = run.fleet.epoch
        key = position.stage.key
        try:
            step = self.source.next_step(key.goal_ratio if run.prepared.caches else 0.0, key.batch_size)
        except HstuReplayError as exc:  # counted, said once, and no tight loop
            run.stats.count_error(f"planning: {exc}")
            run.say_once(f"a step could not be planned: {exc}")
            gevent.sleep(PLAN_BACKOFF_S)
            return
        if step.send_at_s is not None:  # natural replay: the request goes at its own time
            intended = run.clock.started_at + step.send_at_s
            position = run.clock.position(intended)
            if position is None:  # after the end of the sweep: not sent
                run.fleet.retire(self.source.settle(step, False))
                return
        kind = "warmup" if position.warming_up else "measure"
        sent = None
        if step.prime is not None and run.prepared.caches:  # sent before the intended time: not charged
            sent = self._send("warmup" if position.warming_up else "prime", step, step.prime, position, prime=True)
        if sent is None or sent.outcome.ok:
            if intended is not None:
                gevent.sleep(min(max(intended - time.monotonic(), 0.0), run.prepared.schedule.duration_s))
            sent = self._send(kind, step, step.request, position, intended)
        else:  # without its prime the request cannot be what the stage measures: it fails with it, where
            # the prime failed (routing it would take a balancer's turn for a request never sent)
            run.accountant.file(Sent(kind, position.stage.key, step.request, step.expected_hits,
                                     (0,) * step.request.batch_size,
                                     Outcome(0.0, error="not sent: its priming request failed"), step.label,
                                     self.index, server=sent.server))
        outcome = sent.outcome
        retired = self.source.settle(step, outcome.ok)
        if run.prepared.caches:
            run.fleet.retire(retired)
        if outcome.refused:  # the server is away: back off instead of a storm of failures
            self.backoff = min(max(self.backoff * 2, BACKOFF_S[0]), BACKOFF_S[1])
            gevent.sleep(self.backoff)
        else:
            self.backoff = 0.0

    def _send(self, kind: str, step: PlannedStep, request: RequestTensors, position: StagePosition,
              intended: float | None = None, prime: bool = False) -> Sent:
        """Send one request and file it (what is filed is returned); a failed one leaves its keys'
        server state unknown."""
        run = self.run
        caches = run.prepared.caches
        server = run.fleet.route(request)
        predicted = run.fleet.predict(server, request) if caches else None
        start = time.monotonic()
        try:
            routed = route_key(int(request.user_ids[0])) if run.config.target.routing_header else None
            response = self._client(server.index).infer(request, routed)
            outcome = Outcome(response.latency_s, response.logits, response.cached_tokens,
                              host_cached_tokens=response.host_cached_tokens)
        except HstuReplayError as exc:
            outcome = Outcome(time.monotonic() - start, error=str(exc), refused=isinstance(exc, ServerUnavailable))
            if caches:
                run.fleet.forget(server, request)
            refused = limit_refusal(outcome.error)
            if refused is not None:  # a limit the server did not publish: every request like it would fail
                self.environment.hstu.stop_run(refused.line())
        if outcome.refused:
            server.availability.refused(position.stage.key)
        elif server.availability.answered():
            run.fleet.lost_cache(server)
        label = step.label + " (prime)" if prime else step.label
        if kind == "measure" and self.epoch != run.fleet.epoch:  # its plan assumed the lost cache
            kind, label = "warmup", label + " (planned before the server restarted)"
        if intended is not None:
            outcome.lag_s = max(start - intended, 0.0)
        # Locust's failure table groups by message: it gets the cause (the example stays in our report)
        exception = RuntimeError(cause_of(outcome.error)) if outcome.error else None
        if not prime and outcome.ok and step.reference is not None:
            checks = run.config.checks
            if self.rng.random() < checks.verify_fraction:
                outcome.verdict = compare(outcome.logits, step.reference, request.num_candidates, checks.tolerance)
                if not outcome.verdict.ok:
                    v = outcome.verdict
                    user = int(request.users()[v.worst_user].user_id) if v.worst_user >= 0 else -1
                    outcome.mismatch = (f"mismatch in {step.label}: user {user} max |diff| {v.max_abs_diff:.4g} "
                                        f"> {checks.tolerance} {v.reason}").rstrip()
                    exception = MismatchError(cause_of(outcome.mismatch))
        hits = (0,) * request.batch_size if prime else step.expected_hits
        sent = Sent(kind, position.stage.key, request, hits, predicted.hits if predicted else (0,) * request.batch_size,
                    outcome, label, self.index, predicted.host if predicted else (), server.index)
        run.accountant.file(sent)
        if kind == "measure" and outcome.ok:
            run.clock.measured(position.stage)
        self.environment.events.request.fire(
            request_type=run.config.target.protocol.value, name=request_name(position, "prime" if prime else kind),
            response_time=outcome.latency_s * 1e3, response_length=0 if outcome.logits is None else outcome.logits.nbytes,
            exception=exception, context={"label": step.label},
        )
        return sent


def request_name(position: StagePosition, kind: str) -> str:
    """Locust's name for a request: its stage, and what it was for when not measured."""
    key = position.stage.key
    return key.name().replace("_", " ") + {"measure": "", "warmup": " warm-up", "prime": " prime"}[kind]
