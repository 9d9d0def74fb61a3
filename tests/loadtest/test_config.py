"""The typed config: sections built once from the options, enums for the choices, the workload
registry deciding what each workload allows."""

from __future__ import annotations

import argparse

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.config import Arrival, LoadTestConfig, TritonProtocol
from hstu_replay.loadtest.options import OPTIONS, SECRETS
from hstu_replay.plan.workloads import WORKLOADS


def config(**given) -> LoadTestConfig:
    return LoadTestConfig.from_options(argparse.Namespace(**given))


def test_sections_hold_typed_values(tmp_path):
    c = config(workload="dumps", dump_dir=str(tmp_path), arrival="poisson", request_rate=50.0,
               hit_ratios="0,0.5", batch_sizes="1,4", triton_protocol="http", timeline_shard="")
    assert c.sweep.arrival is Arrival.POISSON and c.sweep.arrival.open and c.sweep.open_rate == 50.0
    assert c.target.protocol is TritonProtocol.HTTP and c.target.url == "http://127.0.0.1:8001"
    assert (c.sweep.ratios, c.sweep.batches) == ((0.0, 0.5), (1, 4))
    assert c.data.kind is WORKLOADS["dumps"] and c.data.path == str(tmp_path)
    assert list(c.options) == [o.dest for o in OPTIONS if o.dest not in SECRETS]  # report.json's order
    assert c.options["arrival"] == "poisson" and type(c.options["arrival"]) is str


def test_a_closed_loop_offers_no_rate(tmp_path):
    c = config(workload="dumps", dump_dir=str(tmp_path), request_rate=50.0)
    assert c.sweep.arrival is Arrival.CLOSED and c.sweep.open_rate == 0.0


@pytest.mark.parametrize("given, message", [
    ({"arrival": "bursty"}, "--arrival 'bursty': use one of closed, constant, poisson"),
    ({"triton_protocol": "udp"}, "--triton-protocol 'udp': use grpc or http"),
    ({"workload": "replay"}, "--workload 'replay': use sessions, dumps or timeline"),
    ({"workload": "sessions"}, "--workload sessions needs --store"),
    ({"time_scale": 2.0}, "only with --workload timeline"),
    ({"timeline_shard": "0/2"}, "only with --workload timeline"),
    ({"arrival": "constant"}, "--arrival constant needs --request-rate > 0"),
    ({"batch_sizes": "1.5"}, "--batch-sizes '1.5': use a whole number of users in 1..8"),
    ({"batch_sizes": "1,9"}, "--batch-sizes '9': use a whole number of users in 1..8"),
    ({"hit_ratios": "0,1.5"}, "--hit-ratios '1.5': use a hit ratio in 0..1"),
    ({"hit_ratios": "-0.1"}, "--hit-ratios '-0.1': use a hit ratio in 0..1"),
    ({"max_p99_ms": "x"}, "--max-p99-ms"),
])
def test_bad_values_are_named(tmp_path, given, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        config(**{"workload": "dumps", "dump_dir": str(tmp_path), **given})


def test_time_scale_needs_a_closed_loop(tmp_path):
    with pytest.raises(ConfigError, match="leave --arrival closed"):
        config(workload="timeline", store=str(tmp_path), time_scale=2.0, arrival="constant", request_rate=1.0)


def test_every_workload_names_an_existing_option():
    for kind in WORKLOADS.values():
        assert kind.data_option in {o.dest for o in OPTIONS}
        assert kind.data_flag == next(o.flag for o in OPTIONS if o.dest == kind.data_option)


@pytest.mark.parametrize("given, message", [
    ({"tier_mix": "gpu:0.6,host:0.3"}, "--tier-mix 'gpu:0.6,host:0.3': the shares add up to 0.9, not 1"),
    ({"tier_mix": "gpu:0.5,ssd:0.5"}, "--tier-mix 'gpu:0.5,ssd:0.5': give tier:share pairs"),
    ({"tier_mix": "gpu:0.6,host:0.3,miss:0.1", "cache_budget_tokens": 5000, "host_budget_tokens": 4000},
     "host hits need --host-budget-tokens (4000) above --cache-budget-tokens (5000)"),
    ({"tier_mix": "gpu:0.9,miss:0.1", "host_budget_tokens": 4000}, "host hits and misses need a bounded GPU pool"),
    ({"tier_mix": "gpu:1", "workload": "dumps", "dump_dir": "d", "cache_budget_tokens": 5000},
     "only --workload sessions steers"),
    ({"offload_mode": "lazy"}, "--offload-mode 'lazy': use flexkv or native"),
    ({"host_budget_tokens": -1}, "--host-budget-tokens -1: use 0 or more tokens"),
    ({"offload_chunk_tokens": 0}, "--offload-chunk-tokens 0: must be at least 1"),
    ({"tier_mix": "gpu:0.6,host:0.4", "cache_budget_tokens": 3000, "host_budget_tokens": 9000, "max_history": 256,
      "offload_chunk_tokens": 519}, "only once it has 519 tokens, and the longest sent here has 518"),
    ({"tier_mix": "gpu:0.6,host:0.4", "cache_budget_tokens": 3000, "host_budget_tokens": 9000, "max_history": 256},
     "under --offload-mode native a history reaches the host only once it has 1,024 tokens, and the longest sent "
     "here has 518 (--max-history 256)"),
])
def test_bad_tier_options_are_named(tmp_path, given, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.").replace(")", r"\)")):
        config(**{"workload": "sessions", "store": str(tmp_path), **given})


