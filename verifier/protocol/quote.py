"""Quote verification (TPM 2.0 Part 3, 18.4 TPM2_Quote).

:func:`verify_quote` is the single place where a quote becomes trusted. It
checks, in order: the attestation key was activated; the signature over
TPMS_ATTEST with that key; the magic and type; the qualifying data (the
verifier's fresh nonce bound to any data the node must commit to); the
reported PCR values against the signed pcrDigest; the PCR policy; and the
monotonicity of the TPM clock against the last accepted quote of that node.
It is pure: no clock, no I/O, no configuration.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import (
    Prehashed,
    encode_dss_signature,
)

from verifier.protocol import _marshal as m
from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.tpm import (
    ALG_ECDSA,
    ALG_NULL,
    ALG_RSA,
    ALG_RSAPSS,
    ALG_RSASSA,
    ALG_SHA1,
    ALG_SHA256,
    ATTR_DECRYPT,
    ATTR_FIXED_PARENT,
    ATTR_FIXED_TPM,
    ATTR_RESTRICTED,
    ATTR_SIGN,
    TPM_GENERATED_VALUE,
    ClockInfo,
    PcrSelection,
    TpmAttest,
    TpmPublic,
    TpmSignature,
    pcr_banks_digest,
)

__all__ = [
    "EXTRA_BANKS",
    "AttestationKey",
    "ClockState",
    "Quote",
    "QuoteVerdict",
    "bind_nonce",
    "check_ak_template",
    "verify_quote",
]

_BIND_LABEL = b"trusted-cloud quote v1\x00"
#: The banks a quote may cover besides sha256, by name: sha1, for legacy
#: SHA-1 event logs and sha1 IMA boot aggregates (issue 32).
EXTRA_BANKS = {"sha1": ALG_SHA1}
_ACCEPTED_HASHES = {ALG_SHA256: hashes.SHA256}
_ECDSA_PREHASHED = ec.ECDSA(Prehashed(hashes.SHA256()))
_AK_ATTRS = ATTR_FIXED_TPM | ATTR_FIXED_PARENT | ATTR_RESTRICTED | ATTR_SIGN


def bind_nonce(nonce: bytes, *bound: bytes) -> bytes:
    """Qualifying data for a quote: the nonce bound to ``bound`` items.

    The node commits, inside the signed quote, to the exact data it hands
    over alongside (e.g. its share-transport key, its CSR).

    Returns:
        32 bytes: SHA-256(label || len(nonce) || nonce || SHA-256(item)...).
    """
    h = hashlib.sha256(_BIND_LABEL)
    h.update(m.u16(len(nonce)) + nonce)
    for item in bound:
        h.update(hashlib.sha256(item).digest())
    return h.digest()


def check_ak_template(ak: TpmPublic) -> None:
    """Require that ``ak`` is a TPM-resident restricted signing key.

    ``noDA`` is accepted and not required: it only spares the node's own
    availability (a TPM in dictionary-attack lockout still quotes with it),
    and AKs registered before the agent set it stay valid.

    Args:
        ak: the AK's public area.

    Raises:
        EvidenceError: ``ak_template`` if it could sign arbitrary data or
            leave the TPM.
    """
    _check_ak_attributes(ak.attributes)


def _check_ak_attributes(attributes: int) -> None:
    if attributes & _AK_ATTRS != _AK_ATTRS or attributes & ATTR_DECRYPT:
        raise EvidenceError(
            "ak_template",
            "attestation key must be fixedTPM, fixedParent, restricted, sign-only",
        )


class AttestationKey:
    """An AK as the registrar vouches for it.

    Compact on purpose (a verifier holds one per node): it keeps the key's
    TPMT_PUBLIC bytes, attributes, scheme and public point or modulus, and
    builds the ``cryptography`` key object for each verification (~7 us)
    rather than holding one (~2 KB of OpenSSL state per node).

    Args:
        public: the AK's TPMT_PUBLIC.
        activated: whether the TPM holding the EK proved it holds this AK
            (TPM2_ActivateCredential). Only activated keys are trusted.
    """

    __slots__ = (
        "_curve",
        "_exponent",
        "_material",
        "_raw",
        "activated",
        "attributes",
        "scheme",
    )

    def __init__(self, public: TpmPublic, activated: bool) -> None:
        self._raw = public.raw
        self.activated = activated
        self.attributes = public.attributes
        self.scheme = public.scheme[0]
        if public.type == ALG_RSA:
            self._curve: type[ec.EllipticCurve] | None = None
            self._material = public.unique[0]
            self._exponent = public.rsa_exponent
        else:
            point = public.public_key()  # validates the point
            assert isinstance(point, ec.EllipticCurvePublicKey)
            self._curve = type(point.curve)
            self._material = b"\x04" + public.unique[0] + public.unique[1]
            self._exponent = 0

    @property
    def public(self) -> TpmPublic:
        return TpmPublic.from_tpmt(self._raw)

    @property
    def key(self) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
        """A fresh ``cryptography`` key object for this AK."""
        if self._curve is None:
            n = int.from_bytes(self._material, "big")
            return rsa.RSAPublicNumbers(self._exponent, n).public_key()
        return ec.EllipticCurvePublicKey.from_encoded_point(
            self._curve(), self._material
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, AttestationKey)
            and self._raw == other._raw
            and self.activated == other.activated
        )

    def __hash__(self) -> int:
        return hash((self._raw, self.activated))

    def __repr__(self) -> str:
        return (
            f"AttestationKey(name={self.public.name.hex()}, activated={self.activated})"
        )


@dataclasses.dataclass(frozen=True, order=True)
class ClockState:
    """The TPM clock as of the last accepted quote of a node."""

    reset_count: int
    restart_count: int
    clock: int

    @classmethod
    def from_info(cls, info: ClockInfo) -> ClockState:
        return cls(info.reset_count, info.restart_count, info.clock)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> ClockState:
        return cls(
            int(data["reset_count"]), int(data["restart_count"]), int(data["clock"])
        )


def _b64(field: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise MalformedError("quote", f"'{field}' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedError("quote", f"'{field}' is not valid base64")


@dataclasses.dataclass(frozen=True)
class Quote:
    """A quote as a node hands it over: attest, signature, PCR values.

    The wire form carries the sha256 values as ``pcrs`` and the values of
    any other bank quoted (:data:`EXTRA_BANKS`) under ``banks``, only when
    there are some: a verifier that knows no ``banks`` never asks for them
    and reads the answer as before.

    Attributes:
        attest: the TPMS_ATTEST bytes the signature covers.
        signature: the marshalled TPMT_SIGNATURE.
        pcr_values: sha256-bank values the node claims for the quoted PCRs.
        bank_values: bank name (``sha1``) -> values of that bank's quoted
            PCRs, for a quote over more banks than sha256.
    """

    attest: bytes
    signature: bytes
    pcr_values: Mapping[int, bytes]
    bank_values: Mapping[str, Mapping[int, bytes]] = dataclasses.field(
        default_factory=dict
    )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "attest": base64.b64encode(self.attest).decode(),
            "signature": base64.b64encode(self.signature).decode(),
            "pcrs": _hex_pcrs(self.pcr_values),
        }
        if self.bank_values:
            out["banks"] = {
                bank: _hex_pcrs(values) for bank, values in self.bank_values.items()
            }
        return out

    @classmethod
    def from_dict(cls, data: object) -> Quote:
        """Parse the JSON form.

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError("quote", "must be an object")
        values = _parse_pcrs("pcrs", data.get("pcrs", {}))
        banks = data.get("banks", {})
        if not isinstance(banks, Mapping):
            raise MalformedError("quote", "'banks' must be an object")
        extra = {}
        for bank, pcrs in banks.items():
            if bank not in EXTRA_BANKS:
                raise MalformedError(
                    "quote", f"'banks': {bank!r} is not one of {sorted(EXTRA_BANKS)}"
                )
            extra[bank] = _parse_pcrs(f"banks.{bank}", pcrs)
        attest = _b64("attest", data.get("attest"))
        signature = _b64("signature", data.get("signature"))
        if len(attest) > 4096 or len(signature) > 1024:
            raise MalformedError("quote", "attest or signature too large")
        return cls(attest, signature, values, extra)


