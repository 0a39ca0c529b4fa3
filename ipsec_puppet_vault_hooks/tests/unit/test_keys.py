"""Tests of :func:`ipsec_puppet_vault_hooks.load_public_key`."""

from __future__ import annotations

import os

import fixtures
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from oslotest import base

from ipsec_puppet_vault_hooks import HooksError, load_public_key


def _pem(key: ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class LoadPublicKeyTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def test_loads_ed25519_key(self) -> None:
        key = ed25519.Ed25519PrivateKey.generate().public_key()
        path = self._write("verifier.pem", _pem(key))
        loaded = load_public_key(path)
        self.assertEqual(_pem(key), _pem(loaded))

    def test_missing_file(self) -> None:
        path = os.path.join(self.tmp, "missing.pem")
        exc = self.assertRaises(HooksError, load_public_key, path)
        self.assertIn(path, str(exc))

    def test_not_pem(self) -> None:
        path = self._write("junk.pem", b"not a key")
        exc = self.assertRaises(HooksError, load_public_key, path)
        self.assertIn(path, str(exc))

    def test_wrong_key_type(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1()).public_key()
        path = self._write("ec.pem", _pem(key))
        exc = self.assertRaises(HooksError, load_public_key, path)
        self.assertIn(path, str(exc))
        self.assertIn("not an Ed25519", str(exc))
