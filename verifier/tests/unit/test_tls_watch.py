"""What the servers log about certificates (:mod:`verifier.common._tls_watch`).

A server context of :func:`verifier.common.tls.server_context` on asyncio
and on uvloop (as the services run), over a real loopback socket: a client
certificate that has expired, or that another CA signed, is refused at the
handshake and the refusal is logged once, with why. A service whose own
certificate has expired, or expires within 30 days, warns at start naming
the file and the date.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
import tempfile
import unittest
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from verifier.common import tls as tlsutil
from verifier.tests.unit.test_tls_resumption import _issue, _name

_LOGGER = "verifier.common.tls"


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM)


class CertDirCase(unittest.TestCase):
    """A temporary directory with a test CA (``ca_file``) and certificates
    it issues on demand (:meth:`_cert`)."""

    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.now = datetime.datetime.now(datetime.UTC)
        self.ca_key, ca_pem = _ca("test CA")
        self.ca_file = self._write("ca", b"", ca_pem)[1]

    def _write(self, name: str, key: bytes, cert: bytes) -> tuple[str, str]:
        key_file = os.path.join(self.tmp, f"{name}-key.pem")
        cert_file = os.path.join(self.tmp, f"{name}.pem")
        if key:
            tlsutil.write_private(key_file, key)
        with open(cert_file, "wb") as f:
            f.write(cert)
        return key_file, cert_file

    def _cert(
        self, name: str, valid_for: datetime.timedelta, ca: Any = None
    ) -> tuple[str, str]:
        key, cert = _issue(ca or self.ca_key, name, self.now + valid_for, ["127.0.0.1"])
        return self._write(name, key, cert)


class TlsWatchTest(CertDirCase):
    def _server_context(self, valid_for: datetime.timedelta) -> ssl.SSLContext:
        key_file, cert_file = self._cert("server", valid_for)
        return tlsutil.server_context(cert_file, key_file, self.ca_file)

    # -- refused client certificates ----------------------------------------

    def _refused(
        self, client: tuple[str, str], run: Callable[[Coroutine[Any, Any, None]], None]
    ) -> list[str]:
        """Connect with ``client`` (key, cert) on the loop ``run`` starts;
        the messages logged about it."""
        server = self._server_context(datetime.timedelta(days=365))
        ctx = tlsutil.client_context(client[1], client[0], self.ca_file)

        async def connect() -> None:
            loop = asyncio.get_running_loop()
            srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=server)
            port = srv.sockets[0].getsockname()[1]
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
                )
                self.assertEqual(b"", await reader.read(1))  # refused
                writer.close()
            except (OSError, ssl.SSLError):
                pass
            await asyncio.sleep(0.1)
            srv.close()

        with self.assertLogs(_LOGGER, logging.WARNING) as logs:
            run(connect())
        return [r.getMessage() for r in logs.records]

    def test_expired_client_certificate_refusal_is_logged_once_with_why(
        self,
    ) -> None:
        client = self._cert("client", datetime.timedelta(seconds=-60))
        for run in (asyncio.run, uvloop.run):
            with self.subTest(loop=run.__module__):
                messages = self._refused(client, run)
                self.assertEqual(1, len(messages), messages)
                self.assertIn("certificate has expired", messages[0])

    def test_client_certificate_of_another_ca_refusal_is_logged_once_with_why(
        self,
    ) -> None:
        other, _ = _ca("another CA")
        client = self._cert("intruder", datetime.timedelta(days=1), other)
        messages = self._refused(client, uvloop.run)
        self.assertEqual(1, len(messages), messages)
        self.assertIn("certificate signature failure", messages[0])  # same name

    # -- the service's own certificate ----------------------------------------

    def _start_warnings(self, valid_for: datetime.timedelta) -> list[str]:
        with self.assertLogs(_LOGGER, logging.WARNING) as logs:
            self._server_context(valid_for)
            logging.getLogger(_LOGGER).warning("end")  # assertLogs needs one
        return [r.getMessage() for r in logs.records][:-1]

    def test_service_starting_with_an_expired_certificate_warns(self) -> None:
        (message,) = self._start_warnings(datetime.timedelta(seconds=-60))
        self.assertIn(os.path.join(self.tmp, "server.pem"), message)
        self.assertIn("expired on", message)
        self.assertIn(self.now.date().isoformat(), message)

    def test_service_certificate_expiring_within_30_days_warns(self) -> None:
        (message,) = self._start_warnings(datetime.timedelta(days=10))
        self.assertIn(os.path.join(self.tmp, "server.pem"), message)
        self.assertIn("expires on", message)

    def test_service_certificate_valid_for_long_says_nothing(self) -> None:
        self.assertEqual([], self._start_warnings(datetime.timedelta(days=90)))
