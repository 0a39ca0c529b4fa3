# ruff: noqa: I001  (nova must be imported before anything that imports eventlet)
"""(Run in a process of their own by test_nova_boot.py; see there.)

Trusted boot through real Nova 34 (its in-process functional environment:
real API, conductor, scheduler and compute with the fake virt driver,
in-process placement), a real registrar and verifier (LocalCluster), and
the Nova notification listener on a real oslo.messaging transport that
Nova's own notifier emits on.
"""

from __future__ import annotations

import os

# Nova's test fixtures monkey-patch the process with eventlet unless told
# not to (Nova 34's native threading mode); our asyncio code must never run
# on a patched socket module. This must come before anything imports nova.
os.environ["OS_NOVA_DISABLE_EVENTLET_PATCHING"] = "1"

import asyncio  # noqa: E402
import base64  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import uuid as uuid_mod  # noqa: E402

from nova.tests.functional import integrated_helpers  # noqa: E402, I001
from nova.tests import fixtures as nova_fixtures  # noqa: E402
from nova import rpc as nova_rpc  # noqa: E402
from nova.conf import CONF as NOVA_CONF  # noqa: E402

import fixtures  # noqa: E402
import oslo_messaging  # noqa: E402
import requests  # noqa: E402

from trusted_testing.nova.cli import run_cli, tenant_argv  # noqa: E402
from nova_plugin.boot import TrustedBoot  # noqa: E402
from nova_plugin.exceptions import ServiceError  # noqa: E402
from nova_plugin.userdata import parse_user_data  # noqa: E402
from verifier.common import tls as tlsutil  # noqa: E402
from verifier.nova_listener import (  # noqa: E402
    InstanceEndpoint,
    VerifierOperator,
    make_listener,
)
from verifier.protocol import PcrPolicy, generate_key  # noqa: E402
from trusted_testing.cluster import PCR, LocalCluster, wait_until  # noqa: E402

SECRET = b"TOP-SECRET-PAYLOAD-MARKER"
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n# ' + SECRET + b"\n"


