"""The measured-boot policy of a Secure Boot chain (shim, GRUB, a signed
kernel): one named test per refusal, the passing boot, forged log text,
and the parsers it adds (EFI_SIGNATURE_LIST, EV_IPL strings, SbatLevel).

Logs are synthetic (:mod:`trusted_testing.secureboot_log`), in the order
and format OVMF, shim and GRUB write them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from typing import Any

import testtools

from trusted_testing.secureboot_log import (
    INITRD_PATH,
    SecureBootBoot,
    cert_der,
    cert_pem,
)
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.evidence import check_measured_boot
from verifier.protocol.mb import (
    MeasuredBootPolicy,
    check,
    efisig,
    evaluate,
    parse,
    replay,
)
from verifier.protocol.mb.bootstrings import SbatLevel, ipl_string
from verifier.protocol.mb.chain import mok_empty
from verifier.protocol.mb.eventlog import EV_IPL, Event


def judge(boot: SecureBootBoot, policy: dict[str, Any] | None = None) -> list[str]:
    """The failures, as strings, of ``boot``'s log under ``policy``
    (default: the golden boot's policy)."""
    document = SecureBootBoot().policy() if policy is None else policy
    events = parse(boot.build()).events
    return [str(f) for f in evaluate(MeasuredBootPolicy.from_dict(document), events)]


class ChainRefusalTest(testtools.TestCase):
    """Each refusal names the event (index, type, PCR) and what the policy
    expected."""

    def assertOneFailure(self, failures: list[str], *fragments: str) -> str:
        self.assertEqual(1, len(failures), str(failures))
        for fragment in fragments:
            self.assertIn(fragment, failures[0])
        return failures[0]

    def test_the_pinned_boot_passes(self) -> None:
        boot = SecureBootBoot()
        self.assertEqual([], judge(boot))
        check(MeasuredBootPolicy.from_dict(boot.policy()), parse(boot.build()).events)

    def test_wrong_pk_is_refused(self) -> None:
        failures = judge(SecureBootBoot(pk="Someone else's PK"))
        self.assertOneFailure(
            failures, "EV_EFI_VARIABLE_DRIVER_CONFIG, PCR 7", "PK ", "is not one of"
        )

    def test_missing_dbx_entry_is_refused(self) -> None:
        boot = SecureBootBoot()
        old = SecureBootBoot(dbx=boot.dbx[:3])  # two revocations behind
        text = self.assertOneFailure(
            judge(old), "PCR 7", "dbx lacks 2 of the policy's 5 entries"
        )
        self.assertIn(
            "sha256:" + boot.dbx[3].hex(), text + "sha256:" + boot.dbx[4].hex()
        )

    def test_newer_dbx_than_the_tenants_passes(self) -> None:
        boot = SecureBootBoot()
        newer = SecureBootBoot(dbx=[*boot.dbx, hashlib.sha256(b"new").digest()])
        self.assertEqual([], judge(newer))

    def test_unknown_authority_is_refused(self) -> None:
        failures = judge(SecureBootBoot(vendor_cert="Someone's Secure Boot CA"))
        # the MokList digest changes too (shim's certificate is in it)
        authority = [f for f in failures if "EV_EFI_VARIABLE_AUTHORITY" in f]
        self.assertOneFailure(authority, "PCR 7", "authority Shim x509:", "not allowed")

    def test_authority_from_db_not_named_is_refused(self) -> None:
        failures = judge(SecureBootBoot(shim_authority="Microsoft Windows PCA"))
        self.assertOneFailure(
            failures, "authority db x509:", "is not allowed (policy allows:"
        )

    def test_lower_sbat_level_is_refused(self) -> None:
        old = "sbat,1,2022052400\nshim,2\ngrub,2\n"
        failures = judge(SecureBootBoot(sbat_level=old))
        self.assertOneFailure(
            failures,
            "EV_EFI_VARIABLE_AUTHORITY, PCR 7",
            "SbatLevel lower than the policy's",
            "datestamp 2022052400 < 2023012900",
            "grub generation 2 < 3",
            "grub.debian missing",
        )

    def test_mok_not_allowed_is_refused(self) -> None:
        mok = efisig.signature_list(
            efisig.EFI_CERT_X509, uuid.uuid4(), [cert_der("Machine owner key")]
        )
        failures = judge(SecureBootBoot(moklist=mok))
        self.assertOneFailure(failures, "EV_IPL, PCR 14", "MokList contents")

    def test_mok_enrolled_by_the_tenant_passes(self) -> None:
        mok = efisig.signature_list(
            efisig.EFI_CERT_X509, uuid.uuid4(), [cert_der("Tenant's MOK")]
        )
        boot = SecureBootBoot(moklist=mok)
        self.assertEqual([], judge(boot, boot.policy()))

    def test_unknown_kernel_is_refused(self) -> None:
        failures = judge(SecureBootBoot(kernel=b"vmlinuz 6.1.0-99 built elsewhere"))
        self.assertOneFailure(
            failures,
            "EV_EFI_BOOT_SERVICES_APPLICATION, PCR 4",
            "kernel Authenticode digest",
            "not among the policy's 1 kernel digest(s)",
        )

    def test_unknown_shim_and_grub_are_refused(self) -> None:
        failures = judge(SecureBootBoot(shim=b"old shim", grub=b"old grub"))
        self.assertEqual(2, len(failures), str(failures))
        self.assertIn("shim Authenticode digest", failures[0])
        self.assertIn("GRUB Authenticode digest", failures[1])

    def test_changed_cmdline_is_refused(self) -> None:
        boot = SecureBootBoot(cmdline=SecureBootBoot().cmdline + " init=/bin/sh")
        self.assertOneFailure(
            judge(boot), "EV_IPL, PCR 8", "kernel command line", "init=/bin/sh"
        )

    def test_exact_cmdline_passes_and_others_do_not(self) -> None:
        boot = SecureBootBoot()
        policy = boot.policy() | {"kernel_cmdlines": [boot.kernel_cmdline()]}
        self.assertEqual([], judge(boot, policy))
        quiet_off = SecureBootBoot(cmdline=boot.cmdline.replace(" quiet", ""))
        self.assertEqual(1, len(judge(quiet_off, policy)))

    def test_unknown_initrd_is_refused(self) -> None:
        failures = judge(SecureBootBoot(initrd=b"initrd with a backdoor"))
        self.assertOneFailure(
            failures, "EV_IPL, PCR 9", INITRD_PATH, "not among the policy's 1 initrds"
        )

    def test_secure_boot_off_is_refused(self) -> None:
        failures = judge(SecureBootBoot(secure_boot=False))
        self.assertOneFailure(
            failures,
            "EV_EFI_VARIABLE_DRIVER_CONFIG, PCR 7",
            "Secure Boot is disabled, policy wants enabled",
        )

    def test_shim_validation_turned_off_is_refused(self) -> None:
        boot = SecureBootBoot()
        raw = boot.build()
        events = parse(raw).events
        from node_agent.trial.eventlog import efi_variable_data

        data = efi_variable_data(efisig.SHIM_LOCK, "MokSBState", b"\x01")
        sb_state = Event(
            len(events), 7, 0x800000E0, {"sha256": hashlib.sha256(data).digest()}, data
        )
        policy = MeasuredBootPolicy.from_dict(boot.policy())
        failures = [str(f) for f in evaluate(policy, [*events, sb_state])]
        self.assertEqual(1, len(failures), str(failures))
        self.assertIn("shim validation is disabled (MokSBState set)", failures[0])

    def test_failures_reach_the_verdict_as_mb_policy(self) -> None:
        boot = SecureBootBoot(kernel=b"another kernel")
        policy = MeasuredBootPolicy.from_dict(SecureBootBoot().policy())
        exc = self.assertRaises(
            EvidenceError, check, policy, parse(boot.build()).events
        )
        self.assertEqual("mb_policy", exc.reason)
        self.assertIn("PCR 4", exc.detail)


def judge_events(events: list[Event], document: dict[str, Any]) -> list[str]:
    policy = MeasuredBootPolicy.from_dict(document)
    return [str(f) for f in evaluate(policy, events)]


def relabel(events: list[Event], old: bytes, new: bytes) -> list[Event]:
    """The events with ``old`` in one event's data replaced by ``new``, the
    digests kept (what an attacker editing the log can do)."""
    out, done = [], False
    for event in events:
        if not done and old in event.data:
            event = dataclasses.replace(event, data=event.data.replace(old, new))
            done = True
        out.append(event)
    assert done, old
    return out


class ForgedLogTextTest(testtools.TestCase):
    """The PCRs cover digests, not the logged data: data that does not hash
    to its digest is not believed."""

    def test_dbx_rewritten_in_the_log_is_refused(self) -> None:
        golden = SecureBootBoot()
        stale = [*golden.dbx[:3], b"\xaa" * 32, b"\xbb" * 32]
        events = list(parse(SecureBootBoot(dbx=stale).build()).events)
        spliced = relabel(events, stale[3], golden.dbx[3])
        spliced = relabel(spliced, stale[4], golden.dbx[4])
        failures = judge_events(spliced, golden.policy())
        self.assertEqual(1, len(failures), str(failures))
        self.assertIn(
            "PCR 7): event data does not match its logged digest", failures[0]
        )

    def test_cmdline_text_rewritten_in_the_log_is_refused(self) -> None:
        golden = SecureBootBoot()
        bad = SecureBootBoot(cmdline=golden.cmdline + " init=/bin/sh")
        events = list(parse(bad.build()).events)
        spliced = relabel(
            events,
            b"kernel_cmdline: " + bad.kernel_cmdline().encode(),
            b"kernel_cmdline: " + golden.kernel_cmdline().encode(),
        )
        failures = judge_events(spliced, golden.policy())
        self.assertIn(
            "kernel_cmdline text does not match its digest", "\n".join(failures)
        )

    def test_initrd_path_relabelled_in_the_log_is_refused(self) -> None:
        events = list(parse(SecureBootBoot(initrd=b"backdoored").build()).events)
        # rename the file event only (the initrd command is covered by PCR 8)
        file_event = [
            e for e in events if e.pcr == 9 and INITRD_PATH.encode() in e.data
        ]
        self.assertEqual(1, len(file_event))
        events[file_event[0].index] = dataclasses.replace(
            file_event[0], data=b"/boot/grub/fonts/unicode.pf2\0"
        )
        failures = judge_events(events, SecureBootBoot().policy())
        self.assertEqual(1, len(failures), str(failures))
        self.assertIn(f"initrd '{INITRD_PATH}' was not measured in PCR 9", failures[0])

    def test_secure_boot_flag_rewritten_in_the_log_is_refused(self) -> None:
        events = list(parse(SecureBootBoot(secure_boot=False).build()).events)
        name = "SecureBoot".encode("utf-16-le")
        spliced = relabel(events, name + b"\x00", name + b"\x01")
        failures = judge_events(spliced, {"secure_boot": True})
        self.assertEqual(1, len(failures), str(failures))
        self.assertIn(
            "SecureBoot event data does not match its logged digest", failures[0]
        )


class ChainPolicyDocumentTest(testtools.TestCase):
    def test_old_documents_keep_their_meaning(self) -> None:
        old = {"boot_applications": ["aa" * 32], "firmware": None, "secure_boot": True}
        policy = MeasuredBootPolicy.from_dict(old)
        self.assertIsNone(policy.chain)
        self.assertEqual(old, policy.to_dict())

    def test_round_trip_of_a_chain_policy(self) -> None:
        policy = MeasuredBootPolicy.from_dict(SecureBootBoot().policy())
        again = MeasuredBootPolicy.from_dict(policy.to_dict())
        self.assertEqual(policy, again)
        self.assertEqual(policy.to_dict(), again.to_dict())
        hash(again)  # policies are cached and compared as values

    def test_pem_and_its_sha256_are_the_same_entry(self) -> None:
        pem = cert_pem("Tenant PK")
        key = "x509:" + hashlib.sha256(cert_der("Tenant PK")).hexdigest()
        self.assertEqual(key, efisig.key_from_text(pem, "pk[0]"))
        self.assertEqual(
            key, efisig.key_from_text(key.upper().replace("X509", "x509"), "pk[0]")
        )

    def test_unknown_field_is_named(self) -> None:
        exc = self.assertRaises(
            MalformedError,
            MeasuredBootPolicy.from_dict,
            SecureBootBoot().policy() | {"dbx_min": [], "kernel": []},
        )
        self.assertIn("unknown keys ['dbx_min', 'kernel']", exc.detail)

    def test_missing_pk_is_named(self) -> None:
        document = SecureBootBoot().policy()
        del document["pk"]
        exc = self.assertRaises(MalformedError, MeasuredBootPolicy.from_dict, document)
        self.assertIn(
            "pk missing: a policy that pins kek, db, dbx, authorities", exc.detail
        )

    def test_pk_without_secure_boot_true_is_refused(self) -> None:
        document = SecureBootBoot().policy() | {"secure_boot": None}
        exc = self.assertRaises(MalformedError, MeasuredBootPolicy.from_dict, document)
        self.assertIn("secure_boot must be true when pk is set", exc.detail)

    def test_bad_entries_are_named(self) -> None:
        cases = {
            "db": (["x509:zz"], "db[0]: 'x509:zz' is not"),
            "kernels": (["abc"], "kernels[0]: 'abc' is not a sha256"),
            "kernel_cmdlines": (
                [{"pattern": "("}],
                "kernel_cmdlines[0].pattern does not compile",
            ),
            "mok": ({"MokListRT": []}, "unknown MOK variables ['MokListRT']"),
            "sbat_level": ("shim,2\n", "sbat_level: line 1"),
            "authorities": ([{"variable": "db"}], "authorities[0] must be an object"),
        }
        for key, (value, fragment) in cases.items():
            document = SecureBootBoot().policy() | {key: value}
            exc = self.assertRaises(
                MalformedError, MeasuredBootPolicy.from_dict, document
            )
            self.assertIn(fragment, exc.detail)

    def test_mok_empty_is_shims_placeholder(self) -> None:
        placeholder = efisig.signature_list(
            efisig.EFI_CERT_SHA256, efisig.SHIM_LOCK, [bytes(32)]
        )
        self.assertEqual(hashlib.sha256(placeholder).digest(), mok_empty())
        self.assertEqual(76, len(placeholder))  # 28-byte header + 16 + 32


class SignatureListTest(testtools.TestCase):
    def test_lists_of_two_types_parse_in_order(self) -> None:
        owner = uuid.uuid4()
        data = efisig.signature_list(
            efisig.EFI_CERT_X509, owner, [cert_der("A")]
        ) + efisig.signature_list(
            efisig.EFI_CERT_SHA256, owner, [b"\1" * 32, b"\2" * 32]
        )
        entries = efisig.parse_signature_lists(data, "event 9 (db)")
        self.assertEqual(3, len(entries))
        self.assertEqual({owner}, {e.owner for e in entries})
        self.assertEqual(cert_der("A"), entries[0].data)
        self.assertEqual("sha256:" + "02" * 32, entries[2].key)
        self.assertEqual((), efisig.parse_signature_lists(b"", "event 9 (db)"))

    def test_malformed_lists_name_the_event_and_field(self) -> None:
        good = efisig.signature_list(efisig.EFI_CERT_SHA256, uuid.uuid4(), [b"\1" * 32])
        cases = {
            good[:20]: "list at offset 0: header truncated",
            good[:16] + b"\xff\0\0\0" + good[20:]: "SignatureListSize 255 does not fit",
            good[:20] + b"\x40\0\0\0" + good[24:]: "SignatureHeaderSize 64 exceeds",
            good[:24] + b"\x10\0\0\0" + good[28:]: "SignatureSize 16 leaves no",
            good[:24] + b"\x31\0\0\0" + good[28:]: "SignatureSize 49 is not 48",
            good + good[:20]: "list at offset 76: header truncated",
        }
        for data, fragment in cases.items():
            exc = self.assertRaises(
                MalformedError, efisig.parse_signature_lists, data, "event 9 (db)"
            )
            self.assertEqual("EFI_SIGNATURE_LIST", exc.structure)
            self.assertIn("event 9 (db): ", exc.detail)
            self.assertIn(fragment, exc.detail)

    def test_malformed_db_in_a_log_names_the_event(self) -> None:
        boot = SecureBootBoot()
        raw = boot.build()
        events = list(parse(raw).events)
        db = next(
            e
            for e in events
            if e.variable and e.variable.name == "db" and e.event_type == 0x80000001
        )
        from node_agent.trial.eventlog import efi_variable_data

        bad = efi_variable_data(efisig.EFI_IMAGE_SECURITY_DATABASE, "db", b"\0" * 20)
        events[db.index] = Event(
            db.index, 7, db.event_type, {"sha256": hashlib.sha256(bad).digest()}, bad
        )
        policy = MeasuredBootPolicy.from_dict(boot.policy())
        exc = self.assertRaises(MalformedError, evaluate, policy, events)
        self.assertIn(
            f"event {db.index} (db): list at offset 0: header truncated", exc.detail
        )


class BootStringsTest(testtools.TestCase):
    def ipl(self, data: bytes, pcr: int = 8) -> Event:
        return Event(12, pcr, EV_IPL, {"sha256": hashlib.sha256(data).digest()}, data)

    def test_grub_strings(self) -> None:
        text = ipl_string(self.ipl(b"kernel_cmdline: root=/dev/vda1 ro\0"))
        self.assertEqual(
            ("kernel_cmdline", "root=/dev/vda1 ro"), (text.kind, text.text)
        )
        self.assertEqual(
            ("", "/boot/grub/grub.cfg"),
            tuple(vars_of(ipl_string(self.ipl(b"/boot/grub/grub.cfg\0", 9)))),
        )

    def test_malformed_strings_name_the_event_and_field(self) -> None:
        cases = {
            b"grub_cmd: boot": "event 12 (EV_IPL, PCR 8): event data has no "
            "terminating NUL",
            b"grub_cmd: \xff\0": "is not UTF-8 at byte 10",
            b"grub_cmd: a\0b\0": "control character 0x00 at 11",
            b"x" * 70000 + b"\0": "over 65536",
        }
        for data, fragment in cases.items():
            exc = self.assertRaises(MalformedError, ipl_string, self.ipl(data))
            self.assertIn(fragment, exc.detail)

    def test_sbat_level_comparison(self) -> None:
        want = SbatLevel.from_text("sbat,1,2023012900\nshim,2\ngrub,3\n", "policy")
        have = SbatLevel.from_bytes(
            b"sbat,1,2024010900\nshim,4\ngrub,3\ngrub.debian,4\n\0", "event 3"
        )
        self.assertEqual([], have.shortfalls(want))
        self.assertEqual(
            [
                "datestamp 2023012900 < 2024010900",
                "grub.debian missing (want >= 4)",
                "shim generation 2 < 4",
            ],
            want.shortfalls(have),
        )

    def test_malformed_sbat_level_is_named(self) -> None:
        for text, fragment in {
            "": "line 1: empty",
            "sbat,1\n": "line 1: 'sbat,1' is not sbat,<version>,<datestamp>",
            "sbat,1,2023\nshim\n": "line 2: 'shim' is not <component>,<generation>",
            "sbat,1,2023\nshim,1\nshim,2\n": "line 3: 'shim,2': bad or repeated",
        }.items():
            exc = self.assertRaises(
                MalformedError, SbatLevel.from_text, text, "event 7"
            )
            self.assertIn(f"event 7: {fragment}", exc.detail)
        exc = self.assertRaises(
            MalformedError, SbatLevel.from_bytes, b"\xff", "event 7"
        )
        self.assertIn("not ASCII", exc.detail)


def vars_of(text: Any) -> tuple[str, str]:
    return text.kind, text.text


class MokPcrTest(testtools.TestCase):
    """The MOK lists are logged in PCR 14: a policy that checks them has
    PCR 14 quoted and replayed, so their digests are covered."""

    def setUp(self) -> None:
        super().setUp()
        self.boot = SecureBootBoot()
        self.log = self.boot.build()
        self.policy = MeasuredBootPolicy.from_dict(self.boot.policy())
        replayed = replay(parse(self.log).events, ("sha256",), (*range(10), 14))
        self.pcrs = replayed["sha256"]

    def test_quoted_pcr_14_that_replays_passes(self) -> None:
        check_measured_boot(self.log, self.pcrs, self.policy)

    def test_pcr_14_not_quoted_is_refused(self) -> None:
        pcrs = {i: v for i, v in self.pcrs.items() if i != 14}
        exc = self.assertRaises(
            EvidenceError, check_measured_boot, self.log, pcrs, self.policy
        )
        self.assertEqual("pcr_selection", exc.reason)
        self.assertIn("PCR 14 must be quoted", exc.detail)

    def test_mok_digest_rewritten_in_the_log_does_not_replay(self) -> None:
        mok = efisig.signature_list(
            efisig.EFI_CERT_X509, uuid.uuid4(), [cert_der("Machine owner key")]
        )
        quoted = SecureBootBoot(moklist=mok)  # what the TPM saw
        pcrs = replay(parse(quoted.build()).events, ("sha256",), (*range(10), 14))
        exc = self.assertRaises(
            EvidenceError, check_measured_boot, self.log, pcrs["sha256"], self.policy
        )
        self.assertEqual("mb_pcr_mismatch", exc.reason)
        self.assertIn("PCR 14", exc.detail)

    def test_a_policy_checking_mok_has_pcr_14_quoted(self) -> None:
        from verifier.protocol.attestation.machine import _quoted_pcrs

        self.assertIn(14, _quoted_pcrs((16,), False, self.policy))
        plain = MeasuredBootPolicy.from_dict({"secure_boot": True})
        self.assertEqual((*range(10), 16), _quoted_pcrs((16,), False, plain))


class DocExampleTest(testtools.TestCase):
    """The user guide's example (doc/source/user/policies.rst) is a valid
    policy meaning what the page says."""

    def test_debian_chain_example_parses(self) -> None:
        import json
        import os
        import re

        from trusted_testing.docpages import DOC

        with open(os.path.join(DOC, "user", "policies.rst"), encoding="utf-8") as f:
            text = f.read()
        found = re.search(
            r"\.\. code-block:: json\n   :name: debian-chain-policy\n\n"
            r"((?:   .*\n|\n)+)",
            text,
        )
        assert found is not None, "no debian-chain-policy block"
        policy = MeasuredBootPolicy.from_dict(json.loads(found.group(1)))
        chain = policy.chain
        assert chain is not None and chain.kernel_cmdlines is not None
        self.assertEqual(2, len(chain.kernels or ()))
        self.assertEqual(
            {"MokList", "MokListX", "MokListTrusted"}, set(dict(chain.mok or ()))
        )
        (pattern,) = chain.kernel_cmdlines[1]
        line = (
            "BOOT_IMAGE=/boot/vmlinuz-6.1.0-21-amd64 "
            "root=UUID=6b1a3e0c-2f44-4a57-9d3e-51c0a3a2d7e1 ro"
        )
        self.assertIsNotNone(pattern.fullmatch(line))
        self.assertIsNotNone(pattern.fullmatch(line + " quiet"))
        self.assertIsNone(pattern.fullmatch(line + " init=/bin/sh"))
