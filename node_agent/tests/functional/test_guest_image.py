"""The operator's guest image, built with diskimage-builder and booted.

The image (``elements/trusted-agent``, :mod:`trusted_testing.guest_vm`) is
built once per machine and cached. One boot is shared by the class: qemu
(TCG) + OVMF + a swtpm vTPM + a NoCloud seed whose cloud-config writes
``/etc/trusted-cloud/bootstrap.json`` and runs a probe script that prints
what it finds to the serial console (``@@PROBE key value`` lines).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
import urllib.request
import uuid

import fixtures
import testtools

from trusted_testing.guest_vm import CMDLINE, VmImage, build, wheel_metadata
from trusted_testing.guest_vm_boot import (
    AGENT_LOGGED,
    AGENT_PORT,
    BOOTSTRAP,
    CLOUD_INIT_DONE,
    VmGuest,
)

# A guest port the probe serves the marker on (forwarded like the agent's).
PROBE_PORT = 9003
# Server-side distributions the agent's own extra must not pull in.
SERVER_ONLY = ("sqlalchemy", "alembic", "libvirt-python", "oslo-messaging")
PROBE = r"""#!/bin/sh
# Prints what the test checks, one "@@PROBE key value" line each.
p() { echo "@@PROBE $1 $2"; }
p begin "$(cat /proc/sys/kernel/random/boot_id)"
p bootstrap "$(sha256sum /etc/trusted-cloud/bootstrap.json | cut -d' ' -f1)"
p marker "$(cat /var/lib/trusted-guest-test/marker)"
p tpmrm0 "$(test -c /dev/tpmrm0 && echo present || echo missing)"
ima=/sys/kernel/security/ima/ascii_runtime_measurements
p ima_entries "$(wc -l < $ima)"
p ima_first "$(head -n 1 $ima | cut -d' ' -f3-5)"
p cmdline "$(cat /proc/cmdline)"
p kernel "$(uname -r)"
p os "$(. /etc/os-release; echo $VERSION_CODENAME)"
/usr/local/bin/trusted-agent --help >/tmp/help.txt 2>&1
p help_rc "$?"
p help_usage "$(head -n 1 /tmp/help.txt)"
p help_config "$(grep -c -- --config-file /tmp/help.txt)"
p unit "$(systemctl is-enabled trusted-agent.service)"
p ipv4 "$(hostname -I)"
# Serve the marker on a forwarded port: the host fetches it.
cd /var/lib/trusted-guest-test
setsid python3 -m http.server 9003 </dev/null >/dev/null 2>&1 &
p venv_mb "$(du -sm /opt/trusted-agent | cut -f1)"
p root_mb "$(df -m --output=used / | tail -n 1 | tr -d ' ')"
p dists "$(/opt/trusted-agent/bin/python -c 'import importlib.metadata as m
print(" ".join(sorted(d.metadata["Name"].lower().replace("_", "-")
                      for d in m.distributions())))')"
p end ok
"""
# Each line comes through cloud-final's stdout: "[ uptime] cloud-init[pid]: ".
_PROBE_LINE = re.compile(r"@@PROBE (\w+) ?(.*)$", re.M)


def user_data(bootstrap: str, marker: str) -> str:
    """The test's cloud-config: the bootstrap file, a marker, the probe."""
    files = [
        {"path": BOOTSTRAP, "permissions": "0600",
         "content": bootstrap},
        {"path": "/var/lib/trusted-guest-test/marker", "content": marker + "\n"},
        {"path": "/var/lib/trusted-guest-test/probe.sh", "permissions": "0755",
         "content": PROBE},
    ]  # fmt: skip
    config = {
        "write_files": files,
        "runcmd": [["/var/lib/trusted-guest-test/probe.sh"]],
    }
    # JSON is YAML: cloud-init parses it as a cloud-config.
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


