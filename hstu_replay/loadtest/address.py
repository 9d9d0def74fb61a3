"""The Triton address: --host (Locust's Host field) and its alias --triton-url, as URLs whose
scheme says the protocol and TLS, or a bare host:port (then --triton-protocol and --triton-ssl)."""

from __future__ import annotations

from hstu_replay.errors import ConfigError

DEFAULT_ADDRESS = "127.0.0.1:8001"
#: URL scheme -> (protocol, TLS)
SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False), "https": ("http", True)}


def address_url(address: str, protocol: str, ssl: bool) -> str:
    """host:port as a URL (what Locust's Host field shows)."""
    scheme = {named: scheme for scheme, named in SCHEMES.items()}
    return f"{scheme[protocol, ssl]}://{address}"


def resolve_address(host: str | None, url: str, protocol: str, ssl: bool) -> tuple[str, str, bool]:
    """(host:port, protocol, tls) from --host and its alias --triton-url: `grpc://h:p`,
    `grpcs://h:p`, `http://h:p`, `https://h:p` (the scheme sets protocol and TLS) or a bare
    `h:p` (then --triton-protocol and --triton-ssl). Both given and different: an error."""
    given = [split_address(flag, text, protocol, ssl) for flag, text in (("--host", host), ("--triton-url", url))
             if text]
    if not given:
        return DEFAULT_ADDRESS, protocol, ssl
    if any(other != given[0] for other in given[1:]):
        raise ConfigError(f"--host {host!r} and --triton-url {url!r} name different targets: give one")
    return given[0]


def split_address(flag: str, text: str, protocol: str, ssl: bool) -> tuple[str, str, bool]:
    """One address option's (host:port, protocol, tls); `protocol` and `ssl` are the flags'."""
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    rest = rest.rstrip("/")
    if not sep:
        return text, protocol, ssl
    if scheme.lower() not in SCHEMES:
        raise ConfigError(f"{flag} {text!r}: use grpc://, grpcs://, http:// or https:// (or host:port)")
    named_protocol, named_ssl = SCHEMES[scheme.lower()]
    if protocol != "grpc" and protocol != named_protocol:
        raise ConfigError(f"{flag} {text!r} says {named_protocol}, --triton-protocol says {protocol}: give one")
    if ssl and not named_ssl:
        raise ConfigError(f"{flag} {text!r} has no TLS but --triton-ssl is set: use https:// or grpcs://")
    if not rest or "/" in rest:
        raise ConfigError(f"{flag} {text!r}: give scheme://host:port (no path)")
    return rest, named_protocol, named_ssl
