"""The trusted-boot story in a real guest, and the life of its VM.

The operator's image (``elements/trusted-agent``) boots under qemu (TCG) +
OVMF + a swtpm vTPM whose EK certificate the compute host's swtpm local CA
signed. cloud-init reads the tenant's user-data from a NoCloud seed; the
agent registers with the registrar on the host (through qemu's user
network, https://10.0.2.2:PORT); the tenant checks an identity quote and
sends U; the verifier quotes the guest with its kernel's IMA list and its
firmware's event log against policies built from the image and releases V;
the payload is decrypted and runs in the guest. A program the image does
not have is then run in the guest, and the node is revoked naming it.

:class:`TestTrustedBootStory` boots one VM for its tests: the story, with an
agent restart and a guest reboot (each must leave the node attested, the
payload not run again) before the unknown program. :class:`TestVmLife`
boots another and takes it through a QMP ``system_reset`` and a crash of
qemu and swtpm restarted on the same disk and vTPM state (attested again),
then a replayed older vTPM state (revoked). The life events are split
between the two VMs, whose classes run in parallel, to keep the VM tests'
wall time down (every event is a boot of 1-3 minutes on TCG).

dm-crypt is not exercised (no device-mapper on the machines that build and
test the image; no cryptsetup in it).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

from nova_plugin.policygen import PAYLOAD_PATH
from trusted_testing.guest_vm import build
from trusted_testing.guest_vm_case import VmStoryCase
from trusted_testing.guest_vm_story import (
    AWAY_AND_BACK,
    IMA_LIST,
    MB_LOG,
    StoryNode,
    VmCluster,
)
from trusted_testing.qga import GuestAgentError
from verifier.protocol.ima import parse_ascii
from verifier.protocol.mb import parse
from verifier.protocol.mb.eventlog import EV_EFI_BOOT_SERVICES_APPLICATION

INTERVAL = 3.0
#: Boot to a registered agent takes 60-150 s on TCG; allow for a busy host.
BOOT_TIMEOUT = 600.0
#: A quote of a TCG guest takes seconds, tens of seconds on a loaded host
#: (seen: two quotes in 60 s); detection is bounded by quotes, not time.
DETECT_TIMEOUT = 240.0
PAYLOAD = b"""#!/bin/sh
echo "payload ran on node $TRUSTED_NODE_UUID as $(id -un)"
echo "run $(cat /proc/sys/kernel/random/uuid)"
touch /run/trusted-payload-ran
"""


class _VmCase(VmStoryCase):
    """One VM and its services for the class."""

    payload_out: bytes

    @classmethod
    def start_story(cls) -> None:
        image = build()
        cls.cluster = VmCluster(os.path.join(cls.tmp, "cluster"), INTERVAL)
        cls.cluster.prepare()
        cls.node = StoryNode.boot(
            cls.cluster, image, str(uuid.uuid4()), PAYLOAD, allow_reboot=True
        )
        cls.node.bootstrap(BOOT_TIMEOUT)
        cls.payload_out = cls.node.guest.agent.read_file(PAYLOAD_PATH + ".out")

    def wait_new_boot(self, old: str) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            try:
                self.guest.agent.wait_ready(BOOT_TIMEOUT)
                if self.boot_id() != old:
                    return
            except GuestAgentError:
                pass
            time.sleep(2.0)
        self.fail(f"the guest did not boot again\n{self.guest.diagnosis()}")

    def assert_attested_again(self, quotes_before: int, since: tuple[int, int]) -> None:
        """Attested by two quotes more, never revoked; in between the node
        was unreachable and then recovered, each a signed event whose only
        hook was the log (no revocation action ran); the payload not run
        again: its output is the first run's (a run writes a new random
        token; the agent syncs it when the payload ends, so even a hard
        reset keeps it); in a new boot, the run's marker in /run is absent."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        status = self.status()
        seen = {status["state"]}
        while time.monotonic() < deadline:
            status = self.status()
            seen.add(status["state"])
            self.assertNotEqual("revoked", status["state"], status)
            if (
                status["state"] == "attested"
                and status["quotes_verified"] >= quotes_before + 2
            ):
                break
            time.sleep(1.0)
        else:
            self.fail(f"not attested again: {status}")
        self.assertIn("unreachable", seen)
        uuid = self.node.uuid
        events, hooks = since
        self.assertEqual(AWAY_AND_BACK, self.cluster.event_types(uuid)[events:])
        # the hooks saw both (in the order their deliveries ended)
        self.assertEqual(
            sorted(AWAY_AND_BACK), sorted(self.cluster.hook_types(uuid)[hooks:])
        )
        self.assertEqual([], self.cluster.wait_hooks(uuid, 0.0))
        out = self.guest.agent.exec(["/bin/cat", PAYLOAD_PATH + ".out"])
        self.assertEqual((0, self.payload_out), (out.exit_code, out.stdout))

    def _through(self, what: str) -> None:
        old, quotes = self.boot_id(), self.status()["quotes_verified"]
        since = self.history()
        if what == "reboot":
            self.reboot_guest()
        else:
            if what == "reset":
                self.guest.qmp.call("system_reset")
            else:
                self.guest.kill()
                self.guest.relaunch()
            self.wait_new_boot(old)
        self.assert_attested_again(quotes, since)
        ran = self.guest.agent.exec(["/usr/bin/test", "-e", "/run/trusted-payload-ran"])
        self.assertEqual(1, ran.exit_code, "the payload ran again")


