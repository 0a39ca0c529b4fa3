"""The listener's ``vtpm`` instance hook against the real registrar app
(in-process, plain HTTP), loaded by name as ``trusted-nova-listener`` does."""

from __future__ import annotations

import contextlib
import io
import os
import uuid as uuid_mod

import fixtures
import oslo_messaging
import stevedore
import testtools
from oslo_config import cfg

from trusted_testing.cluster import free_port
from trusted_testing.registrar import ThreadRegistrar
from trusted_testing.softtpm import SoftTpm
from verifier.ca import CertificateAuthority
from verifier.cmd import nova_listener as nova_listener_cmd
from verifier.exceptions import NotFoundError
from verifier.nova_listener import (
    InstanceEndpoint,
    InstanceHookError,
    InstanceHookRetryError,
    VerifierOperator,
)
from verifier.nova_listener.listener import DELETE_END
from vtpm_manager.conf import instance_hook as hook_conf
from vtpm_manager.instance_hook import VtpmInstanceHook
from vtpm_manager.registrar_client import ProviderRegistrarClient
from vtpm_manager.swtpm_state import EkIdentity


def _conf(**options: object) -> cfg.ConfigOpts:
    """The listener's configuration with ``[instance_hook_vtpm]`` options."""
    conf = cfg.ConfigOpts()
    conf([], project="trusted-cloud")
    hook_conf.register_opts(conf)  # as the driver does on the listener's conf
    for name, value in options.items():
        conf.set_override(name, value, group="instance_hook_vtpm")
    return conf


def _load(conf: cfg.ConfigOpts) -> VtpmInstanceHook:
    """The driver as the listener loads it (stevedore, conf keyword)."""
    manager = stevedore.NamedExtensionManager(
        "verifier.instance_hooks",
        ["vtpm"],
        invoke_on_load=True,
        invoke_kwds={"conf": conf},
        on_load_failure_callback=lambda _m, _e, exc: (_ for _ in ()).throw(exc),
    )
    hook = manager["vtpm"].obj
    assert isinstance(hook, VtpmInstanceHook)
    return hook


class VtpmInstanceHookTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.server = ThreadRegistrar()
        cls.ek = EkIdentity(SoftTpm(ak_alg="ecc", ek_alg="rsa").ek.to_bytes(), None)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.client = ProviderRegistrarClient(self.server.url, retries=0)
        self.hook = _load(_conf(registrar_url=self.server.url, retries=0))

    def registered(self) -> str:
        uuid = str(uuid_mod.uuid4())
        self.assertTrue(self.client.register_ek(uuid, self.ek))
        return uuid

    def test_delete_removes_the_provider_ek(self) -> None:
        uuid = self.registered()
        other = self.registered()
        self.hook.instance_deleted(uuid)
        self.assertIsNone(self.client.get_ek(uuid))
        self.assertEqual(self.ek, self.client.get_ek(other))  # only that one

    def test_second_delivery_succeeds(self) -> None:
        uuid = self.registered()
        self.hook.instance_deleted(uuid)
        self.hook.instance_deleted(uuid)  # redelivered: a 404 is success
        self.assertIsNone(self.client.get_ek(uuid))

    def test_instance_without_a_vtpm_is_fine(self) -> None:
        self.hook.instance_deleted(str(uuid_mod.uuid4()))

    def test_created_does_not_touch_the_registration(self) -> None:
        uuid = self.registered()
        self.hook.instance_created(uuid)
        self.assertEqual(self.ek, self.client.get_ek(uuid))

    def test_registrar_down_asks_for_a_requeue(self) -> None:
        url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
        hook = _load(_conf(registrar_url=url, retries=1, backoff=0.01))
        with self.assertRaises(InstanceHookRetryError) as ctx:
            hook.instance_deleted(str(uuid_mod.uuid4()))
        self.assertIn("unreachable after 2 attempts", str(ctx.exception))

    def test_refusal_is_logged_not_requeued(self) -> None:
        with self.assertRaises(InstanceHookError) as ctx:
            self.hook.instance_deleted("not-a-uuid")
        self.assertNotIsInstance(ctx.exception, InstanceHookRetryError)
        self.assertIn("400", str(ctx.exception))

    def test_https_without_certificate_is_a_config_error(self) -> None:
        conf = _conf(registrar_url="https://127.0.0.1:1", cert_file="/x.pem")
        with self.assertRaises(InstanceHookError) as ctx:
            VtpmInstanceHook(conf)
        self.assertIn("['key_file', 'ca_file']", str(ctx.exception))

    def test_bad_url_is_a_config_error(self) -> None:
        with self.assertRaises(InstanceHookError) as ctx:
            VtpmInstanceHook(_conf(registrar_url="ftp://registrar"))
        self.assertIn("bad registrar URL", str(ctx.exception))

    def test_listener_requeues_on_retry_and_goes_on_after_an_error(self) -> None:
        down = _load(_conf(registrar_url=f"http://127.0.0.1:{free_port()}", retries=0))
        operator = VerifierOperator("http://127.0.0.1:1", None)  # not called
        uuid = self.registered()
        endpoint = InstanceEndpoint(operator, [down, self.hook])
        self.assertEqual(
            oslo_messaging.NotificationResult.REQUEUE,
            endpoint._run_hooks(DELETE_END, uuid),
        )
        self.assertIsNone(self.client.get_ek(uuid))  # later hooks still ran
        endpoint = InstanceEndpoint(operator, [self.hook])
        self.assertEqual(
            oslo_messaging.NotificationResult.HANDLED,
            endpoint._run_hooks(DELETE_END, "not-a-uuid"),
        )


