"""TPM 2.0 structures for quotes and credential activation.

Implements the parts of TPM 2.0 Library Part 2 (Structures) that a verifier
needs: TPML_PCR_SELECTION (10.9.7), TPMS_CLOCK_INFO (10.11.1),
TPMS_QUOTE_INFO (10.12.4), TPMS_ATTEST (10.12.12), TPMT_SIGNATURE (11.3.4)
and TPMT_PUBLIC / TPM2B_PUBLIC (12.2.4-12.2.5) for RSA and ECC keys, with
the object Name (Part 1, 16) and conversion to a ``cryptography`` key.

Every class parses with ``from_bytes`` (validating, rejecting trailing
bytes), serialises with ``to_bytes`` and compares by value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Iterable, Mapping

from cryptography.hazmat.primitives.asymmetric import ec, rsa

from verifier.protocol import _marshal as m
from verifier.protocol.errors import MalformedError

__all__ = [
    "ALG_ECDSA",
    "ALG_NULL",
    "ALG_RSA",
    "ALG_ECC",
    "ALG_RSASSA",
    "ALG_RSAPSS",
    "ALG_SHA1",
    "ALG_SHA256",
    "ALG_SHA384",
    "ALG_SHA512",
    "ATTR_DECRYPT",
    "ATTR_FIXED_PARENT",
    "ATTR_FIXED_TPM",
    "ATTR_NO_DA",
    "ATTR_RESTRICTED",
    "ATTR_SENSITIVE_DATA_ORIGIN",
    "ATTR_SIGN",
    "ClockInfo",
    "PcrSelection",
    "ST_ATTEST_QUOTE",
    "TPM_GENERATED_VALUE",
    "TpmAttest",
    "TpmPublic",
    "TpmSignature",
    "hash_for_alg",
    "pcr_banks_digest",
    "pcr_digest",
]

TPM_GENERATED_VALUE = 0xFF544347
ST_ATTEST_QUOTE = 0x8018

ALG_RSA = 0x0001
ALG_SHA1 = 0x0004
ALG_AES = 0x0006
ALG_SHA256 = 0x000B
ALG_SHA384 = 0x000C
ALG_SHA512 = 0x000D
ALG_NULL = 0x0010
ALG_RSASSA = 0x0014
ALG_RSAES = 0x0015
ALG_RSAPSS = 0x0016
ALG_OAEP = 0x0017
ALG_ECDSA = 0x0018
ALG_ECDH = 0x0019
ALG_ECDAA = 0x001A
ALG_ECSCHNORR = 0x001C
ALG_ECC = 0x0023
ALG_CFB = 0x0043

ECC_NIST_P256 = 0x0003
ECC_NIST_P384 = 0x0004

ATTR_FIXED_TPM = 1 << 1
ATTR_FIXED_PARENT = 1 << 4
ATTR_SENSITIVE_DATA_ORIGIN = 1 << 5
ATTR_USER_WITH_AUTH = 1 << 6
ATTR_ADMIN_WITH_POLICY = 1 << 7
ATTR_NO_DA = 1 << 10
ATTR_RESTRICTED = 1 << 16
ATTR_DECRYPT = 1 << 17
ATTR_SIGN = 1 << 18

_HASHES = {
    ALG_SHA1: "sha1",
    ALG_SHA256: "sha256",
    ALG_SHA384: "sha384",
    ALG_SHA512: "sha512",
}
_CURVES: dict[int, type[ec.EllipticCurve]] = {
    ECC_NIST_P256: ec.SECP256R1,
    ECC_NIST_P384: ec.SECP384R1,
}
_CURVE_IDS = {"secp256r1": ECC_NIST_P256, "secp384r1": ECC_NIST_P384}
_MAX_PCR = 24
_HEAD = struct.Struct(">IHH")
_U16 = struct.Struct(">H")
_CLOCK = struct.Struct(">QIIBQ")


def hash_for_alg(alg: int) -> str:
    """Return the hashlib name of a TPM hash algorithm.

    Raises:
        MalformedError: for an algorithm we do not support.
    """
    try:
        return _HASHES[alg]
    except KeyError:
        raise MalformedError("TPMI_ALG_HASH", f"unsupported hash 0x{alg:04x}")


def pcr_digest(hash_alg: int, values: Iterable[bytes]) -> bytes:
    """Digest of concatenated PCR values, as TPM2_Quote computes pcrDigest."""
    h = hashlib.new(hash_for_alg(hash_alg))
    for value in values:
        h.update(value)
    return h.digest()


@dataclasses.dataclass(frozen=True)
class PcrSelection:
    """One bank of a TPML_PCR_SELECTION: a hash and a set of PCR indices."""

    hash_alg: int
    pcrs: tuple[int, ...]

    def __post_init__(self) -> None:
        hash_for_alg(self.hash_alg)
        if list(self.pcrs) != sorted(set(self.pcrs)):
            raise MalformedError("TPMS_PCR_SELECTION", "PCRs not sorted and unique")
        if any(not 0 <= p < _MAX_PCR for p in self.pcrs):
            raise MalformedError("TPMS_PCR_SELECTION", "PCR index out of range")

    @classmethod
    def read_list(cls, r: m.Reader) -> tuple[PcrSelection, ...]:
        count = r.u32()
        if count > 16:
            raise MalformedError(r.structure, f"{count} PCR banks")
        out = []
        for _ in range(count):
            alg = r.u16()
            size = r.u8()
            if not 3 <= size <= 4:
                raise MalformedError(r.structure, f"sizeofSelect {size}")
            bitmap = r.raw(size)
            pcrs = tuple(
                i * 8 + b
                for i, byte in enumerate(bitmap)
                for b in range(8)
                if byte >> b & 1
            )
            out.append(cls(alg, pcrs))
        return tuple(out)

    @staticmethod
    def list_to_bytes(selections: Iterable[PcrSelection]) -> bytes:
        selections = tuple(selections)
        out = [m.u32(len(selections))]
        for sel in selections:
            bitmap = bytearray(3)
            for p in sel.pcrs:
                bitmap[p // 8] |= 1 << (p % 8)
            out.append(m.u16(sel.hash_alg) + bytes([3]) + bytes(bitmap))
        return b"".join(out)


@dataclasses.dataclass(frozen=True)
class ClockInfo:
    """TPMS_CLOCK_INFO: the TPM's clock and its reset and restart counts."""

    clock: int
    reset_count: int
    restart_count: int
    safe: bool

    def to_bytes(self) -> bytes:
        return (
            m.u64(self.clock)
            + m.u32(self.reset_count)
            + m.u32(self.restart_count)
            + bytes([1 if self.safe else 0])
        )


