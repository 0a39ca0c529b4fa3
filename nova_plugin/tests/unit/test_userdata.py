"""User-data for a trusted boot: format, compression, Nova's size limit."""

from __future__ import annotations

import base64
import os
import zlib

import testtools

from node_agent.exceptions import RefusedError
from node_agent.payload import unwrap
from nova_plugin import userdata
from nova_plugin.boot import prepare_user_data
from nova_plugin.exceptions import TenantError
from verifier.common.tls import self_signed_certificate
from verifier.protocol import EnvelopeError, open_payload

PAYLOAD = b"#!/bin/sh\necho hello\n"
CA_PEM = self_signed_certificate("operator CA", ["192.0.2.1"])[1].decode()


class UserDataTest(testtools.TestCase):
    def test_limit_is_nova_s_65535_base64_characters(self) -> None:
        self.assertEqual(49149, userdata.MAX_USER_DATA_BYTES)
        self.assertLessEqual(len(base64.b64encode(bytes(49149))), 65535)
        self.assertGreater(len(base64.b64encode(bytes(49150))), 65535)

    def test_round_trip_opens_only_with_k_and_the_boot_id(self) -> None:
        key, sealed, boot_id, data = prepare_user_data(
            PAYLOAD, "https://registrar:8891", CA_PEM
        )
        config, envelope = userdata.parse_user_data(data)
        self.assertEqual(sealed, envelope)
        self.assertEqual(boot_id, config["boot_id"])
        self.assertEqual("https://registrar:8891", config["registrar_url"])
        self.assertNotIn(b"echo hello", data)
        plain = open_payload(key, envelope, boot_id)
        self.assertEqual(PAYLOAD, unwrap(plain, 1 << 20))
        other = "00000000-0000-0000-0000-000000000001"
        self.assertRaises(EnvelopeError, open_payload, key, envelope, other)

    def test_push_mode_puts_the_push_url_into_the_bootstrap_configuration(
        self,
    ) -> None:
        _, _, _, data = prepare_user_data(
            PAYLOAD, "https://registrar:8891", CA_PEM, "https://verifier:8883"
        )
        config, _ = userdata.parse_user_data(data)
        self.assertEqual("https://verifier:8883", config["push_url"])
        _, _, _, data = prepare_user_data(PAYLOAD, "https://registrar:8891", CA_PEM)
        self.assertNotIn("push_url", userdata.parse_user_data(data)[0])

    def test_push_url_that_is_not_a_url_is_refused_before_nova(self) -> None:
        exc = self.assertRaises(
            TenantError,
            prepare_user_data,
            PAYLOAD,
            "https://r:8891",
            CA_PEM,
            "ftp://verifier/?x=1",
        )
        self.assertIn("push_url", str(exc))

    def test_ca_that_is_not_a_certificate_is_refused_before_nova(self) -> None:
        exc = self.assertRaises(
            TenantError, prepare_user_data, PAYLOAD, "https://r:8891", "PEM"
        )
        self.assertIn("ca_pem", str(exc))

    def test_compressible_payload_over_the_limit_fits(self) -> None:
        big = b"echo 'the same line again'\n" * 8000  # 216 KB
        _, _, _, data = prepare_user_data(big, "https://r", None)
        self.assertLess(len(data), userdata.MAX_USER_DATA_BYTES)

    def test_incompressible_payload_over_the_limit_is_refused_with_its_size(
        self,
    ) -> None:
        exc = self.assertRaises(
            userdata.UserDataTooLargeError,
            prepare_user_data,
            os.urandom(50000),
            "https://r",
            None,
        )
        self.assertIn("after compression", str(exc))
        self.assertIn("49,149 bytes", str(exc))

    def test_decompression_bomb_is_refused(self) -> None:
        bomb = userdata.COMPRESSED_MAGIC + zlib.compress(bytes(4 << 20))
        exc = self.assertRaises(RefusedError, unwrap, bomb, 1 << 20)
        self.assertEqual("bad_payload", exc.code)

    def test_corrupt_compressed_payload_is_refused(self) -> None:
        exc = self.assertRaises(
            RefusedError, unwrap, userdata.COMPRESSED_MAGIC + b"junk", 1 << 20
        )
        self.assertEqual("bad_payload", exc.code)

    def test_not_trusted_user_data_is_refused(self) -> None:
        self.assertRaises(ValueError, userdata.parse_user_data, b"#!/bin/sh\n")