def _payload(uuid: str, host: str | None) -> dict[str, object]:
    """The parts of Nova's versioned InstanceActionPayload the listener reads."""
    return {
        "nova_object.name": "InstanceActionPayload",
        "nova_object.namespace": "nova",
        "nova_object.version": "1.8",
        "nova_object.data": {"uuid": uuid, "host": host, "state": "active"},
    }


class PlacementTest(testtools.TestCase):
    """Nova's notifications tell the registrar where each instance runs."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.server = ThreadRegistrar()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.hook = _load(_conf(registrar_url=self.server.url, retries=0))
        self.hosts = self.server.registrar.hosts
        # the verifier is down: create/delete ends are requeued, but the
        # placement (a hook of its own) is recorded first
        self.endpoint = InstanceEndpoint(
            VerifierOperator(f"http://127.0.0.1:{free_port()}", None), [self.hook]
        )

    def notify(self, event: str, uuid: str, host: str | None) -> object:
        return self.endpoint.info(
            {}, "nova-compute:compute-a", event, _payload(uuid, host), {}
        )

    def test_create_resize_and_revert_move_the_placement(self) -> None:
        uuid = str(uuid_mod.uuid4())
        requeue = oslo_messaging.NotificationResult.REQUEUE
        self.assertEqual(requeue, self.notify("instance.create.end", uuid, "compute-a"))
        self.assertEqual(("compute-a", "compute-a"), self.hosts.get_placement(uuid))
        # the verifier is down: requeued so that it learns the new host too
        self.assertEqual(
            requeue, self.notify("instance.resize_finish.end", uuid, "compute-b")
        )
        self.assertEqual(("compute-b", "compute-a"), self.hosts.get_placement(uuid))
        self.notify("instance.resize_revert.end", uuid, "compute-a")
        self.assertEqual(("compute-a", "compute-a"), self.hosts.get_placement(uuid))

    def test_event_without_a_host_records_nothing(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.notify("instance.resize_finish.end", uuid, None)
        with self.assertRaises(NotFoundError):
            self.hosts.get_placement(uuid)

    def test_delete_removes_the_placement_and_is_idempotent(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.hook.instance_placed(uuid, "compute-a")
        self.hook.instance_deleted(uuid)
        with self.assertRaises(NotFoundError):
            self.hosts.get_placement(uuid)
        self.hook.instance_deleted(uuid)  # redelivered

    def test_bad_host_is_refused_not_requeued(self) -> None:
        with self.assertRaises(InstanceHookError) as ctx:
            self.hook.instance_placed(str(uuid_mod.uuid4()), "bad host")
        self.assertNotIsInstance(ctx.exception, InstanceHookRetryError)
        self.assertIn("compute host name", str(ctx.exception))


class ListenerLoadsHooksTest(testtools.TestCase):
    """``trusted-nova-listener`` refuses hooks it cannot load (exit 2)."""

    def run_listener(self, listener: str, extra: str = "") -> tuple[int, str]:
        tmp = self.useFixture(fixtures.TempDir()).path
        CertificateAuthority.create(tmp, "Test CA").issue_to_files(
            tmp, "operator", ["localhost"]
        )
        path = os.path.join(tmp, "listener.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                "[nova_listener]\n"
                f"cert_file = {tmp}/operator.pem\n"
                f"key_file = {tmp}/operator-key.pem\n"
                f"ca_file = {tmp}/ca.pem\n"
                f"{listener}\n{extra}"
            )
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = nova_listener_cmd.main(["--config-file", path])
        return code, err.getvalue()

    def test_unknown_hook_is_a_configuration_error(self) -> None:
        code, err = self.run_listener("hooks = noop,nosuch")
        self.assertEqual(2, code)
        self.assertIn("unknown [nova_listener] hooks: ['nosuch']", err)

    def test_vtpm_hook_without_its_options_is_a_configuration_error(self) -> None:
        code, err = self.run_listener("hooks = vtpm", "[instance_hook_vtpm]\n")
        self.assertEqual(2, code)
        self.assertIn("hook vtpm", err)
        self.assertIn("missing options in [instance_hook_vtpm]", err)
