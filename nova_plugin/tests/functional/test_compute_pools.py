"""Integration: trusted compute pools with Nova's own scheduler.

Two emulated compute hosts (:class:`~trusted_testing.nova.libvirt_deploy.
LibvirtNovaDeployment` with ``hosts=2``: two nova-computes, each with its
own libvirtd, swtpm local CA and compute node resource provider), the real
Placement 16 and Nova 34's scheduler. A flavor with
``trait:CUSTOM_ATTESTATION_TRUSTED=required`` (or an image with that
property) is placed only on a host whose provider carries the trait; with
none, the boot ends in ERROR with "No valid host".

The guests boot a blank disk (no OS: what is tested is where Nova puts a
vTPM guest and that libvirt starts it there, not what runs inside).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid as uuid_mod
from typing import Any

import requests
import testtools

from nova_plugin.tests.functional.test_nova_libvirt import _missing
from trusted_testing.nova.compute_hosts import ComputeHost
from trusted_testing.nova.libvirt_deploy import (
    PLACEMENT_HEADERS,
    LibvirtNovaDeployment,
)

TRAIT = "CUSTOM_ATTESTATION_TRUSTED"
ACTIVE_TIMEOUT = 600.0
#: how long each part of the class took (setUpClass and each test), seconds
TIMES: dict[str, float] = {}


def blank_image(nova: LibvirtNovaDeployment, path: str, **properties: str) -> str:
    """Serve a blank 1 MiB qcow2 through the Glance stand-in (a guest that
    boots no OS); returns its image ID."""
    if not os.path.exists(path):
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", path, "1M"],
            check=True,
            timeout=60,
        )
    image_id = str(uuid_mod.uuid4())
    nova.standins.add_image(
        {
            "id": image_id,
            "name": f"blank-{image_id[:8]}",
            "status": "active",
            "visibility": "public",
            "min_disk": 0,
            "min_ram": 0,
            "protected": False,
            "tags": [],
            "owner": "provider",
            "checksum": None,
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "schema": "/v2/schemas/image",
            "disk_format": "qcow2",
            "container_format": "bare",
            "size": os.path.getsize(path),
            "file": f"/v2/images/{image_id}/file",
            **properties,
        },
        path,
    )
    return image_id


def set_trait(placement_url: str, host: ComputeHost, present: bool) -> None:
    """Put the trait on (or take it off) ``host``'s resource provider
    through Placement's API: read-modify-write with its generation."""
    url = f"{placement_url}/resource_providers/{host.provider}/traits"
    for _ in range(10):
        resp = requests.get(url, headers=PLACEMENT_HEADERS, timeout=30)
        resp.raise_for_status()
        body = resp.json()
        traits = set(body["traits"])
        wanted = traits | {TRAIT} if present else traits - {TRAIT}
        if wanted == traits:
            return
        resp = requests.put(
            url,
            headers=PLACEMENT_HEADERS,
            json={
                "traits": sorted(wanted),
                "resource_provider_generation": body["resource_provider_generation"],
            },
            timeout=30,
        )
        if resp.status_code == 200:
            return
        if resp.status_code != 409:
            resp.raise_for_status()
    raise AssertionError(f"Placement kept refusing the traits of {host.name}")


def provider_traits(placement_url: str, host: ComputeHost) -> set[str]:
    resp = requests.get(
        f"{placement_url}/resource_providers/{host.provider}/traits",
        headers=PLACEMENT_HEADERS,
        timeout=30,
    )
    resp.raise_for_status()
    return set(resp.json()["traits"])


