"""Runtime (IMA) and measured-boot policies: stored once, shared by nodes.

A policy is stored by the SHA-256 of its canonical JSON and named
``name`` at a ``version``; nodes reference it by digest, so a million-path
allowlist used by a thousand nodes exists once in the database and once in
memory (:meth:`PolicyStore.load` keeps one parsed object per digest).

A runtime policy may be a delta over a base of the same project and name
(``"base"``: the base's digest, :mod:`verifier.protocol.ima.policy`): it
stores only its additions, and its parsed object shares its base's tables,
so a base and any number of versions over it are stored and held once. A
base cannot be deleted while a delta of its project extends it. The
canonical body of a delta begins with ``{"base":"<digest>"`` (its keys are
sorted and no other field sorts before ``base``): the store finds a base's
deltas, and lists each delta's base, from that prefix, with no column of
its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer, load_only

from verifier.attest.quotas import Quotas
from verifier.db import Node, StoredPolicy
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import MalformedError
from verifier.protocol.ima import RuntimePolicy
from verifier.protocol.ima.policy import MAX_DELTA_DEPTH, MAX_VERSION, base_digest
from verifier.protocol.ima.signing import VerifyingKey
from verifier.protocol.mb import MeasuredBootPolicy

__all__ = ["KINDS", "MEASURED_BOOT", "RUNTIME", "PolicyStore", "canonical", "follows"]

RUNTIME = "runtime"
MEASURED_BOOT = "measured-boot"
KINDS = (RUNTIME, MEASURED_BOOT)
_COLUMN = {RUNTIME: Node.runtime_policy, MEASURED_BOOT: Node.mb_policy}
Parsed = RuntimePolicy | MeasuredBootPolicy
_VERSION = re.compile(r"[0-9]{1,10}")
_BASE_PREFIX = b'{"base":"'
_PREFIX_LEN = len(_BASE_PREFIX) + 64


def follows(ref: str) -> str | None:
    """The name a policy reference follows: a bare ``name`` follows (the
    newest version of that name is in force, now and whenever a newer one
    is added); ``name@version`` and a digest pin (None)."""
    if "@" in ref or (len(ref) == 64 and all(c in "0123456789abcdef" for c in ref)):
        return None
    return ref


def canonical(document: Mapping[str, Any]) -> bytes:
    """Sorted keys, no spaces, ASCII: the form digests and signatures cover."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("ascii")


def _parse(
    kind: str,
    document: object,
    max_entries: int,
    base: RuntimePolicy | None = None,
) -> tuple[Parsed, int]:
    """The parsed policy and its entries (a delta: its own paths)."""
    if not isinstance(document, dict):
        raise RequestError("bad_policy", "'policy' must be a JSON object")
    try:
        if kind == RUNTIME:
            runtime = RuntimePolicy.from_dict(document, max_entries, base)
            return runtime, runtime.own_paths
        mb = MeasuredBootPolicy.from_dict(document)
        digests = (mb.boot_applications or frozenset()) | (mb.firmware or frozenset())
        return mb, len(digests)
    except MalformedError as exc:
        raise RequestError("bad_policy", exc.detail) from None


def _check_min_dbx(policy: MeasuredBootPolicy, minimum: frozenset[str]) -> None:
    """A policy pinning the Secure Boot keys lists at least the operator's
    minimum dbx.

    Raises:
        RequestError: ``bad_policy`` naming what the dbx lacks.
    """
    chain = policy.chain
    if not minimum or chain is None or chain.pk is None:
        return
    if chain.dbx is None:
        raise RequestError(
            "bad_policy",
            f"dbx missing: this verifier requires a dbx at least as recent as "
            f"its minimum ({len(minimum)} entries)",
        )
    missing = sorted(minimum - chain.dbx)
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise RequestError(
            "bad_policy",
            f"dbx older than this verifier's minimum: lacks {len(missing)} of its "
            f"{len(minimum)} entries: {', '.join(missing[:3])}{more}",
        )


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise NotFoundError(
            "unknown_policy_kind", f"policy kind must be one of {', '.join(KINDS)}"
        )


