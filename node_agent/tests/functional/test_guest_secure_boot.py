"""The trusted-boot story for an image that boots the way distribution cloud
images do: a whole disk under UEFI Secure Boot, Microsoft-signed shim,
Debian-signed GRUB, Debian-signed kernel (:mod:`trusted_testing.guest_sb`).

One VM (OVMF's Secure Boot build with Microsoft's keys, a swtpm vTPM with
an EK certificate) for the class; the steps run in order:

1. the tenant enrols it with the measured-boot policy generated from the
   image (``trusted-tenant policy generate measured-boot --image DISK
   --vars OVMF_VARS_4M.ms.fd``): attested, the payload runs;
2. that policy passes the guest's own firmware event log, line by line,
   and holds what the build put on the disk;
3. Secure Boot turned off in the variable store: Debian's GRUB then starts
   the kernel without its EFI stub, so the guest has no firmware event log
   at all: revoked, the reason names the missing log;
4. the guest's root edits the GRUB command line on the ESP (IMA's policy
   dropped), Secure Boot on again: the boot's real log is refused naming
   the command line (by the protocol core the verifier runs: the node is
   already revoked);
5. an unsigned kernel under Secure Boot: shim refuses it, GRUB says so and
   no kernel starts.

The node is enrolled with a measured-boot policy and no runtime (IMA)
policy: what it pins is the boot chain. A kernel update inside the guest
(``dpkg -i`` of a 400 MB kernel package, then ``update-initramfs``) took
over six minutes under TCG, so it is not a step here: kernel rollover is
tested on the policy, against this guest's real log
(``verifier/tests/unit/test_secure_boot_real_log.py``) and through the
generator's ``--keep`` (``nova_plugin/tests/unit/test_policygen_image.py``).
"""

from __future__ import annotations

import os
import re
import time
import uuid

from nova_plugin.imagepolicy import measured_boot_from_image
from nova_plugin.policygen import PAYLOAD_PATH
from trusted_testing.guest_sb import (
    OVMF_VARS_PLAIN,
    OVMF_VARS_SB,
    SECURE_BOOT,
    SbImage,
    build_secure_boot,
    reference_policy,
)
from trusted_testing.guest_vm import build
from trusted_testing.guest_vm_case import VmStoryCase
from trusted_testing.guest_vm_story import MB_LOG, StoryNode, VmCluster
from verifier.protocol.mb import MeasuredBootPolicy, parse
from verifier.protocol.mb.policy import evaluate, secure_boot_state

INTERVAL = 3.0
BOOT_TIMEOUT = 600.0
DETECT_TIMEOUT = 240.0
PAYLOAD = b"""#!/bin/sh
echo "payload ran on node $TRUSTED_NODE_UUID under Secure Boot"
"""
ESP = "/dev/vda1"
#: GRUB's words when shim refuses the kernel (Debian GRUB 2.06).
SHIM_REFUSED = re.compile(r"bad shim signature|Verification failed|invalid signature")
#: Strip a PE image's signatures in the guest (what ``sbattach --remove``
#: does): zero the certificate table's directory entry, cut the table off.
UNSIGN = r"""
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
pe = struct.unpack_from("<I", data, 0x3C)[0]
magic = struct.unpack_from("<H", data, pe + 24)[0]
entry = pe + 24 + (112 if magic == 0x20B else 96) + 32
offset, size = struct.unpack_from("<II", data, entry)
struct.pack_into("<II", data, entry, 0, 0)
open(path, "wb").write(data[:offset])
"""