def _hex_pcrs(values: Mapping[int, bytes]) -> dict[str, str]:
    return {str(i): v.hex() for i, v in sorted(values.items())}


def _parse_pcrs(field: str, pcrs: object) -> dict[int, bytes]:
    if not isinstance(pcrs, Mapping) or len(pcrs) > 24:
        raise MalformedError("quote", f"'{field}' must be an object of at most 24")
    values = {}
    for key, text in pcrs.items():
        try:
            values[int(key)] = bytes.fromhex(text)
        except (TypeError, ValueError):
            raise MalformedError(
                "quote", f"'{field}': PCR {key!r}: not an index and hex value"
            )
    return values


@dataclasses.dataclass(frozen=True)
class QuoteVerdict:
    """The result of a successful :func:`verify_quote` (failures raise)."""

    attest: TpmAttest
    clock: ClockState
    pcr_values: Mapping[int, bytes]
    #: bank name -> verified values of the other banks quoted (sha1).
    bank_values: Mapping[str, Mapping[int, bytes]] = dataclasses.field(
        default_factory=dict
    )

    def __bool__(self) -> bool:
        return True


def _verify_signature(key: AttestationKey, sig: TpmSignature, data: bytes) -> None:
    hash_cls = _ACCEPTED_HASHES.get(sig.hash_alg)
    if hash_cls is None:
        raise EvidenceError("signature_hash", f"hash 0x{sig.hash_alg:04x} not accepted")
    pub = key.key
    ak_scheme = key.scheme
    if ak_scheme != ALG_NULL and sig.sig_alg != ak_scheme:
        raise EvidenceError("signature_scheme", "scheme does not match the AK")
    try:
        if sig.sig_alg == ALG_ECDSA and isinstance(pub, ec.EllipticCurvePublicKey):
            der = encode_dss_signature(
                int.from_bytes(sig.r, "big"), int.from_bytes(sig.s, "big")
            )
            digest = hashlib.sha256(data).digest()
            pub.verify(der, digest, _ECDSA_PREHASHED)
        elif sig.sig_alg == ALG_RSASSA and isinstance(pub, rsa.RSAPublicKey):
            pub.verify(sig.sig, data, padding.PKCS1v15(), hash_cls())
        elif sig.sig_alg == ALG_RSAPSS and isinstance(pub, rsa.RSAPublicKey):
            pss = padding.PSS(padding.MGF1(hash_cls()), padding.PSS.AUTO)
            pub.verify(sig.sig, data, pss, hash_cls())
        else:
            raise EvidenceError("signature_scheme", "scheme does not match the AK")
    except InvalidSignature:
        raise EvidenceError(
            "signature_invalid", "quote is not signed by the node's attestation key"
        )


