"""Trusted-boot user-data and the bootstrap configuration
(:mod:`verifier.protocol.userdata`): what the agent accepts from the cloud,
which the tenant does not trust; only MalformedError ever escapes."""

from __future__ import annotations

import gzip
import json
import uuid as uuid_mod

import testtools
from hypothesis import given, settings
from hypothesis import strategies as st

from nova_plugin.userdata import build_user_data
from verifier.common.tls import self_signed_certificate
from verifier.protocol import MalformedError
from verifier.protocol.userdata import (
    MAX_USER_DATA_INFLATED,
    BootstrapConfig,
    parse_user_data,
)

CA_PEM = self_signed_certificate("operator CA", ["192.0.2.1"])[1].decode()
BOOT_ID = str(uuid_mod.uuid4())


def _config(**changes: object) -> dict[str, object]:
    config = BootstrapConfig(BOOT_ID, "https://192.0.2.1:8891", CA_PEM)
    return config.to_dict() | changes


class BootstrapConfigTest(testtools.TestCase):
    def test_round_trip(self) -> None:
        config = BootstrapConfig(BOOT_ID.upper(), "https://r.example:8891/", CA_PEM)
        self.assertEqual(BOOT_ID, config.boot_id)
        self.assertEqual("https://r.example:8891", config.registrar_url)
        raw = json.dumps(config.to_dict()).encode()
        self.assertEqual(config, BootstrapConfig.from_json(raw))

    def test_ca_is_optional(self) -> None:
        self.assertIsNone(BootstrapConfig.from_dict(_config(ca_pem=None)).ca_pem)

    def test_bad_fields_are_malformed(self) -> None:
        for bad in (
            _config(version=2),
            _config(boot_id="boot-1"),
            _config(boot_id=7),
            _config(registrar_url="ftp://r"),
            _config(registrar_url="https://user:pw@r"),
            _config(registrar_url="https://"),
            _config(ca_pem="not a certificate"),
            _config(extra=1),
            {"version": 1},
            [],
        ):
            self.assertRaises(MalformedError, BootstrapConfig.from_dict, bad)

    def test_not_json_is_malformed(self) -> None:
        for raw in (b"{", b"\xff\xfe", b"x" * (300 * 1024)):
            self.assertRaises(MalformedError, BootstrapConfig.from_json, raw)


class UserDataTest(testtools.TestCase):
    def test_parses_what_the_boot_wrapper_builds(self) -> None:
        config = BootstrapConfig(BOOT_ID, "https://192.0.2.1:8891", CA_PEM)
        parsed = parse_user_data(build_user_data(config, b"TCP1" + bytes(100)))
        self.assertEqual(config, parsed.config)
        self.assertEqual(b"TCP1" + bytes(100), parsed.envelope)

    def test_gzip_bomb_is_refused(self) -> None:
        bomb = gzip.compress(bytes(MAX_USER_DATA_INFLATED + 1))
        exc = self.assertRaises(MalformedError, parse_user_data, bomb)
        self.assertIn("inflates too far", str(exc))

    def test_corrupt_gzip_is_malformed(self) -> None:
        self.assertRaises(MalformedError, parse_user_data, b"\x1f\x8bjunk")

    def test_foreign_user_data_is_malformed(self) -> None:
        for data in (b"#!/bin/sh\necho hi\n", b"#cloud-config\n{}\n", b""):
            self.assertRaises(MalformedError, parse_user_data, data)

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=2048))
    def test_random_bytes_raise_only_malformed(self, data: bytes) -> None:
        try:
            parse_user_data(data)
        except MalformedError:
            pass
