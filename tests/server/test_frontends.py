"""`server serve`'s typed config and the frontend registry, in process: what each frontend serves and
refuses (one line, exit 2, before any work), and no option changed behind the user's back."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hstu_replay.cache_ledger import OffloadMode
from hstu_replay.cli import build_parser, main
from hstu_replay.errors import ConfigError
from hstu_replay.server.frontends import FRONTENDS, Engine, Frontend
from hstu_replay.server.serve_config import ServeConfig


def parsed(*argv: str):
    return build_parser().parse_args(["server", "serve", *argv])


@pytest.fixture
def refused(capsys):
    """`server serve ARGV` run in this process: (exit status, stderr lines); SIGINT's handler kept."""
    previous = signal.getsignal(signal.SIGINT)

    def run(*argv: str) -> tuple[int, list[str]]:
        code = main(["server", "serve", "--repository", "/nonexistent", *argv])
        return code, capsys.readouterr().err.strip().splitlines()

    yield run
    signal.signal(signal.SIGINT, previous)


#: (frontend, Refusal.options) -> a command line of that combination and its line, written by hand
DECLARED = {
    ("pytriton", "--reserve-pool --engine aoti"): (
        ("--reserve-pool", "--engine", "aoti"),
        "--reserve-pool: --engine aoti keeps each user's K/V apart, in no pool; use --engine batched or batched-aoti"),
    ("python-backend", "--reserve-pool --engine aoti"): (
        ("--frontend", "python-backend", "--reserve-pool"),  # aoti: the Python frontends' default
        "--reserve-pool: --engine aoti keeps each user's K/V apart, in no pool; use --engine batched or batched-aoti"),
}


def test_every_frontend_declares_its_engines_and_each_engine_is_served():
    assert set(FRONTENDS) == set(Frontend) and all(FRONTENDS[f].name is f for f in FRONTENDS)
    for kind in FRONTENDS.values():
        assert kind.engines and len(set(kind.engines)) == len(kind.engines) and kind.help
        assert kind.default_engine is kind.engines[0]
    assert set().union(*(kind.engines for kind in FRONTENDS.values())) == set(Engine)
    assert FRONTENDS[Frontend.CPP_BACKEND].engines == (Engine.BATCHED_AOTI,)  # the batched package only
    assert [e for e in Engine if e.pooled] == [Engine.BATCHED, Engine.BATCHED_AOTI]


def test_the_engine_kinds_the_server_builds_are_the_engines_frontends_declare():
    from hstu_replay.server.build import ENGINE_KINDS

    assert set(ENGINE_KINDS) == {e.value for e in Engine}


def test_each_declared_refusal_has_a_case_here():
    declared = {(str(f), r.options) for f, kind in FRONTENDS.items() for r in kind.refusals}
    assert declared == set(DECLARED)


@pytest.mark.parametrize("case", sorted(DECLARED))
def test_each_declared_refusal_is_one_line_and_exit_2(refused, case):
    argv, line = DECLARED[case]
    code, err = refused(*argv)
    assert (code, err) == (2, [f"hstu-replay: error: {line}"])


@pytest.mark.parametrize("frontend, engine", [(f, e) for f, kind in FRONTENDS.items() for e in Engine
                                              if e not in kind.engines])
def test_an_engine_a_frontend_does_not_serve_is_refused_naming_both(refused, frontend, engine):
    code, err = refused("--frontend", frontend, "--engine", engine)
    served = " or ".join(FRONTENDS[frontend].engines)
    assert (code, err) == (2, [f"hstu-replay: error: --frontend {frontend} serves --engine {served} only "
                               f"(got --engine {engine})"])


@pytest.mark.parametrize("argv, line", [
    (("--tls-cert", "x.pem"), "--tls-cert and --tls-key go together"),
    (("--threads", "-1"), "--threads -1: use 0 (the default policy) or a positive count"),
    (("--frontend", "cpp-backend", "--host-budget-tokens", "-5"),
     "--host-budget-tokens -5: use 0 (no host tier) or a positive count"),
    (("--offload-chunk-tokens", "0"), "--offload-chunk-tokens 0: must be at least 1"),
    (("--https-port", "8443"), "--https-port needs --tls-cert and --tls-key"),
])
def test_other_bad_options_are_one_line_and_exit_2(refused, argv, line):
    assert refused(*argv) == (2, [f"hstu-replay: error: {line}"])


@pytest.mark.parametrize("frontend, default", [("pytriton", "aoti"), ("python-backend", "aoti"),
                                               ("cpp-backend", "batched-aoti")])
def test_the_default_engine_is_the_frontends_own_and_marked_as_taken(frontend, default):
    config = ServeConfig.from_args(parsed("--frontend", frontend))
    assert (config.frontend, config.engine.kind, config.engine.defaulted) == (frontend, default, True)


@pytest.mark.parametrize("frontend, engine", [(f, e) for f, kind in FRONTENDS.items() for e in kind.engines])
def test_a_served_engine_given_is_kept_as_given(frontend, engine):
    config = ServeConfig.from_args(parsed("--frontend", frontend, "--engine", engine, "--reserve-pool")
                                   if engine.pooled else parsed("--frontend", frontend, "--engine", engine))
    assert (config.engine.kind, config.engine.defaulted, config.cache.reserve_pool) == (engine, False, engine.pooled)


def test_the_sections_hold_the_options_given():
    config = ServeConfig.from_args(parsed(
        "--repository", "runs/repo", "--config", "small", "--seed", "7", "--device", "cpu", "--engine", "batched",
        "--dtype", "bfloat16", "--threads", "3", "--cache-budget-tokens", "4096", "--page-tokens", "16",
        "--host-budget-tokens", "8192", "--offload-mode", "flexkv", "--offload-chunk-tokens", "64",
        "--host", "0.0.0.0", "--http-port", "9000", "--grpc-port", "9001", "--metrics-port", "9002",
        "--cache-metrics-port", "9003", "--log-verbose", "1", "--no-limit-parameters",
        "--require-header", "X-Key=abc"))
    engine, cache, network = config.engine, config.cache, config.network
    assert (engine.repository, engine.config, engine.seed, engine.device, engine.dtype, engine.threads) == (
        Path("runs/repo"), "small", 7, "cpu", "bfloat16", 3)
    assert (cache.budget_tokens, cache.page_tokens, cache.reserve_pool) == (4096, 16, False)
    assert (cache.host.budget_tokens, cache.host.mode, cache.host.chunk_tokens) == (8192, OffloadMode.FLEXKV, 64)
    assert network.ports == {"http": 9000, "grpc": 9001, "metrics": 9002, "cache metrics": 9003}
    assert (network.host, network.log_verbose, network.publish_limits, network.tls) == ("0.0.0.0", 1, False, None)
    assert (network.required_header.name, network.required_header.value) == ("x-key", "abc")


def test_a_config_built_by_hand_is_checked_as_one_from_the_command_line():
    config = ServeConfig.from_args(parsed("--frontend", "cpp-backend"))
    with pytest.raises(ConfigError, match="--frontend cpp-backend serves --engine batched-aoti only"):
        type(config)(frontend=Frontend.CPP_BACKEND, engine=type(config.engine)(
            kind=Engine.BATCHED, repository=Path("."), config="small", seed=0, device="cpu"),
            cache=config.cache, network=config.network)


def test_the_help_names_each_frontends_default_engine(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["server", "serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for frontend, kind in FRONTENDS.items():
        assert f"{kind.default_engine} with --frontend {frontend}" in text and f"{frontend}: {kind.help}" in text