def _fetch(port: int, path: str, timeout: float = 60.0) -> bytes:
    """GET http://127.0.0.1:port/path, retrying while the server starts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}{path}", timeout=10
            ) as reply:
                return bytes(reply.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


class TestGuestImageBuild(testtools.TestCase):
    """The build (cached per machine) gives a bootable partition image."""

    def setUp(self) -> None:
        super().setUp()
        self.image = build()

    def test_cached_build_is_reused(self) -> None:
        started = time.monotonic()
        again = build()
        self.assertEqual(self.image, again)
        self.assertLess(time.monotonic() - started, 60.0)

    def test_qcow2_holds_an_ext4_root_filesystem(self) -> None:
        info = json.loads(
            subprocess.run(
                ["qemu-img", "info", "--output=json", self.image.qcow2],
                capture_output=True,
                check=True,
            ).stdout
        )
        self.assertEqual("qcow2", info["format"])
        self.assertGreaterEqual(info["virtual-size"], 1 << 30)
        # A partition image: the filesystem starts at byte 0 (ext4 magic at
        # 1080), no partition table, no bootloader.
        out = self.useFixture(fixtures.TempDir()).join("head.raw")
        subprocess.run(
            ["qemu-img", "dd", "-f", "qcow2", "-O", "raw", "bs=4096", "count=1",
             f"if={self.image.qcow2}", f"of={out}"],
            capture_output=True,
            check=True,
        )  # fmt: skip
        with open(out, "rb") as handle:
            raw = handle.read()
        self.assertEqual(b"\x53\xef", raw[1080:1082])
        self.assertEqual(b"cloudimg-rootfs", raw[1024 + 120 : 1024 + 135])

    def test_kernel_and_initrd_are_beside_it(self) -> None:
        with open(self.image.kernel, "rb") as handle:
            head = handle.read(0x240)
        self.assertEqual(b"MZ", head[:2])  # a PE image: OVMF can measure it
        self.assertEqual(b"HdrS", head[0x202:0x206])
        with open(self.image.initrd, "rb") as handle:
            self.assertIn(handle.read(2), (b"\x1f\x8b", b"07"))  # gzip or cpio

    def test_wheel_is_the_projects(self) -> None:
        version, _extras = wheel_metadata(self.image.wheel)
        self.assertTrue(self.image.wheel.endswith(f"-{version}-py3-none-any.whl"))


class TestGuestBoot(testtools.TestCase):
    """One boot of the image: cloud-init, the vTPM, IMA and the agent."""

    image: VmImage
    guest: VmGuest
    console: str
    probe: dict[str, str]
    boot_seconds: float
    guest_uptime: float
    bootstrap: str
    marker: str
    fetched: bytes

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.image = build()
        cls.bootstrap = json.dumps({"uuid": str(uuid.uuid4()), "test": True})
        cls.marker = uuid.uuid4().hex
        cls.guest = VmGuest(
            cls.image,
            user_data(cls.bootstrap, cls.marker),
            instance_id=str(uuid.uuid4()),
            forward=(AGENT_PORT, PROBE_PORT),
        )
        cls.guest.start()
        try:
            finished = cls.guest.wait_for(CLOUD_INIT_DONE, what="cloud-init to finish")
            cls.boot_seconds = cls.guest.elapsed()
            cls.guest_uptime = float(finished.group(1))
            # The unit starts after cloud-init's final stage: wait for its log.
            cls.guest.wait_for(AGENT_LOGGED, 300.0, "the agent's first log line")
            cls.console = cls.guest.console()
            cls.fetched = _fetch(cls.guest.ports[PROBE_PORT], "/marker")
        finally:
            cls.guest.stop()
        cls.probe = dict(_PROBE_LINE.findall(cls.console))

    def test_probe_ran_to_the_end(self) -> None:
        self.assertEqual("ok", self.probe.get("end"), self.console[-3000:])

    def test_cloud_init_wrote_the_bootstrap_file(self) -> None:
        digest = hashlib.sha256(self.bootstrap.encode()).hexdigest()
        self.assertEqual(digest, self.probe["bootstrap"])
        self.assertEqual(self.marker, self.probe["marker"])

    def test_cloud_init_used_the_nocloud_seed(self) -> None:
        self.assertIn("DataSourceNoCloud", self.console)

    def test_guest_network_is_qemu_user_networking(self) -> None:
        # DHCP from qemu's user network (cloud-init's fallback config,
        # rendered for systemd-networkd); the host reaches the guest only
        # through a port forwarded from its own 127.0.0.1.
        self.assertRegex(self.probe["ipv4"], r"^10\.0\.2\.\d+\b")
        self.assertEqual(self.marker + "\n", self.fetched.decode())

    def test_vtpm_is_the_kernels_resource_manager(self) -> None:
        self.assertEqual("present", self.probe["tpmrm0"])

    def test_ima_measures_with_the_tcb_policy(self) -> None:
        self.assertIn("ima_policy=tcb ima_hash=sha256", self.probe["cmdline"])
        self.assertTrue(self.probe["cmdline"].startswith(CMDLINE))
        # The first entry is boot_aggregate (sha256 over PCRs 0-9), in the
        # kernel's default template.
        self.assertRegex(
            self.probe["ima_first"],
            r"^ima-(?:ng|sig) sha256:[0-9a-f]{64} boot_aggregate$",
        )
        self.assertGreater(int(self.probe["ima_entries"]), 100)

    def test_debian_bookworm_with_its_kernel(self) -> None:
        self.assertEqual("bookworm", self.probe["os"])
        self.assertRegex(self.probe["kernel"], r"^6\.1\.\d+-\d+-amd64$")

    def test_trusted_agent_help_runs_in_the_guest(self) -> None:
        self.assertEqual("0", self.probe["help_rc"])
        self.assertIn("usage: trusted-agent", self.probe["help_usage"])
        self.assertNotEqual("0", self.probe["help_config"])

    def test_unit_is_enabled_and_started_after_cloud_init(self) -> None:
        self.assertEqual("enabled", self.probe["unit"])
        finished = CLOUD_INIT_DONE.search(self.console)
        agent = AGENT_LOGGED.search(self.console)
        assert finished is not None and agent is not None
        self.assertGreater(agent.start(), finished.start())

    def test_agent_venv_holds_only_what_its_extra_asks(self) -> None:
        dists = set(self.probe["dists"].split())
        version, extras = wheel_metadata(self.image.wheel)
        self.assertIn("trusted-cloud", dists)
        self.assertIn("tpm2-pytss", dists)
        self.assertNotIn("nova", dists)
        if "agent" in extras:
            self.assertEqual(set(), dists & set(SERVER_ONLY))
        else:
            # No agent extra in this wheel: pip installed the base
            # requirements, which still hold the server's.
            self.assertIn("sqlalchemy", dists)