@pytest.mark.parametrize("given, message", [
    ({"working_set": -3, "hit_ratios": "1"}, "--working-set -3: give a number of keys"),
    ({"working_set": 4, "hit_ratios": "0.5,1"},
     "--working-set 4: every visit revisits its key whole: give --hit-ratios 1, not 0.5,1"),
    ({"working_set": 4, "hit_ratios": "1", "tier_mix": "gpu:1"}, "leave out --tier-mix"),
    ({"working_set": 4, "hit_ratios": "1", "workload": "timeline"}, "only --workload sessions revisits"),
])
def test_bad_working_set_options_are_named(tmp_path, given, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        config(**{"workload": "sessions", "store": str(tmp_path), **given})


def test_a_working_set_with_full_revisits_is_taken(tmp_path):
    assert config(workload="sessions", store=str(tmp_path), working_set=8, hit_ratios="1").data.working_set == 8


def test_a_tier_mix_and_the_budgets_the_server_says():
    c = config(workload="sessions", store="s", tier_mix="gpu:0.6,host:0.3,miss:0.1")  # checked once budgets are known
    assert c.cache.tier_mix.as_dict() == {"gpu": 0.6, "host": 0.3, "miss": 0.1}
    assert c.report.rules.tier_mix == (("gpu", 0.6), ("host", 0.3), ("miss", 0.1))
    told = c.with_budgets(3000, 9000)
    assert (told.cache.budget_tokens, told.cache.host_budget_tokens) == (3000, 9000)
    assert (told.options["cache_budget_tokens"], told.options["host_budget_tokens"]) == (3000, 9000)
    with pytest.raises(ConfigError, match="host hits need --host-budget-tokens"):
        c.with_budgets(3000, 0)


def test_the_offload_chunk_reaches_the_cache_section(tmp_path):
    """A server that offloads in chunks of 512: histories of 518 tokens reach its host, so a host share is allowed."""
    c = config(workload="sessions", store=str(tmp_path), tier_mix="gpu:0.6,host:0.4", cache_budget_tokens=3000,
               host_budget_tokens=9000, max_history=256, offload_chunk_tokens=512)
    assert c.cache.offload_chunk_tokens == 512 and c.options["offload_chunk_tokens"] == 512
    assert config(workload="dumps", dump_dir=str(tmp_path)).cache.offload_chunk_tokens == 1024


def test_partial_hits_from_reuse_are_for_dumps_only(tmp_path):
    from hstu_replay.plan.reuse import PartialHits

    assert config(workload="dumps", dump_dir=str(tmp_path)).data.partial_hits is PartialHits.PRIME
    assert config(workload="dumps", dump_dir=str(tmp_path), partial_hits="reuse").data.partial_hits is PartialHits.REUSE
    with pytest.raises(ConfigError, match="--partial-hits reuse: only --workload dumps mixes full hits and misses"):
        config(workload="sessions", store=str(tmp_path), partial_hits="reuse")
    with pytest.raises(ConfigError, match="--partial-hits 'some': use one of prime, reuse"):
        config(workload="dumps", dump_dir=str(tmp_path), partial_hits="some")