@dataclasses.dataclass(frozen=True)
class TpmAttest:
    """TPMS_ATTEST carrying a TPMS_QUOTE_INFO (the signed body of a quote)."""

    magic: int
    type: int
    qualified_signer: bytes
    extra_data: bytes
    clock_info: ClockInfo
    firmware_version: int
    pcr_select: tuple[PcrSelection, ...]
    pcr_digest: bytes

    @classmethod
    def from_bytes(cls, data: bytes) -> TpmAttest:
        """Parse a TPMS_ATTEST of type quote.

        This is on every quote's path, so it unpacks with precompiled
        structs and checks each length once instead of walking a reader.

        Raises:
            MalformedError: if the bytes are not a TPMS_ATTEST of a quote.
        """
        if not isinstance(data, bytes):
            raise MalformedError("TPMS_ATTEST", "expected bytes")
        try:
            magic, st, size = _HEAD.unpack_from(data, 0)
            if st != ST_ATTEST_QUOTE:
                raise MalformedError("TPMS_ATTEST", f"type 0x{st:04x} is not a quote")
            pos = 8 + size
            signer = data[8:pos]
            (size,) = _U16.unpack_from(data, pos)
            extra = data[pos + 2 : pos + 2 + size]
            pos += 2 + size
            if len(signer) > 68 or len(extra) > 66:
                raise MalformedError("TPMS_ATTEST", "name or extraData too long")
            clock, resets, restarts, safe, firmware = _CLOCK.unpack_from(data, pos)
            pos += _CLOCK.size
        except struct.error:
            raise MalformedError("TPMS_ATTEST", "truncated")
        r = m.Reader(data[pos:], "TPMS_ATTEST")
        selection = PcrSelection.read_list(r)
        digest = r.tpm2b(64)
        r.end()
        info = ClockInfo(clock, resets, restarts, safe != 0)
        return cls(magic, st, signer, extra, info, firmware, selection, digest)

    def to_bytes(self) -> bytes:
        return b"".join(
            (
                m.u32(self.magic),
                m.u16(self.type),
                m.tpm2b(self.qualified_signer),
                m.tpm2b(self.extra_data),
                self.clock_info.to_bytes(),
                m.u64(self.firmware_version),
                PcrSelection.list_to_bytes(self.pcr_select),
                m.tpm2b(self.pcr_digest),
            )
        )


