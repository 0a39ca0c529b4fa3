"""Fuzz targets: every parser and judging entry point of the protocol core.

Each :class:`Target` takes arbitrary bytes to one entry point (the bytes
themselves for binary structures, their JSON for wire messages and
policies) and lets only the project's errors (:class:`ProtocolError`)
through: any other exception is a defect (issue 18). ``seeds`` gives valid
inputs to start a corpus from. Used by ``tools/fuzz/run.py`` (atheris,
coverage-guided) and by the unit tests, which replay the seeds and the
crashing inputs kept in ``tools/fuzz/regressions/<target>/``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Any

from trusted_testing.fuzz_common import NODE, Target, run_one
from trusted_testing.fuzz_common import dump_json as _dump
from trusted_testing.fuzz_common import load_json as _json
from trusted_testing.fuzz_common import node as _node
from trusted_testing.fuzz_diskimage import diskimage_targets
from trusted_testing.fuzz_hostbatch import hostbatch_targets
from trusted_testing.fuzz_translog import translog_targets
from trusted_testing.fuzz_wire import wire_targets
from verifier.protocol import errors

__all__ = ["TARGETS", "Target", "run_one"]

# -- TPM structures ------------------------------------------------------------


def _tpm_attest(data: bytes) -> object:
    from verifier.protocol.tpm import TpmAttest

    return TpmAttest.from_bytes(data)


def _tpm_public(data: bytes) -> object:
    from verifier.protocol.quote import check_ak_template
    from verifier.protocol.tpm import TpmPublic

    public = TpmPublic.from_bytes(data)
    check_ak_template(public)
    return public


def _tpm_signature(data: bytes) -> object:
    from verifier.protocol.tpm import TpmSignature

    return TpmSignature.from_bytes(data)


def _tpm_seeds() -> list[bytes]:
    tpm, _, _, _, answer = _node()
    quote = answer["quote"]
    return [
        base64.b64decode(quote["attest"]),
        base64.b64decode(quote["signature"]),
        tpm.ak.to_bytes(),
        tpm.ek.to_bytes(),
    ]


# -- quote answers, judged -----------------------------------------------------


def _quote_answer(data: bytes) -> object:
    """Parse and judge an answer like the verifier's quote loop (whose
    judge must never raise at all)."""
    from verifier.protocol import AttestationKey, PcrPolicy
    from verifier.protocol.attestation import (
        AttestationRules,
        NodeAttestation,
        NodeState,
    )
    from verifier.protocol.messages.quote import QuoteRequest

    tpm, _, _, nonce, _ = _node()
    policy = PcrPolicy({16: frozenset({tpm.pcrs[16]})})
    node = NodeAttestation(
        NODE, policy, AttestationKey(tpm.ak, activated=True), state=NodeState.ATTESTED
    )
    request = QuoteRequest(nonce, (16,), False, None, False)
    try:
        answer: object = _json(data)
    except errors.MalformedError as exc:
        answer = exc
    verdict = node.judge(request, answer, 1.0, AttestationRules())
    node.snapshot()
    return verdict


def _quote_seeds() -> list[bytes]:
    answer = _node()[4]
    # a quote carrying sha1 values as well (issue 32)
    banks = {"sha1": {"16": "00" * 20}}
    two_banks = dict(answer, quote=dict(answer["quote"], banks=banks))
    return [
        _dump(answer),
        _dump({"quote": answer["quote"]}),
        b"{}",
        _dump(two_banks),
    ]


# -- IMA -------------------------------------------------------------------------


def _ima_ascii(data: bytes) -> object:
    from verifier.protocol.ima import parse_ascii

    return parse_ascii(data)


def _ima_binary(data: bytes) -> object:
    from verifier.protocol.ima import parse_binary

    return parse_binary(data)


@functools.lru_cache(maxsize=1)
def _ima_policy() -> Any:
    from verifier.protocol.ima import RuntimePolicy

    digest = "sha256:" + hashlib.sha256(b"/bin/sh").hexdigest()
    return RuntimePolicy.from_dict(
        {"name": "fuzz", "version": 1, "digests": {"/bin/sh": [digest]}}
    )


def _ima_evidence(data: bytes) -> object:
    """An agent's IMA part, parsed and judged against PCR 10 and a policy."""
    from verifier.protocol.evidence import check_ima, parse_ima_evidence
    from verifier.protocol.ima import ReplayState

    evidence = parse_ima_evidence(_json(data))
    pcrs = {i: bytes(32) for i in range(11)}
    return check_ima(ReplayState(), evidence, pcrs, _ima_policy())