def _check_clock(info: ClockInfo, previous: ClockState | None) -> None:
    """Refuse a quote from an older TPM state than the last accepted one.

    TPM 2.0 Part 1, Clock and Time: ``resetCount`` goes up at each TPM Reset
    (a reboot) and ``restartCount`` at each TPM Restart or Resume within one
    reset. Clock is only saved to NV now and then, so after a stop without
    an orderly shutdown it comes back from the last saved value: lower than
    what the TPM reported before, whatever ``safe`` says by the time the
    verifier sees the next quote. A lower Clock is therefore honest after a
    reset or restart, and an attack only within the same reset and restart;
    counts going backwards are always a replayed older state.

    Args:
        info: the clock information of the quote being verified.
        previous: the clock of the node's last accepted quote, if any.

    Raises:
        EvidenceError: ``clock_rollback`` for an older state.
    """
    if previous is None:
        return
    if info.reset_count < previous.reset_count or (
        info.reset_count == previous.reset_count
        and info.restart_count < previous.restart_count
    ):
        raise EvidenceError("clock_rollback", "TPM reset/restart count went backwards")
    same_run = (info.reset_count, info.restart_count) == (
        previous.reset_count,
        previous.restart_count,
    )
    if same_run and info.clock < previous.clock:
        raise EvidenceError(
            "clock_rollback",
            f"TPM clock {info.clock} is before the last accepted {previous.clock}",
        )


