"""Batched monitor attestation of the verifier host (the service side).

Customers' nonces wait in a queue. A batch closes when ``window`` seconds
have passed since its first nonce arrived, when it holds ``max_batch``
nonces, or -- whichever comes later -- when the TPM finished the previous
quote: requests that arrive while the TPM is busy join the next batch, so
the batch size adapts to the load and the TPM quotes back to back. Each
batch becomes a Merkle tree (:mod:`verifier.protocol.monitor`), the TPM
quotes once over its root, and every waiting request gets that quote and
its own inclusion path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from verifier.exceptions import RequestError, VerifierError
from verifier.protocol import Quote
from verifier.protocol.monitor import (
    MerkleTree,
    MonitorAttestation,
    check_nonce,
    monitor_qualifying_data,
)

__all__ = ["HostTpm", "MonitorBatcher", "MonitorUnavailableError"]

LOG = logging.getLogger(__name__)

#: Signs ``qualifying_data`` with the host's AK over the configured PCRs.
QuoteFn = Callable[[bytes], Awaitable[Quote]]


class MonitorUnavailableError(RequestError, VerifierError):
    """Monitor attestation is off, overloaded, or the host TPM failed (503)."""

    def __init__(self, detail: str) -> None:
        super().__init__("monitor_unavailable", detail, 503)


class MonitorBatcher:
    """Collects customers' nonces into batches, one TPM quote per batch.

    Args:
        quote: makes the TPM quote over a batch's qualifying data.
        window: seconds a batch stays open after its first nonce.
        max_batch: most nonces in one batch (1: one quote per request).
        max_waiting: refuse new nonces when this many already wait.
    """

    def __init__(
        self,
        quote: QuoteFn,
        window: float = 0.005,
        max_batch: int = 65536,
        max_waiting: int = 1 << 20,
    ) -> None:
        self._quote = quote
        self._window = window
        self._max_batch = max_batch
        self._max_waiting = max_waiting
        self._waiting: list[tuple[bytes, asyncio.Future[MonitorAttestation]]] = []
        self._first_at = 0.0
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: counters for operators and the benchmark
        self.batches = 0
        self.attested = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, future in self._waiting:
            if not future.done():
                future.set_exception(MonitorUnavailableError("monitor stopped"))
        self._waiting = []

    async def attest(self, nonce: bytes) -> MonitorAttestation:
        """Wait for the batch holding ``nonce`` to be quoted.

        Raises:
            MalformedError: the nonce is not 16..64 bytes.
            MonitorUnavailableError: not started, overloaded, or the TPM
                failed.
        """
        check_nonce(nonce)
        if self._task is None:
            raise MonitorUnavailableError("monitor attestation is not running")
        if len(self._waiting) >= self._max_waiting:
            raise MonitorUnavailableError("too many monitor requests waiting")
        future: asyncio.Future[MonitorAttestation] = (
            asyncio.get_running_loop().create_future()
        )
        if not self._waiting:
            self._first_at = time.monotonic()
            self._arrived.set()
        self._waiting.append((nonce, future))
        if len(self._waiting) >= self._max_batch:
            self._full.set()
        return await future

    async def _loop(self) -> None:
        while True:
            await self._arrived.wait()
            remaining = self._first_at + self._window - time.monotonic()
            if remaining > 0 and not self._full.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), remaining)
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            if self._waiting:
                self._first_at = time.monotonic()
                if len(self._waiting) < self._max_batch:
                    self._full.clear()
            else:
                self._arrived.clear()
                self._full.clear()
            await self._answer(batch)

    async def _answer(
        self, batch: list[tuple[bytes, asyncio.Future[MonitorAttestation]]]
    ) -> None:
        batch = [(n, f) for n, f in batch if not f.done()]  # cancelled clients
        if not batch:
            return
        tree = MerkleTree([nonce for nonce, _ in batch])
        try:
            quote = await self._quote(monitor_qualifying_data(tree.root, tree.size))
        except Exception as exc:  # the TPM's failure goes to every waiter
            LOG.error("Monitor quote failed: %s", exc)
            for _, future in batch:
                if not future.done():
                    future.set_exception(
                        MonitorUnavailableError(f"the verifier's TPM failed: {exc}")
                    )
            return
        self.batches += 1
        self.attested += len(batch)
        for index, (_, future) in enumerate(batch):
            if not future.done():
                future.set_result(
                    MonitorAttestation(quote, index, tree.size, tree.path(index))
                )


class HostTpm:
    """The verifier host's own TPM (:class:`verifier.common.tpm.Tpm` over a TCTI),
    one operation at a time in a worker thread.

    Args:
        tcti: e.g. ``device:/dev/tpmrm0`` or ``swtpm:host=127.0.0.1,port=P``.
        pcrs: the PCRs quoted for customers.
        ek_alg: ``rsa`` or ``ecc``.
        ak_alg: ``ecc`` or ``rsa``.
    """

    def __init__(
        self, tcti: str, pcrs: list[int], ek_alg: str = "rsa", ak_alg: str = "ecc"
    ) -> None:
        from verifier.common.tpm import Tpm  # the TPM layer the agents use
        from verifier.common.tpm_access import TpmAccess

        self.pcrs = sorted(set(pcrs))
        self._access = TpmAccess(lambda: Tpm(tcti, ek_alg, ak_alg), shared=False)

    async def quote(self, qualifying_data: bytes) -> Quote:
        """Quote :attr:`pcrs` over ``qualifying_data`` with the host's AK."""
        raw = await self._access.run(lambda t: t.quote(qualifying_data, self.pcrs))
        return Quote(raw.attest, raw.signature, dict(raw.pcr_values))

    async def identity(self) -> tuple[bytes, bytes, bytes | None]:
        """(AK TPM2B_PUBLIC, EK TPM2B_PUBLIC, DER EK certificate or None)."""
        return await self._access.run(
            lambda t: (t.ak_public(), t.ek_public(), t.ek_certificate())
        )

    async def activate(self, credential_blob: bytes, encrypted_secret: bytes) -> bytes:
        """TPM2_ActivateCredential: proves the AK and EK share this TPM.

        Raises:
            RequestError: ``activation_failed`` (400) if the TPM refuses.
        """
        from verifier.common.errors import TpmError

        try:
            return await self._access.run(
                lambda t: t.activate_credential(credential_blob, encrypted_secret)
            )
        except TpmError as exc:
            raise RequestError("activation_failed", str(exc))

    def close(self) -> None:
        self._access.close()