def _base_ref(kind: str, document: object) -> str | None:
    """The digest a runtime delta names as its base (None: not a delta).

    Raises: RequestError ``bad_policy`` (a malformed ``"base"``)."""
    if kind != RUNTIME or not isinstance(document, dict):
        return None
    try:
        return base_digest(document)
    except MalformedError as exc:
        raise RequestError("bad_policy", exc.detail) from None


def _prefix_base(prefix: bytes | None) -> str | None:
    """The base digest at the start of a stored body (None: not a delta)."""
    if prefix is None or not bytes(prefix).startswith(_BASE_PREFIX):
        return None
    return bytes(prefix)[len(_BASE_PREFIX) : _PREFIX_LEN].decode("ascii")


def _unknown_base(ref: str) -> NotFoundError:
    return NotFoundError(
        "unknown_policy", f"no runtime policy {ref} (the base the delta names)"
    )


def _base_meta(meta: Mapping[str, Any] | None, ref: str) -> dict[str, Any]:
    if meta is None:  # cannot be while the delta is stored
        return {"name": None, "version": None, "digest": ref}
    return {"name": meta["name"], "version": meta["version"], "digest": ref}


def _added(row: StoredPolicy, base: RuntimePolicy | None) -> dict[str, Any]:
    """The metadata of a policy just stored (a runtime one's ``base``)."""
    meta = _meta(row)
    if row.kind == RUNTIME:
        meta["base"] = None
        if base is not None:
            meta["base"] = {
                "name": base.name,
                "version": base.version,
                "digest": base.digest.hex(),
            }
    return meta


def _meta(row: StoredPolicy) -> dict[str, Any]:
    return {
        "kind": row.kind,
        "name": row.name,
        "version": row.version,
        "digest": row.digest,
        "entries": row.entries,
        "signed": row.signature is not None,
        "created_at": row.created_at,
    }