class NovaBootBase(integrated_helpers._IntegratedTestBase):
    """Nova, the deployment, the bus and helpers; no tests of its own."""

    ADMIN_API = False
    cluster: LocalCluster
    tmp: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-nova-")
        cls.cluster = LocalCluster(os.path.join(cls.tmp, "cluster"), nodes=0)
        try:
            cls.cluster.start()
        except Exception:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.cluster.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            super().tearDownClass()

    def _setup_services(self) -> None:
        # the paste pipeline the nova wheel installs into the venv
        paste = os.path.join(sys.prefix, "etc", "nova", "api-paste.ini")
        self.flags(api_paste_config=paste, group="wsgi")
        super()._setup_services()

    def setUp(self) -> None:
        super().setUp()
        self.flags(notification_format="versioned", group="notifications")
        self._bus()
        self.workdir = self.useFixture(fixtures.TempDir()).path
        self.payload_file = self._write("payload.sh", PAYLOAD)
        policy = {"pcrs": {str(PCR): [self.cluster.good_pcr_hex()]}}
        self.policy_file = self._write("policy.json", json.dumps(policy).encode())
        self.flavor = self.api.get_flavors()[0]["id"]
        self.image = self.api.get_images()[0]["id"]
        self.admin_api.microversion = "2.3"

    #: None: a transport of the test's own with the listener in-process;
    #: else the URL of a bus where a listener process runs.
    transport_url: str | None = None

    def _bus(self) -> None:
        """Nova's versioned notifier and our listener on one real transport."""
        transport = oslo_messaging.get_notification_transport(
            NOVA_CONF, url=self.transport_url or f"fake:/{uuid_mod.uuid4().hex}"
        )
        self.addCleanup(transport.cleanup)
        notifier = oslo_messaging.Notifier(
            transport,
            serializer=nova_rpc.RequestContextSerializer(
                nova_rpc.JsonPayloadSerializer()
            ),
            driver="messagingv2",
            topics=["versioned_notifications"],
        )
        self.stub_out("nova.rpc.NOTIFIER", notifier)
        if self.transport_url is not None:
            return
        context = tlsutil.client_context(
            self.cluster.pki_file("operator.pem"),
            self.cluster.pki_file("operator-key.pem"),
            self.cluster.pki_file("ca.pem"),
        )
        endpoint = InstanceEndpoint(
            VerifierOperator(self.cluster.verifier_url, context, 10.0)
        )
        listener = make_listener(transport, endpoint, pool="trusted-test")
        listener.start()
        self.addCleanup(listener.wait)
        self.addCleanup(listener.stop)

    # -- helpers ------------------------------------------------------------

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.workdir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def boot_argv(self, *extra: str, verifier: str | None = None) -> list[str]:
        env = self.cluster.tenant_env()
        return [
            "boot",
            "trusted-vm",
            "--flavor",
            str(self.flavor),
            "--image",
            self.image,
            "--payload",
            self.payload_file,
            "--trust-policy",
            self.policy_file,
            *tenant_argv(env, self.api_fixture.base_url, verifier),
            "--nova-header",
            "X-Auth-User:tenant-user",
            "--nova-header",
            f"X-Auth-Project-Id:{nova_fixtures.PROJECT_ID}",
            "--nova-header",
            "X-Roles:reader,member",
            *extra,
        ]

    def run_cli(self, argv: list[str]) -> tuple[int, str, str]:
        return run_cli(argv)

    def node(self, uuid: str) -> dict | None:  # type: ignore[type-arg]
        return self.cluster.node_status(uuid)

    def servers(self) -> list[dict]:  # type: ignore[type-arg]
        return list(self.admin_api.get_servers(detail=True))

    def metadata_user_data(self, uuid: str) -> bytes:
        md = self.useFixture(nova_fixtures.OSMetadataServer())
        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.network.neutron.API.get_fixed_ip_by_address",
                lambda *a, **k: {"instance_uuid": uuid},
            )
        )
        resp = requests.get(f"{md.md_url}openstack/latest/user_data", timeout=10)
        self.assertEqual(200, resp.status_code, resp.text)
        return resp.content

    def assert_no_plaintext(self, user_data: bytes) -> None:
        self.assertNotIn(SECRET, user_data)
        self.assertNotIn(b"payload ran on", user_data)
        if user_data[:2] == b"\x1f\x8b":
            inner = gzip.decompress(user_data)
            self.assertNotIn(SECRET, inner)
            self.assertNotIn(b"payload ran on", inner)
        config, envelope = parse_user_data(user_data)
        self.assertTrue(envelope.startswith(b"TCP1"))  # an AES-GCM envelope
        self.assertNotIn(SECRET, envelope)
        self.assertEqual(self.cluster.registrar_url, config["registrar_url"])