def _ima_seeds() -> list[bytes]:
    from node_agent.trial.ima import make_entry, to_ascii, to_binary

    entries = [make_entry("/bin/sh", b"/bin/sh"), make_entry("/usr/bin/x", b"x")]
    return [to_ascii(entries).encode(), to_binary(entries)]


def _ima_evidence_seeds() -> list[bytes]:
    ascii_list, binary = _ima_seeds()
    return [
        _dump({"format": "ascii", "from": 0, "entries": ascii_list.decode()}),
        _dump(
            {
                "format": "binary",
                "from": 0,
                "entries": base64.b64encode(binary).decode(),
            }
        ),
    ]


# -- UEFI event logs ---------------------------------------------------------------


def _event_log(data: bytes) -> object:
    """Parse, replay and judge a firmware log (PCRs 0-9 and a policy)."""
    from verifier.protocol.evidence import check_measured_boot
    from verifier.protocol.mb import MeasuredBootPolicy, parse

    log = parse(data)
    for event in log.events:
        event.variable  # noqa: B018 -- parses EFI variable data
    policy = MeasuredBootPolicy.from_dict({"secure_boot": True})
    check_measured_boot(data, {i: bytes(32) for i in range(10)}, policy)
    return log


def _event_log_seeds() -> list[bytes]:
    from node_agent.trial.eventlog import LegacyLogWriter, LogWriter, sample_log
    from verifier.protocol.mb import eventlog as ev
    from verifier.protocol.mb.replay import STARTUP_LOCALITY

    legacy = LegacyLogWriter().add(0, ev.EV_S_CRTM_VERSION, b"1\x00")
    legacy.add(0, ev.EV_SEPARATOR, bytes(4))
    legacy.add(ev.NOT_EXTENDED, ev.EV_EFI_ACTION, b"note")
    # H-CRTM start, events extended into no PCR, a Spec ID event outside
    # PCR 0 (issue 32, item 4)
    hcrtm = LogWriter().add(0, ev.EV_NO_ACTION, STARTUP_LOCALITY + b"\x04")
    hcrtm.add(0, ev.EV_EFI_HCRTM_EVENT, b"HCRTM")
    hcrtm.add(ev.NOT_EXTENDED, ev.EV_NO_ACTION, b"NvIndexInstance\x00")
    hcrtm.add(ev.NOT_EXTENDED, ev.EV_EFI_ACTION, b"note")
    hcrtm.add(0, ev.EV_SEPARATOR, bytes(4))
    ccel = LogWriter(("sha384",), spec_id_pcr=1).add(1, ev.EV_EFI_ACTION, b"x")
    return [
        sample_log(),
        sample_log(locality=None, banks=("sha256",)),
        legacy.build(),
        hcrtm.build(),
        ccel.build(),
    ]


def _efi_signature_list(data: bytes) -> object:
    from verifier.protocol.mb import efisig

    entries = efisig.parse_signature_lists(data, "event 1 (db)")
    return [entry.key for entry in entries]


def _efi_signature_list_seeds() -> list[bytes]:
    import uuid

    from trusted_testing.secureboot_log import cert_der
    from verifier.protocol.mb import efisig

    owner = uuid.UUID(int=7)
    certs = efisig.signature_list(efisig.EFI_CERT_X509, owner, [cert_der("fuzz")])
    hashes = efisig.signature_list(efisig.EFI_CERT_SHA256, owner, [b"\1" * 32] * 3)
    return [certs + hashes, hashes, b""]


def _ipl_string(data: bytes) -> object:
    """GRUB's and shim's EV_IPL strings, and shim's SbatLevel."""
    from verifier.protocol.mb.bootstrings import SbatLevel, ipl_string
    from verifier.protocol.mb.eventlog import EV_IPL, Event

    event = Event(3, 8, EV_IPL, {"sha256": hashlib.sha256(data).digest()}, data)
    text = ipl_string(event)
    text.matches_digest(event)
    try:
        level = SbatLevel.from_bytes(data, "event 3")
    except errors.MalformedError:
        return text
    return level.shortfalls(SbatLevel.from_text("sbat,1,2023012900\ngrub,3\n", "p"))


def _ipl_string_seeds() -> list[bytes]:
    return [
        b"grub_cmd: linux /boot/vmlinuz root=/dev/vda1 ro\0",
        b"kernel_cmdline: BOOT_IMAGE=/boot/vmlinuz ro quiet\0",
        b"/boot/initrd.img-6.1.0-18-amd64\0",
        b"sbat,1,2023012900\nshim,2\ngrub,3\ngrub.debian,4\n",
    ]


@functools.lru_cache(maxsize=1)
def _chain_policy() -> Any:
    from trusted_testing.secureboot_log import SecureBootBoot
    from verifier.protocol.mb import MeasuredBootPolicy

    return MeasuredBootPolicy.from_dict(SecureBootBoot().policy())