class TestTrustedBootStory(_VmCase):
    """Boot → attested → payload; an agent restart and a guest reboot keep
    it attested; an unknown program → revoked → hooks."""

    def test_1_agent_registered_with_its_vtpm_ek_certificate(self) -> None:
        record = self.node.record
        self.assertTrue(record.activated)
        self.assertIsNotNone(record.ek_certificate)
        # The verifier and the tenant reach the agent through the port qemu
        # forwards from the host's loopback, as the agent registered it.
        self.assertEqual(
            ("127.0.0.1", self.node.contact_port), (record.host, record.port)
        )

    def test_2_attested_with_the_guest_kernels_ima_list_and_event_log(self) -> None:
        status = self.status()
        self.assertEqual("attested", status["state"], status)
        self.assertIsNotNone(status["runtime_policy"])
        self.assertIsNotNone(status["mb_policy"])
        # the verifier replayed the guest kernel's own list
        self.assertGreater(status["ima_entries"], 500)

    def test_3_kernel_digest_from_the_image_is_what_ovmf_measured(self) -> None:
        events = parse(self.guest.agent.read_file(MB_LOG)).events
        apps = [
            e.digests["sha256"].hex()
            for e in events
            if e.event_type == EV_EFI_BOOT_SERVICES_APPLICATION
        ]
        self.assertEqual(self.node.mb_policy["boot_applications"], apps)

    def test_4_payload_ran_once_in_the_guest_and_its_output_is_read_back(self) -> None:
        out = self.guest.agent.read_file(PAYLOAD_PATH + ".out").decode()
        first, run = out.splitlines()
        self.assertEqual(f"payload ran on node {self.node.uuid} as root", first)
        self.assertRegex(run, r"^run [0-9a-f-]{36}$")
        status = self.guest.agent.read_file(PAYLOAD_PATH + ".status")
        self.assertEqual(b'{"exit_code": 0}', status)
        entries = parse_ascii(self.guest.agent.read_file(IMA_LIST))
        runs = [e for e in entries if e.path == PAYLOAD_PATH]
        self.assertEqual(
            [("sha256", hashlib.sha256(PAYLOAD).digest())],
            [(e.digest_algorithm, e.digest) for e in runs],
        )

    def test_5_agent_restart_is_unreachable_then_recovered_not_revoked(
        self,
    ) -> None:
        quotes, since = self.status()["quotes_verified"], self.history()
        # an agent upgrade: stopped until the verifier finds it unreachable
        done = self.guest.agent.exec(["/usr/bin/systemctl", "stop", "trusted-agent"])
        self.assertEqual(0, done.exit_code, done.stderr)
        away = self.cluster.wait_node(self.node.uuid, ("unreachable",), DETECT_TIMEOUT)
        self.assertFalse(away["trusted"], away)
        self.assertTrue(away["failure_reason"].startswith("unreachable"), away)
        done = self.guest.agent.exec(["/usr/bin/systemctl", "start", "trusted-agent"])
        self.assertEqual(0, done.exit_code, done.stderr)
        self.assert_attested_again(quotes, since)
        ran = self.guest.agent.exec(["/usr/bin/test", "-e", "/run/trusted-payload-ran"])
        self.assertEqual(0, ran.exit_code)  # the first run's, same boot

    def test_6_guest_reboot_is_unreachable_then_recovered(self) -> None:
        self._through("reboot")

    def test_7_unknown_program_is_revoked_naming_it_and_hooks_fire(self) -> None:
        before = self.status()
        self.assertEqual("attested", before["state"])
        program = f"/root/unknown-{uuid.uuid4().hex[:8]}"
        ran = self.guest.agent.shell(
            f"printf '#!/bin/sh\\necho not in the image\\n' > {program}; "
            f"chmod 0755 {program}; {program}"
        )
        self.assertEqual((0, "not in the image\n"), (ran.exit_code, ran.text))
        ran_at = self.status()["quotes_verified"]
        revoked = self.cluster.wait_node(self.node.uuid, ("revoked",), DETECT_TIMEOUT)
        self.assertIn(program, revoked["failure_reason"])
        # Revoked within two quotes of the program running: at most the
        # quote in flight when it ran was accepted after it.
        self.assertLessEqual(revoked["quotes_verified"] - ran_at, 1)
        hooks = self.cluster.wait_hooks(self.node.uuid, 60.0)
        self.assertTrue(hooks, self.cluster.hook_records())


class TestVmLife(_VmCase):
    """An honest node stays attested through hard resets of its VM; an older
    vTPM state replayed is a rollback. One VM; the steps run in order."""

    saved_state: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # The vTPM as it is now: replayed at the end, after two resets.
        cls.saved_state = os.path.join(cls.tmp, "tpm-saved")
        cls.node.guest.save_tpm_state(cls.saved_state)

    def test_1_hard_reset_is_unreachable_then_recovered(self) -> None:
        self._through("reset")

    def test_2_qemu_and_swtpm_killed_and_restarted_unreachable_then_back(
        self,
    ) -> None:
        self._through("kill")

    def test_3_replayed_older_vtpm_state_is_revoked(self) -> None:
        self.assertEqual("attested", self.status()["state"])
        self.guest.kill()
        self.guest.restore_tpm_state(self.saved_state)
        self.guest.relaunch()
        revoked = self.cluster.wait_node(self.node.uuid, ("revoked",), BOOT_TIMEOUT)
        self.assertIn("clock_rollback", revoked["failure_reason"])
        self.assertTrue(self.cluster.wait_hooks(self.node.uuid, 60.0))
