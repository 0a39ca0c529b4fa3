"""Build runtime policies from a known-good node.

Pure: the caller reads the measurement list or walks the file tree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from verifier.protocol.ima.keys import ImaKey
from verifier.protocol.ima.log import ImaEntry
from verifier.protocol.ima.policy import RuntimePolicy
from verifier.protocol.ima.replay import BOOT_AGGREGATE

__all__ = ["policy_from_files", "policy_from_log"]


def policy_from_log(
    entries: Iterable[ImaEntry],
    name: str,
    version: int,
    excludes: Sequence[str] = (),
    keys: Sequence[ImaKey] = (),
) -> RuntimePolicy:
    """An allowlist of every file and ima-buf buffer measured in ``entries``.

    Violations and the boot aggregate are left out.
    """
    allow: dict[str, set[tuple[str, bytes]]] = {}
    buf: dict[str, set[tuple[str, bytes]]] = {}
    for entry in entries:
        if entry.is_violation or entry.path == BOOT_AGGREGATE:
            continue
        target = allow if entry.buffer is None else buf
        target.setdefault(entry.path, set()).add((entry.digest_algorithm, entry.digest))
    return RuntimePolicy(name, version, allow, excludes, keys, buf)


def policy_from_files(
    files: Iterable[tuple[str, bytes]],
    name: str,
    version: int,
    algorithms: Sequence[str] = ("sha256",),
    excludes: Sequence[str] = (),
    keys: Sequence[ImaKey] = (),
) -> RuntimePolicy:
    """An allowlist of ``(path, content)`` pairs, hashed with ``algorithms``."""
    allow: dict[str, set[tuple[str, bytes]]] = {}
    for path, content in files:
        digests = allow.setdefault(path, set())
        for algo in algorithms:
            digests.add((algo, hashlib.new(algo, content).digest()))
    return RuntimePolicy(name, version, allow, excludes, keys)