def _secure_boot_log(data: bytes) -> object:
    """A Secure Boot chain's log judged by a policy pinning all of it."""
    from verifier.protocol.mb import evaluate, parse

    return evaluate(_chain_policy(), parse(data).events)


def _secure_boot_log_seeds() -> list[bytes]:
    from trusted_testing.secureboot_log import SecureBootBoot

    return [SecureBootBoot().build(), SecureBootBoot(secure_boot=False).build()]


def _shim_image(data: bytes) -> object:
    """shim's built-in lists and SBAT levels read from a PE file."""
    from verifier.protocol.mb.shim import mok_digests, shim_builtins

    return mok_digests(shim_builtins(data))


def _shim_image_seeds() -> list[bytes]:
    from trusted_testing.secureboot_log import (
        cert_der,
        coff_image,
        sbat_section,
        vendor_cert_section,
    )

    level = sbat_section("sbat,1,2024010900\nshim,4\n", "sbat,1,2024040900\n")
    return [
        coff_image(
            [
                (b".text", b"\x90" * 16),
                (b".vendor_cert", vendor_cert_section(cert_der("fuzz"), b"")),
                (b".sbatlevel", level),
            ]
        )
    ]


# -- policies ----------------------------------------------------------------------


def _pcr_policy(data: bytes) -> object:
    from verifier.protocol import PcrPolicy

    return PcrPolicy.from_dict(_json(data), allow_empty=True).to_dict()


def _runtime_policy(data: bytes) -> object:
    from verifier.protocol.ima import RuntimePolicy

    return RuntimePolicy.from_dict(_json(data)).to_dict()


def _mb_policy(data: bytes) -> object:
    from verifier.protocol.mb import MeasuredBootPolicy

    return MeasuredBootPolicy.from_dict(_json(data))


def _sealing_policy(data: bytes) -> object:
    from verifier.protocol.abe.policy import parse_policy, satisfies

    text = data.decode("utf-8", "replace")
    tree = parse_policy(text)
    return satisfies(tree, ["region=eu", "hv=kvm"])


def _chain_document() -> dict[str, Any]:
    from trusted_testing.secureboot_log import SecureBootBoot

    return SecureBootBoot().policy()


def _policy_seeds() -> dict[str, list[bytes]]:
    digest = "sha256:" + "ab" * 32
    return {
        "pcr": [_dump({"pcrs": {"16": ["00" * 32], "7": ["11" * 32]}})],
        "runtime": [
            _dump(
                {
                    "name": "web",
                    "version": 3,
                    "digests": {"/usr/bin/true": [digest]},
                    "excludes": ["/tmp/.*"],
                    "ima_buf": {"kexec-cmdline": [digest]},
                }
            )
        ],
        "mb": [
            _dump({"secure_boot": True, "boot_applications": ["ab" * 32]}),
            _dump(_chain_document()),
        ],
        "sealing": [
            b"region=eu and (hv=kvm or hv=xen)",
            b"2 of (a=1, b=2, c=3)",
            b"tier >= 3 or level = gold",
        ],
    }


def _targets() -> dict[str, Target]:
    policy = _policy_seeds
    entries = [
        Target("tpm_attest", _tpm_attest, _tpm_seeds),
        Target("tpm_public", _tpm_public, _tpm_seeds),
        Target("tpm_signature", _tpm_signature, _tpm_seeds),
        Target("quote_answer", _quote_answer, _quote_seeds),
        Target("ima_ascii", _ima_ascii, _ima_seeds),
        Target("ima_binary", _ima_binary, _ima_seeds),
        Target("ima_evidence", _ima_evidence, _ima_evidence_seeds),
        Target("event_log", _event_log, _event_log_seeds),
        Target("efi_signature_list", _efi_signature_list, _efi_signature_list_seeds),
        Target("ipl_string", _ipl_string, _ipl_string_seeds),
        Target("secure_boot_log", _secure_boot_log, _secure_boot_log_seeds),
        Target("shim_image", _shim_image, _shim_image_seeds),
        Target("pcr_policy", _pcr_policy, lambda: policy()["pcr"]),
        Target("runtime_policy", _runtime_policy, lambda: policy()["runtime"]),
        Target("mb_policy", _mb_policy, lambda: policy()["mb"]),
        Target("sealing_policy", _sealing_policy, lambda: policy()["sealing"]),
        *wire_targets(),
        *translog_targets(),
        *hostbatch_targets(),
        *diskimage_targets(),
    ]
    return {t.name: t for t in entries}


#: Every target by name.
TARGETS: dict[str, Target] = _targets()
