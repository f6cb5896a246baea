"""Secured listeners for the test brokers: SASL_SSL with SCRAM-SHA-512 and mutual TLS, under ACLs.

Production Kafka clusters run SASL_SSL or mutual TLS with ACLs, and the jobs must read through those settings as
they read PLAINTEXT, fail clearly when a credential is wrong, and never show a secret. A
`sim.brokers.KafkaCluster(secured=True)` serves, beside its PLAINTEXT listener (the admin's and the brokers' own,
whose ANONYMOUS principal is the super user), a SASL_SSL listener (SCRAM-SHA-512 over server-authenticated TLS) and
an SSL listener that requires a client certificate (the principal is the certificate's CN). KRaft's
StandardAuthorizer is on: any other principal may do only what an ACL grants it.

The certificates are made by `openssl` when the cluster is made, in its own directory (removed with it; nothing
is committed): a CA; the broker's, for 127.0.0.1 and localhost (librdkafka checks the host name); a client's with
an encrypted key; the same client key certified for a day in 2020 (expired) and by a CA the broker does not trust.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPER_USER = "User:ANONYMOUS"  # the PLAINTEXT listener's principal: the admin and the brokers themselves
SCRAM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
MTLS_CN = "tidegauge-mtls"
# the principal of a client certificate is its CN (Kafka's default would be the whole distinguished name)
# (Java writes the subject most specific part last: "O=...,CN=name")
PRINCIPAL_RULES = r"RULE:^(.*,)?CN=([^,]+)(,.*)?$/$2/,DEFAULT"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SECURED_LISTENERS = ("SASL_SSL", "SSL")


class CertificateError(RuntimeError):
    """openssl is missing or refused to make a certificate; the message says which step and what it said."""


@dataclass(frozen=True)
class Certificates:
    """PEM files of a secured test cluster. `client_key` is encrypted with `key_password`."""

    dir: Path
    ca: Path
    broker_keystore: Path  # the broker's key and certificate in one PEM file (Kafka's PEM keystore)
    client_cert: Path
    client_key: Path
    key_password: str
    expired_cert: Path  # client_key's certificate, valid for one day in 2020
    untrusted_cert: Path  # client_key's certificate, signed by another CA
    untrusted_ca: Path

    def mtls_conf(self, cert: Path | None = None) -> dict[str, str]:
        """librdkafka settings of a client presenting `cert` (default: the good client certificate)."""
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca),
            "ssl.certificate.location": str(cert or self.client_cert),
            "ssl.key.location": str(self.client_key),
            "ssl.key.password": self.key_password,
        }

    def scram_conf(self, user: str, password: str) -> dict[str, str]:
        """librdkafka settings of a SCRAM-SHA-512 client over TLS."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.ca),
        }


def _openssl(args: list[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise CertificateError("openssl is not installed (apt-get install openssl)") from None
    if done.returncode != 0:
        raise CertificateError(f"openssl could not make {what}: {done.stderr.strip()[-600:]}")


def _ec_key(path: Path, cwd: Path, password: str | None = None) -> None:
    args = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)]
    if password is not None:
        args += ["-aes-256-cbc", "-pass", f"pass:{password}"]
    _openssl(args, cwd, path.name)


def _ca(name: str, cwd: Path) -> tuple[Path, Path]:
    key, cert = cwd / f"{name}.key", cwd / f"{name}.pem"
    _ec_key(key, cwd)
    _openssl(
        ["req", "-x509", "-new", "-key", str(key), "-subj", f"/CN={name}", "-days", "30", "-out", str(cert)],
        cwd,
        f"the CA {name}",
    )
    return key, cert


def _csr(key: Path, cn: str, cwd: Path, password: str | None = None) -> Path:
    csr = cwd / f"{cn}.csr"
    args = ["req", "-new", "-key", str(key), "-subj", f"/CN={cn}/O=tidegauge tests", "-out", str(csr)]
    if password is not None:
        args += ["-passin", f"pass:{password}"]
    _openssl(args, cwd, f"the request of {cn}")
    return csr


