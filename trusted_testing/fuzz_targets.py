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
import dataclasses
import functools
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from verifier.protocol import errors, jsonlimits

__all__ = ["TARGETS", "Target", "run_one"]

NODE = "3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10"
_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


@dataclasses.dataclass(frozen=True)
class Target:
    """One fuzz target.

    Attributes:
        name: its name on the command line.
        run: the entry point, given the fuzzer's bytes.
        seeds: valid (or nearly valid) inputs to start from.
    """

    name: str
    run: Callable[[bytes], object]
    seeds: Callable[[], Sequence[bytes]]


def run_one(target: Target, data: bytes) -> None:
    """Run ``target`` on ``data``; the project's errors are expected.

    Raises:
        Exception: anything but a :class:`ProtocolError` (a finding).
    """
    try:
        target.run(data)
    except errors.ProtocolError:
        pass


def _json(data: bytes) -> Any:
    return jsonlimits.loads(data)


def _dump(value: object) -> bytes:
    return json.dumps(value).encode()


# -- fixtures shared by the targets (built once per process) ----------------


@functools.lru_cache(maxsize=1)
def _node() -> Any:
    """A SoftTpm with its AK, an NK and a good quote answer to one request."""
    from trusted_testing.softtpm import SoftTpm
    from verifier.protocol import bind_nonce

    tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
    tpm.extend(16, hashlib.sha256(b"boot").digest())
    nk = x25519.X25519PrivateKey.generate()
    nk_public = nk.public_key().public_bytes(*_RAW)
    nonce = bytes(range(20))
    quote = tpm.quote(bind_nonce(nonce, nk_public), (16,))
    answer = {"quote": quote.to_dict(), "nk": base64.b64encode(nk_public).decode()}
    return tpm, nk, nk_public, nonce, answer


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
    return [_dump(answer), _dump({"quote": answer["quote"]}), b"{}"]


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
    from trusted_testing.ima import make_entry, to_ascii, to_binary

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
    from trusted_testing.eventlog import LegacyLogWriter, sample_log
    from verifier.protocol.mb import eventlog as ev

    legacy = LegacyLogWriter().add(0, ev.EV_S_CRTM_VERSION, b"1\x00")
    legacy.add(0, ev.EV_SEPARATOR, bytes(4))
    return [sample_log(), sample_log(locality=None, banks=("sha256",)), legacy.build()]


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
        "mb": [_dump({"secure_boot": True, "boot_applications": ["ab" * 32]})],
        "sealing": [
            b"region=eu and (hv=kvm or hv=xen)",
            b"2 of (a=1, b=2, c=3)",
            b"tier >= 3 or level = gold",
        ],
    }


# -- envelopes, events, capabilities, rekey messages ------------------------------


@functools.lru_cache(maxsize=1)
def _keys() -> Any:
    return os.urandom(32), x25519.X25519PrivateKey.generate()


def _envelope(data: bytes) -> object:
    from verifier.protocol import open_payload, open_share

    key, nk = _keys()
    if data[:1] == b"s":
        return open_share(nk, data[1:], "V", NODE)
    return open_payload(key, data[1:], NODE)


def _envelope_seeds() -> list[bytes]:
    from verifier.protocol import seal_payload, seal_share

    key, nk = _keys()
    return [
        b"p" + seal_payload(key, b"payload", NODE),
        b"s" + seal_share(nk.public_key().public_bytes(*_RAW), b"v" * 32, "V", NODE),
    ]


@functools.lru_cache(maxsize=1)
def _event_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def _signed_event(data: bytes) -> object:
    from verifier.protocol import SignedEvent

    return SignedEvent.from_dict(_json(data)).verify(_event_key().public_key())


def _event_seeds() -> list[bytes]:
    from verifier.protocol import RevocationEvent

    event = RevocationEvent(
        str(uuid.UUID(int=1)), NODE, "pcr_policy", "PCR 16", "2026-01-01T00:00:00Z"
    )
    return [_dump(event.sign(_event_key()).to_dict())]


def _capability(data: bytes) -> object:
    from verifier.protocol.capability import CapabilityChecker

    checker = CapabilityChecker(_keys()[0])
    return checker.check_token(data.decode("utf-8", "replace"), "secret:s", "r", 1.0)


def _capability_seeds() -> list[bytes]:
    from verifier.protocol.capability import NONCE_BYTES, issue

    cap = issue(_keys()[0], NODE, "secret:s", "r", 60, 0, bytes(NONCE_BYTES))
    return [cap.to_token().encode()]


def _rekey(data: bytes) -> object:
    from verifier.protocol.lkh import RekeyMessage, Welcome

    if data[:1] == b"w":
        return Welcome.from_dict(_json(data[1:]))
    return RekeyMessage.from_bytes(data[1:])