class TestSecureBootGuest(VmStoryCase):
    """One Secure Boot VM through its story (module doc); in order."""

    sb: SbImage
    prefix = "guest-sb-"

    @classmethod
    def start_story(cls) -> None:
        cls.sb = build_secure_boot(build())
        cls.cluster = VmCluster(os.path.join(cls.tmp, "cluster"), INTERVAL)
        cls.cluster.prepare()
        cls.node = StoryNode.boot(
            cls.cluster,
            cls.sb.image,
            str(uuid.uuid4()),
            PAYLOAD,
            allow_reboot=True,
            firmware=SECURE_BOOT,
            mb_policy=measured_boot_from_image(cls.sb.disk, OVMF_VARS_SB),
        )
        cls.node.bootstrap(BOOT_TIMEOUT, runtime=False)

    def guest_log(self) -> bytes:
        self.guest.agent.wait_ready(BOOT_TIMEOUT)
        return self.guest.agent.read_file(MB_LOG)

    def shell(self, script: str) -> str:
        done = self.guest.agent.shell(script)
        self.assertEqual(0, done.exit_code, (script, done.text, done.stderr))
        return done.text

    def relaunch(self, nvram: str) -> None:
        """Power the VM off, give it ``nvram``'s variables, power it on (the
        console then shows this boot only)."""
        self.guest.kill()
        self.guest.replace_nvram(nvram)
        self.guest.relaunch()

    def test_1_attested_under_secure_boot_and_the_payload_ran(self) -> None:
        status = self.status()
        self.assertEqual("attested", status["state"], status)
        self.assertIsNone(status["runtime_policy"])
        self.assertIsNotNone(status["mb_policy"])
        console = self.guest.console()
        self.assertIn("secureboot: Secure boot enabled", console)
        out = self.guest.agent.read_file(PAYLOAD_PATH + ".out").decode()
        self.assertIn("under Secure Boot", out)

    def test_2_the_policy_passes_the_guests_own_event_log(self) -> None:
        events = parse(self.guest_log()).events
        found = secure_boot_state(events)
        self.assertIsNotNone(found)
        assert found is not None
        self.assertTrue(found[1])
        policy = MeasuredBootPolicy.from_dict(self.node.mb_policy)
        self.assertEqual([], evaluate(policy, events))
        # the generator read from the disk what the build put on it
        reference = reference_policy(self.sb)
        self.assertEqual(reference, {k: self.node.mb_policy[k] for k in reference})
        for key in ("pk", "kek", "db", "dbx", "authorities"):
            self.assertTrue(self.node.mb_policy[key], key)
        # each part of the chain was judged from a real event
        kinds = {(e.pcr, e.event_type) for e in events}
        for pcr in (4, 7, 8, 9, 14):
            self.assertTrue(any(p == pcr for p, _ in kinds), pcr)

    def test_3_secure_boot_off_leaves_no_event_log_and_is_revoked(self) -> None:
        # With Secure Boot off, Debian's GRUB starts the kernel without its
        # EFI stub, which is what copies the firmware's log for the kernel:
        # the guest has no log at all. The verifier refuses a boot it cannot
        # judge, naming why.
        self.relaunch(OVMF_VARS_PLAIN)
        # the relaunched guest boots before its agent can answer: on a loaded
        # machine (TCG) that alone took more than DETECT_TIMEOUT once
        revoked = self.cluster.wait_node(
            self.node.uuid, ("revoked",), BOOT_TIMEOUT + DETECT_TIMEOUT
        )
        reason = revoked["failure_reason"]
        self.assertIn("mb_log_unavailable", reason)
        self.assertIn("binary_bios_measurements", reason)
        self.guest.agent.wait_ready(BOOT_TIMEOUT)
        self.assertNotIn("secureboot: Secure boot enabled", self.guest.console())
        absent = self.guest.agent.exec(["/usr/bin/test", "-e", MB_LOG])
        self.assertEqual(1, absent.exit_code)

    def test_4_a_changed_grub_command_line_is_refused_naming_it(self) -> None:
        # root in the guest drops IMA's policy from GRUB's command line, and
        # Secure Boot is back on: the boot is judged from its real log by the
        # protocol core the verifier runs (the node is already revoked).
        self.shell(
            f"mkdir -p /mnt/esp && mount {ESP} /mnt/esp && "
            "sed -i 's/ ima_policy=tcb//' /mnt/esp/EFI/debian/grub.cfg && "
            "sync && umount /mnt/esp"
        )
        self.relaunch(OVMF_VARS_SB)
        events = parse(self.guest_log()).events
        policy = MeasuredBootPolicy.from_dict(self.node.mb_policy)
        reasons = [str(f) for f in evaluate(policy, events)]
        self.assertEqual(1, len(reasons), reasons)
        self.assertIn("kernel command line", reasons[0])
        self.assertIn("EV_IPL, PCR 8", reasons[0])
        self.assertNotIn("ima_policy", reasons[0])

    def test_5_an_unsigned_kernel_is_refused_by_shim(self) -> None:
        self.shell(f"python3 -c '{UNSIGN}' {self.sb.kernel} && sync")
        seen = len(self.guest.console())
        self.reboot_guest(until=lambda printed: bool(SHIM_REFUSED.search(printed)))
        time.sleep(10.0)
        self.assertNotIn("Linux version", self.guest.console()[seen:])
