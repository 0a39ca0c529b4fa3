"""The node agent: TPM identity, quotes and the U/V payload bootstrap.

At start the agent makes fresh, memory-only keys
(:mod:`node_agent.fresh_keys`), but for its TLS key:

* NK, an X25519 share-transport key: the tenant seals share U and the
  verifier seals share V to it; the agent commits to NK inside its quotes;
* a P-256 identity key with a CSR (CN = node UUID), committed to in the
  first quote, which the verifier's CA turns into the node's identity cert;
* a self-signed TLS certificate, registered with the registrar so that
  verifiers and tenants can pin it; unlike the others it is kept in
  ``work_dir`` and reused at each start (:mod:`node_agent.tls_state`), so
  the pin still holds after the agent restarts.

U is taken only from the node's enroller: V comes with the enroller's
commitment to U (:mod:`verifier.protocol.enroller`), and until V arrives
every U received is kept as a candidate, so no one else's U can replace
the enroller's.

When both shares have arrived the agent recombines K = U xor V, decrypts
the tenant payload, forgets U, V and K, and installs the payload, which
runs if it is a script (:class:`node_agent.payload.Installation`).

A way back (re-enrolment): after its tenant deletes the node, the same
node can be enrolled again without touching the agent. The agent then
takes a new U and V exactly as for the first bootstrap, and the payload in
force stays until a complete pair decrypts a new payload (the payload
envelope is authenticated under K: a pair that is not the enroller's does
not open it). A share that arrives alone, a U that is not the enroller's
or a pair that does not decrypt changes nothing of what is installed. A
share already spent in an earlier bootstrap of this agent (a replayed
enrolment: its U or its V) is refused with ``already_bootstrapped``
(409), nothing stored and nothing run again, so an old payload cannot be
put back. A new pair's payload replaces the old one and runs once (a run
of the old one still going is stopped first: its enrolment is gone).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import time
from typing import Any

from oslo_config import cfg

from node_agent.bootstrap import BootPayload, resolve
from node_agent.exceptions import BootstrapError, RefusedError
from node_agent.fresh_keys import FreshKeys
from node_agent.payload import Installation, unwrap
from node_agent.registration import Contact, register
from node_agent.shares import Share as _Share
from node_agent.shares import check_enroller, offer, select_u
from node_agent.tls_state import load_or_create
from verifier.common.tls import server_context_from_pem
from verifier.common.tpm import Tpm
from verifier.common.tpm_access import TpmAccess, TpmLike
from verifier.protocol import (
    EnvelopeError,
    Quote,
    ShareKind,
    bind_nonce,
    canonical_uuid,
    combine,
    open_payload,
)
from verifier.protocol.enroller import UCandidates
from verifier.protocol.messages.quote import QuoteAnswer

__all__ = ["Agent", "TpmAccess", "TpmLike"]

LOG = logging.getLogger(__name__)


class Agent:
    """One node agent.

    Args:
        uuid: the node UUID.
        tpm: access to the node's TPM.
        work_dir: where the payload, its output and the identity go.
        registrar_url: base URL of the registrar.
        ca_file: operator CA (trusts the registrar; signs allowed clients).
        cert_file: client certificate presented to the registrar; None:
            register without one (identified by the TPM's EK certificate).
        key_file: key of ``cert_file``.
        contact_host: host the registrar tells others to contact us at.
        port: port the agent listens on.
        payload_timeout: seconds an executable payload may run.
        contact_port: port registered with the registrar (None: ``port``).
        boot_payload: the payload from the user-data, used when U comes
            without one.
        no_payload_reason: why there is no ``boot_payload`` (told to a
            tenant whose U comes without a payload).

    Raises:
        MalformedError: if ``uuid`` is not a UUID.
        NodeAgentError: if the TLS state in ``work_dir`` is corrupt.
    """

    def __init__(
        self,
        uuid: str,
        tpm: TpmAccess,
        work_dir: str,
        *,
        registrar_url: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        contact_host: str = "127.0.0.1",
        port: int = 9002,
        payload_timeout: float = 300.0,
        contact_port: int | None = None,
        boot_payload: BootPayload | None = None,
        no_payload_reason: str = "no payload was delivered with the user-data",
        bootstrap_push_url: str | None = None,
    ) -> None:
        self.uuid = canonical_uuid(uuid)
        self.tpm = tpm
        self.work_dir = os.path.abspath(work_dir)
        self.registrar_url = registrar_url.rstrip("/") if registrar_url else None
        self.ca_file = ca_file
        #: the push endpoint the tenant's bootstrap file names (push mode)
        self.bootstrap_push_url = bootstrap_push_url
        self.cert_file = cert_file
        self.key_file = key_file
        self.contact_host = contact_host
        self.port = port
        self.payload_timeout = payload_timeout
        self.contact_port = contact_port
        self.boot_payload = boot_payload
        self.no_payload_reason = no_payload_reason

        self._keys = FreshKeys(self.uuid)
        self.nk_public: bytes = self._keys.nk_public
        self.csr_der: bytes = self._keys.csr_der
        self._tls_key_pem, self.tls_cert_pem = load_or_create(
            self.work_dir, self.uuid, contact_host
        )

        self._state_lock = asyncio.Lock()
        self._u: _Share | None = None
        self._v: _Share | None = None
        #: U received before V (V says which is the enroller's), and the last
        #: from a tenant certificate (for a V without a commitment)
        self._candidates: UCandidates[_Share] = UCandidates(self.uuid)
        self._certified_u: _Share | None = None
        #: digests of the shares of every bootstrap done (see _spent_digest)
        self._spent: set[bytes] = set()
        self.bootstrapped = False
        #: ``time.monotonic()`` when the payload was decrypted (benchmarks).
        self.bootstrapped_at: float | None = None
        #: the last bootstrap refusal, shown by ``status()``
        self.last_error: dict[str, str] | None = None
        self._payload = Installation(self.work_dir, self.uuid)

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> Agent:
        """Build the agent from the ``[agent]`` options.

        The bootstrap file and cloud-init's instance id and user-data fill
        what the options leave unset (:func:`node_agent.bootstrap.resolve`).

        Raises:
            BootstrapError: no usable UUID, or a malformed bootstrap file.
            MalformedError: ``uuid`` is not a UUID.
        """
        opts = conf.agent
        settings = resolve(opts)
        tcti, ek_alg, ak_alg = opts.tcti, opts.ek_alg, opts.ak_alg
        access = TpmAccess(lambda: Tpm(tcti, ek_alg, ak_alg), shared=opts.tpm_shared)
        return cls(
            settings.uuid,
            access,
            opts.work_dir,
            registrar_url=settings.registrar_url,
            ca_file=settings.ca_file,
            cert_file=opts.cert_file,
            key_file=opts.key_file,
            contact_host=settings.contact_host,
            port=opts.port,
            payload_timeout=opts.payload_timeout,
            contact_port=opts.contact_port,
            boot_payload=settings.boot_payload,
            no_payload_reason=settings.no_payload_reason,
            bootstrap_push_url=settings.push_url,
        )

    # -- TLS ---------------------------------------------------------------

    def server_ssl_context(self) -> ssl.SSLContext:
        """The agent's HTTPS context: our self-signed cert, client certs
        required from ``ca_file``. Writes the TLS key (0600) to work_dir.

        Raises:
            BootstrapError: if ``ca_file`` is not set or unreadable.
        """
        if not self.ca_file:
            raise BootstrapError(
                "[agent] ca_file (or the ca_pem of the bootstrap file) is "
                "required to serve HTTPS"
            )
        try:
            with open(self.ca_file, encoding="utf-8") as f:
                ca_pem = f.read()
        except OSError as exc:
            raise BootstrapError(f"cannot read ca_file {self.ca_file}: {exc}")
        os.makedirs(self.work_dir, mode=0o700, exist_ok=True)
        return server_context_from_pem(
            self.tls_cert_pem, self._tls_key_pem, ca_pem, self.work_dir
        )

    # -- registration --------------------------------------------------------

    async def register(self) -> None:
        """Register EK, EK cert, AK, TLS cert and address; activate the AK
        (:func:`node_agent.registration.register`).

        Raises:
            BootstrapError: the registrar or its CA is not configured.
            RegistrationError: the registrar is unreachable or refused.
            TpmError: the TPM failed.
        """
        contact = Contact(
            uuid=self.uuid,
            registrar_url=self.registrar_url,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            tls_cert_pem=self.tls_cert_pem,
            host=self.contact_host,
            port=self.contact_port or self.port,
        )
        await register(contact, self.tpm)

    # -- quotes ------------------------------------------------------------

    async def quote(
        self,
        nonce: bytes,
        pcrs: list[int],
        with_csr: bool,
        banks: tuple[str, ...] = ("sha256",),
    ) -> QuoteAnswer:
        """Quote ``pcrs`` with the nonce bound to NK (and the CSR), in the
        sha256 bank and the other ``banks`` asked for (sha1) that the TPM
        has active.

        Returns:
            The answer: the quote, NK and (only if asked) the CSR.

        Raises:
            TpmError: the TPM failed.
        """
        bound = (self.nk_public, self.csr_der) if with_csr else (self.nk_public,)
        qualifying = bind_nonce(nonce, *bound)
        if banks == ("sha256",):
            raw = await self.tpm.run(lambda tpm: tpm.quote(qualifying, list(pcrs)))
        else:
            raw = await self.tpm.run(
                lambda tpm: tpm.quote(qualifying, list(pcrs), banks)
            )
        quote = Quote(
            raw.attest,
            raw.signature,
            dict(raw.pcr_values),
            {bank: dict(values) for bank, values in raw.bank_values.items()},
        )
        return QuoteAnswer(quote, self.nk_public, self.csr_der if with_csr else None)

    # -- bootstrap -----------------------------------------------------------

    async def receive_u(
        self,
        u_envelope: bytes,
        payload_envelope: bytes | None = None,
        payload_id: str | None = None,
        *,
        certified: bool = True,
    ) -> bool:
        """Accept the tenant's share U (and the payload envelope).

        U counts only if it is the enroller's: once V has come, U must
        match V's commitment; before that it is kept as a candidate.
        ``certified`` says that it came with a tenant certificate (only
        such a U is taken for a V without a commitment). After a bootstrap
        the same holds for the next enrolment's U (the payload installed
        stays until its pair completes).

        ``payload_id`` is the UUID the envelope is bound to when it is not
        this node's own: a payload sealed before Nova named the instance
        (the boot id of ``trusted-nova boot``, shared by the servers of one
        request). U and V stay bound to this node. Without
        ``payload_envelope`` the payload is the one of the user-data
        (:attr:`boot_payload`), bound to its boot id.

        Returns:
            True if this completed the bootstrap.

        Raises:
            EnvelopeError: U does not open for this node (nothing stored).
            RefusedError: ``no_payload`` (409, nothing stored: neither U
                nor the user-data carries a payload),
                ``u_not_from_enroller`` (403, nothing stored),
                ``too_many_shares`` (429, nothing stored: retry after V),
                ``already_bootstrapped`` (409, nothing stored: a U
                spent in an earlier bootstrap) or ``shares_mismatch`` (U
                discarded, V kept).
        """
        if payload_envelope is None:
            if self.boot_payload is None:
                raise self._refuse(
                    "no_payload",
                    f"U came without a payload and {self.no_payload_reason}",
                    409,
                )
            payload_envelope = self.boot_payload.envelope
            payload_id = self.boot_payload.boot_id
        async with self._state_lock:
            value = self._keys.open(ShareKind.U, u_envelope)
            self._check_not_spent(ShareKind.U, value)
            share = _Share(value, payload=payload_envelope, payload_id=payload_id)
            if self._v is None:
                offer(self._candidates, value, share)
                if certified:
                    self._certified_u = share
                return False
            check_enroller(self._v, self.uuid, value, certified)
            self._u = share
            return await self._try_bootstrap(received=ShareKind.U)

    async def receive_v(
        self,
        v_envelope: bytes,
        identity_cert_pem: bytes | None,
        u_commitment: bytes | None = None,
    ) -> bool:
        """Accept the verifier's share V, the node identity certificate and
        the enroller's commitment to U (which of the U received is taken).

        Returns:
            True if this completed the bootstrap.

        Raises:
            EnvelopeError: V does not open for this node (nothing stored).
            RefusedError: ``bad_identity_cert`` (nothing stored),
                ``already_bootstrapped`` (409, nothing stored: a V spent in
                an earlier bootstrap) or ``shares_mismatch`` (V discarded,
                U kept).
        """
        if identity_cert_pem is not None:
            self._keys.check_identity_cert(identity_cert_pem)
        async with self._state_lock:
            value = self._keys.open(ShareKind.V, v_envelope)
            self._check_not_spent(ShareKind.V, value)
            self._v = _Share(
                value, identity_cert=identity_cert_pem, commitment=u_commitment
            )
            certified, self._certified_u = self._certified_u, None
            self._u = select_u(
                self.uuid, u_commitment, self._u, certified, self._candidates
            )
            return await self._try_bootstrap(received=ShareKind.V)

    @property
    def holds_v(self) -> bool:
        """Whether the verifier's share V reached this agent (push mode
        says so in each evidence post, so a lost V is sent again): also
        once bootstrapped, unless a new enrolment's U is waiting for its V."""
        if self._v is not None:
            return True
        waiting = self._u is not None or len(self._candidates) > 0
        return self.bootstrapped and not waiting

    def open_transport(self, kind: ShareKind, envelope: bytes) -> bytes:
        """Open an envelope sealed to NK (e.g. kind ``ABE``, a CP-ABE key).

        Raises:
            EnvelopeError: it does not authenticate for this node and kind.
        """
        return self._keys.open(kind, envelope)

    def _spent_digest(self, kind: ShareKind, value: bytes) -> bytes:
        """What is remembered of a share once spent: a hash, never the
        share (a 256-bit random value: its hash reveals nothing of K)."""
        label = f"trusted-cloud spent share\x00{kind}\x00{self.uuid}\x00"
        return hashlib.sha256(label.encode() + value).digest()

    def _check_not_spent(self, kind: ShareKind, value: bytes) -> None:
        """Refuse a share of an earlier bootstrap of this agent: the same
        enrolment again (a retry) or a replay that would put an old payload
        back."""
        if self._spent_digest(kind, value) in self._spent:
            raise RefusedError(
                "already_bootstrapped",
                f"this {kind} was already used in a bootstrap of this node "
                "(a new enrolment brings new shares); nothing stored, "
                "nothing ran again",
                409,
            )

    async def _try_bootstrap(self, received: ShareKind) -> bool:
        if self._u is None or self._v is None:
            return False
        assert self._u.payload is not None
        key = combine(self._u.value, self._v.value)
        try:
            plaintext = open_payload(
                key, self._u.payload, self._u.payload_id or self.uuid
            )
        except EnvelopeError:
            if received is ShareKind.U:
                self._u = None
            else:
                self._v = None
            raise self._refuse(
                "shares_mismatch",
                f"the payload does not decrypt with U xor V ({received} "
                "discarded, nothing ran)",
            )
        if self._u.payload_id is not None:  # sealed by the boot wrapper
            try:
                plaintext = unwrap(plaintext, 16 * 1024 * 1024)
            except RefusedError as exc:
                self._u = self._v = None  # both shares are spent
                raise self._refuse(exc.code, f"{exc.detail} (nothing ran)")
        self.bootstrapped_at = time.monotonic()
        identity_cert = self._v.identity_cert
        del key
        self._spent.add(self._spent_digest(ShareKind.U, self._u.value))
        self._spent.add(self._spent_digest(ShareKind.V, self._v.value))
        self._u = self._v = None
        if self.bootstrapped:  # a re-enrolment: its pair is complete
            LOG.info(
                "node %s enrolled again: the new payload replaces the old", self.uuid
            )
            await self._payload.close()  # a run of the old payload stops
        self.bootstrapped = True
        self.last_error = None
        identity = None
        if identity_cert is not None:
            identity = (identity_cert, self._keys.identity_key_pem())
        await asyncio.to_thread(self._payload.install, plaintext, identity)
        if plaintext.startswith(b"#!"):
            self._payload.start(identity is not None, self.payload_timeout)
            LOG.info("payload decrypted and started for node %s", self.uuid)
        else:
            LOG.info(
                "payload decrypted for node %s (not executable, stored only)",
                self.uuid,
            )
        return True

    def _refuse(self, code: str, detail: str, status: int = 400) -> RefusedError:
        """Log a bootstrap failure (one line), keep it for ``status()``."""
        LOG.error("bootstrap of node %s refused: %s: %s", self.uuid, code, detail)
        self.last_error = {"code": code, "message": detail}
        return RefusedError(code, detail, status)

    async def wait_payload(self) -> int | None:
        """Wait for the payload started by the bootstrap, if any.

        Returns:
            Its exit code (None if none was started or it could not start).
        """
        return await self._payload.wait()

    @property
    def payload_exit_code(self) -> int | None:
        """The payload's exit code once it ran (None before that, or if it
        could not start)."""
        return self._payload.exit_code

    def status(self) -> dict[str, Any]:
        """The bootstrap state (never key material)."""
        return {
            "uuid": self.uuid,
            "bootstrapped": self.bootstrapped,
            "has_u": self._u is not None or len(self._candidates) > 0,
            "has_v": self._v is not None,
            "payload_exit_code": self.payload_exit_code,
            "last_error": self.last_error,
        }

    async def close(self) -> None:
        """Stop a running payload wait and close the TPM connection."""
        await self._payload.close()
        self.tpm.close()
