"""The customer's side of monitor attestation: is the verifier healthy?

Trusting the verifier's AK happens once, like the registrar trusts a node's
AK: :func:`trust_monitor_ak` checks the verifier host's EK certificate
against the TPM vendor's CA, then makes a TPM2_MakeCredential challenge for
that EK and the offered AK's Name; only the TPM holding both can answer it.
The AK that passes is pinned (a file the customer keeps). Afterwards
:func:`monitor_attest` sends a fresh nonce and checks the batched quote
against the pinned AK and the PCR values the customer expects of the
verifier host (:func:`verifier.protocol.monitor.verify_monitor_attestation`).
"""

from __future__ import annotations

import datetime
import hmac
import os

from nova_plugin.exceptions import AttestationFailedError
from nova_plugin.tenant import Tenant
from verifier.protocol import (
    AttestationKey,
    EvidenceError,
    MalformedError,
    PcrPolicy,
    TpmPublic,
    check_ak_template,
    make_credential,
)
from verifier.protocol.ekcert import check_ek_certificate, load_anchors
from verifier.protocol.messages.monitor import MonitorIdentity
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
)
from verifier.protocol.monitor import (
    MonitorAttestation,
    MonitorVerdict,
    verify_monitor_attestation,
)

__all__ = ["load_pinned_ak", "monitor_attest", "trust_monitor_ak"]


async def trust_monitor_ak(tenant: Tenant, ek_ca_pem: bytes) -> bytes:
    """Prove the verifier's AK lives in a genuine TPM; return it to pin.

    Args:
        tenant: the connection to the verifier.
        ek_ca_pem: the TPM vendor CA bundle the host's EK certificate must
            chain to.

    Returns:
        The AK's TPM2B_PUBLIC (what :func:`load_pinned_ak` reads back).

    Raises:
        AttestationFailedError: no or a bad EK certificate, an AK that is
            not a restricted TPM key, or a failed activation.
        ServiceError: the verifier is unreachable or refused.
    """
    data = await tenant.request("GET", tenant.verifier_url + "/v1/monitor/ak")
    try:
        identity = MonitorIdentity.from_dict(data)
    except MalformedError as exc:
        raise AttestationFailedError(f"the verifier's TPM identity is bad: {exc}")
    if not identity.ek_certificate:
        raise AttestationFailedError("the verifier host has no EK certificate")
    ak, ek = identity.ak_public, identity.ek_public
    try:
        AttestationKey(ak, True)  # validates the key
        check_ak_template(ak)
        check_ek_certificate(
            identity.ek_certificate,
            ek,
            load_anchors(ek_ca_pem),
            datetime.datetime.now(datetime.UTC),
        )
        secret = os.urandom(32)
        challenge = make_credential(ek, ak.name, secret)
    except (EvidenceError, MalformedError, ValueError) as exc:
        raise AttestationFailedError(f"the verifier's TPM identity is bad: {exc}")
    body = ActivationChallenge(challenge.credential_blob, challenge.encrypted_secret)
    answer = await tenant.request(
        "POST", tenant.verifier_url + "/v1/monitor/activate", body.to_dict()
    )
    try:
        credential = ActivationProof.from_dict(answer).credential
    except MalformedError as exc:
        raise AttestationFailedError(f"the verifier's activation answer: {exc}")
    if not hmac.compare_digest(credential, secret):
        raise AttestationFailedError(
            "the verifier's TPM could not activate the credential: its AK and "
            "EK are not in the same TPM"
        )
    return ak.to_bytes()


def load_pinned_ak(ak_public: bytes) -> AttestationKey:
    """The pinned AK (TPM2B_PUBLIC bytes) as a trusted key.

    Raises:
        MalformedError: not a TPM2B_PUBLIC.
    """
    return AttestationKey(TpmPublic.from_bytes(ak_public), activated=True)


async def monitor_attest(
    tenant: Tenant,
    ak: AttestationKey,
    policy: PcrPolicy,
    nonce: bytes | None = None,
) -> MonitorVerdict:
    """Ask the verifier to prove its integrity now.

    Args:
        tenant: the connection to the verifier.
        ak: the pinned verifier AK.
        policy: the PCR values accepted for the verifier host.
        nonce: fresh bytes (default: 32 random bytes).

    Raises:
        AttestationFailedError: the reply does not verify (the reason names
            the check: ``nonce_not_in_batch``, ``signature_invalid``,
            ``pcr_policy``, ...).
        ServiceError: the verifier is unreachable or refused.
    """
    nonce = os.urandom(32) if nonce is None else nonce
    data = await tenant.request(
        "GET", f"{tenant.verifier_url}/v1/monitor/attest?nonce={nonce.hex()}"
    )
    try:
        reply = MonitorAttestation.from_dict(data)
        return verify_monitor_attestation(reply, nonce=nonce, ak=ak, policy=policy)
    except (EvidenceError, MalformedError) as exc:
        raise AttestationFailedError(f"the verifier failed monitor attestation: {exc}")
