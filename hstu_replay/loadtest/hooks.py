"""Locust event listeners: options, per-process runtime, merging at the master, final reports.

Registered when the locustfile imports this module (Locust's extension model).
"""

from __future__ import annotations

import sys

import gevent
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from hstu_replay.client.triton import TritonClient
from hstu_replay.errors import HstuReplayError
from hstu_replay.loadtest import server_stats, webui
from hstu_replay.loadtest.options import LoadTestConfig, register_arguments
from hstu_replay.loadtest.runtime import LoadTestRuntime
from hstu_replay.stats.run_stats import RunStats

def fail(environment, message: str, code: int = 2) -> None:
    """One line for the user, then stop the run with a non-zero exit code."""
    print(f"hstu-replay: error: {message}", file=sys.stderr, flush=True)
    environment.process_exit_code = code
    if environment.runner is not None:
        gevent.spawn_later(0, environment.runner.quit)


@events.init_command_line_parser.add_listener
def _arguments(parser, **_):
    register_arguments(parser)


@events.init.add_listener
def _init(environment, **_):
    runner = environment.runner
    role = "master" if isinstance(runner, MasterRunner) else "worker" if isinstance(runner, WorkerRunner) else "local"
    if role == "worker":
        config = LoadTestConfig()  # placeholder: the master's options arrive with each test start
    else:
        try:
            config = LoadTestConfig.from_options(environment.parsed_options)
        except HstuReplayError as exc:
            print(f"hstu-replay: error: {exc}", file=sys.stderr, flush=True)
            sys.exit(exc.exit_code)
    environment.hstu = LoadTestRuntime(config, role)
    if role != "worker" and getattr(environment.parsed_options, "headless", False):
        _detect_interface(environment, exit_on_failure=True)
    if environment.web_ui is not None:
        webui.install(environment)
    runtime = environment.hstu

    def report_to_master(client_id, data, **_):
        data["hstu"] = runtime.stats.take().to_dict()

    def worker_report(client_id, data, **_):
        if "hstu" in data:
            runtime.stats.merge(RunStats.from_dict(data["hstu"]))

    environment.events.report_to_master.add_listener(report_to_master)
    environment.events.worker_report.add_listener(worker_report)


def _detect_interface(environment, exit_on_failure: bool = False) -> bool:
    runtime: LoadTestRuntime = environment.hstu
    client = TritonClient(runtime.config.client_options())
    try:
        runtime.binding = client.connect()
        return True
    except HstuReplayError as exc:
        if exit_on_failure:
            print(f"hstu-replay: error: {exc}", file=sys.stderr, flush=True)
            sys.exit(exc.exit_code)
        fail(environment, str(exc))
        return False
    finally:
        client.close()


@events.test_start.add_listener
def _test_start(environment, **_):
    runtime: LoadTestRuntime = environment.hstu
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        # Custom attributes of parsed_options travel to the workers with the spawn message.
        environment.parsed_options.hstu_worker_count = max(runner.worker_count, 1)
        environment.parsed_options.hstu_total_users = environment.parsed_options.num_users
        runtime.worker_count = environment.parsed_options.hstu_worker_count
    if isinstance(runner, WorkerRunner):
        runtime.worker_index = runner.worker_index
        runtime.worker_count = int(getattr(environment.parsed_options, "hstu_worker_count", 1))
    try:
        runtime.configure(LoadTestConfig.from_options(environment.parsed_options))
    except HstuReplayError as exc:
        fail(environment, str(exc))
        return
    if not _detect_interface(environment):
        return
    runtime.start()
    if runtime.role != "worker":
        server_stats.watch(environment)


@events.test_stop.add_listener
def _test_stop(environment, **_):
    runtime: LoadTestRuntime = environment.hstu
    if runtime.role != "worker" and runtime.binding is not None:
        from hstu_replay.loadtest.finish import write_final_report

        write_final_report(environment)


@events.quitting.add_listener
def _quitting(environment, **_):
    runtime: LoadTestRuntime = getattr(environment, "hstu", None)
    if runtime is None:
        return
    if runtime.role != "worker" and runtime.binding is not None:
        from hstu_replay.loadtest.finish import write_final_report

        write_final_report(environment, final=True)
    runtime.close()
