"""The agent's bootstrap from what cloud-init writes (node_agent.bootstrap)
and the payload of the user-data taken when U comes alone."""

import gzip
import json
import os
import uuid as uuid_mod

from oslo_config import cfg

from node_agent import conf as agent_conf
from node_agent.bootstrap import BOOTSTRAP_CA, BootPayload, contact_address, resolve
from node_agent.exceptions import BootstrapError, RefusedError
from node_agent.tests.unit.test_agent import SCRIPT, AgentTestBase
from nova_plugin.userdata import build_user_data, compress_payload
from verifier.common.tls import self_signed_certificate
from verifier.protocol import generate_key, seal_payload, seal_share, split
from verifier.protocol.userdata import BootstrapConfig

CA_PEM = self_signed_certificate("operator CA", ["192.0.2.1"])[1].decode()


class ResolveTest(AgentTestBase):
    def setUp(self):
        super().setUp()
        self.conf = cfg.ConfigOpts()
        agent_conf.register_opts(self.conf)
        self.conf([], project="trusted-cloud-test")
        self.boot_id = str(uuid_mod.uuid4())
        self.config = BootstrapConfig(self.boot_id, "https://192.0.2.1:8891", CA_PEM)
        self.files = {
            "bootstrap_file": self.file("bootstrap.json"),
            "user_data_file": self.file("user-data.txt"),
            "instance_data_file": self.file("instance-data.json"),
            "instance_id_file": self.file("instance-id"),
        }
        self.set(work_dir=self.work_dir, **self.files)

    def file(self, name, data=None):
        path = os.path.join(self.tmp.name, name)
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        return path

    def set(self, **options):
        for name, value in options.items():
            self.conf.set_override(name, value, group="agent")

    def write_bootstrap(self):
        self.file("bootstrap.json", json.dumps(self.config.to_dict()).encode())

    def write_instance(self, instance_id):
        data = {"v1": {"instance_id": instance_id}}
        self.file("instance-data.json", json.dumps(data).encode())

    def test_bootstrap_fills_unset_options(self):
        self.write_bootstrap()
        self.write_instance(self.uuid.upper())
        settings = resolve(self.conf.agent)
        self.assertEqual(self.uuid, settings.uuid)
        self.assertEqual("https://192.0.2.1:8891", settings.registrar_url)
        self.assertEqual(os.path.join(self.work_dir, BOOTSTRAP_CA), settings.ca_file)
        with open(settings.ca_file, encoding="utf-8") as f:
            self.assertEqual(CA_PEM, f.read())

    def test_options_set_win_over_the_bootstrap_file(self):
        self.write_bootstrap()
        self.set(uuid=self.uuid, registrar_url="https://r:1", ca_file="/etc/ca.pem")
        settings = resolve(self.conf.agent)
        self.assertEqual(
            (self.uuid, "https://r:1", "/etc/ca.pem"),
            (settings.uuid, settings.registrar_url, settings.ca_file),
        )

    def test_bootstrap_push_url_names_the_push_endpoint(self):
        # trusted-nova boot --mode push: the tenant's user-data says "push"
        self.config = BootstrapConfig(
            self.boot_id, "https://192.0.2.1:8891", CA_PEM, "https://192.0.2.1:8883/"
        )
        self.write_bootstrap()
        self.set(uuid=self.uuid)
        self.assertEqual("https://192.0.2.1:8883", resolve(self.conf.agent).push_url)

    def test_bootstrap_without_push_url_leaves_the_mode_to_the_options(self):
        self.write_bootstrap()
        self.set(uuid=self.uuid)
        self.assertIsNone(resolve(self.conf.agent).push_url)
        self.assertNotIn("push_url", self.config.to_dict())  # as before

    def test_no_bootstrap_file_leaves_options_as_they_are(self):
        self.set(uuid=self.uuid)
        settings = resolve(self.conf.agent)
        self.assertIsNone(settings.registrar_url)
        self.assertIsNone(settings.ca_file)

    def test_malformed_bootstrap_file_is_a_bootstrap_error(self):
        self.set(uuid=self.uuid)
        self.file("bootstrap.json", b'{"version": 1, "boot_id": "x"')
        exc = self.assertRaises(BootstrapError, resolve, self.conf.agent)
        self.assertIn("bootstrap.json", str(exc))

    def test_uuid_from_the_instance_id_file(self):
        self.file("instance-id", f"{self.uuid}\n".encode())
        self.assertEqual(self.uuid, resolve(self.conf.agent).uuid)

    def test_instance_id_that_is_not_a_uuid_is_refused(self):
        self.write_instance("i-0123456789abcdef")  # not a Nova instance
        exc = self.assertRaises(BootstrapError, resolve, self.conf.agent)
        self.assertIn("not a UUID", str(exc))

    def test_no_uuid_anywhere_is_refused(self):
        exc = self.assertRaises(BootstrapError, resolve, self.conf.agent)
        self.assertIn("[agent] uuid is not set", str(exc))

    def test_payload_from_gzipped_user_data(self):
        self.set(uuid=self.uuid)
        data = build_user_data(self.config, b"TCP1" + bytes(64))
        if data[:2] != b"\x1f\x8b":
            data = gzip.compress(data)
        self.file("user-data.txt", data)
        settings = resolve(self.conf.agent)
        self.assertEqual(
            BootPayload(b"TCP1" + bytes(64), self.boot_id), settings.boot_payload
        )

    def test_foreign_user_data_gives_no_payload_and_says_why(self):
        self.set(uuid=self.uuid)
        self.file("user-data.txt", b"#!/bin/sh\necho not ours\n")
        settings = resolve(self.conf.agent)
        self.assertIsNone(settings.boot_payload)
        self.assertIn("carries no trusted-boot payload", settings.no_payload_reason)


