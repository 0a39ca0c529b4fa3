"""TPM object templates and TSS structure helpers of the agent's TPM layer:
the restricted signing AK template (noDA, so dictionary-attack lockout
never stops attestation), sha256 PCR selections, comparing two
TPMT_PUBLIC areas, and the length of a DER object read from NV."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tpm2_pytss import (
    TPM2_ALG,
    TPM2_ECC,
    TPM2B_PUBLIC,
    TPMA_OBJECT,
    TPML_PCR_SELECTION,
    TPMS_ECC_PARMS,
    TPMS_ECC_POINT,
    TPMS_PCR_SELECTION,
    TPMS_RSA_PARMS,
    TPMS_SCHEME_HASH,
    TPMT_ECC_SCHEME,
    TPMT_KDF_SCHEME,
    TPMT_PUBLIC,
    TPMT_RSA_SCHEME,
    TPMT_SYM_DEF_OBJECT,
    TPMU_ASYM_SCHEME,
    TPMU_PUBLIC_ID,
    TPMU_PUBLIC_PARMS,
)

from verifier.common.errors import TpmError

__all__ = [
    "BANK_ALGS",
    "ak_template",
    "bank_selection",
    "der_length",
    "same_public",
    "sha256_selection",
]

_AK_ATTRIBUTES = (
    TPMA_OBJECT.FIXEDTPM
    | TPMA_OBJECT.FIXEDPARENT
    | TPMA_OBJECT.SENSITIVEDATAORIGIN
    | TPMA_OBJECT.USERWITHAUTH
    | TPMA_OBJECT.NODA
    | TPMA_OBJECT.RESTRICTED
    | TPMA_OBJECT.SIGN_ENCRYPT
)


def ak_template(ak_alg: str) -> TPM2B_PUBLIC:
    """Build the restricted signing AK template.

    The AK has an empty auth value and ``noDA`` set: it is exempt from the
    TPM's dictionary-attack protection, so a TPM in lockout (failed
    authorisations elsewhere, or unclean restarts counted as failures)
    still quotes.

    Args:
        ak_alg: ``"ecc"`` (NIST P-256, ECDSA-SHA256) or ``"rsa"`` (RSA 2048,
            RSASSA-SHA256).

    Returns:
        The TPM2B_PUBLIC template.

    Raises:
        TpmError: If ``ak_alg`` is not supported.
    """
    if ak_alg == "ecc":
        scheme = TPMT_ECC_SCHEME(
            scheme=TPM2_ALG.ECDSA,
            details=TPMU_ASYM_SCHEME(ecdsa=TPMS_SCHEME_HASH(hashAlg=TPM2_ALG.SHA256)),
        )
        parms = TPMU_PUBLIC_PARMS(
            eccDetail=TPMS_ECC_PARMS(
                symmetric=TPMT_SYM_DEF_OBJECT(algorithm=TPM2_ALG.NULL),
                scheme=scheme,
                curveID=TPM2_ECC.NIST_P256,
                kdf=TPMT_KDF_SCHEME(scheme=TPM2_ALG.NULL),
            )
        )
        alg, unique = TPM2_ALG.ECC, TPMU_PUBLIC_ID(ecc=TPMS_ECC_POINT())
    elif ak_alg == "rsa":
        parms = TPMU_PUBLIC_PARMS(
            rsaDetail=TPMS_RSA_PARMS(
                symmetric=TPMT_SYM_DEF_OBJECT(algorithm=TPM2_ALG.NULL),
                scheme=TPMT_RSA_SCHEME(
                    scheme=TPM2_ALG.RSASSA,
                    details=TPMU_ASYM_SCHEME(
                        rsassa=TPMS_SCHEME_HASH(hashAlg=TPM2_ALG.SHA256)
                    ),
                ),
                keyBits=2048,
                exponent=0,
            )
        )
        alg, unique = TPM2_ALG.RSA, TPMU_PUBLIC_ID()
    else:
        raise TpmError(f"unsupported AK algorithm {ak_alg!r}")
    return TPM2B_PUBLIC(
        publicArea=TPMT_PUBLIC(
            type=alg,
            nameAlg=TPM2_ALG.SHA256,
            objectAttributes=_AK_ATTRIBUTES,
            parameters=parms,
            unique=unique,
        )
    )


def sha256_selection(indices: Iterable[int]) -> TPML_PCR_SELECTION:
    """Build a SHA-256 bank PCR selection for the given PCR indices."""
    pcrs = sorted(set(indices))
    if not pcrs or not all(0 <= index < 24 for index in pcrs):
        raise TpmError(f"invalid PCR selection {pcrs}")
    sel = TPMS_PCR_SELECTION(hash=TPM2_ALG.SHA256, pcrs=pcrs)
    return TPML_PCR_SELECTION(pcrSelections=[sel])


#: The banks a quote may cover, by name (sha256 first, always).
BANK_ALGS = {"sha256": TPM2_ALG.SHA256, "sha1": TPM2_ALG.SHA1}


def bank_selection(indices: Iterable[int], banks: Sequence[str]) -> TPML_PCR_SELECTION:
    """Build a selection of the given PCR indices in each of ``banks``
    (``sha256``, ``sha1``), in that order."""
    pcrs = sorted(set(indices))
    if not pcrs or not all(0 <= index < 24 for index in pcrs):
        raise TpmError(f"invalid PCR selection {pcrs}")
    if not banks or any(b not in BANK_ALGS for b in banks):
        raise TpmError(f"invalid PCR banks {list(banks)}")
    return TPML_PCR_SELECTION(
        pcrSelections=[TPMS_PCR_SELECTION(hash=BANK_ALGS[b], pcrs=pcrs) for b in banks]
    )


def same_public(a: TPMT_PUBLIC, b: TPMT_PUBLIC) -> bool:
    """Compare two public areas, ignoring the unique field."""
    return bool(
        a.type == b.type
        and a.nameAlg == b.nameAlg
        and a.objectAttributes == b.objectAttributes
        and bytes(a.authPolicy) == bytes(b.authPolicy)
        and a.parameters.marshal(a.type) == b.parameters.marshal(b.type)
    )


def der_length(data: bytes) -> int:
    """Return the length of the DER element at the start of ``data``.

    NV indices may be larger than the certificate they hold; this allows
    trailing padding to be dropped.
    """
    if len(data) < 2 or data[1] < 0x80:
        return min(len(data), 2 + (data[1] if len(data) > 1 else 0))
    count = data[1] & 0x7F
    return min(len(data), 2 + count + int.from_bytes(data[2 : 2 + count], "big"))