class _Timed(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        begin = time.monotonic()
        self.addCleanup(lambda: TIMES.__setitem__(self.id(), time.monotonic() - begin))


class ComputePoolsTest(_Timed):
    """One deployment of two compute hosts for the whole class."""

    tmp: str
    nova: LibvirtNovaDeployment
    image_id: str
    trusted_image_id: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        problem = _missing()
        if problem:
            raise testtools.TestCase.skipException(problem)
        begin = time.monotonic()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-compute-pools-")
        cls.nova = LibvirtNovaDeployment(cls.tmp, hosts=2)
        try:
            cls.nova.start()
            resp = requests.put(
                f"{cls.nova.placement_url}/traits/{TRAIT}",
                headers=PLACEMENT_HEADERS,
                timeout=30,
            )
            resp.raise_for_status()
            disk = f"{cls.tmp}/blank.qcow2"
            cls.image_id = blank_image(cls.nova, disk)
            cls.trusted_image_id = blank_image(
                cls.nova, disk, **{f"trait:{TRAIT}": "required"}
            )
        except BaseException:
            cls.nova.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        TIMES["setUpClass"] = time.monotonic() - begin

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.nova.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
        for name, seconds in TIMES.items():
            print(f"compute pools timing: {name}: {seconds:.1f} s")
        super().tearDownClass()

    # -- helpers ----------------------------------------------------------------

    @property
    def host_a(self) -> ComputeHost:
        return self.nova.hosts[0]

    @property
    def host_b(self) -> ComputeHost:
        return self.nova.hosts[1]

    def trusted(self, *hosts: ComputeHost) -> None:
        """Exactly ``hosts`` carry the trait."""
        for host in self.nova.hosts:
            set_trait(self.nova.placement_url, host, host in hosts)
        self.addCleanup(self._untrust_all)

    def _untrust_all(self) -> None:
        for host in self.nova.hosts:
            set_trait(self.nova.placement_url, host, False)

    def boot(self, flavor: str, image: str | None = None) -> dict[str, Any]:
        """Boot and wait for ACTIVE or ERROR; the server as an admin sees it."""
        body = {
            "server": {
                "name": f"pool-{flavor}",
                "imageRef": image or self.image_id,
                "flavorRef": flavor,
                "networks": "none",
            }
        }
        resp = self.nova.request("POST", "/servers", json=body, microversion="2.37")
        self.assertEqual(202, resp.status_code, resp.text)
        uuid = str(resp.json()["server"]["id"])
        self.addCleanup(self._delete, uuid)
        return self.wait_status(uuid, ("ACTIVE", "ERROR"))

    def wait_status(
        self, uuid: str, statuses: tuple[str, ...], timeout: float = ACTIVE_TIMEOUT
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        server: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            server = self.nova.server(uuid)
            if server and server["status"] in statuses:
                return server
            time.sleep(1)
        raise AssertionError(f"{uuid} never reached {statuses}: {server}")

    def _delete(self, uuid: str) -> None:
        resp = self.nova.request("DELETE", f"/servers/{uuid}")
        if resp.status_code == 404:
            return
        self.assertEqual(204, resp.status_code, resp.text)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.nova.server(uuid) is not None:
            time.sleep(1)

    def assert_on(self, host: ComputeHost, server: dict[str, Any]) -> None:
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        self.assertEqual(host.name, server["OS-EXT-SRV-ATTR:host"])
        self.assertIn(server["id"], host.domain_uuids())
        other = [h for h in self.nova.hosts if h is not host]
        for h in other:
            self.assertNotIn(server["id"], h.domain_uuids())

    def assert_no_valid_host(self, server: dict[str, Any]) -> None:
        self.assertEqual("ERROR", server["status"])
        self.assertIn("No valid host", server.get("fault", {}).get("message", ""))
        self.assertIsNone(server.get("OS-EXT-SRV-ATTR:host"))

    # -- the deployment -----------------------------------------------------------

    def test_two_hosts_each_with_its_libvirtd_ca_and_provider(self) -> None:
        a, b = self.host_a, self.host_b
        self.assertNotEqual(a.name, b.name)
        self.assertNotEqual(a.provider, b.provider)
        self.assertNotEqual(a.uri, b.uri)
        self.assertEqual(a.name, a.virsh("hostname").strip())
        self.assertEqual(b.name, b.virsh("hostname").strip())
        resp = self.nova.request(
            "GET", "/os-hypervisors/detail", admin=True, microversion="2.53"
        )
        self.assertEqual(200, resp.status_code, resp.text)
        ids = {h["service"]["host"]: h["id"] for h in resp.json()["hypervisors"]}
        self.assertEqual({a.name: a.provider, b.name: b.provider}, ids)
        self.assertNotIn(TRAIT, provider_traits(self.nova.placement_url, a))
        self.assertIn(
            "COMPUTE_SECURITY_TPM_2_0", provider_traits(self.nova.placement_url, b)
        )

    # -- scheduling by trait ------------------------------------------------------

    def test_trusted_flavor_without_a_trusted_host_is_no_valid_host(self) -> None:
        self.trusted()
        self.assert_no_valid_host(self.boot("trusted-pool"))

    def test_trusted_flavor_lands_on_the_host_with_the_trait(self) -> None:
        self.trusted(self.host_b)
        self.assert_on(self.host_b, self.boot("trusted-pool"))
        # and Nova's own reports keep the trait it did not set
        self.assertIn(TRAIT, provider_traits(self.nova.placement_url, self.host_b))

    def test_trusted_image_without_a_trusted_host_is_no_valid_host(self) -> None:
        self.trusted()
        self.assert_no_valid_host(self.boot("trusted-vtpm", self.trusted_image_id))

    def test_trusted_image_lands_on_the_host_with_the_trait(self) -> None:
        self.trusted(self.host_a)
        self.assert_on(self.host_a, self.boot("trusted-vtpm", self.trusted_image_id))