def _sign(csr: Path, ca: tuple[Path, Path], out: Path, cwd: Path, ext: str | None = None) -> None:
    args = ["x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial"]
    args += ["-days", "30", "-out", str(out)]
    if ext:
        (cwd / "ext.cnf").write_text(ext)
        args += ["-extfile", str(cwd / "ext.cnf")]
    _openssl(args, cwd, out.name)


def _sign_expired(csr: Path, ca: tuple[Path, Path], out: Path, cwd: Path) -> None:
    """A certificate whose validity ended in 2020: `openssl x509` (3.0) sets no start date, `openssl ca` does."""
    db = cwd / "ca-db"
    db.mkdir()
    (db / "index.txt").write_text("")
    (db / "serial").write_text("1000\n")
    (db / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\n"
        f"database = {db / 'index.txt'}\nserial = {db / 'serial'}\nnew_certs_dir = {db}\n"
        "default_md = sha256\npolicy = any\nunique_subject = no\n[any]\ncommonName = supplied\n"
    )
    args = ["ca", "-batch", "-config", str(db / "ca.cnf"), "-cert", str(ca[1]), "-keyfile", str(ca[0])]
    args += ["-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-notext"]
    _openssl([*args, "-in", str(csr), "-out", str(out)], cwd, out.name)


def make_certificates(directory: Path) -> Certificates:
    """Every certificate a secured test cluster and its clients need, made by openssl in `directory`."""
    if shutil.which("openssl") is None:
        raise CertificateError("openssl is not installed (apt-get install openssl)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca("tidegauge-test-ca", d)
    broker_key = d / "broker.key"
    _ec_key(broker_key, d)
    broker_cert = d / "broker.pem"
    _sign(
        _csr(broker_key, "localhost", d),
        ca,
        broker_cert,
        d,
        ext="subjectAltName = IP:127.0.0.1, DNS:localhost\n",
    )
    keystore = d / "broker-keystore.pem"
    keystore.write_text(broker_key.read_text() + broker_cert.read_text())
    password = secrets.token_hex(12)
    client_key = d / "client.key"
    _ec_key(client_key, d, password)
    csr = _csr(client_key, MTLS_CN, d, password)
    client_cert, expired, untrusted = d / "client.pem", d / "client-expired.pem", d / "client-untrusted.pem"
    _sign(csr, ca, client_cert, d)
    _sign_expired(csr, ca, expired, d)
    rogue = _ca("some-other-ca", d)
    _sign(csr, rogue, untrusted, d)
    return Certificates(d, ca[1], keystore, client_cert, client_key, password, expired, untrusted, rogue[1])


def broker_properties(certs: Certificates) -> dict[str, Any]:
    """The broker settings of the secured listeners (their ports are the cluster's to set) and the authorizer."""
    return {
        "sasl.enabled.mechanisms": SCRAM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": certs.broker_keystore,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": certs.ca,
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": PRINCIPAL_RULES,
        "authorizer.class.name": AUTHORIZER,
        "super.users": SUPER_USER,
    }


def add_scram_user(admin: Any, user: str, password: str, timeout_s: float = 30) -> None:
    """A SCRAM-SHA-512 user, through the AdminClient (AlterUserScramCredentials)."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, info, password.encode())], request_timeout=timeout_s
    )
    for fut in futures.values():
        fut.result(timeout=timeout_s + 5)


def allow(
    admin: Any,
    principal: str,
    topics: list[str],
    operations: tuple[str, ...] = ("READ", "DESCRIBE"),
    timeout_s: float = 30,
) -> None:
    """ACLs that let `principal` (e.g. "User:reader") do `operations` on exactly these topics."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            getattr(AclOperation, op),
            AclPermissionType.ALLOW,
        )
        for topic in topics
        for op in operations
    ]
    for fut in admin.create_acls(bindings, request_timeout=timeout_s).values():
        fut.result(timeout=timeout_s + 5)
