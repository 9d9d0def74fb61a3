"""Locust event listeners: options, the run's lifecycle in each process, merging at the master.

Registered when the locustfile imports this module (Locust's extension model). At test start
each process prepares its run (loadtest.prepare: options, model, data; a failure stops the
run with one line before any load; a worker's failure reaches its master), the sweep clock
starts when spawning completes, and the report is written at test stop (loadtest.finish).
"""

from __future__ import annotations

import signal
import sys

import gevent
from locust import events
from locust.runners import STATE_INIT, STATE_RUNNING, STATE_SPAWNING, MasterRunner, WorkerRunner

from hstu_replay.errors import HstuReplayError
from hstu_replay.loadtest import monitor, server_stats, webaccess, webform, webui
from hstu_replay.loadtest.options import LoadTestConfig, register_arguments, take_secrets
from hstu_replay.loadtest.prepare import connect, prepare
from hstu_replay.loadtest.runtime import LoadTestRuntime
from hstu_replay.stats.run_stats import RunStats

WORKER_FAILED = "hstu_worker_failed"  # worker -> master: preparing the run failed
SWEEP_CLOCK = "hstu_sweep_clock"  # master -> workers: seconds since the sweep started


def fail(environment, message: str, code: int = 2) -> None:
    """One line for the user, then stop the run with a non-zero exit code."""
    print(f"hstu-replay: error: {message}", file=sys.stderr, flush=True)
    environment.process_exit_code = code
    if environment.runner is not None:
        gevent.spawn_later(0, environment.runner.quit)


@events.init_command_line_parser.add_listener
def _arguments(parser, **_):
    register_arguments(parser)
    webaccess.register_arguments(parser)
    webform.register_arguments(parser)
    webform.show_paths(parser, webform.installed)


@events.init.add_listener
def _init(environment, **_):
    runner = environment.runner
    role = "master" if isinstance(runner, MasterRunner) else "worker" if isinstance(runner, WorkerRunner) else "local"
    options = environment.parsed_options
    secrets = take_secrets(options)  # each process's own, never in the options a master sends
    credentials = webaccess.take_credentials(options)
    _interrupt_ends_the_process(environment)
    if role == "worker":
        config = LoadTestConfig()  # placeholder: the master's options arrive with each test start
    else:
        try:
            config = LoadTestConfig.from_options(options, host=environment.host, secrets=secrets)
            policy = webform.FormPolicy.from_options(options)
        except HstuReplayError as exc:
            _exit(exc)
        _address_in_host(environment, config)
    runtime = environment.hstu = LoadTestRuntime(config, role, secrets=secrets)
    if role != "worker" and getattr(environment.parsed_options, "headless", False):
        try:  # headless: an unusable server or model ends the run before any user spawns
            runtime.binding = connect(config)
        except HstuReplayError as exc:
            _exit(exc)
    if environment.web_ui is not None:
        webaccess.install_login(environment, *credentials)
        webform.install(environment, policy, secrets)
        webui.install(environment)

    def report_to_master(client_id, data, **_):
        if runtime.run is not None:
            data["hstu"] = runtime.run.stats.take().to_dict()

    def worker_report(client_id, data, **_):
        if "hstu" in data and runtime.run is not None:
            runtime.run.stats.merge(RunStats.from_dict(data["hstu"]))

    environment.events.report_to_master.add_listener(report_to_master)
    environment.events.worker_report.add_listener(worker_report)
    environment.events.spawning_complete.add_listener(lambda **_: _start_sweep(environment))
    if role == "master":
        runner.register_message(WORKER_FAILED, lambda msg, **_: fail(environment, f"worker {msg.data}"))
    if role == "worker":
        def sweep_clock(msg, **_):
            if runtime.run is not None:
                runtime.run.clock.start(elapsed_s=float(msg.data))

        runner.register_message(SWEEP_CLOCK, sweep_clock)


def _start_sweep(environment) -> None:
    """At spawning complete, in a single process, and in a master once every worker has spawned
    its users (workers get the master's clock, also when they join late)."""
    run = environment.hstu.run
    if run is None:
        return
    run.clock.start()  # no-op when the sweep already runs (the web UI changed the user count)
    run.users = max(run.users, environment.runner.user_count)
    if isinstance(environment.runner, MasterRunner):
        environment.runner.send_message(SWEEP_CLOCK, run.clock.elapsed_s())


def _address_in_host(environment, config: LoadTestConfig) -> None:
    """The target address lives in Locust's host (the web form's Host field, sent to workers),
    as a URL whose scheme says protocol and TLS; --triton-url and its companions are folded in."""
    environment.host = environment.parsed_options.host = config.address_url
    options = environment.parsed_options
    options.triton_url, options.triton_protocol, options.triton_ssl = "", "grpc", False


