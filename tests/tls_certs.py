"""A throwaway PKI for TLS tests: a CA, a server and a client certificate, and an untrusted CA's client.

Certificates name localhost and 127.0.0.1 and live one day; keys are EC P-256 (fast to make).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by a CA nobody trusts
    rogue_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, server: bool
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.timezone.utc)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH, *([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])]
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.SubjectAlternativeName([
                   x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                   critical=False))
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None
           ) -> tuple[Path, Path | None]:
    cert_path = folder / f"{name}.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is None:
        return cert_path, None
    key_path = folder / f"{name}.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("rlfleet test CA")
    rogue_ca, rogue_ca_key = _ca("rogue CA")
    ca_path, _ = _write(folder, "ca", ca)
    server = _write(folder, "server", *_leaf("rlfleet server", ca, ca_key, server=True))
    client = _write(folder, "client", *_leaf("rlfleet client", ca, ca_key, server=False))
    rogue = _write(folder, "rogue", *_leaf("rogue client", rogue_ca, rogue_ca_key, server=False))
    return Pki(ca_path, server[0], server[1], client[0], client[1], rogue[0], rogue[1])


def secure_job_config(folder: Path, pki: Pki, token: str) -> Path:
    """A job config with mutual TLS (pki's server certificate, client certificates required) and a bearer
    token in a file of mode 0600, as the secure end-to-end runs use it; returns the config's path."""
    token_file = folder / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    config = folder / "secure.yaml"
    config.write_text(
        "security:\n"
        f"  tls_cert: {pki.server_cert}\n  tls_key: {pki.server_key}\n  tls_ca: {pki.ca}\n"
        f"  require_client_cert: true\n  token_file: {token_file}\n")
    return config
