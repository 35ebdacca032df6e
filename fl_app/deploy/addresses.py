"""Checks of the addresses an operator types: host names, loopback, and the insecure local-test mode's limits."""

from __future__ import annotations

import ipaddress
import re
import sys

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
INSECURE_REMOTE_FLAG = "--insecure-allow-remote"


def check_host(host: str, what: str = "--host") -> str:
    """A DNS name (labels of letters, digits and '-', 1-63 characters each, at most 253 in all) or an IP address;
    raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(host, str) and host:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            if len(host) <= 253 and all(DNS_LABEL.fullmatch(label) for label in host.split(".")):
                return host
    raise ValueError(
        f"{what} {host!r}: not a DNS name or an IP address (DNS names: labels of letters, digits and "
        "'-', 1-63 characters each, at most 253 characters in all)"
    )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_insecure_address(host: str, what: str, allow_remote: bool) -> None:
    """The insecure local-test mode sends everything in plain text without authentication: loopback only, unless
    the operator says otherwise in so many words (``allow_remote``), and then it is said loudly."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ValueError(
            f"{what} {host!r}: the insecure local-test mode (no TLS, no SuperNode authentication) only "
            f"uses loopback addresses ({', '.join(LOOPBACK_NAMES)}); for anything else set up TLS "
            f"(certs, keys) or pass {INSECURE_REMOTE_FLAG}"
        )
    print(
        f"WARNING: {what} {host!r} is not a loopback address: traffic is unencrypted and any host that reaches it "
        "can join or submit runs",
        file=sys.stderr,
        flush=True,
    )


def split_address(address: str) -> str:
    """The host of HOST:PORT or [IPv6]:PORT."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
