"""The registrar reads every enrolled host CA at each registration and
activation (:meth:`HostRegistry.binding`): each CA is parsed once, not
at every call, and a stored CA that does not parse still gives its host
no anchors (fail closed)."""

from __future__ import annotations

import uuid as uuid_mod
from unittest import mock

import sqlalchemy as sa
import testtools
from cryptography.hazmat.primitives import serialization

from verifier.db import HostCa
from verifier.registrar import Registrar
from verifier.registrar import hosts as hosts_mod
from verifier.tests.dbfixture import SqliteDatabase
from verifier.tests.unit.test_registrar_service import _ca


def _ca_pem(name: str) -> str:
    return _ca(name)[1].public_bytes(serialization.Encoding.PEM).decode()


class HostCaParsingTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.engine = self.useFixture(SqliteDatabase()).engine
        self.hosts = Registrar(self.engine).hosts
        hosts_mod.parsed_host_ca.cache_clear()
        self.addCleanup(hosts_mod.parsed_host_ca.cache_clear)

    def test_each_ca_is_parsed_once_across_bindings(self) -> None:
        for name in ("compute-a", "compute-b", "compute-c"):
            self.hosts.put_host_ca(name, _ca_pem(name), "vtpm-manager")
        hosts_mod.parsed_host_ca.cache_clear()  # put_host_ca parsed them too
        real = hosts_mod.load_host_ca
        with mock.patch.object(hosts_mod, "load_host_ca", side_effect=real) as load:
            for _ in range(4):
                binding = self.hosts.binding(str(uuid_mod.uuid4()))
                assert binding is not None
                self.assertEqual(
                    {"compute-a", "compute-b", "compute-c"}, set(binding.anchors)
                )
        self.assertEqual(3, load.call_count)

    def test_a_replaced_ca_is_parsed_anew(self) -> None:
        self.hosts.put_host_ca("compute-a", _ca_pem("old"), "vtpm-manager")
        first = self.hosts.binding(str(uuid_mod.uuid4()))
        self.hosts.put_host_ca("compute-a", _ca_pem("new"), "vtpm-manager")
        second = self.hosts.binding(str(uuid_mod.uuid4()))
        assert first is not None and second is not None
        names = [
            b.anchors["compute-a"][0].subject.rfc4514_string() for b in (first, second)
        ]
        self.assertEqual(["CN=old", "CN=new"], names)

    def test_a_stored_ca_that_does_not_parse_gives_no_anchors(self) -> None:
        self.hosts.put_host_ca("compute-a", _ca_pem("a"), "vtpm-manager")
        self.hosts.put_host_ca("compute-b", _ca_pem("b"), "vtpm-manager")
        with self.engine.begin() as conn:  # written by an older, laxer registrar
            conn.execute(
                sa.update(HostCa)
                .where(HostCa.host == "compute-b")
                .values(ca_pem="junk")
            )
        for _ in range(2):
            binding = self.hosts.binding(str(uuid_mod.uuid4()))
            assert binding is not None
            self.assertEqual(["compute-a"], list(binding.anchors))
