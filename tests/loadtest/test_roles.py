"""One role per kind of Locust process (which one: `role_for`, exercised by every distributed test)."""

from __future__ import annotations

from hstu_replay.loadtest.roles import LocalRole, MasterRole, WorkerRole


def test_what_each_role_does():
    assert (LocalRole.replays, LocalRole.reports, LocalRole.ends_stages_on_count) == (True, True, True)
    assert (MasterRole.replays, MasterRole.reports, MasterRole.ends_stages_on_count) == (False, True, False)
    assert (WorkerRole.replays, WorkerRole.reports, WorkerRole.reads_own_options) == (True, False, False)
    assert {r.name for r in (LocalRole, MasterRole, WorkerRole)} == {"local", "master", "worker"}
