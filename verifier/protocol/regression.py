"""Key regression for lazy revocation (after Plutus, Kallahalla et al., FAST 2003).

A filegroup's key moves to a new *version* when a reader is revoked. Key
regression lets anyone who holds the newest version's *state* derive the
keys of every older version (so data written before the revocation stays
readable without re-encryption), while a state never yields a newer one
(so a revoked reader learns nothing written afterwards).

We use a hash chain generated backwards (Fu, Kamara and Kohno, NDSS 2006,
"KR-SHA"): the owner keeps a secret seed and a chain length ``N``;
``state(v) = H^(N - v)(seed)``, so ``state(v - 1) = H(state(v))``, and going
from ``state(v)`` to ``state(v + 1)`` means inverting SHA-256. The key of
version ``v`` is a separate hash of its state, so a key never reveals a state.

Lazy re-encryption: :class:`LazyFileGroup` stores which version each object
was written under; a write always uses the newest version, reads use the
object's own. Nothing is re-encrypted when a reader is revoked.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import os

from verifier.protocol.errors import EvidenceError, MalformedError

__all__ = [
    "KeyRegressionOwner",
    "LazyFileGroup",
    "ReaderState",
    "RegressionError",
]

STATE_BYTES = 32
DEFAULT_LENGTH = 4096


class RegressionError(EvidenceError):
    """A key that cannot or must not be derived.

    ``reason`` is ``future_version`` (the state is older than the key asked
    for: the holder was revoked before that version), ``exhausted`` (the
    chain is used up), or ``bad_state``.
    """


def _step(state: bytes) -> bytes:
    return hashlib.sha256(b"tc-kr-state" + state).digest()


def _key(state: bytes) -> bytes:
    return hashlib.sha256(b"tc-kr-key" + state).digest()


@dataclasses.dataclass(frozen=True)
class ReaderState:
    """What a reader holds: the state of ``version`` (secret).

    Attributes:
        group: the filegroup.
        version: the newest version this state opens.
        state: 32 bytes.
        check: ``H(state(0))``, published, to validate a state given to us.
    """

    group: str
    version: int
    state: bytes
    check: bytes

    def __post_init__(self) -> None:
        if len(self.state) != STATE_BYTES or self.version < 0:
            raise MalformedError("key regression state", "bad length or version")

    def key(self, version: int) -> bytes:
        """The key of ``version`` (``<= self.version``).

        Raises:
            RegressionError: ``future_version`` for a newer version.
        """
        if version > self.version:
            raise RegressionError(
                "future_version",
                f"state of version {self.version} cannot derive version {version}",
            )
        if version < 0:
            raise RegressionError("bad_state", "versions start at 0")
        state = self.state
        for _ in range(self.version - version):
            state = _step(state)
        return _key(state)

    def valid(self) -> bool:
        """Whether the state regresses to the published anchor."""
        state = self.state
        for _ in range(self.version):
            state = _step(state)
        return hmac.compare_digest(_step(state), self.check)


class KeyRegressionOwner:
    """The filegroup owner's side: the seed and the current version.

    Args:
        group: the filegroup id.
        seed: 32 secret bytes (random if None).
        length: how many versions the chain allows.
        version: the current version (e.g. restored from storage).
    """

    def __init__(
        self,
        group: str,
        seed: bytes | None = None,
        length: int = DEFAULT_LENGTH,
        version: int = 0,
    ) -> None:
        if length < 1 or not 0 <= version < length:
            raise ValueError("need 0 <= version < length")
        self.group = group
        self.length = length
        self.version = version
        self._seed = seed if seed is not None else os.urandom(STATE_BYTES)
        if len(self._seed) != STATE_BYTES:
            raise ValueError(f"seed must be {STATE_BYTES} bytes")
        self.check = _step(self._state(0))

    def _state(self, version: int) -> bytes:
        state = self._seed
        for _ in range(self.length - 1 - version):
            state = _step(state)
        return state

    def reader_state(self) -> ReaderState:
        """The state a current reader gets (opens every version so far)."""
        return ReaderState(
            self.group, self.version, self._state(self.version), self.check
        )

    def key(self, version: int | None = None) -> bytes:
        return _key(self._state(self.version if version is None else version))

    def wind(self) -> int:
        """Move to the next version (on a revocation); the new version.

        Raises:
            RegressionError: ``exhausted`` when the chain is used up.
        """
        if self.version + 1 >= self.length:
            raise RegressionError("exhausted", f"all {self.length} versions used")
        self.version += 1
        return self.version


class LazyFileGroup:
    """Objects of one filegroup and the key version each was written under.

    Pure bookkeeping: callers encrypt with :meth:`write_version`'s key and
    record it with :meth:`written`. A revocation winds the owner; objects keep
    their version until they are next written (lazy re-encryption).

    Attributes:
        versions: object id -> version it is encrypted under.
    """

    def __init__(self, owner: KeyRegressionOwner) -> None:
        self.owner = owner
        self.versions: dict[str, int] = {}

    def revoke(self) -> int:
        """A reader was revoked: new writes use a new version."""
        return self.owner.wind()

    def write_version(self) -> int:
        return self.owner.version

    def written(self, obj: str, version: int) -> None:
        self.versions[obj] = version

    def stale(self) -> list[str]:
        """Objects still under an older version (re-encrypted on next write)."""
        return sorted(o for o, v in self.versions.items() if v < self.owner.version)

    def histogram(self) -> dict[int, int]:
        return dict(collections.Counter(self.versions.values()))