def _rekey_seeds() -> list[bytes]:
    from verifier.protocol.lkh import LkhTree

    tree = LkhTree("fuzz", _event_key(), degree=2)
    _, welcome = tree.join("a")
    message, _ = tree.join("b")
    return [b"w" + _dump(welcome.to_dict()), b"r" + message.to_bytes()]


# -- wire messages -----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _message_classes() -> list[Any]:
    from verifier.protocol.deepquote import DeepQuote
    from verifier.protocol.merkle import Header
    from verifier.protocol.messages import (
        abe,
        capabilities,
        enrolment,
        keyservice,
        monitor,
        policies,
        provider,
        registration,
        shares,
    )
    from verifier.protocol.messages import errors as error_body
    from verifier.protocol.messages import quote as quote_messages
    from verifier.protocol.monitor import MonitorAttestation

    modules = (
        abe,
        capabilities,
        enrolment,
        keyservice,
        monitor,
        policies,
        provider,
        registration,
        shares,
        error_body,
        quote_messages,
    )
    found = [DeepQuote, Header, MonitorAttestation]
    for module in modules:
        for name in sorted(vars(module)):
            value = getattr(module, name)
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and callable(getattr(value, "from_dict", None))
            ):
                found.append(value)
    return found


def _wire_message(data: bytes) -> object:
    """The first byte picks the message class, the rest is its JSON."""
    classes = _message_classes()
    if not data:
        return None
    cls = classes[data[0] % len(classes)]
    return cls.from_dict(_json(data[1:]))


def _message_seeds() -> list[bytes]:
    classes = _message_classes()
    return [bytes([i]) + b'{"a": 1}' for i in range(len(classes))]


def _user_data(data: bytes) -> object:
    """The agent's reading of cloud-init's files: user-data (MIME, maybe
    gzip) or, with a leading ``b``, the bootstrap file."""
    from verifier.protocol.userdata import BootstrapConfig, parse_user_data

    if data[:1] == b"b":
        return BootstrapConfig.from_json(data[1:])
    return parse_user_data(data[1:])


def _user_data_seeds() -> list[bytes]:
    config = {"boot_id": NODE, "registrar_url": "https://127.0.0.1:8891"}
    cloud = "#cloud-config\n" + json.dumps(
        {
            "write_files": [
                {
                    "path": "/etc/trusted-cloud/bootstrap.json",
                    "content": json.dumps(config),
                }
            ]
        }
    )
    mime = (
        'Content-Type: multipart/mixed; boundary="b"\nMIME-Version: 1.0\n\n'
        "--b\nContent-Type: text/cloud-config\n\n" + cloud + "\n--b--\n"
    )
    return [b"b" + _dump(config), b"u" + mime.encode()]


def _json_text(data: bytes) -> object:
    return jsonlimits.loads(data)


def _abe_blob(data: bytes) -> object:
    from verifier.protocol.abe.bsw07 import Ciphertext, PublicParams, SecretKey

    kind, body = data[:1], data[1:]
    if kind == b"c":
        return Ciphertext.from_bytes(body)
    if kind == b"k":
        return SecretKey.from_bytes(body)
    return PublicParams.from_bytes(body)


def _abe_seeds() -> list[bytes]:
    return [b"c" + bytes(64), b"k" + bytes(64), b"p" + bytes(64)]


def _ek_anchors(data: bytes) -> object:
    from verifier.protocol.ekcert import load_anchors

    return load_anchors(data)


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
        Target("pcr_policy", _pcr_policy, lambda: policy()["pcr"]),
        Target("runtime_policy", _runtime_policy, lambda: policy()["runtime"]),
        Target("mb_policy", _mb_policy, lambda: policy()["mb"]),
        Target("sealing_policy", _sealing_policy, lambda: policy()["sealing"]),
        Target("envelope", _envelope, _envelope_seeds),
        Target("signed_event", _signed_event, _event_seeds),
        Target("capability", _capability, _capability_seeds),
        Target("rekey", _rekey, _rekey_seeds),
        Target("wire_message", _wire_message, _message_seeds),
        Target("user_data", _user_data, _user_data_seeds),
        Target("json", _json_text, lambda: [b'{"a": [1, 2.5, "x", null]}']),
        Target("abe_blob", _abe_blob, _abe_seeds),
        Target("ek_anchors", _ek_anchors, lambda: [b"-----BEGIN CERTIFICATE-----\n"]),
    ]
    return {t.name: t for t in entries}


#: Every target by name.
TARGETS: dict[str, Target] = _targets()