class TrustedNovaBootTest(NovaBootBase):
    """Each test gets a fresh Nova (~5 s); the deployment is shared."""

    # -- the flow -------------------------------------------------------------

    def test_boot_seals_user_data_enrols_and_delete_unenrols(self) -> None:
        code, out, err = self.run_cli(self.boot_argv())
        self.assertEqual(0, code, err)
        row = json.loads(out.splitlines()[0])
        uuid = row["id"]
        server = self._wait_for_state_change({"id": uuid}, "ACTIVE")
        self.assertEqual("trusted-vm", server["name"])
        # Nova stored and serves ciphertext only
        admin_view = self.admin_api.get_server(uuid)
        stored = base64.b64decode(admin_view["OS-EXT-SRV-ATTR:user_data"])
        self.assert_no_plaintext(stored)
        served = self.metadata_user_data(uuid)
        self.assertEqual(stored, served)
        self.assert_no_plaintext(served)
        # the verifier holds the enrolment; instance.create.end (from Nova,
        # through the bus and the listener) made it wait for the agent
        node = wait_until(
            lambda: (n := self.node(uuid)) and n["state"] == "created" and n, 10
        )
        self.assertTrue(node, self.node(uuid))
        self.assertEqual(row["boot_id"], parse_user_data(stored)[0]["boot_id"])
        # deleting the server unenrols it through the listener
        self.api.delete_server(uuid)
        self._wait_until_deleted({"id": uuid})
        self.assertTrue(wait_until(lambda: self.node(uuid) is None, 10))

    def test_wait_bootstraps_the_agent_of_the_instance(self) -> None:
        started: dict[str, object] = {}
        done = threading.Event()

        def start_agent_for_new_server() -> None:
            # stands in for the guest: its agent comes up with the UUID Nova
            # gave the instance, on its own swtpm, with the user-data Nova
            # serves (cloud-init's copy); the tenant then sends U alone,
            # through the verifier's relay: the agent takes no tenant
            # certificate at all
            try:
                found = wait_until(lambda: self.servers(), 30, 0.2)
                if found:
                    uuid = found[0]["id"]
                    view = self.admin_api.get_server(uuid)
                    path = os.path.join(self.cluster.workdir, f"user-data-{uuid}")
                    with open(path, "wb") as f:
                        f.write(base64.b64decode(view["OS-EXT-SRV-ATTR:user_data"]))
                    started["node"] = self.cluster.add_node(
                        uuid, {"user_data_file": path, "tenant_clients": "nobody"}
                    )
            except Exception as exc:  # reported by the assertion below
                started["error"] = exc
            # the agent dies with the thread that started it (PDEATHSIG)
            done.wait()

        thread = threading.Thread(target=start_agent_for_new_server)
        thread.start()
        self.addCleanup(thread.join)
        self.addCleanup(done.set)
        code, out, err = self.run_cli(self.boot_argv("--wait", "--wait-timeout", "90"))
        self.assertNotIn("error", started, started)
        self.assertEqual(0, code, err)
        uuid = json.loads(out.splitlines()[0])["id"]
        self.assertIn("attested", err)  # the progress lines
        self.assertEqual("attested", self.node(uuid)["state"])  # type: ignore[index]
        node = started["node"]
        text = wait_until(lambda: node.payload_output(), 20)  # type: ignore[attr-defined]
        self.assertEqual(f"payload ran on {uuid}\n", text)
        self.api.delete_server(uuid)
        self.assertTrue(wait_until(lambda: self.node(uuid) is None, 10))

    # -- bad input ------------------------------------------------------------

    def test_payload_too_large_after_compression_creates_nothing(self) -> None:
        self.payload_file = self._write("big.bin", os.urandom(60000))
        code, _, err = self.run_cli(self.boot_argv())
        self.assertEqual(1, code)
        self.assertIn("after compression", err)
        self.assertIn("49,149 bytes", err)
        self.assertEqual([], self.servers())

    def test_unknown_image_is_nova_s_own_error(self) -> None:
        argv = self.boot_argv()
        argv[argv.index("--image") + 1] = str(uuid_mod.uuid4())
        code, _, err = self.run_cli(argv)
        self.assertEqual(1, code)
        self.assertIn("Nova refused to create the server", err)
        self.assertIn("Can not find requested image (HTTP 400)", err)
        self.assertIn("no server was created", err)
        self.assertEqual([], self.servers())

    def test_unknown_flavor_is_refused_before_any_server(self) -> None:
        argv = self.boot_argv()
        argv[argv.index("--flavor") + 1] = "no-such-flavor"
        code, _, err = self.run_cli(argv)
        self.assertEqual(1, code)
        self.assertIn("Flavor 'no-such-flavor' could not be found", err)
        self.assertIn("no server was created", err)
        self.assertEqual([], self.servers())

    def test_verifier_unreachable_deletes_the_server_and_says_so(self) -> None:
        dead = "https://127.0.0.1:9"  # nothing listens on the discard port
        code, _, err = self.run_cli(self.boot_argv(verifier=dead))
        self.assertEqual(1, code)
        self.assertIn("trusted boot failed", err)
        self.assertIn("was created", err)
        self.assertIn("it was not enrolled", err)
        self.assertIn("it was deleted again", err)
        self.assertTrue(
            wait_until(lambda: not [s for s in self.servers()], 20), self.servers()
        )

    def test_duplicate_enrolment_of_one_uuid_is_refused_and_kept(self) -> None:
        code, out, err = self.run_cli(self.boot_argv())
        self.assertEqual(0, code, err)
        uuid = json.loads(out.splitlines()[0])["id"]
        before = self.node(uuid)

        async def enrol_again() -> str:
            tenant = self.cluster.tenant()
            try:
                boot = TrustedBoot(
                    None,
                    tenant,
                    PcrPolicy.from_dict({"pcrs": {"16": ["00" * 32]}}),
                    self.cluster.registrar_url,
                )
                from nova_plugin.boot import ServerState

                try:
                    await boot.enrol([ServerState(uuid, "x")], generate_key())
                except ServiceError as exc:
                    return str(exc)
                return "accepted"
            finally:
                await tenant.close()

        message = asyncio.run(enrol_again())
        self.assertIn(f"instance {uuid} is already enrolled", message)
        self.assertIn("left as it is", message)
        after = self.node(uuid)
        self.assertEqual(before["policy"], after["policy"])  # type: ignore[index]