@dataclasses.dataclass(frozen=True)
class TpmSignature:
    """TPMT_SIGNATURE for RSASSA, RSAPSS or ECDSA.

    For RSA schemes ``sig`` holds the signature and ``r``/``s`` are empty;
    for ECDSA ``r`` and ``s`` hold the big-endian integers.
    """

    sig_alg: int
    hash_alg: int
    sig: bytes = b""
    r: bytes = b""
    s: bytes = b""

    @classmethod
    def from_bytes(cls, data: bytes) -> TpmSignature:
        """Parse a marshalled TPMT_SIGNATURE.

        Raises:
            MalformedError: on a scheme other than RSASSA, RSAPSS, ECDSA.
        """
        rd = m.Reader(data, "TPMT_SIGNATURE")
        alg = rd.u16()
        if alg in (ALG_RSASSA, ALG_RSAPSS):
            out = cls(alg, rd.u16(), sig=rd.tpm2b(512))
        elif alg == ALG_ECDSA:
            out = cls(alg, rd.u16(), r=rd.tpm2b(66), s=rd.tpm2b(66))
        else:
            raise MalformedError("TPMT_SIGNATURE", f"unsupported scheme 0x{alg:04x}")
        rd.end()
        hash_for_alg(out.hash_alg)
        return out

    def to_bytes(self) -> bytes:
        head = m.u16(self.sig_alg) + m.u16(self.hash_alg)
        if self.sig_alg == ALG_ECDSA:
            return head + m.tpm2b(self.r) + m.tpm2b(self.s)
        return head + m.tpm2b(self.sig)


def _read_scheme(r: m.Reader) -> tuple[int, int]:
    scheme = r.u16()
    if scheme in (ALG_NULL, ALG_RSAES):  # no hash follows these schemes
        return scheme, ALG_NULL
    hash_alg = r.u16()
    if scheme == ALG_ECDAA:
        r.u16()  # count
    return scheme, hash_alg


def _read_symmetric(r: m.Reader) -> tuple[int, int, int]:
    alg = r.u16()
    if alg == ALG_NULL:
        return alg, 0, ALG_NULL
    return alg, r.u16(), r.u16()


@dataclasses.dataclass(frozen=True)
class TpmPublic:
    """TPMT_PUBLIC of an RSA or ECC key, kept with its exact encoding.

    ``raw`` is the marshalled TPMT_PUBLIC (no size prefix); the Name and the
    ``cryptography`` key are derived from it, so two keys compare equal
    exactly when their encodings do.
    """

    raw: bytes
    type: int
    name_alg: int
    attributes: int
    auth_policy: bytes
    symmetric: tuple[int, int, int]
    scheme: tuple[int, int]
    rsa_bits: int = 0
    rsa_exponent: int = 0
    curve: int = 0
    kdf: tuple[int, int] = (ALG_NULL, ALG_NULL)
    unique: tuple[bytes, ...] = ()

    @classmethod
    def from_bytes(cls, data: bytes) -> TpmPublic:
        """Parse a marshalled TPM2B_PUBLIC (with its 2-byte size prefix).

        Raises:
            MalformedError: for a malformed structure or an unsupported type.
        """
        outer = m.Reader(data, "TPM2B_PUBLIC")
        inner = outer.tpm2b(1024)
        outer.end()
        return cls.from_tpmt(inner)

    @classmethod
    def from_tpmt(cls, raw: bytes) -> TpmPublic:
        """Parse a marshalled TPMT_PUBLIC (no size prefix)."""
        r = m.Reader(raw, "TPMT_PUBLIC")
        kind, name_alg, attrs = r.u16(), r.u16(), r.u32()
        policy = r.tpm2b(64)
        hash_for_alg(name_alg)
        sym = _read_symmetric(r)
        scheme = _read_scheme(r)
        if kind == ALG_RSA:
            bits, exponent = r.u16(), r.u32()
            out = cls(
                raw,
                kind,
                name_alg,
                attrs,
                policy,
                sym,
                scheme,
                rsa_bits=bits,
                rsa_exponent=exponent or 65537,
                unique=(r.tpm2b(512),),
            )
            if len(out.unique[0]) * 8 != bits:
                raise MalformedError("TPMT_PUBLIC", "RSA modulus size != keyBits")
        elif kind == ALG_ECC:
            curve = r.u16()
            kdf = _read_scheme(r)
            x, y = r.tpm2b(66), r.tpm2b(66)
            if curve not in _CURVES:
                raise MalformedError("TPMT_PUBLIC", f"unsupported curve 0x{curve:04x}")
            out = cls(
                raw,
                kind,
                name_alg,
                attrs,
                policy,
                sym,
                scheme,
                curve=curve,
                kdf=kdf,
                unique=(x, y),
            )
        else:
            raise MalformedError("TPMT_PUBLIC", f"unsupported key type 0x{kind:04x}")
        r.end()
        return out

    def to_bytes(self) -> bytes:
        """Marshal as TPM2B_PUBLIC."""
        return m.tpm2b(self.raw)

    @property
    def name(self) -> bytes:
        """The TPM Name: nameAlg || H_nameAlg(TPMT_PUBLIC)."""
        digest = hashlib.new(hash_for_alg(self.name_alg), self.raw).digest()
        return m.u16(self.name_alg) + digest

    def has_attributes(self, mask: int) -> bool:
        return self.attributes & mask == mask

    def public_key(self) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
        """The key as a ``cryptography`` public key.

        Raises:
            MalformedError: if the numbers do not form a valid key.
        """
        try:
            if self.type == ALG_RSA:
                n = int.from_bytes(self.unique[0], "big")
                return rsa.RSAPublicNumbers(self.rsa_exponent, n).public_key()
            x, y = (int.from_bytes(v, "big") for v in self.unique)
            curve = _CURVES[self.curve]()
            return ec.EllipticCurvePublicNumbers(x, y, curve).public_key()
        except ValueError as exc:
            raise MalformedError("TPMT_PUBLIC", f"invalid key: {exc}")

    def same_key(self, key: object) -> bool:
        """Whether ``key`` (a ``cryptography`` public key) is this key."""
        mine = self.public_key()
        if isinstance(mine, rsa.RSAPublicKey) and isinstance(key, rsa.RSAPublicKey):
            return mine.public_numbers() == key.public_numbers()
        if isinstance(mine, ec.EllipticCurvePublicKey) and isinstance(
            key, ec.EllipticCurvePublicKey
        ):
            return mine.public_numbers() == key.public_numbers()
        return False


