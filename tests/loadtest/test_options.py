"""The target address: --host (Locust's Host field) and its alias --triton-url."""

from __future__ import annotations

import argparse

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.address import resolve_address
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.options import ADDRESS_OPTIONS, PATH_OPTIONS, SECRETS, take_secrets


@pytest.mark.parametrize("host, url, protocol, ssl, expected", [
    (None, "", "grpc", False, ("127.0.0.1:8001", "grpc", False)),  # nothing given: the default
    ("grpc://triton:8001", "", "grpc", False, ("triton:8001", "grpc", False)),
    ("grpcs://triton:8001", "", "grpc", False, ("triton:8001", "grpc", True)),
    ("http://triton:8000", "", "grpc", False, ("triton:8000", "http", False)),
    ("https://triton:8443/", "", "grpc", False, ("triton:8443", "http", True)),
    ("HTTPS://triton:8443", "", "http", True, ("triton:8443", "http", True)),
    (None, "triton:8000", "http", True, ("triton:8000", "http", True)),  # the alias, bare: flags decide
    ("triton:8001", "", "grpc", False, ("triton:8001", "grpc", False)),
    ("http://triton:8000", "triton:8000", "http", False, ("triton:8000", "http", False)),  # both, agreeing
    ("http://triton:8000", "http://triton:8000", "grpc", False, ("triton:8000", "http", False)),
])
def test_the_address_sets_protocol_and_tls(host, url, protocol, ssl, expected):
    assert resolve_address(host, url, protocol, ssl) == expected


@pytest.mark.parametrize("host, url, protocol, ssl, message", [
    ("grpc://a:8001", "b:8001", "grpc", False, "name different targets"),
    ("grpc://a:8001", "http://a:8001", "grpc", False, "name different targets"),
    ("http://a:8000", "", "grpc", True, "no TLS but --triton-ssl"),
    ("grpc://a:8001", "", "http", False, "--triton-protocol says http"),
    ("ftp://a:1", "", "grpc", False, "use grpc://, grpcs://, http:// or https://"),
    ("http://a:8000/v2", "", "grpc", False, "no path"),
    ("http://", "", "grpc", False, "no path"),
])
def test_conflicting_or_malformed_addresses_are_refused(host, url, protocol, ssl, message):
    with pytest.raises(ConfigError, match=message) as caught:
        resolve_address(host, url, protocol, ssl)
    assert caught.value.exit_code == 2


def test_the_config_takes_the_host_and_shows_it_as_a_url(tmp_path):
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path), triton_url="")
    config = LoadTestConfig.from_options(parsed, host="https://triton.example:8443")
    assert (config.target.address, config.target.protocol, config.target.ssl) == ("triton.example:8443", "http", True)
    assert config.target.url == "https://triton.example:8443"
    assert LoadTestConfig.from_options(parsed).target.url == "grpc://127.0.0.1:8001"


def test_secrets_leave_the_options_and_reach_only_the_config(tmp_path):
    sentinel = "x-auth=SENTINEL-7f3a"
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path), triton_headers=sentinel)
    secrets = take_secrets(parsed)
    assert secrets == {"triton_headers": sentinel}
    assert parsed.triton_headers == ""  # what a master would send to its workers
    config = LoadTestConfig.from_options(parsed, secrets=secrets)
    assert config.target.client_options().headers == {"x-auth": "SENTINEL-7f3a"}
    assert "SENTINEL" not in repr(config)


def test_a_malformed_secret_is_named_without_its_value(tmp_path):
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        LoadTestConfig.from_options(parsed, secrets={"triton_headers": "ok=1,SENTINEL-no-equals"})
    assert "item 2" in str(caught.value) and "SENTINEL" not in str(caught.value)


def test_the_web_form_classes_of_the_options():
    # what loadtest.webform checks a submitted form against, from each option's WebForm
    assert set(ADDRESS_OPTIONS) == {"triton_url", "triton_protocol", "triton_ssl"}
    assert set(PATH_OPTIONS) == {"triton_root_cert", "store", "dump_dir", "report_dir"}
    assert SECRETS == ("triton_headers",)


def test_a_fleet_is_a_list_or_a_file_of_addresses(tmp_path):
    listed = tmp_path / "fleet.txt"
    listed.write_text("# the fleet\ngrpc://a:8001\n\nb:8001  # second\n")
    assert resolve_address("grpc://a:8001,b:8001", "", "grpc", False) == ("a:8001,b:8001", "grpc", False)
    assert resolve_address(f"@{listed}", "", "grpc", False) == ("a:8001,b:8001", "grpc", False)
    assert resolve_address(None, "https://a:1,https://b:2", "grpc", False) == ("a:1,b:2", "http", True)


@pytest.mark.parametrize("host, message", [
    ("a:8001,b:8001,A:8001", "A:8001 is given twice"),
    ("grpc://a:8001,http://b:8000", "the same protocol and TLS"),
    ("http://a:8000,https://b:8443", "the same protocol and TLS"),
    ("a:8001,,b:8001", "an empty address in the list"),
    ("@/nonexistent/fleet.txt", "cannot read the list of addresses"),
    (",".join(f"h{i}:1" for i in range(257)), "at most 256 in one fleet"),
])
def test_a_bad_fleet_is_refused_in_one_line(host, message):
    with pytest.raises(ConfigError, match=message) as caught:
        resolve_address(host, "", "grpc", False)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_an_empty_fleet_file_is_refused(tmp_path):
    empty = tmp_path / "none.txt"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="names no address"):
        resolve_address(f"@{empty}", "", "grpc", False)


def test_a_fleet_config_names_each_server_its_routing_and_budgets(tmp_path):
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path), routing="round-robin",
                                routing_header="X-Hstu-Route", fleet_budgets="1000,2000")
    config = LoadTestConfig.from_options(parsed, host="grpc://a:8001,b:8001")
    assert config.target.addresses == ("a:8001", "b:8001")
    assert config.target.url == "grpc://a:8001,grpc://b:8001"
    assert config.target.routing.value == "round-robin"
    assert [config.target.client_options(i).url for i in (0, 1)] == ["a:8001", "b:8001"]
    assert config.target.client_options(1).route_header == "x-hstu-route"
    assert config.cache.gpu_budgets(2) == (1000, 2000)


@pytest.mark.parametrize("options, message", [
    ({"fleet_budgets": "1000"}, "--fleet-budgets gives 1 budgets for a fleet of 2 servers"),
    ({"fleet_budgets": "1000,x"}, "--fleet-budgets"),
    ({"routing_header": "x-route: 1"}, "--routing-header 'x-route: 1': a header name is"),
    ({"routing_header": "x\r\ny"}, "a header name is"),
    ({"routing": "sticky"}, "--routing 'sticky'"),
])
def test_bad_fleet_options_are_refused_in_one_line(tmp_path, options, message):
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path), **options)
    with pytest.raises(ConfigError, match=message) as caught:
        LoadTestConfig.from_options(parsed, host="grpc://a:8001,b:8001")
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value).replace("\\n", "")
