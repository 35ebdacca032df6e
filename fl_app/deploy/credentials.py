"""TLS certificates for the SuperLink and authentication keys for the SuperNodes, each set written all or nothing
(``fl_app.deploy.files.install_file_set``).

Key formats (Flower 1.42): the SuperLink's TLS files are PEM (CA certificate, server certificate, PKCS#8 key);
SuperNode authentication keys are NIST elliptic-curve (P-384) keys, the private key in OpenSSH format and the
public key as an OpenSSH `ecdsa-sha2-nistp384 ...` line (what `ssh-keygen -t ecdsa -b 384` writes).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fl_app.deploy.addresses import LOOPBACK_NAMES, check_count, check_host
from fl_app.deploy.files import install_file_set, refuse_existing

CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.pem", "server.key"
MAX_CERT_DAYS = 3650  # certificate lifetime in days: at least one, at most ten years
MAX_NODE_INDEX = 1_000_000  # the first index in key file names (a partition id)
PRIVATE, PUBLIC = 0o600, 0o644


# ---------------------------------------------------------------------------------------------------------------
# TLS certificates for the SuperLink
# ---------------------------------------------------------------------------------------------------------------
def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fl-app deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_bytes(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca_certificate(ca_key, start: datetime.datetime, end: datetime.datetime) -> x509.Certificate:
    """The local CA's self-signed certificate (path length 0: it signs the server certificate, no other CA)."""
    ca_name = _name("fl-app deployment CA")
    return (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _server_certificate(
    server_key, hosts: list[str], ca_key, ca_name: x509.Name, start: datetime.datetime, end: datetime.datetime
) -> x509.Certificate:
    """The SuperLink's TLS certificate, signed by the CA, for the loopback names and ``hosts``."""
    return (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(_alternative_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _alternative_names(hosts: list[str]) -> list[x509.GeneralName]:
    """The loopback names and ``hosts`` in order, without duplicates: IP addresses as such, the rest as DNS names."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*LOOPBACK_NAMES, *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_certs(
    out_dir: str | Path, hosts: tuple[str, ...] | list[str] = (), days: int = 365, force: bool = False
) -> dict[str, Path]:
    """A local CA and a SuperLink server certificate signed by it, valid for localhost, 127.0.0.1, ::1 and `hosts`
    (DNS names or IP addresses the SuperNodes and the `flwr` CLI use to reach the SuperLink) for `days` days.
    Returns {"ca": ca.crt, "cert": server.pem, "key": server.key}; the CA's own key stays in ca.key. Private keys
    are created with mode 0600; existing files are refused unless `force`."""
    hosts = [check_host(host) for host in hosts]
    if not (isinstance(days, int) and 1 <= days <= MAX_CERT_DAYS):
        raise ValueError(f"--days {days!r}: a certificate lifetime in whole days in [1, {MAX_CERT_DAYS}]")
    out = Path(out_dir)
    paths = {"ca": out / CA_CERT, "cert": out / SERVER_CERT, "key": out / SERVER_KEY}
    refuse_existing([out / CA_KEY, *paths.values()], force)  # before any key is generated
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = _ca_certificate(ca_key, start, end)
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_cert = _server_certificate(server_key, hosts, ca_key, ca_cert.subject, start, end)

    install_file_set(  # all four or none: a failure midway leaves the previous set as it was
        out,
        {
            CA_KEY: (_key_bytes(ca_key), PRIVATE),
            SERVER_KEY: (_key_bytes(server_key), PRIVATE),
            CA_CERT: (ca_cert.public_bytes(serialization.Encoding.PEM), PUBLIC),
            SERVER_CERT: (server_cert.public_bytes(serialization.Encoding.PEM), PUBLIC),
        },
        force,
    )
    return paths


# ---------------------------------------------------------------------------------------------------------------
# SuperNode authentication keys
# ---------------------------------------------------------------------------------------------------------------
def _node_key_files(name: str) -> dict[str, tuple[bytes, int]]:
    """A fresh EC P-384 key pair: the private key in OpenSSH format (mode 0600) and its public key line."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    return {name: (private, PRIVATE), f"{name}.pub": (public, PUBLIC)}


def make_node_key(private_path: str | Path, force: bool = False) -> tuple[Path, Path]:
    """One SuperNode key pair: an EC P-384 private key in OpenSSH format at `private_path` (mode 0600) and its public
    key (`ecdsa-sha2-nistp384 ...`) at `private_path`.pub. Existing files are refused unless `force`.
    Returns (private, public)."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + ".pub")
    refuse_existing([private_path, public_path], force)
    install_file_set(private_path.parent, _node_key_files(private_path.name), force)
    return private_path, public_path


def make_node_keys(
    out_dir: str | Path, nodes: int, prefix: str = "supernode", start: int = 0, force: bool = False
) -> list[tuple[Path, Path]]:
    """`nodes` key pairs named <prefix>-<i> / <prefix>-<i>.pub, i = start .. start+nodes-1 (i = partition id),
    written as one set: all pairs or none."""
    check_count(nodes)  # before any key is made: each pair costs a key generation and two files
    if start < 0 or start > MAX_NODE_INDEX:
        raise ValueError(f"--start {start}: allowed: a whole number from 0 to {MAX_NODE_INDEX}")
    if nodes < 1 or start < 0 or not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix) or prefix.startswith("."):
        raise ValueError(
            f"--nodes {nodes}, --start {start}, --prefix {prefix!r}: need nodes >= 1, start >= 0 and a "
            "file-name prefix of letters, digits, '_', '.' and '-' (not starting with '.')"
        )
    out = Path(out_dir)
    names = [f"{prefix}-{i}" for i in range(start, start + nodes)]
    refuse_existing([out / n for name in names for n in (name, f"{name}.pub")], force)  # before any key is made
    files = {}
    for name in names:
        files.update(_node_key_files(name))
    install_file_set(out, files, force)
    return [(out / name, out / f"{name}.pub") for name in names]