def make_public(
    key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
    attributes: int,
    scheme: tuple[int, int],
    symmetric: tuple[int, int, int] = (ALG_NULL, 0, ALG_NULL),
    auth_policy: bytes = b"",
    name_alg: int = ALG_SHA256,
) -> TpmPublic:
    """Build the TPMT_PUBLIC a TPM would report for ``key`` (for software
    TPMs such as the fleet emulator and tests)."""
    sym = m.u16(symmetric[0])
    if symmetric[0] != ALG_NULL:
        sym += m.u16(symmetric[1]) + m.u16(symmetric[2])
    sch = m.u16(scheme[0]) + (m.u16(scheme[1]) if scheme[0] != ALG_NULL else b"")
    head = m.u16(name_alg) + m.u32(attributes) + m.tpm2b(auth_policy) + sym + sch
    if isinstance(key, rsa.RSAPublicKey):
        nums = key.public_numbers()
        modulus = nums.n.to_bytes(key.key_size // 8, "big")
        exponent = 0 if nums.e == 65537 else nums.e
        body = m.u16(key.key_size) + m.u32(exponent) + m.tpm2b(modulus)
        return TpmPublic.from_tpmt(m.u16(ALG_RSA) + head + body)
    ecn = key.public_numbers()
    size = (key.curve.key_size + 7) // 8
    point = m.tpm2b(ecn.x.to_bytes(size, "big")) + m.tpm2b(ecn.y.to_bytes(size, "big"))
    curve = _CURVE_IDS[key.curve.name]
    body = m.u16(curve) + m.u16(ALG_NULL) + point
    return TpmPublic.from_tpmt(m.u16(ALG_ECC) + head + body)


def pcr_banks_digest(
    selection: tuple[PcrSelection, ...],
    values: Mapping[int, Mapping[int, bytes]],
    digest_alg: int = ALG_SHA256,
) -> bytes:
    """pcrDigest over the values of a selection of one or more banks, as
    TPM2_Quote computes it: the quote's hash (``digest_alg``) over every
    selected PCR's value, bank after bank in the selection's order.

    Args:
        selection: the quote's PCR selection.
        values: TPM_ALG_ID of a bank -> PCR index -> value.
        digest_alg: the hash of the AK's signing scheme.

    Raises:
        MalformedError: a selected PCR has no value or the wrong size.
    """
    h = hashlib.new(hash_for_alg(digest_alg))
    for bank in selection:
        name = hash_for_alg(bank.hash_alg)
        size = hashlib.new(name).digest_size
        bank_values = values.get(bank.hash_alg, {})
        for index in bank.pcrs:
            value = bank_values.get(index)
            if value is None or len(value) != size:
                raise MalformedError(
                    "PCR values", f"{name} PCR {index} missing or not {size} bytes"
                )
            h.update(value)
    return h.digest()


def pcr_values_digest(
    selection: tuple[PcrSelection, ...], values: Mapping[int, bytes]
) -> bytes:
    """pcrDigest over ``values`` in the order of a single-bank ``selection``.

    Raises:
        MalformedError: if a selected PCR has no value or the wrong size.
    """
    (bank,) = selection
    size = hashlib.new(hash_for_alg(bank.hash_alg)).digest_size
    ordered = []
    for index in bank.pcrs:
        value = values.get(index)
        if value is None or len(value) != size:
            raise MalformedError(
                "PCR values", f"PCR {index} missing or not {size} bytes"
            )
        ordered.append(value)
    return pcr_digest(bank.hash_alg, ordered)
