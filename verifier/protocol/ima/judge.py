"""Judging IMA measurement-list entries against a runtime policy
(:class:`~verifier.protocol.ima.policy.RuntimePolicy`, full or a delta
composed with its base): which entries it does not allow, and why.

Most entries are files the policy lists with exactly the measured digest:
:func:`evaluate` accepts those with one dictionary look-up per table (a
full policy has one table; a delta has its own, then its base's, looked in
from the largest) and hands every other entry to :func:`_judge`, which
applies the union of the chain's digests, then excludes, keys and
``ima-buf`` allowances.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from verifier.protocol.errors import EvidenceError
from verifier.protocol.ima.keys import verify_ima_signature
from verifier.protocol.ima.log import ImaEntry
from verifier.protocol.ima.policy import (
    _NAMES,
    _TAGS,
    _ZERO20,
    Failure,
    RuntimePolicy,
    _as_tuple,
    _contains,
)
from verifier.protocol.ima.replay import BOOT_AGGREGATE

__all__ = ["check", "evaluate"]


def _judge(policy: RuntimePolicy, entry: ImaEntry, index: int) -> Failure | None:
    path = entry.path
    if entry.buffer is not None:
        return _judge_buffer(policy, entry, index)
    tag = _TAGS.get(entry.digest_algorithm)
    known = False
    for allow in policy._allows:  # a delta's own table, then its base's
        value = allow.get(path)
        if value is not None:
            known = True
            if tag is not None and _contains(value, tag + entry.digest):
                return None
    if entry.template_hash == _ZERO20:
        if index == 0 or policy.is_excluded(path):
            return None
        return Failure(index, path, "violation", "measurement violation logged")
    if index == 0 and path == BOOT_AGGREGATE:
        return None
    sig = entry.signature
    if (
        sig
        and policy._keys
        and verify_ima_signature(
            sig, entry.digest_algorithm, entry.digest, policy._keys
        )
    ):
        return None
    if policy.is_excluded(path):
        return None
    shown = f"{entry.digest_algorithm}:{entry.digest.hex()}"
    if sig and policy._keys:
        return Failure(index, path, "bad_signature", f"{shown} signature not valid")
    if known:
        return Failure(index, path, "digest_mismatch", f"{shown} not allowed")
    return Failure(index, path, "unknown_file", f"{shown} not in the policy")


def _judge_buffer(policy: RuntimePolicy, entry: ImaEntry, index: int) -> Failure | None:
    buffer = entry.buffer
    assert buffer is not None
    path = entry.path
    if hashlib.new(entry.digest_algorithm, buffer).digest() != entry.digest:
        return Failure(
            index, path, "buffer_digest_mismatch", "digest is not that of the buffer"
        )
    for table in policy._bufs:
        value = table.get(path)
        if value is not None:
            for tag in _as_tuple(value):
                if hashlib.new(_NAMES[tag[0]], buffer).digest() == tag[1:]:
                    return None
    if policy.is_excluded(path):
        return None
    return Failure(index, path, "buffer_not_allowed", "buffer not in the policy")


def evaluate(
    policy: RuntimePolicy, entries: Iterable[ImaEntry], first_index: int = 0
) -> list[Failure]:
    """Every entry of ``entries`` the policy does not allow.

    Args:
        policy: the runtime policy.
        entries: consecutive entries of the list.
        first_index: index of the first of ``entries`` in the list (entry 0,
            the boot aggregate, is checked by
            :func:`~verifier.protocol.ima.replay.check_boot_aggregate`).

    Returns:
        The failures, in list order (empty when all are allowed).
    """
    if policy._base is not None:
        return _evaluate_chain(policy, entries, first_index)
    failures = []
    allow = policy._allow
    tags = _TAGS
    index = first_index
    for entry in entries:
        value = allow.get(entry.path)
        if value is not None and entry.buffer is None:
            tag = tags.get(entry.digest_algorithm, b"")
            if value == tag + entry.digest:  # the common case, fast
                index += 1
                continue
        failure = _judge(policy, entry, index)
        if failure is not None:
            failures.append(failure)
        index += 1
    return failures


def _evaluate_chain(
    policy: RuntimePolicy, entries: Iterable[ImaEntry], first_index: int
) -> list[Failure]:
    """:func:`evaluate` of a delta: the fast path looks in each table of
    the chain, largest first (most entries are the base's: the union does
    not depend on the order), the rest is :func:`_judge`'s."""
    failures = []
    allows = sorted(policy._allows, key=len, reverse=True)
    tags = _TAGS
    index = first_index - 1
    for entry in entries:
        index += 1
        if entry.buffer is None:
            path = entry.path
            want = tags.get(entry.digest_algorithm, b"") + entry.digest
            for allow in allows:
                if allow.get(path) == want:  # the common case, fast
                    break
            else:
                failure = _judge(policy, entry, index)
                if failure is not None:
                    failures.append(failure)
            continue
        failure = _judge(policy, entry, index)
        if failure is not None:
            failures.append(failure)
    return failures


def check(
    policy: RuntimePolicy, entries: Iterable[ImaEntry], first_index: int = 0
) -> None:
    """Like :func:`evaluate` but raise on the first failure.

    Raises:
        EvidenceError: ``ima_policy`` naming the entry index, path and why.
    """
    failures = evaluate(policy, entries, first_index)
    if failures:
        f = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise EvidenceError(
            "ima_policy", f"entry {f.index} {f.path!r}: {f.reason}: {f.detail}{more}"
        )