def _interrupt_ends_the_process(environment) -> None:
    """Ctrl-C raises KeyboardInterrupt in Locust's main greenlet, in every mode, where Locust
    catches it, stops the run and quits (the report is written at quitting). Python's own handler
    raises it in whichever greenlet happens to run (often a user's, which just dies) and leaves
    the process up. A headless master still waiting for --expect-workers (a wait Locust does not
    interrupt cleanly) tells the workers already connected to quit and exits 1: no run happened.
    Locust's --processes parent keeps its own handler."""
    if getattr(environment.parsed_options, "processes", None):
        return
    hub = gevent.get_hub()
    main = hub.parent  # the greenlet Locust's main() runs in

    def interrupt():
        runner = environment.runner
        if isinstance(runner, MasterRunner) and runner.state == STATE_INIT and environment.parsed_options.headless:
            print("hstu-replay: interrupted while waiting for workers; no run happened", file=sys.stderr, flush=True)
            runner.quit()
            hub.loop.run_callback(main.throw, SystemExit(1))
        else:
            hub.loop.run_callback(main.throw, KeyboardInterrupt)

    gevent.signal_handler(signal.SIGINT, interrupt)
    if environment.parsed_options.headless:
        # Locust installs its SIGTERM handler only once a headless run is over: until then a
        # SIGTERM (Kubernetes, docker stop) killed the process with no report. Take it as Ctrl-C
        # while the run goes; afterwards Locust's own handler acts alone.
        def terminate():
            if environment.runner is not None and environment.runner.state in (STATE_SPAWNING, STATE_RUNNING):
                interrupt()

        gevent.signal_handler(signal.SIGTERM, terminate)


def _exit(exc: HstuReplayError) -> None:
    print(f"hstu-replay: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(exc.exit_code)


@events.test_start.add_listener
def _test_start(environment, **_):
    runtime: LoadTestRuntime = environment.hstu
    runner = environment.runner
    options = environment.parsed_options
    if isinstance(runner, MasterRunner):
        # Custom attributes of parsed_options travel to the workers with the spawn message.
        options.hstu_worker_count = max(runner.worker_count, 1)
        options.hstu_total_users = options.num_users
        runtime.worker_count = options.hstu_worker_count
    if isinstance(runner, WorkerRunner):
        runtime.worker_index = runner.worker_index
        runtime.worker_count = int(getattr(options, "hstu_worker_count", 1))
    runtime.drop_run()  # a rerun from the web UI starts clean, also when it fails to prepare
    try:
        config = LoadTestConfig.from_options(options, host=environment.host, secrets=runtime.secrets)
        binding = runtime.binding if config == runtime.config else None
        prepared = prepare(config, runtime.placement, binding)
    except HstuReplayError as exc:
        if isinstance(runner, WorkerRunner):
            runner.send_message(WORKER_FAILED, f"{runtime.worker_index}: {exc}")
        fail(environment, str(exc))
        return
    run = runtime.begin(prepared)
    if not prepared.caches and any(config.ratios):
        print(f"hstu-replay: model {config.triton_model} keeps no KV cache: one stage at hit ratio 0 per batch "
              f"size instead of --hit-ratios {config.hit_ratios}", file=sys.stderr, flush=True)
    for batch, cap in prepared.history_caps().items():
        print(f"hstu-replay: batch {batch}: histories capped at {cap} items so that {batch} users fit "
              f"--max-values {config.max_values}", file=sys.stderr, flush=True)
    if runtime.role != "master":
        monitor.watch_client(run)
    if runtime.role != "worker":
        server_stats.watch(environment, run)


@events.test_stop.add_listener
def _test_stop(environment, **_):
    runtime: LoadTestRuntime = environment.hstu
    if runtime.run is None:
        return
    runtime.run.ended = True
    if runtime.role != "worker":
        from hstu_replay.loadtest.finish import write_final_report

        write_final_report(environment)


@events.quitting.add_listener
def _quitting(environment, **_):
    runtime: LoadTestRuntime = getattr(environment, "hstu", None)
    if runtime is None:
        return
    runner = environment.runner
    if runtime.run is not None and runner is not None and runner.state in (STATE_SPAWNING, STATE_RUNNING):
        # a run still going (Ctrl-C): its users end before the report is written; a worker
        # quitting on its own also sends its last statistics, which Locust sends only when the
        # master asks it to quit (else the master's report misses up to 3 s of this worker's)
        runner.stop()
        if isinstance(runner, WorkerRunner):
            runner._send_stats()
    if runtime.role != "worker" and runtime.run is not None:
        from hstu_replay.loadtest.finish import write_final_report

        write_final_report(environment, final=True)
    runtime.close()
