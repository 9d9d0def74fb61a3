"""The Locust user: plan a step, prime if needed, send, verify, account. One key in flight each."""

from __future__ import annotations

import random
import time

import gevent
from locust import User, constant, task

from hstu_replay.client.limits import limit_refusal
from hstu_replay.errors import HstuReplayError, ServerUnavailable
from hstu_replay.loadtest.fleet import Server
from hstu_replay.loadtest.runtime import ActiveRun
from hstu_replay.loadtest.schedule import StagePosition
from hstu_replay.plan.arrivals import ArrivalClock
from hstu_replay.plan.keys import route_key
from hstu_replay.plan.step import PlannedStep
from hstu_replay.plan.tiers import TierHits
from hstu_replay.request import RequestTensors
from hstu_replay.stats.accounting import Outcome, Sent
from hstu_replay.stats.causes import cause_of
from hstu_replay.verify import Verdict, compare

IDLE_S = 0.05  # before the sweep starts (users still spawning) and after it ends
PLAN_BACKOFF_S = 1.0  # after a step that could not be planned
BACKOFF_S = (0.05, 1.0)  # while the server refuses requests: first wait, doubling up to the last


class MismatchError(Exception):
    """A response whose logits differ from the reference beyond the tolerance."""


class HstuUser(User):
    """Replays one stream of HSTU requests against Triton (closed loop, no think time)."""

    wait_time = constant(0)

    def on_start(self):
        self.active: ActiveRun | None = self.environment.hstu.run  # (`run` is Locust's User.run)
        if self.active is None:  # the run failed to prepare and is being stopped: send nothing
            return
        prepared, live = self.active.prepared, self.active.live
        self.clock, self.fleet, self.accountant = live.clock, live.fleet, live.accountant
        self.caches = prepared.caches  # hit ratios apply: primes sent, predictions made, keys retired
        self.paced = prepared.paced_by_arrivals
        self.config = prepared.config
        self.index = live.new_user_index()
        self.clients: dict = {}  # server index -> its client, opened at the first request to it
        self.source = live.source_for(self.index)
        self.rng = random.Random(self.config.data.seed * 7919 + self.index)
        self.arrivals: ArrivalClock | None = None
        self.epoch = self.fleet.epoch  # of the servers' caches, as this user planned for them
        self.backoff = 0.0

    def _arrival_clock(self) -> ArrivalClock | None:
        """Open loop: this user's share of the rate, from the sweep's start."""
        sweep = self.config.sweep
        if not sweep.arrival.open:
            return None
        options = self.environment.parsed_options  # the master's -u reaches workers as hstu_total_users
        users = int(getattr(options, "hstu_total_users", 0) or getattr(options, "num_users", 0) or 1)
        return ArrivalClock(sweep.arrival.value, sweep.request_rate / max(users, 1), self.clock.started_at, self.rng)

    def on_stop(self):
        for client in getattr(self, "clients", {}).values():
            client.close()

    def _client(self, server: int):
        if server not in self.clients:
            self.clients[server] = self.active.live.open_client(server)
        return self.clients[server]

    @task
    def replay(self):
        """One step of this user's stream: when it is due, planned, its requests sent, settled."""
        if self.active is None or not self.clock.started or self.clock.over() or self.source.exhausted:
            gevent.sleep(IDLE_S)
            return
        intended = self._next_arrival() if self.paced else None
        position = self.clock.position(intended)
        if position is None:
            gevent.sleep(IDLE_S)
            return
        step = self._plan(position)
        if step is None:
            return
        if step.send_at_s is not None:  # natural replay: the request goes at its own time
            intended = self.clock.started_at + step.send_at_s
            position = self.clock.position(intended)
            if position is None:  # after the end of the sweep: not sent
                self.fleet.retire(self.source.settle(step, False))
                return
        self._settle(step, self._send_step(step, position, intended).outcome)

    def _next_arrival(self) -> float:
        """Open loop: when this user's next request is due."""
        self.arrivals = self.arrivals or self._arrival_clock()
        return self.arrivals.next()

    def _plan(self, position: StagePosition) -> PlannedStep | None:
        """The next step for the stage (planned afresh where a server came back empty); None where it
        could not be planned: counted, said once, and no tight loop."""
        if self.epoch != self.fleet.epoch:
            self.source.reset()
            self.epoch = self.fleet.epoch
        key = position.stage.key
        try:
            return self.source.next_step(key.goal_ratio if self.caches else 0.0, key.batch_size)
        except HstuReplayError as exc:
            self.active.figures.stats.count_error(f"planning: {exc}")
            self.active.live.notices.say_once(f"a step could not be planned: {exc}")
            gevent.sleep(PLAN_BACKOFF_S)
            return None

    def _send_step(self, step: PlannedStep, position: StagePosition, intended: float | None) -> Sent:
        """The step's priming request where the target needs one (sent before the intended time: not
        charged), then its request at the intended time. Returned: the request as filed, or the failed
        prime that kept it from being sent (its outcome, a refusal among them, settles the step)."""
        kind = "warmup" if position.warming_up else "measure"
        if step.prime is not None and self.caches:
            primed = self._send("warmup" if position.warming_up else "prime", step, step.prime, position, prime=True)
            if not primed.outcome.ok:
                self._file_unsent(kind, step, position, primed.server)
                return primed
        if intended is not None:
            gevent.sleep(min(max(intended - time.monotonic(), 0.0), self.active.prepared.schedule.duration_s))
        return self._send(kind, step, step.request, position, intended)

    def _file_unsent(self, kind: str, step: PlannedStep, position: StagePosition, server: int) -> None:
        """Without its prime the request cannot be what the stage measures: it fails with it, where the
        prime failed (routing it would take a balancer's turn for a request never sent)."""
        request = step.request
        self.accountant.file(Sent(kind, position.stage.key, request, step.expected_hits, (0,) * request.batch_size,
                                  Outcome(0.0, error="not sent: its priming request failed"), step.label, self.index,
                                  server=server))

    def _settle(self, step: PlannedStep, outcome: Outcome) -> None:
        """The step's keys retired where the source is done with them; while the server refuses
        requests, a back-off instead of a storm of failures."""
        retired = self.source.settle(step, outcome.ok)
        if self.caches:
            self.fleet.retire(retired)
        if outcome.refused:
            self.backoff = min(max(self.backoff * 2, BACKOFF_S[0]), BACKOFF_S[1])
            gevent.sleep(self.backoff)
        else:
            self.backoff = 0.0

    def _send(self, kind: str, step: PlannedStep, request: RequestTensors, position: StagePosition,
              intended: float | None = None, prime: bool = False) -> Sent:
        """One request: routed, its hits predicted, sent, checked and filed (what is filed is returned)."""
        server = self.fleet.route(request)
        predicted = self.fleet.predict(server, request) if self.caches else None
        outcome = self._infer(server, request, position, intended)
        if not prime:
            self._check(outcome, step, request)
        return self._file(kind, step, request, position, server, predicted, outcome, prime)

    def _infer(self, server: Server, request: RequestTensors, position: StagePosition,
               intended: float | None) -> Outcome:
        """Sending: the answer, or the failure (which leaves the request's keys' state at the server
        unknown); the server's availability as this request saw it; how late it went."""
        start = time.monotonic()
        try:
            routed = route_key(int(request.user_ids[0])) if self.config.target.routing_header else None
            response = self._client(server.index).infer(request, routed)
            outcome = Outcome(response.latency_s, response.logits, response.cached_tokens,
                              host_cached_tokens=response.host_cached_tokens)
        except HstuReplayError as exc:
            outcome = Outcome(time.monotonic() - start, error=str(exc), refused=isinstance(exc, ServerUnavailable))
            self._failed(server, request, outcome)
        if outcome.refused:
            server.availability.refused(position.stage.key)
        elif server.availability.answered():
            self.fleet.lost_cache(server)
        if intended is not None:
            outcome.lag_s = max(start - intended, 0.0)
        return outcome

    def _failed(self, server: Server, request: RequestTensors, outcome: Outcome) -> None:
        """A request that failed: its keys forgotten at its server; a limit the server did not
        publish stops the run (every request like it would fail)."""
        if self.caches:
            self.fleet.forget(server, request)
        refused = limit_refusal(outcome.error)
        if refused is not None:
            self.environment.hstu.stop_run(refused.line())

    def _check(self, outcome: Outcome, step: PlannedStep, request: RequestTensors) -> None:
        """Checking: a sampled answer against its reference; a mismatch named in one line."""
        if not outcome.ok or step.reference is None:
            return
        checks = self.config.checks
        if self.rng.random() < checks.verify_fraction:
            outcome.verdict = compare(outcome.logits, step.reference, request.num_candidates, checks.tolerance)
            if not outcome.verdict.ok:
                outcome.mismatch = mismatch_line(step.label, request, outcome.verdict, checks.tolerance)

    def _file(self, kind: str, step: PlannedStep, request: RequestTensors, position: StagePosition, server: Server,
              predicted: TierHits | None, outcome: Outcome, prime: bool) -> Sent:
        """Accounting: the request filed under its stage (a measured one planned before its server
        lost its cache counts as warm-up), the stage's count moved on, and Locust's event fired."""
        label = step.label + " (prime)" if prime else step.label
        if kind == "measure" and self.epoch != self.fleet.epoch:  # its plan assumed the lost cache
            kind, label = "warmup", label + " (planned before the server restarted)"
        hits = (0,) * request.batch_size if prime else step.expected_hits
        sent = Sent(kind, position.stage.key, request, hits, predicted.hits if predicted else (0,) * request.batch_size,
                    outcome, label, self.index, predicted.host if predicted else (), server.index)
        self.accountant.file(sent)
        if kind == "measure" and outcome.ok:
            self.clock.measured(position.stage)
        self.environment.events.request.fire(
            request_type=self.config.target.protocol.value, name=request_name(position, "prime" if prime else kind),
            response_time=outcome.latency_s * 1e3, response_length=0 if outcome.logits is None else outcome.logits.nbytes,
            exception=locust_exception(outcome), context={"label": step.label},
        )
        return sent


def mismatch_line(label: str, request: RequestTensors, verdict: Verdict, tolerance: float) -> str:
    """One line naming the request, its worst user and the difference."""
    user = int(request.users()[verdict.worst_user].user_id) if verdict.worst_user >= 0 else -1
    return (f"mismatch in {label}: user {user} max |diff| {verdict.max_abs_diff:.4g} > {tolerance} "
            f"{verdict.reason}").rstrip()


def locust_exception(outcome: Outcome) -> Exception | None:
    """What Locust's failure table gets: it groups by message, so the cause (the example stays in our
    report). A mismatch is only found in an answer, so an outcome has one or the other."""
    if outcome.mismatch:
        return MismatchError(cause_of(outcome.mismatch))
    return RuntimeError(cause_of(outcome.error)) if outcome.error else None


def request_name(position: StagePosition, kind: str) -> str:
    """Locust's name for a request: its stage, and what it was for when not measured."""
    key = position.stage.key
    return key.name().replace("_", " ") + {"measure": "", "warmup": " warm-up", "prime": " prime"}[kind]
