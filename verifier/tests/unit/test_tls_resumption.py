"""No TLS session outlives the client certificate that opened it.

A resumed session skips the client certificate's verification. The
server context of every service (:func:`verifier.common.tls.server_context`)
is held, over a real loopback socket, against a client whose certificate
expires two seconds after it is made: it connects while the certificate
is valid, keeps whatever session it got, and tries to resume it once the
certificate has expired -- by TLS 1.2 session ID or ticket, and by TLS
1.3 ticket. Both are refused.
"""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import tempfile
import threading
import time
import unittest

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from verifier.common import tls as tlsutil

_LIFETIME = 2  # seconds the client certificate is valid


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    cn: str,
    not_after: datetime.datetime,
    hosts: list[str] | None = None,
) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name("test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
    )
    if hosts:
        builder = builder.add_extension(tlsutil.subject_alt_names(hosts), False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return tlsutil.private_pem(key), cert.public_bytes(serialization.Encoding.PEM)


class _Server(threading.Thread):
    """Accepts TLS connections with ``ctx`` and answers ``ok`` to each."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        super().__init__(daemon=True)
        self.ctx = ctx
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()


class ResumptionTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        ca = (
            x509.CertificateBuilder()
            .subject_name(_name("test CA"))
            .issuer_name(_name("test CA"))
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.files = {}
        pems = {"ca": (b"", ca.public_bytes(serialization.Encoding.PEM))}
        pems["server"] = _issue(
            self.ca_key, "server", now + datetime.timedelta(days=1), ["127.0.0.1"]
        )
        self.expiry = now.replace(microsecond=0) + datetime.timedelta(
            seconds=_LIFETIME + 1
        )
        pems["client"] = _issue(self.ca_key, "client", self.expiry)
        for name, (key, cert) in pems.items():
            self.files[name] = os.path.join(tmp.name, f"{name}.pem")
            with open(self.files[name], "wb") as f:
                f.write(cert)
            if key:
                self.files[f"{name}-key"] = os.path.join(tmp.name, f"{name}-key.pem")
                tlsutil.write_private(self.files[f"{name}-key"], key)
        ctx = tlsutil.server_context(
            self.files["server"], self.files["server-key"], self.files["ca"]
        )
        self.server = _Server(ctx)
        self.server.start()
        self.addCleanup(self.server.sock.close)

    def _client(self, maximum: ssl.TLSVersion) -> ssl.SSLContext:
        ctx = tlsutil.client_context(
            self.files["client"], self.files["client-key"], self.files["ca"]
        )
        ctx.maximum_version = maximum
        return ctx

    def _talk(
        self, ctx: ssl.SSLContext, session: ssl.SSLSession | None
    ) -> tuple[bytes, ssl.SSLSession | None]:
        """Connect (resuming ``session`` if given): (the answer, the
        session after it); the answer is empty if the server refused."""
        with socket.create_connection(("127.0.0.1", self.server.port), 5) as raw:
            try:
                with ctx.wrap_socket(
                    raw, server_hostname="127.0.0.1", session=session
                ) as tls:
                    answer = tls.recv(2)
                    return answer, tls.session
            except (OSError, ssl.SSLError):
                return b"", None

    def _wait_for_expiry(self) -> None:
        left = (self.expiry - datetime.datetime.now(datetime.UTC)).total_seconds()
        time.sleep(max(0.0, left) + 1.5)

    def _assert_no_resumption_past_expiry(self, maximum: ssl.TLSVersion) -> None:
        ctx = self._client(maximum)
        _, session = self._talk(ctx, None)  # TLS 1.2 only: refused by now
        self._wait_for_expiry()
        answer, _ = self._talk(ctx, session)
        self.assertEqual(b"", answer, "the expired certificate got in")

    def test_tls12_session_made_before_expiry_does_not_resume_after(self) -> None:
        self._assert_no_resumption_past_expiry(ssl.TLSVersion.TLSv1_2)

    def test_tls13_session_made_before_expiry_does_not_resume_after(self) -> None:
        self._assert_no_resumption_past_expiry(ssl.TLSVersion.TLSv1_3)

    def test_a_valid_certificate_still_gets_in(self) -> None:
        answer, _ = self._talk(self._client(ssl.TLSVersion.MAXIMUM_SUPPORTED), None)
        self.assertEqual(b"ok", answer)