class PolicyStore:
    """Add, list, resolve and load stored policies.

    Args:
        engine: the verifier database.
        signing_keys: when not empty, every upload must carry a detached
            signature (Ed25519, or ECDSA P-256/SHA-256) by one of them over
            the policy's canonical JSON.
        max_entries: refuse runtime policies with more entries.
        clock: wall clock.
        quotas: per-project limits of policies and their bytes.
        min_dbx: dbx entry keys (:mod:`verifier.protocol.mb.efisig`) a
            measured-boot policy that pins ``pk`` must list in its ``dbx``.
    """

    def __init__(
        self,
        engine: sa.Engine,
        signing_keys: Sequence[VerifyingKey] = (),
        max_entries: int = 5_000_000,
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
        min_dbx: frozenset[str] = frozenset(),
    ) -> None:
        self.engine = engine
        self._min_dbx = min_dbx
        self._quotas = quotas or Quotas()
        self._keys = tuple(signing_keys)
        self._max_entries = max_entries
        self._clock = clock
        self._cache: dict[str, Parsed] = {}
        #: (project, digest) -> (name, version): a stored row never changes
        self._names: dict[tuple[str, str], tuple[str, int]] = {}
        self._lock = threading.Lock()

    # -- API operations ----------------------------------------------------

    def add(
        self,
        kind: str,
        document: object,
        name: str | None = None,
        signature: bytes | None = None,
        project: str = "",
    ) -> tuple[dict[str, Any], bool]:
        """Store a policy owned by ``project`` (idempotent for identical
        content; other projects' policies are never seen or touched). A
        runtime policy with ``"base"`` is a delta over that policy of
        ``project``; its metadata names the base.

        Returns:
            (its metadata, True if it was new).

        Raises:
            RequestError: ``bad_policy`` (naming the problem),
                ``policy_signature`` (missing or not valid).
            NotFoundError: ``unknown_policy``: a delta over a base
                ``project`` does not store (naming the base's digest).
            ConflictError: ``policy_exists``: that name and version hold
                other content.
        """
        _check_kind(kind)
        ref = _base_ref(kind, document)
        base = None if ref is None else self._delta_base(ref, project)
        parsed, entries = _parse(kind, document, self._max_entries, base)
        if isinstance(parsed, MeasuredBootPolicy):
            _check_min_dbx(parsed, self._min_dbx)
        name, body, version = self._identify(parsed, name)
        self._check_signature(body, signature)
        digest = hashlib.sha256(body).hexdigest()
        with self._quotas.lock, Session(self.engine) as session, session.begin():
            if ref is not None:  # still there (and kept, where rows lock)
                self._base_row(session, ref, project, lock=True)
            old = session.get(StoredPolicy, (project, digest))
            if old is not None and old.kind == kind and old.name == name:
                return _added(old, base), False
            if version is None:
                version = self._next_version(session, project, kind, name)
            if project:
                self._check_quotas(session, project, len(body))
            row = StoredPolicy(
                project_id=project,
                digest=digest,
                kind=kind,
                name=name,
                version=version,
                body=body,
                signature=signature,
                entries=entries,
                created_at=self._clock(),
            )
            session.add(row)
            try:
                session.flush()
            except IntegrityError:
                raise ConflictError(
                    "policy_exists",
                    f"{kind} policy {name!r} version {version} already exists "
                    "with other content (or this content under another name)",
                )
            meta = _added(row, base)
        with self._lock:  # nodes may already share an object of this digest
            self._cache.setdefault(digest, parsed)
        return meta, True

    def candidate(self, document: object, project: str = "") -> RuntimePolicy:
        """The runtime policy ``document`` would be once stored by
        :meth:`add` for ``project`` -- parsed, and a delta composed with its
        base among ``project``'s runtime policies -- without storing it (no
        signature asked: nothing is stored). Its ``digest`` is the one
        :meth:`add` would give it.

        Raises:
            RequestError: ``bad_policy`` (naming the problem).
            NotFoundError: ``unknown_policy``: a delta over a base
                ``project`` does not store (naming the base's digest).
        """
        ref = _base_ref(RUNTIME, document)
        base = None if ref is None else self._delta_base(ref, project)
        parsed, _ = _parse(RUNTIME, document, self._max_entries, base)
        assert isinstance(parsed, RuntimePolicy)
        return parsed

    @staticmethod
    def _base_row(session: Session, ref: str, project: str, lock: bool = False) -> None:
        """Raises: NotFoundError unless ``project`` stores runtime policy
        ``ref`` (locked for the transaction with ``lock``)."""
        query = sa.select(StoredPolicy.digest).where(
            StoredPolicy.project_id == project,
            StoredPolicy.kind == RUNTIME,
            StoredPolicy.digest == ref,
        )
        if session.scalar(query.with_for_update() if lock else query) is None:
            raise _unknown_base(ref)

    def _delta_base(self, ref: str, project: str) -> RuntimePolicy:
        """The base a delta names, among ``project``'s runtime policies.

        Raises: NotFoundError ``unknown_policy`` naming it (also when only
        another project stores it)."""
        with Session(self.engine) as session:
            self._base_row(session, ref, project)
        base = self.load(ref)
        if not isinstance(base, RuntimePolicy):
            raise _unknown_base(ref)
        return base

    @staticmethod
    def _identify(parsed: Parsed, name: str | None) -> tuple[str, bytes, int | None]:
        """The name, canonical body and version of a policy to store.

        A runtime policy names and versions itself (``name``, if given, must
        agree); a measured-boot policy takes ``name`` and gets its version
        when stored (None here).

        Raises:
            RequestError: ``bad_policy`` (the names differ) or ``bad_field``
                (no usable ``name`` for a measured-boot policy).
        """
        if isinstance(parsed, RuntimePolicy):
            if name is not None and name != parsed.name:
                raise RequestError(
                    "bad_policy", f"'name' {name!r} differs from the policy's name"
                )
            return parsed.name, parsed.canonical_json(), parsed.version
        if not isinstance(name, str) or not 0 < len(name) <= 255:
            raise RequestError(
                "bad_field", "'name' must be a string of 1-255 characters"
            )
        return name, canonical(parsed.to_dict()), None

    @staticmethod
    def _next_version(session: Session, project: str, kind: str, name: str) -> int:
        """One more than the highest version ``project`` stores of ``name``."""
        top = session.scalar(
            sa.select(sa.func.max(StoredPolicy.version)).where(
                StoredPolicy.project_id == project,
                StoredPolicy.kind == kind,
                StoredPolicy.name == name,
            )
        )
        return (top or 0) + 1

    def _check_quotas(self, session: Session, project: str, size: int) -> None:
        count, used = session.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(sa.func.length(StoredPolicy.body)), 0),
            ).where(StoredPolicy.project_id == project)
        ).one()
        self._quotas.check("policies", count, project=project)
        self._quotas.check("policy_bytes", used, size, project)

    def _check_signature(self, body: bytes, signature: bytes | None) -> None:
        if not self._keys:
            return
        if signature is None:
            raise RequestError(
                "policy_signature", "this verifier accepts signed policies only"
            )
        for key in self._keys:
            try:
                if isinstance(key, ed25519.Ed25519PublicKey):
                    key.verify(signature, body)
                else:
                    key.verify(signature, body, ec.ECDSA(hashes.SHA256()))
                return
            except InvalidSignature:
                continue
        raise RequestError(
            "policy_signature", "the signature is not valid for any trusted key"
        )

    def list(self, kind: str, scope: str | None = None) -> list[dict[str, Any]]:
        """The policies of ``kind`` of project ``scope`` (None: all)."""
        _check_kind(kind)
        prefix = sa.func.substr(StoredPolicy.body, 1, _PREFIX_LEN)
        query = (
            sa.select(StoredPolicy, prefix)
            .options(defer(StoredPolicy.body))
            .where(StoredPolicy.kind == kind)
        )
        if scope is not None:
            query = query.where(StoredPolicy.project_id == scope)
        with Session(self.engine) as session:
            rows = session.execute(
                query.order_by(StoredPolicy.name, StoredPolicy.version)
            ).all()
            metas = {(r.project_id, r.digest): _meta(r) for r, _ in rows}
            out = []
            for row, head in rows:
                meta = metas[row.project_id, row.digest]
                if kind == RUNTIME:
                    ref = _prefix_base(head)
                    meta["base"] = None
                    if ref is not None:
                        of = metas.get((row.project_id, ref))
                        meta["base"] = _base_meta(of, ref)
                out.append(meta)
            return out

    def _row(
        self,
        session: Session,
        kind: str,
        ref: str,
        scope: str | None,
        digest_only: bool = False,
    ) -> StoredPolicy:
        """``ref`` is ``name`` (newest version), ``name@version`` or a
        digest, among the policies of project ``scope`` (None: all). Its
        body (megabytes for a large allowlist) is read only when used, and
        with ``digest_only`` nothing but the key is read: every enrolment
        resolves its policy reference, and a database that stores the body
        inline (SQLite) walks all of it to reach the columns after it."""
        only = (StoredPolicy.project_id, StoredPolicy.digest)
        query = (
            sa.select(StoredPolicy)
            .options(load_only(*only) if digest_only else defer(StoredPolicy.body))
            .where(StoredPolicy.kind == kind)
        )
        if scope is not None:
            query = query.where(StoredPolicy.project_id == scope)
        name, at, version = ref.rpartition("@") if "@" in ref else (ref, "", "")
        if at:
            # ASCII digits only (str.isdigit also takes "²"), and a version
            # a stored policy can have: the database column is 64-bit
            if not _VERSION.fullmatch(version) or int(version) > MAX_VERSION:
                raise RequestError(
                    "bad_field",
                    f"bad policy version in {ref[:200]!r}: "
                    f"an integer from 0 to {MAX_VERSION}",
                )
            query = query.where(
                StoredPolicy.name == name, StoredPolicy.version == int(version)
            )
        elif len(ref) == 64 and all(c in "0123456789abcdef" for c in ref):
            query = query.where(StoredPolicy.digest == ref)
        else:
            query = query.where(StoredPolicy.name == ref).order_by(
                StoredPolicy.version.desc()
            )
        row = session.scalars(query.limit(1)).first()
        if row is None:
            raise NotFoundError("unknown_policy", f"no {kind} policy {ref!r}")
        return row

    def get(self, kind: str, ref: str, scope: str | None = None) -> dict[str, Any]:
        """Metadata plus the policy document.

        Raises: NotFoundError (also for another project's policy).
        """
        _check_kind(kind)
        with Session(self.engine) as session:
            row = self._row(session, kind, ref, scope)
            meta = _meta(row)
            meta["policy"] = json.loads(row.body)
            if kind == RUNTIME:
                base = _prefix_base(row.body[:_PREFIX_LEN])
                meta["base"] = None
                if base is not None:
                    of = session.get(StoredPolicy, (row.project_id, base))
                    meta["base"] = _base_meta(None if of is None else _meta(of), base)
            if row.signature is not None:
                meta["signature"] = base64.b64encode(row.signature).decode()
            return meta

    def resolve(self, kind: str, ref: str, project: str) -> str:
        """The digest ``ref`` names among ``project``'s policies (see
        :meth:`get`). Raises: NotFoundError."""
        _check_kind(kind)
        with Session(self.engine) as session:
            return self._row(session, kind, ref, project, digest_only=True).digest

    def names(
        self, pairs: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, int]]:
        """The name and version of each stored policy ``(project, digest)``
        of ``pairs`` (blocking; cached: a stored policy never changes)."""
        wanted = set(pairs)
        missing = [pair for pair in wanted if pair not in self._names]
        if missing:
            digests = {digest for _, digest in missing}
            query = sa.select(
                StoredPolicy.project_id,
                StoredPolicy.digest,
                StoredPolicy.name,
                StoredPolicy.version,
            ).where(StoredPolicy.digest.in_(digests))
            with Session(self.engine) as session:
                found = {(p, d): (n, v) for p, d, n, v in session.execute(query)}
            with self._lock:
                self._names.update(found)
        known = self._names
        return {pair: known[pair] for pair in wanted if pair in known}

    def newest(
        self, kind: str, name: str, project: str, session: Session | None = None
    ) -> tuple[str, int]:
        """The digest and version of the newest ``kind`` policy ``name`` of
        ``project`` (read in the caller's ``session`` if given).

        Raises: NotFoundError."""
        _check_kind(kind)
        if session is not None:
            row = self._row(session, kind, name, project, digest_only=False)
            return row.digest, row.version
        with Session(self.engine) as own:
            row = self._row(own, kind, name, project)
            return row.digest, row.version

    def delete(self, kind: str, ref: str, scope: str | None = None) -> None:
        """Delete a policy of project ``scope`` (None: any).

        Raises: NotFoundError; ConflictError ``policy_in_use``.
        """
        _check_kind(kind)
        with Session(self.engine) as session, session.begin():
            row = self._row(session, kind, ref, scope)
            users = session.scalar(
                sa.select(sa.func.count())
                .select_from(Node)
                .where(_COLUMN[kind] == row.digest, Node.project_id == row.project_id)
            )
            if users:
                raise ConflictError(
                    "policy_in_use",
                    f"{kind} policy {row.name!r} version {row.version} is used "
                    f"by {users} node(s)",
                )
            if kind == RUNTIME:
                self._check_no_delta(session, row)
            session.delete(row)
            with self._lock:
                self._names.pop((row.project_id, row.digest), None)
            shared = session.scalar(
                sa.select(sa.func.count())
                .select_from(StoredPolicy)
                .where(StoredPolicy.digest == row.digest)
            )
        if not shared:
            with self._lock:
                self._cache.pop(row.digest, None)

    @staticmethod
    def _check_no_delta(session: Session, row: StoredPolicy) -> None:
        """Raises: ConflictError ``policy_in_use`` naming a delta of
        ``row``'s project that extends it (deltas keep their base's name)."""
        prefix = _BASE_PREFIX + row.digest.encode("ascii") + b'"'
        delta = session.scalars(
            sa.select(StoredPolicy)
            .options(load_only(StoredPolicy.version, StoredPolicy.digest))
            .where(
                StoredPolicy.project_id == row.project_id,
                StoredPolicy.kind == RUNTIME,
                StoredPolicy.name == row.name,
                sa.func.substr(StoredPolicy.body, 1, len(prefix)) == prefix,
            )
            .limit(1)
        ).first()
        if delta is not None:
            raise ConflictError(
                "policy_in_use",
                f"runtime policy {row.name!r} version {row.version} is the base "
                f"of version {delta.version} (digest {delta.digest}): delete "
                "that delta first",
            )

    # -- the attestation side -------------------------------------------------

    def load(self, digest: str) -> Parsed:
        """The parsed policy, one shared object per digest (blocking: call
        from a thread when it may not be cached yet).

        A delta is composed with its base, loaded the same way (one base
        object shared by all its deltas).

        Raises: NotFoundError (deleted meanwhile).
        """
        return self._load(digest, 0)

    def _load(self, digest: str, depth: int) -> Parsed:
        parsed = self._cache.get(digest)
        if parsed is not None:
            return parsed
        with Session(self.engine) as session:
            row = session.scalars(
                sa.select(StoredPolicy).where(StoredPolicy.digest == digest).limit(1)
            ).first()
            if row is None:
                raise NotFoundError("unknown_policy", f"no policy {digest}")
            kind, body = row.kind, row.body
        document = json.loads(body)
        ref, base = _base_ref(kind, document), None
        if ref is not None:
            if depth >= MAX_DELTA_DEPTH:
                raise RequestError("bad_policy", f"policy {digest}: too many deltas")
            loaded = self._load(ref, depth + 1)
            if not isinstance(loaded, RuntimePolicy):
                raise _unknown_base(ref)
            base = loaded
        parsed, _ = _parse(kind, document, self._max_entries, base)
        with self._lock:
            return self._cache.setdefault(digest, parsed)

    def resolve_pair(
        self, runtime: str | None, mb: str | None, project: str = ""
    ) -> tuple[str | None, str | None]:
        """Resolve and load an enrolment's runtime and measured-boot policy
        references (either may be None) among ``project``'s policies.

        Raises: NotFoundError (also for another project's policy).
        """
        out: list[str | None] = []
        for kind, ref in ((RUNTIME, runtime), (MEASURED_BOOT, mb)):
            digest = None if ref is None else self.resolve(kind, ref, project)
            if digest is not None:
                self.load(digest)
            out.append(digest)
        return out[0], out[1]

    def load_many(self, digests: Iterable[str]) -> None:
        """Load the policies of ``digests`` (blocking)."""
        for digest in set(digests):
            self.load(digest)

    def preload(self, rows: Iterable[Node]) -> None:
        """Load the policies ``rows`` reference (blocking)."""
        for row in rows:
            for digest in (row.runtime_policy, row.mb_policy):
                if digest is not None:
                    self.load(digest)

    def cached(self, digest: str) -> Parsed:
        """The parsed policy, which :meth:`load` must have loaded."""
        return self._cache[digest]
