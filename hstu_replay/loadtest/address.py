"""The Triton address: --host (Locust's Host field) and its alias --triton-url, as URLs whose
scheme says the protocol and TLS, or a bare host:port (then --triton-protocol and --triton-ssl).

A fleet is several addresses: a comma-separated list, or `@file` naming a file of them (one per
line, `#` comments). Every address of a fleet speaks the same protocol, with or without TLS alike,
and no address comes twice. Resolved, a fleet is its addresses joined by commas, in order.
"""

from __future__ import annotations

from pathlib import Path

from hstu_replay.errors import ConfigError
from hstu_replay.interface import DEFAULT_ADDRESS

MAX_SERVERS = 256  # addresses in one fleet
MAX_FLEET_FILE_BYTES = 1 << 20
#: URL scheme -> (protocol, TLS)
SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False), "https": ("http", True)}


def address_url(address: str, protocol: str, ssl: bool) -> str:
    """host:port (or a fleet's, joined by commas) as URLs (what Locust's Host field shows)."""
    scheme = {named: scheme for scheme, named in SCHEMES.items()}
    return ",".join(f"{scheme[protocol, ssl]}://{a}" for a in addresses(address))


def resolve_address(host: str | None, url: str, protocol: str, ssl: bool) -> tuple[str, str, bool]:
    """(host:port, protocol, tls) from --host and its alias --triton-url: `grpc://h:p`,
    `grpcs://h:p`, `http://h:p`, `https://h:p` (the scheme sets protocol and TLS) or a bare
    `h:p` (then --triton-protocol and --triton-ssl). Both given and different: an error."""
    given = [split_fleet(flag, text, protocol, ssl) for flag, text in (("--host", host), ("--triton-url", url))
             if text]
    if not given:
        return DEFAULT_ADDRESS, protocol, ssl
    if any(other != given[0] for other in given[1:]):
        raise ConfigError(f"--host {host!r} and --triton-url {url!r} name different targets: give one")
    return given[0]


def fleet_items(flag: str, text: str) -> list[str]:
    """The addresses a fleet option names: its comma-separated items, or those of `@file`."""
    text = text.strip()
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            if path.stat().st_size > MAX_FLEET_FILE_BYTES:
                raise ConfigError(f"{flag} {text}: larger than {MAX_FLEET_FILE_BYTES} bytes: not a list of addresses")
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{flag} {text}: cannot read the list of addresses: {getattr(exc, 'strerror', exc)}") \
                from None
        items = [line.split("#", 1)[0].strip() for line in lines]
        items = [i for i in items if i]
        if not items:
            raise ConfigError(f"{flag} {text}: names no address")
        return items
    items = [i.strip() for i in text.split(",")]
    if any(not i for i in items):
        raise ConfigError(f"{flag} {text!r}: an empty address in the list")
    return items


def split_fleet(flag: str, text: str, protocol: str, ssl: bool) -> tuple[str, str, bool]:
    """A fleet option's (addresses joined by commas, protocol, tls): one protocol and TLS for all."""
    items = fleet_items(flag, text)
    if len(items) > MAX_SERVERS:
        raise ConfigError(f"{flag}: {len(items)} addresses; at most {MAX_SERVERS} in one fleet")
    split = [split_address(flag, item, protocol, ssl) for item in items]
    kinds = {(p, t) for _, p, t in split}
    if len(kinds) > 1:
        raise ConfigError(f"{flag} {text!r}: every address of a fleet needs the same protocol and TLS")
    seen: set[str] = set()
    for address, _, _ in split:
        if address.lower() in seen:
            raise ConfigError(f"{flag}: {address} is given twice; each server of a fleet once")
        seen.add(address.lower())
    (kind,) = kinds
    return ",".join(a for a, _, _ in split), *kind


def addresses(joined: str) -> tuple[str, ...]:
    """The addresses of a resolved fleet (`split_fleet`), in order."""
    return tuple(joined.split(","))


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