class ContactAddressTest(AgentTestBase):
    def test_a_listening_address_is_the_contact_address(self):
        self.assertEqual("192.0.2.5", contact_address("192.0.2.5", None))

    def test_wildcard_registers_the_address_of_the_route_to_the_registrar(self):
        url = "https://127.0.0.1:8891"
        self.assertEqual("127.0.0.1", contact_address("0.0.0.0", url))

    def test_wildcard_without_registrar_is_a_bootstrap_error(self):
        self.assertRaises(BootstrapError, contact_address, "0.0.0.0", None)

    def test_contact_host_set_wins(self):
        conf = cfg.ConfigOpts()
        agent_conf.register_opts(conf)
        conf([], project="trusted-cloud-test")
        for name, value in {
            "uuid": self.uuid,
            "host": "0.0.0.0",
            "contact_host": "203.0.113.4",
            "bootstrap_file": "",
            "user_data_file": "",
        }.items():
            conf.set_override(name, value, group="agent")
        self.assertEqual("203.0.113.4", resolve(conf.agent).contact_host)


class UserDataPayloadTest(AgentTestBase):
    """U alone: the payload is the one of the user-data."""

    def boot_inputs(self):
        key = generate_key()
        u, v = split(key)
        boot_id = str(uuid_mod.uuid4())
        nk = self.agent.nk_public
        sealed = seal_payload(key, compress_payload(SCRIPT), boot_id)
        return (
            seal_share(nk, u, "U", self.uuid),
            seal_share(nk, v, "V", self.uuid),
            BootPayload(sealed, boot_id),
        )

    def test_u_alone_runs_the_user_data_payload(self):
        u_env, v_env, boot_payload = self.boot_inputs()
        self.agent.boot_payload = boot_payload

        async def go():
            self.assertFalse(await self.agent.receive_u(u_env))
            self.assertTrue(await self.agent.receive_v(v_env, None))
            return await self.agent.wait_payload()

        self.assertEqual(3, self.run_async(go()))

    def test_u_alone_without_user_data_payload_is_refused_no_payload(self):
        u_env, _, _ = self.boot_inputs()
        self.agent.no_payload_reason = "no user-data at /x"
        exc = self.assertRaises(
            RefusedError, self.run_async, self.agent.receive_u(u_env)
        )
        self.assertEqual(("no_payload", 409), (exc.code, exc.status))
        self.assertIn("no user-data at /x", exc.detail)
        self.assertFalse(self.agent.status()["has_u"])

    def test_user_data_payload_swapped_by_the_cloud_runs_nothing(self):
        u_env, v_env, boot_payload = self.boot_inputs()
        other_key = generate_key()
        forged = seal_payload(other_key, b"#!/bin/sh\nexit 0\n", boot_payload.boot_id)
        self.agent.boot_payload = BootPayload(forged, boot_payload.boot_id)

        async def go():
            await self.agent.receive_u(u_env)
            await self.agent.receive_v(v_env, None)

        exc = self.assertRaises(RefusedError, self.run_async, go())
        self.assertEqual("shares_mismatch", exc.code)
        self.assertFalse(self.agent.bootstrapped)
        self.assertFalse(os.path.exists(self.path("payload")))


class BadPayloadTest(UserDataPayloadTest):
    """A payload that decrypts but does not unpack: refused, nothing runs,
    the reason stays in the status."""

    def test_payload_that_does_not_unpack_runs_nothing(self):
        key = generate_key()
        u, v = split(key)
        boot_id = str(uuid_mod.uuid4())
        nk = self.agent.nk_public
        self.agent.boot_payload = BootPayload(
            seal_payload(key, b"TCZ1" + b"not zlib", boot_id), boot_id
        )

        async def go():
            await self.agent.receive_u(seal_share(nk, u, "U", self.uuid))
            await self.agent.receive_v(seal_share(nk, v, "V", self.uuid), None)

        exc = self.assertRaises(RefusedError, self.run_async, go())
        self.assertEqual("bad_payload", exc.code)
        status = self.agent.status()
        self.assertEqual("bad_payload", status["last_error"]["code"])
        self.assertEqual(
            (False, False, False),
            (status["bootstrapped"], status["has_u"], status["has_v"]),
        )
        self.assertFalse(os.path.exists(self.path("payload")))
