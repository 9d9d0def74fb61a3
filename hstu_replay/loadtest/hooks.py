"""Locust event listeners: options, the run's lifecycle in each process, merging at the master.

Registered when the locustfile imports this module (Locust's extension model). At init each
process finds its role (loadtest.roles), reads its options and sets up what that role needs. At
test start it prepares its run (loadtest.prepare: options, model, data; a failure stops the run
with one line before any load; a worker's failure reaches its master), the sweep clock starts
when spawning completes, and the report is written at test stop and at quitting (loadtest.finish).
"""

from __future__ import annotations

import sys

from locust import events
from locust.runners import STATE_RUNNING, STATE_SPAWNING

from hstu_replay.errors import HstuReplayError
from hstu_replay.loadtest import interrupts, monitor, server_stats, webaccess, webform, webui
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.options import register_arguments, take_secrets
from hstu_replay.loadtest.prepare import connect, prepare
from hstu_replay.loadtest.roles import Role, fail, role_for
from hstu_replay.loadtest.runtime import LoadTestRuntime
from hstu_replay.loadtest.server_limits import caps_line


@events.init_command_line_parser.add_listener
def _arguments(parser, **_):
    register_arguments(parser)
    webform.show_paths(parser, webform.installed)


@events.init.add_listener
def _init(environment, **_):
    role = role_for(environment)
    options = environment.parsed_options
    secrets = take_secrets(options)  # each process's own, never in the options a master sends
    credentials = webaccess.take_credentials(options)
    interrupts.install(environment, role)
    config, policy = _read_options(environment, role, secrets)
    runtime = environment.hstu = LoadTestRuntime(config, role, secrets=secrets)
    if config is not None and getattr(options, "headless", False):
        _connect_before_spawning(runtime)
    if environment.web_ui is not None:
        webaccess.install_login(environment, *credentials)
        webform.install(environment, policy, secrets)
        webui.install(environment)
    _merge_statistics(environment, runtime)
    environment.events.spawning_complete.add_listener(lambda **_: _start_sweep(environment))
    role.install(runtime)


def _read_options(environment, role: Role, secrets: dict) -> tuple[LoadTestConfig | None, webform.FormPolicy | None]:
    """The config and web form policy of this process's options, checked (a bad one ends the
    process with one line). A worker has none: its master's options arrive with each test start."""
    if not role.reads_own_options:
        return None, None
    options = environment.parsed_options
    try:
        config = LoadTestConfig.from_options(options, host=environment.host, secrets=secrets)
        policy = webform.FormPolicy.from_options(options)
    except HstuReplayError as exc:
        _exit(exc)
    _address_in_host(environment, config)
    return config, policy


def _connect_before_spawning(runtime: LoadTestRuntime) -> None:
    """Headless: an unusable server or model ends the run before any user spawns."""
    try:
        runtime.binding = connect(runtime.config.target)
    except HstuReplayError as exc:
        _exit(exc)


def _merge_statistics(environment, runtime: LoadTestRuntime) -> None:
    """Our statistics travel as Locust's do: each worker report carries what the worker counted
    since its last one (counters, histograms, a natural replay's request rows), and the master
    adds it up."""

    def report_to_master(client_id, data, **_):
        if runtime.run is not None:
            data.update(runtime.run.figures.report_to_master())

    def worker_report(client_id, data, **_):
        if runtime.run is not None:
            runtime.role.worker_reported(client_id, data, runtime.run.figures.merge_worker_report(data))

    environment.events.report_to_master.add_listener(report_to_master)
    environment.events.worker_report.add_listener(worker_report)


def _start_sweep(environment) -> None:
    """At spawning complete, in a single process, and in a master once every worker has spawned
    its users (workers get the master's clock, also when they join late)."""
    runtime: LoadTestRuntime = environment.hstu
    run = runtime.run
    if run is None:
        return
    run.live.clock.start()  # no-op when the sweep already runs (the web UI changed the user count)
    run.figures.users = max(run.figures.users, environment.runner.user_count)
    runtime.role.sweep_started(run)


def _address_in_host(environment, config: LoadTestConfig) -> None:
    """The target address lives in Locust's host (the web form's Host field, sent to workers),
    as a URL whose scheme says protocol and TLS; --triton-url and its companions are folded in."""
    environment.host = environment.parsed_options.host = config.target.url
    options = environment.parsed_options
    options.triton_url, options.triton_protocol, options.triton_ssl = "", "grpc", False


def _exit(exc: HstuReplayError) -> None:
    print(f"hstu-replay: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(exc.exit_code)


@events.test_start.add_listener
def _test_start(environment, **_):
    runtime: LoadTestRuntime = environment.hstu
    role = runtime.role
    options = environment.parsed_options
    role.test_starting(options)
    runtime.drop_run()  # a rerun from the web UI starts clean, also when it fails to prepare
    try:
        config = LoadTestConfig.from_options(options, host=environment.host, secrets=runtime.secrets)
        binding = runtime.binding if config == runtime.config else None
        prepared = prepare(config, runtime.placement, binding)
    except HstuReplayError as exc:
        role.failed_to_prepare(str(exc))
        fail(environment, str(exc))
        return
    run = runtime.begin(prepared)
    _say_what_changed(prepared)
    if role.replays:
        monitor.watch_client(run)
    if role.reports:
        server_stats.watch(environment, run)


def _say_what_changed(prepared) -> None:
    """Where the run differs from what its options asked for, or may not give it, one line each."""
    config = prepared.config
    if not prepared.caches and any(config.sweep.ratios):
        print(f"hstu-replay: model {config.target.model} keeps no KV cache: one stage at hit ratio 0 per batch "
              f"size instead of --hit-ratios {config.options['hit_ratios']}", file=sys.stderr, flush=True)
    if prepared.caps:
        print(f"hstu-replay: {caps_line(prepared.caps)}", file=sys.stderr, flush=True)
    for batch, cap in prepared.history_caps().items():
        print(f"hstu-replay: batch {batch}: histories capped at {cap} items so that {batch} users fit "
              f"--max-values {config.data.max_values}", file=sys.stderr, flush=True)
    workers = prepared.placement.worker_count
    if config.cache.tier_mix is not None and workers > 1 and prepared.placement.role.reports \
            and not config.sweep.arrival.open:
        print(f"hstu-replay: --tier-mix with {workers} workers back to back: each steers against its share of "
              "the server's pools, and one running faster than the others ages their keys out early, so the "
              "mix drifts (an open-loop --arrival keeps them in step)", file=sys.stderr, flush=True)


@events.test_stop.add_listener
def _test_stop(environment, **_):
    runtime: LoadTestRuntime = environment.hstu
    if runtime.run is None:
        return
    runtime.run.live.end()
    if runtime.role.reports:
        from hstu_replay.loadtest.finish import write_report

        write_report(environment)


@events.quitting.add_listener
def _quitting(environment, **_):
    runtime: LoadTestRuntime = getattr(environment, "hstu", None)
    if runtime is None:
        return
    runner = environment.runner
    if runtime.run is not None and runner is not None and runner.state in (STATE_SPAWNING, STATE_RUNNING):
        runtime.role.stop_running()  # a run still going (Ctrl-C): its users end before the report is written
    if runtime.role.reports and runtime.run is not None:
        from hstu_replay.loadtest.finish import write_final_report

        write_final_report(environment)
    runtime.close()