def _check_pcrs(
    attest: TpmAttest, quote: Quote, policy: PcrPolicy
) -> tuple[dict[int, bytes], dict[str, dict[int, bytes]]]:
    selection = attest.pcr_select
    algs = [bank.hash_alg for bank in selection]
    extra_algs = {alg: name for name, alg in EXTRA_BANKS.items()}
    if (
        algs.count(policy.hash_alg) != 1
        or len(set(algs)) != len(algs)
        or any(a != policy.hash_alg and a not in extra_algs for a in algs)
    ):
        raise EvidenceError(
            "pcr_selection",
            "quote must select the sha256 bank once, and at most the sha1 bank besides",
        )
    quoted = next(b.pcrs for b in selection if b.hash_alg == policy.hash_alg)
    missing = set(policy.pcrs) - set(quoted)
    if missing:
        raise EvidenceError(
            "pcr_selection", f"policy PCRs {sorted(missing)} not quoted"
        )
    by_alg: dict[int, Mapping[int, bytes]] = {policy.hash_alg: quote.pcr_values}
    for name, values in quote.bank_values.items():
        by_alg[EXTRA_BANKS[name]] = values
    try:
        digest = pcr_banks_digest(selection, by_alg)
    except MalformedError as exc:
        raise EvidenceError("pcr_values", exc.detail)
    if not hmac.compare_digest(digest, attest.pcr_digest):
        raise EvidenceError(
            "pcr_digest_mismatch", "reported PCR values do not match the signed digest"
        )
    values = {i: quote.pcr_values[i] for i in quoted}
    bad = policy.mismatches(values)
    if bad:
        shown = ", ".join(
            f"PCR {i} = {values[i].hex()}" if i in values else f"PCR {i} missing"
            for i in bad[:4]
        )
        raise EvidenceError(
            "pcr_policy", f"the node reported {shown}: not allowed by the policy"
        )
    extra = {
        extra_algs[bank.hash_alg]: {i: by_alg[bank.hash_alg][i] for i in bank.pcrs}
        for bank in selection
        if bank.hash_alg != policy.hash_alg
    }
    return values, extra


def verify_quote(
    quote: Quote,
    *,
    ak: AttestationKey,
    qualifying_data: bytes,
    policy: PcrPolicy,
    previous_clock: ClockState | None = None,
) -> QuoteVerdict:
    """Verify a TPM 2.0 quote completely.

    Args:
        quote: what the node returned.
        ak: the node's attestation key as vouched for by the registrar.
        qualifying_data: what the quote must carry in extraData, normally
            :func:`bind_nonce` of the fresh nonce.
        policy: the allowed PCR values.
        previous_clock: the clock of the node's last accepted quote.

    Returns:
        A :class:`QuoteVerdict` with the new clock state to store.

    Raises:
        EvidenceError: with ``reason`` naming the failed check.
        MalformedError: if the attest or signature does not parse.
    """
    if not ak.activated:
        raise EvidenceError("ak_not_activated", "attestation key was never activated")
    _check_ak_attributes(ak.attributes)
    signature = TpmSignature.from_bytes(quote.signature)
    _verify_signature(ak, signature, quote.attest)
    attest = TpmAttest.from_bytes(quote.attest)
    if attest.magic != TPM_GENERATED_VALUE:
        raise EvidenceError("magic", "attest was not generated by a TPM")
    if not hmac.compare_digest(attest.extra_data, qualifying_data):
        raise EvidenceError(
            "nonce_mismatch", "quote does not carry this request's nonce"
        )
    values, extra = _check_pcrs(attest, quote, policy)
    _check_clock(attest.clock_info, previous_clock)
    return QuoteVerdict(attest, ClockState.from_info(attest.clock_info), values, extra)


def selection_for(
    pcrs: tuple[int, ...], banks: tuple[str, ...] = ("sha256",)
) -> tuple[PcrSelection, ...]:
    """The selection of ``pcrs`` in the sha256 bank and, in order, the
    other ``banks`` named (:data:`EXTRA_BANKS`)."""
    indexes = tuple(sorted(set(pcrs)))
    out = [PcrSelection(ALG_SHA256, indexes)]
    out += [PcrSelection(EXTRA_BANKS[b], indexes) for b in banks if b != "sha256"]
    return tuple(out)
