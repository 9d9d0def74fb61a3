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
