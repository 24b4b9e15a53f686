"""Local credentials for a deployment: a CA, TLS server certificates, SuperNode auth keys.

    python -m deploy.certs DIR --parties a,b,c

writes DIR/ca.crt (+ ca.key), DIR/server.crt / server.key (for the SuperLink and the linkage
service; valid for 127.0.0.1, ::1 and localhost plus any --host names), and for every party
an EC P-384 key pair in OpenSSH format, DIR/nodes/<party> and <party>.pub, which the SuperLink
registers (``flwr supernode register``) and the SuperNode signs with
(``--auth-supernode-private-key``). For separate hosts, pass every host name or IP the
parties will dial with --host.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from files.private import create_secret

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedsim local deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def write_private(path: Path, data: bytes) -> None:
    """Created 0600 (never readable by others, not even for a moment: files.private.create_secret;
    a certificate or public key too: no one else may replace it); an existing file is replaced
    (new credentials for a new deployment)."""
    path.unlink(missing_ok=True)
    create_secret(path, data, "credential")


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_ca(folder: Path, days: int = 365) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedsim local CA"))
        .issuer_name(_name("fedsim local CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA384())
    )
    write_private(folder / "ca.crt", cert.public_bytes(serialization.Encoding.PEM))
    write_private(folder / "ca.key", _pem_key(key))
    return cert, key


def make_server_cert(
    folder: Path,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: list[str],
    name: str = "server",
    days: int = 365,
) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    write_private(folder / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
    write_private(folder / f"{name}.key", _pem_key(key))


def make_node_key(folder: Path, party: str) -> Path:
    """An EC P-384 key pair in OpenSSH format, the form Flower's SuperNode auth reads."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    write_private(
        folder / party,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    write_private(  # public, but no one else may replace it
        folder / f"{party}.pub",
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH),
    )
    return folder / party


def make_credentials(folder: Path, parties: list[str], hosts: list[str] = ()) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, ca_key = make_ca(folder)
    make_server_cert(folder, ca, ca_key, [*LOCAL_NAMES, *hosts])
    for party in parties:
        make_node_key(folder / "nodes", party)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--parties", required=True, help="comma-separated SuperNode party names")
    ap.add_argument("--host", action="append", default=[], help="another name/IP the servers are reached by")
    args = ap.parse_args()
    parties = [p for p in args.parties.split(",") if p]
    make_credentials(args.folder, parties, args.host)
    print(f"wrote CA, server certificate and {len(parties)} node key pair(s) to {args.folder}")


if __name__ == "__main__":
    main()
