"""TPM 2.0 access for the node agent, on top of tpm2-pytss ESAPI.

One :class:`Tpm` object talks to one TPM through a TCTI string, e.g.
``"swtpm:host=127.0.0.1,port=2321"`` (tests) or ``"device:/dev/tpmrm0"``
(guest). It exposes the endorsement key (EK) and its certificate, an
attestation key (AK), credential activation, quotes and PCR access.

TPM 2.0 commands used: TPM2_GetCapability, TPM2_FlushContext,
TPM2_ReadPublic, TPM2_NV_ReadPublic, TPM2_NV_Read, TPM2_CreatePrimary,
TPM2_StartAuthSession, TPM2_PolicySecret, TPM2_ActivateCredential,
TPM2_Quote, TPM2_PCR_Read and TPM2_PCR_Extend.

Every TSS failure is raised as :class:`verifier.common.errors.TpmError` naming
the failed operation.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType

from tpm2_pytss import (
    ESAPI,
    ESYS_TR,
    TPM2_ALG,
    TPM2_CAP,
    TPM2_HC,
    TPM2_SE,
    TPM2B_DATA,
    TPM2B_ENCRYPTED_SECRET,
    TPM2B_ID_OBJECT,
    TPM2B_PUBLIC,
    TPMA_OBJECT,
    TPML_DIGEST_VALUES,
    TPMT_HA,
    TPMT_SIG_SCHEME,
    TPMT_SYM_DEF,
    TPMU_HA,
    TSS2_Exception,
)
from tpm2_pytss.constants import TSS2_RC
from tpm2_pytss.utils import NoSuchIndex, NVReadEK, create_ek_template

from verifier.common.errors import TctiConfigError, TpmError
from verifier.common.tpm_templates import (
    ak_template,
    bank_selection,
    der_length,
    same_public,
)
from verifier.protocol.quote import Quote

#: EK types tried per algorithm, in order: (template name, NV cert index,
#: persistent handle where the TCG profile / swtpm_setup store that EK).
#: swtpm_setup 0.7 creates its ECC EK from the high-range P-384 template.
_EK_PROFILES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "rsa": (("EK-RSA2048", 0x01C00002, 0x81010001),),
    "ecc": (
        ("EK-ECC256", 0x01C0000A, 0x81010002),
        ("EK-HIGH-ECC384", 0x01C00016, 0x81010016),
    ),
}
_PCR_READ_MAX = 8
_QUOTE_ATTEMPTS = 3
#: Use the AK's own signing scheme.
_NULL_SCHEME = TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL)


#: What the TCTI loader answers for a module it cannot load or a
#: configuration string the module refuses (a connection that fails is
#: TCTI_RC_IO_ERROR: the TPM may come later).
_TCTI_CONFIG_RCS = frozenset(
    {
        TSS2_RC.TCTI_RC_BAD_VALUE,
        TSS2_RC.TCTI_RC_NOT_SUPPORTED,
        TSS2_RC.TCTI_RC_BAD_REFERENCE,
    }
)


def _open(tcti: str) -> ESAPI:
    """An ESAPI context on ``tcti``.

    Raises:
        TctiConfigError: no such TCTI module, or a configuration it rejects.
        TpmError: the TPM does not answer (yet).
    """
    try:
        return ESAPI(tcti)
    except TSS2_Exception as exc:
        if exc.rc in _TCTI_CONFIG_RCS:
            raise TctiConfigError(
                f"TCTI {tcti!r} cannot be loaded ({exc}): the module name "
                "before ':' or its options are wrong (e.g. "
                "'device:/dev/tpmrm0' or 'swtpm:host=127.0.0.1,port=2321')"
            ) from exc
        raise TpmError(f"the TPM at {tcti!r} does not answer ({exc})") from exc


@contextlib.contextmanager
def _tss(operation: str) -> Iterator[None]:
    """Translate TSS exceptions raised in the block into TpmError."""
    try:
        yield
    except TSS2_Exception as exc:
        raise TpmError(f"{operation} failed: {exc}") from exc


class Tpm:
    """A connection to one TPM with its EK and AK.

    Args:
        tcti: TCTI string, e.g. ``"device:/dev/tpmrm0"``.
        ek_alg: ``"rsa"`` (RSA 2048 EK) or ``"ecc"`` (ECC EK).
        ak_alg: ``"ecc"`` (P-256 ECDSA AK) or ``"rsa"`` (RSA 2048 RSASSA AK).

    Raises:
        TctiConfigError: If ``tcti`` names no loadable TCTI or a
            configuration it rejects.
        TpmError: If the TPM cannot be opened or the algorithms are unknown.
    """

    def __init__(self, tcti: str, ek_alg: str = "rsa", ak_alg: str = "ecc") -> None:
        if ek_alg not in _EK_PROFILES:
            raise TpmError(f"unsupported EK algorithm {ek_alg!r}")
        self._ak_template = ak_template(ak_alg)
        self._ek_alg = ek_alg
        self._ek: ESYS_TR | None = None
        self._ek_transient = False
        self._ek_pub: TPM2B_PUBLIC | None = None
        self._ek_cert_index: int | None = None
        self._ak: ESYS_TR | None = None
        self._ak_pub: TPM2B_PUBLIC | None = None
        self._ctx: ESAPI | None = _open(tcti)
        try:
            self._flush_all()
        except TpmError:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------

    @property
    def ctx(self) -> ESAPI:
        """The open ESAPI context.

        Raises:
            TpmError: If the TPM has been closed.
        """
        if self._ctx is None:
            raise TpmError("TPM connection is closed")
        return self._ctx

    def _handles(self, first: int) -> list[int]:
        """List TPM handles of one type, starting at handle ``first``."""
        handles: list[int] = []
        more, start = True, first
        while more:
            more, data = self.ctx.get_capability(TPM2_CAP.HANDLES, start, 64)
            found = [int(h) for h in data.data.handles]
            if not found:
                break
            handles.extend(found)
            start = found[-1] + 1
        return handles

    def _flush_all(self) -> None:
        """Flush every transient object and loaded session (no RM on swtpm)."""
        with _tss("flush stale handles"):
            for first in (TPM2_HC.TRANSIENT_FIRST, TPM2_HC.LOADED_SESSION_FIRST):
                for handle in self._handles(first):
                    self.ctx.flush_context(self.ctx.tr_from_tpmpublic(handle))

    def close(self) -> None:
        """Flush the keys this object loaded and close the connection."""
        if self._ctx is None:
            return
        for handle in (self._ak, self._ek if self._ek_transient else None):
            if handle is not None:
                with contextlib.suppress(TSS2_Exception):
                    self._ctx.flush_context(handle)
        self._ak = self._ek = None
        ctx, self._ctx = self._ctx, None
        with contextlib.suppress(TSS2_Exception):
            ctx.close()

    def __enter__(self) -> Tpm:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- endorsement key -----------------------------------------------------

    def _nv_reader(self) -> Callable[[int], bytes]:
        """Return an NV read callback that skips indices not defined in the TPM.

        Probing absent indices through the TSS would log ESYS errors.
        """
        reader = NVReadEK(self.ctx)
        present = set(self._handles(TPM2_HC.NV_INDEX_FIRST))

        def read(index: int) -> bytes:
            if int(index) not in present:
                raise NoSuchIndex(index)
            return bytes(reader(index))

        return read

    def _ek_template(self) -> tuple[TPM2B_PUBLIC, int, int]:
        """Pick the EK template matching an EK certificate present in NV."""
        read_nv = self._nv_reader()
        profiles = _EK_PROFILES[self._ek_alg]
        chosen = profiles[0]
        for profile in profiles:
            try:
                read_nv(profile[1])
            except NoSuchIndex:
                continue
            chosen = profile
            break
        _, template = create_ek_template(chosen[0], read_nv)
        return template, chosen[1], chosen[2]

    def _load_ek(self) -> ESYS_TR:
        """Return the EK handle, reusing swtpm_setup's persistent EK if it fits."""
        if self._ek is not None:
            return self._ek
        with _tss("load EK"):
            template, self._ek_cert_index, persistent = self._ek_template()
            if persistent in self._handles(TPM2_HC.PERSISTENT_FIRST):
                handle = self.ctx.tr_from_tpmpublic(persistent)
                pub, _, _ = self.ctx.read_public(handle)
                if same_public(pub.publicArea, template.publicArea):
                    self._ek, self._ek_pub = handle, pub
                    return handle
                self.ctx.tr_close(handle)
            handle, pub, _, _, _ = self.ctx.create_primary(
                None, template, ESYS_TR.ENDORSEMENT
            )
        self._ek, self._ek_pub, self._ek_transient = handle, pub, True
        return handle

    def ek_public(self) -> bytes:
        """Return the EK public area as a marshalled TPM2B_PUBLIC.

        Raises:
            TpmError: If the EK cannot be loaded or created.
        """
        self._load_ek()
        assert self._ek_pub is not None
        return bytes(self._ek_pub.marshal())

    def ek_certificate(self) -> bytes | None:
        """Return the DER EK certificate stored in NV, or None if absent.

        Raises:
            TpmError: If reading NV fails for another reason.
        """
        self._load_ek()
        assert self._ek_cert_index is not None
        with _tss("read EK certificate"):
            try:
                data = self._nv_reader()(self._ek_cert_index)
            except NoSuchIndex:
                return None
        return data[: der_length(data)]

    # -- attestation key -----------------------------------------------------

    def _load_ak(self) -> ESYS_TR:
        """Return the AK handle, creating the primary key once."""
        if self._ak is None:
            with _tss("create AK"):
                handle, pub, _, _, _ = self.ctx.create_primary(
                    None, self._ak_template, ESYS_TR.OWNER
                )
            self._ak, self._ak_pub = handle, pub
        return self._ak

    def ak_public(self) -> bytes:
        """Return the AK public area as a marshalled TPM2B_PUBLIC.

        Raises:
            TpmError: If the AK cannot be created.
        """
        self._load_ak()
        assert self._ak_pub is not None
        return bytes(self._ak_pub.marshal())

    # -- credential activation -----------------------------------------------

    def _ek_session(self) -> tuple[ESYS_TR, bool]:
        """Return an authorization for the EK and whether it must be flushed.

        High-range EKs have userWithAuth set, so an empty password suffices;
        low-range EKs need PolicySecret(TPM_RH_ENDORSEMENT).
        """
        assert self._ek_pub is not None
        attrs = self._ek_pub.publicArea.objectAttributes
        if attrs & TPMA_OBJECT.USERWITHAUTH:
            return ESYS_TR.PASSWORD, False
        session = self.ctx.start_auth_session(
            ESYS_TR.NONE,
            ESYS_TR.NONE,
            TPM2_SE.POLICY,
            TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
            TPM2_ALG.SHA256,
        )
        try:
            self.ctx.policy_secret(ESYS_TR.ENDORSEMENT, session)
        except TSS2_Exception:
            self.ctx.flush_context(session)
            raise
        return session, True

    def activate_credential(
        self, credential_blob: bytes, encrypted_secret: bytes
    ) -> bytes:
        """Recover a credential made for this TPM's EK and AK (TPM2_MakeCredential).

        Args:
            credential_blob: Marshalled TPM2B_ID_OBJECT.
            encrypted_secret: Marshalled TPM2B_ENCRYPTED_SECRET.

        Returns:
            The decrypted credential.

        Raises:
            TpmError: If the blobs are malformed or activation fails (e.g. the
                credential was made for another EK or AK name).
        """
        try:
            blob, _ = TPM2B_ID_OBJECT.unmarshal(credential_blob)
            secret, _ = TPM2B_ENCRYPTED_SECRET.unmarshal(encrypted_secret)
        except (TSS2_Exception, ValueError, TypeError) as exc:
            raise TpmError(f"activate credential: malformed input: {exc}")
        ak, ek = self._load_ak(), self._load_ek()
        with _tss("activate credential"):
            session, flush = self._ek_session()
            try:
                cred = self.ctx.activate_credential(
                    ak, ek, blob, secret, session2=session
                )
            finally:
                if flush:
                    self.ctx.flush_context(session)
        return bytes(cred)

    # -- PCRs and quotes -----------------------------------------------------

    def _read_pcrs(
        self, indices: Sequence[int], bank: str = "sha256"
    ) -> tuple[set[int], dict[int, bytes]]:
        """Read PCRs of a bank, returning the update counters seen and
        values."""
        wanted = sorted(set(indices))
        counters: set[int] = set()
        values: dict[int, bytes] = {}
        for start in range(0, len(wanted), _PCR_READ_MAX):
            chunk = wanted[start : start + _PCR_READ_MAX]
            counter, _, digests = self.ctx.pcr_read(bank_selection(chunk, (bank,)))
            if len(digests) != len(chunk):
                raise TpmError(f"PCR read returned {len(digests)} of {len(chunk)}")
            counters.add(int(counter))
            values.update(zip(chunk, (bytes(d) for d in digests), strict=True))
        return counters, values

    def _bank_active(self, bank: str, pcrs: Sequence[int]) -> bool:
        """Whether the TPM has ``pcrs`` allocated in ``bank``."""
        with _tss("PCR read"):
            _, _, digests = self.ctx.pcr_read(bank_selection(pcrs[:1], (bank,)))
        return len(digests) == 1

    def pcr_read(self, indices: Iterable[int]) -> dict[int, bytes]:
        """Read PCR values of the SHA-256 bank.

        Args:
            indices: PCR indices (0-23).

        Returns:
            The values by PCR index.

        Raises:
            TpmError: On TSS failure or invalid index.
        """
        with _tss("PCR read"):
            return self._read_pcrs(list(indices))[1]

    def pcr_extend(self, index: int, digest: bytes) -> None:
        """Extend a SHA-256 PCR: PCR = SHA256(PCR || digest).

        Args:
            index: PCR index (0-23).
            digest: 32-byte SHA-256 digest.

        Raises:
            TpmError: On TSS failure, invalid index or digest length.
        """
        if not 0 <= index < 24 or len(digest) != hashlib.sha256().digest_size:
            raise TpmError(f"PCR extend: invalid PCR {index} or digest length")
        value = TPMT_HA(hashAlg=TPM2_ALG.SHA256, digest=TPMU_HA(sha256=digest))
        with _tss("PCR extend"):
            self.ctx.pcr_extend(ESYS_TR(index), TPML_DIGEST_VALUES(digests=[value]))

    def quote(
        self,
        qualifying_data: bytes,
        pcrs: Sequence[int],
        banks: Sequence[str] = ("sha256",),
    ) -> Quote:
        """Quote PCRs with the AK and read their values.

        The quote is retried (up to 3 attempts) if a PCR changed between the
        quote and the read-back.

        Args:
            qualifying_data: Nonce placed in TPMS_ATTEST.extraData.
            pcrs: PCR indices to quote.
            banks: ``("sha256",)``, or ``("sha256", "sha1")`` to quote the
                same PCRs of the sha1 bank as well. A TPM whose sha1 bank is
                not active (it was manufactured without it) quotes sha256
                only, as if sha1 had not been asked for.

        Returns:
            The quote, its signature and the matching PCR values (the sha1
            ones in ``bank_values``), in the form the agent hands over
            (:class:`verifier.protocol.Quote`).

        Raises:
            TpmError: On TSS failure or if the PCRs keep changing.
        """
        pcrs = sorted(set(pcrs))
        banks = tuple(banks)
        if banks != ("sha256",) and not self._bank_active(banks[-1], pcrs):
            banks = ("sha256",)
        selection = bank_selection(pcrs, banks)
        ak = self._load_ak()
        with _tss("quote"):
            for _ in range(_QUOTE_ATTEMPTS):
                before, _ = self._read_pcrs(pcrs)
                attest, signature = self.ctx.quote(
                    ak, selection, TPM2B_DATA(qualifying_data), _NULL_SCHEME
                )
                after, values = self._read_pcrs(pcrs)
                extra = {}
                for bank in banks[1:]:
                    counters, extra[bank] = self._read_pcrs(pcrs, bank)
                    after |= counters
                if len(before | after) == 1:
                    return Quote(
                        bytes(attest), bytes(signature.marshal()), values, extra
                    )
        raise TpmError(f"quote: PCRs kept changing over {_QUOTE_ATTEMPTS} attempts")
