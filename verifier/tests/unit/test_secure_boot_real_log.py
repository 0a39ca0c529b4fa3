"""The Secure Boot chain policy against a real log: OVMF's Secure Boot build
with Microsoft's keys, Debian's shim 16.1, GRUB 2.06 and signed 6.1 kernel
(``trusted_testing/fixtures/secure-boot``, written by
``tools/guest/capture-secure-boot.py`` from a real boot; ``capture.json``
says what produced it), and the policy ``trusted-tenant policy generate
measured-boot --image DISK --vars OVMF_VARS_4M.ms.fd`` made from that disk.

The generated policy passes; each field of it, changed as a tenant's
different expectation would change it, fails naming the event and what was
expected. What the real log taught (and the synthetic logs had wrong): shim
logs GRUB's authority as ``MokListRT`` (its vendor certificate, owned by
shim), the kernel appears twice in PCR 4 (GRUB asks shim to verify it, then
firmware's LoadImage measures it again), and an empty MOK list of a shim
with a vendor certificate is that certificate, not a placeholder.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import testtools

from trusted_testing import FIXTURES
from verifier.protocol.mb import MeasuredBootPolicy, evaluate, parse
from verifier.protocol.mb.eventlog import EV_EFI_BOOT_SERVICES_APPLICATION
from verifier.protocol.mb.replay import replay

HERE = os.path.join(FIXTURES, "secure-boot")
OTHER = "ab" * 32


def _load() -> tuple[bytes, dict[str, Any]]:
    with open(os.path.join(HERE, "binary_bios_measurements"), "rb") as handle:
        raw = handle.read()
    with open(os.path.join(HERE, "policy.json"), encoding="utf-8") as handle:
        return raw, json.load(handle)


class TestRealSecureBootLog(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        raw, self.document = _load()
        self.events = parse(raw).events

    def reasons(self, **changes: Any) -> list[str]:
        document = copy.deepcopy(self.document)
        document.update(changes)
        return [
            str(f)
            for f in evaluate(MeasuredBootPolicy.from_dict(document), self.events)
        ]

    def assert_refused(self, needle: str, **changes: Any) -> None:
        reasons = self.reasons(**changes)
        self.assertTrue(any(needle in r for r in reasons), reasons)

    def test_the_log_replays(self) -> None:
        pcrs = replay(self.events, pcrs=range(24))
        for pcr in (0, 4, 7, 8, 9, 14):
            self.assertIn(pcr, pcrs.get("sha256", {}))

    def test_the_policy_of_its_image_passes(self) -> None:
        self.assertEqual([], self.reasons())

    def test_the_kernel_is_measured_twice_in_pcr_4(self) -> None:
        apps = [
            e.digests["sha256"].hex()
            for e in self.events
            if e.event_type == EV_EFI_BOOT_SERVICES_APPLICATION
        ]
        self.assertEqual(4, len(apps))
        self.assertEqual(self.document["kernels"], sorted(set(apps[2:])))

    def test_another_shim_is_refused(self) -> None:
        self.assert_refused("shim", shim=[OTHER])

    def test_another_grub_is_refused(self) -> None:
        self.assert_refused("GRUB", grub=[OTHER])

    def test_another_kernel_is_refused(self) -> None:
        self.assert_refused("kernel", kernels=[OTHER])

    def test_another_command_line_is_refused_naming_it(self) -> None:
        self.assert_refused("kernel command line", kernel_cmdlines=["ro quiet"])

    def test_an_anchored_pattern_admits_the_command_line(self) -> None:
        pattern = r"/boot/vmlinuz-6\.1\.0-\d+-amd64 root=LABEL=cloudimg-rootfs ro .*"
        self.assertEqual([], self.reasons(kernel_cmdlines=[{"pattern": pattern}]))

    def test_kernel_rollover_admits_the_old_boot_until_the_old_kernel_is_dropped(
        self,
    ) -> None:
        # version 2 of the policy: the running kernel and an updated one
        new_cmdline = "/boot/vmlinuz-6.1.0-57-amd64 root=LABEL=cloudimg-rootfs ro"
        rollover = {
            "kernels": [*self.document["kernels"], OTHER],
            "kernel_cmdlines": [*self.document["kernel_cmdlines"], new_cmdline],
            "initrds": [*self.document["initrds"], OTHER],
        }
        self.assertEqual([], self.reasons(**rollover))
        # version 3: the old kernel dropped; a node still booting it is refused
        dropped = {k: v[-1:] for k, v in rollover.items()}
        reasons = self.reasons(**dropped)
        for needle in ("kernel", "kernel command line", "initrd"):
            self.assertTrue(any(needle in r for r in reasons), (needle, reasons))

    def test_another_initrd_is_refused(self) -> None:
        self.assert_refused("initrd", initrds=[OTHER])

    def test_a_placeholder_mok_list_is_refused(self) -> None:
        mok = dict(self.document["mok"], MokList=["empty"])
        self.assert_refused("MokList contents", mok=mok)

    def test_a_higher_sbat_level_is_refused(self) -> None:
        self.assert_refused(
            "SbatLevel lower", sbat_level="sbat,1,2099010100\nshim,4\ngrub,9\n"
        )

    def test_another_pk_is_refused(self) -> None:
        self.assert_refused("PK", pk=[f"x509:{OTHER}"])

    def test_another_db_is_refused(self) -> None:
        self.assert_refused("db differs", db=[*self.document["db"], f"x509:{OTHER}"])

    def test_a_dbx_newer_than_the_logged_one_is_refused(self) -> None:
        self.assert_refused("dbx lacks", dbx=[*self.document["dbx"], f"sha256:{OTHER}"])

    def test_an_authority_not_allowed_is_refused(self) -> None:
        only_db = [a for a in self.document["authorities"] if a["variable"] == "db"]
        self.assert_refused("authority MokListRT", authorities=only_db)

    def test_secure_boot_required_off_is_refused(self) -> None:
        document = {"secure_boot": False}
        failures = evaluate(MeasuredBootPolicy.from_dict(document), self.events)
        self.assertTrue(any("Secure Boot is" in str(f) for f in failures))
