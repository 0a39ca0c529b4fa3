"""Serialised access to the TPM from the agent's event loop.

What the agent needs from a TPM is the :class:`TpmLike` protocol
(:class:`verifier.common.tpm.Tpm` on a real or software TPM; tests and the fleet
emulator pass software TPMs). :class:`TpmAccess` runs one operation at a
time in a worker thread, opening the TPM per operation when it is shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

__all__ = ["TpmAccess", "TpmLike"]

_T = TypeVar("_T")


class _QuoteLike(Protocol):
    @property
    def attest(self) -> bytes: ...

    @property
    def signature(self) -> bytes: ...

    @property
    def pcr_values(self) -> Mapping[int, bytes]: ...

    @property
    def bank_values(self) -> Mapping[str, Mapping[int, bytes]]: ...


class TpmLike(Protocol):
    """What the agent needs from a TPM (:class:`verifier.common.tpm.Tpm`)."""

    def ek_public(self) -> bytes: ...

    def ek_certificate(self) -> bytes | None: ...

    def ak_public(self) -> bytes: ...

    def activate_credential(
        self, credential_blob: bytes, encrypted_secret: bytes
    ) -> bytes: ...

    def quote(
        self, qualifying_data: bytes, pcrs: list[int], banks: tuple[str, ...] = ...
    ) -> _QuoteLike: ...

    def close(self) -> None: ...


class TpmAccess:
    """Serialised access to the TPM from the event loop.

    Calls run one at a time (an asyncio lock) in a worker thread. When
    ``shared`` the TPM is opened for each operation and closed after it,
    so that other local TPM users can get in between; otherwise one
    connection is kept until :meth:`close`.

    Args:
        factory: opens the TPM (e.g. ``lambda: Tpm(tcti, "rsa", "ecc")``).
        shared: open and close the TPM around each operation.
    """

    def __init__(self, factory: Callable[[], TpmLike], shared: bool = True) -> None:
        self._factory = factory
        self._shared = shared
        self._tpm: TpmLike | None = None
        self._lock = asyncio.Lock()

    def _call(self, operation: Callable[[TpmLike], _T]) -> _T:
        if self._shared:
            tpm = self._factory()
            try:
                return operation(tpm)
            finally:
                tpm.close()
        if self._tpm is None:
            self._tpm = self._factory()
        return operation(self._tpm)

    async def run(self, operation: Callable[[TpmLike], _T]) -> _T:
        """Run ``operation(tpm)`` in a thread, alone.

        Raises:
            TpmError: whatever the TPM raises.
        """
        async with self._lock:
            return await asyncio.to_thread(self._call, operation)

    def close(self) -> None:
        """Close the kept connection, if any."""
        tpm, self._tpm = self._tpm, None
        if tpm is not None:
            tpm.close()
