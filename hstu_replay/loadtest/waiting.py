"""The load test's way of waiting (`plan.waiting.Waiting`): gevent's events and greenlets, which
Locust's virtual users run on."""

from __future__ import annotations

import gevent
from gevent.event import Event

from hstu_replay.plan.waiting import Waiting

GREENLETS = Waiting(Event, gevent.spawn)
