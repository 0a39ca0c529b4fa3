"""IMA runtime policies (judged against a measurement list by
:mod:`verifier.protocol.ima.judge`).

A :class:`RuntimePolicy` is named and versioned, immutable and compared and
hashed by the SHA-256 of its canonical JSON (:attr:`RuntimePolicy.digest`),
so one object can be shared by every node that uses it. It holds:

* an allowlist: path -> allowed ``(algorithm, digest)`` pairs (any number of
  algorithms per path);
* excludes: regular expressions (matched with :func:`re.match`, i.e.
  anchored at the start of the path) whose paths are not checked;
* IMA keys: public keys (RSA or ECDSA) that may sign files (``ima-sig``
  signatures, format v2 of ``signature_v2_hdr`` in
  ``security/integrity/integrity.h``: type 0x03, version 0x02, hash
  algorithm, big-endian 4-byte key id, big-endian u16 size, signature over
  the file digest);
* ``ima-buf`` allowances: event name -> allowed buffer digests.

JSON form::

    {"name": "web", "version": 3,
     "digests": {"/usr/bin/true": ["sha256:<hex>", "sha1:<hex>"]},
     "excludes": ["/tmp/.*"],
     "keys": [{"public_key": "<base64 DER SubjectPublicKeyInfo>",
               "keyid": "<8 hex, optional>"}],
     "ima_buf": {"kexec-cmdline": ["sha256:<hex>"]}}

A *delta* is the same document with one more field, ``"base"``: the
digest (64 lowercase hex) of the policy it extends, which has the same name
and a lower version. Its digests, excludes, keys and ima-buf allowances are
additions: the composed policy allows, per path, the union of the digests
its chain allows, and any exclude, key or buffer of any link. A delta can
remove nothing. Its digest and signature cover its own document, ``"base"``
included, so a signature over a delta also names the base it extends. The
composed object keeps the delta's own small tables and references its
base's (never copied): every node of every version shares one base.

Tenants' regular expressions are trusted to be reasonable (Python's engine
backtracks); the verifier should accept policies only from tenants.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from verifier.protocol.errors import MalformedError
from verifier.protocol.ima.keys import ImaKey, verify_ima_signature
from verifier.protocol.ima.log import DIGEST_SIZES

__all__ = [
    "MAX_DELTA_DEPTH",
    "MAX_VERSION",
    "DEFAULT_MAX_ENTRIES",
    "Failure",
    "ImaKey",
    "RuntimePolicy",
    "base_digest",
    "canonical_document",
    "verify_ima_signature",
]

DEFAULT_MAX_ENTRIES = 5_000_000
#: The largest policy version (a signed 32-bit value: every database holds it).
MAX_VERSION = 2**31 - 1
#: The longest chain of deltas over a full policy.
MAX_DELTA_DEPTH = 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FIELDS = frozenset(("name", "version", "digests", "excludes", "keys", "ima_buf"))
_STRUCT = "IMA runtime policy"
_TAGS = {name: bytes([i + 1]) for i, name in enumerate(sorted(DIGEST_SIZES))}
_NAMES = {tag[0]: name for name, tag in _TAGS.items()}
_ZERO20 = bytes(20)
_Table = dict[str, bytes | tuple[bytes, ...]]


def _bad(detail: str) -> MalformedError:
    return MalformedError(_STRUCT, detail)


def _parse_digest(value: Any, where: str) -> bytes:
    """``"alg:hex"`` -> tag byte || digest."""
    if not isinstance(value, str):
        raise _bad(f"{where}: digest must be a string")
    algo, _, hexdigest = value.partition(":")
    tag = _TAGS.get(algo)
    try:
        digest = bytes.fromhex(hexdigest)
    except ValueError:
        raise _bad(f"{where}: digest is not hex") from None
    if tag is None or DIGEST_SIZES[algo] != len(digest):
        raise _bad(f"{where}: bad digest {value[:80]!r}")
    return tag + digest


def _show_digest(tagged: bytes) -> str:
    return f"{_NAMES[tagged[0]]}:{tagged[1:].hex()}"


def _pack(tags: Iterable[bytes]) -> bytes | tuple[bytes, ...]:
    unique = tuple(sorted(set(tags)))
    return unique[0] if len(unique) == 1 else unique


def _contains(value: bytes | tuple[bytes, ...], tag: bytes) -> bool:
    return value == tag or (type(value) is tuple and tag in value)


def _as_tuple(value: bytes | tuple[bytes, ...]) -> tuple[bytes, ...]:
    return value if isinstance(value, tuple) else (value,)


def _canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("ascii")


def base_digest(data: Any) -> str | None:
    """The ``"base"`` a policy document names (None: a full policy).

    Raises:
        MalformedError: not an object, or a ``"base"`` that is not 64
            lowercase hex digits.
    """
    if not isinstance(data, dict):
        raise _bad("policy must be an object")
    if "base" not in data:
        return None
    ref = data["base"]
    if not isinstance(ref, str) or not _HEX64.fullmatch(ref):
        raise _bad("'base' must be the base policy's digest: 64 lowercase hex digits")
    return ref


def canonical_document(data: Any, max_entries: int = DEFAULT_MAX_ENTRIES) -> bytes:
    """The canonical JSON of a policy document, full or delta: what the
    verifier stores and digests and what signatures cover. A delta's own
    content is checked and its ``"base"`` kept as given (the base itself is
    not needed).

    Raises:
        MalformedError: as :meth:`RuntimePolicy.from_dict`.
    """
    ref = base_digest(data)
    if ref is None:
        return RuntimePolicy.from_dict(data, max_entries).canonical_json()
    own = RuntimePolicy.from_dict(
        {k: v for k, v in data.items() if k != "base"}, max_entries
    ).to_dict()
    own["base"] = ref
    return _canonical(own)


def _count(mapping: Mapping[Any, Any]) -> int:
    return sum(len(v) if isinstance(v, list | tuple) else 1 for v in mapping.values())


class RuntimePolicy:
    """An immutable IMA runtime policy (full, or a delta composed with its
    base); see the module doc.

    Args:
        name: the policy's name.
        version: its version (a non-negative integer).
        allowlist: path -> allowed ``(algorithm, digest)`` pairs.
        excludes: regular expressions of paths not checked.
        keys: keys whose file signatures are accepted.
        ima_buf: ``ima-buf`` event name -> allowed ``(algorithm, digest)``
            of the buffer.

    Raises:
        MalformedError: an invalid regular expression (naming it), an
            unknown algorithm or a digest of the wrong size.
    """

    __slots__ = (
        "_allow",
        "_allows",
        "_base",
        "_buf",
        "_bufs",
        "_digest",
        "_excl",
        "_excl_src",
        "_keys",
        "_size",
        "_total",
        "name",
        "version",
    )

    name: str
    version: int
    # this document's own tables; _allows and _bufs: the chain's, own first
    _allow: dict[str, bytes | tuple[bytes, ...]]
    _buf: dict[str, bytes | tuple[bytes, ...]]
    _allows: tuple[_Table, ...]
    _bufs: tuple[_Table, ...]
    _base: RuntimePolicy | None
    _keys: tuple[ImaKey, ...]  # the base's, then this document's
    _excl_src: tuple[str, ...]  # this document's
    _excl: re.Pattern[str] | tuple[re.Pattern[str], ...] | None
    _digest: bytes | None
    _size: int  # paths of the composed allowlist
    _total: int  # entries of the chain (for max_entries)

    def __init__(
        self,
        name: str,
        version: int,
        allowlist: Mapping[str, Iterable[tuple[str, bytes]]] | None = None,
        excludes: Sequence[str] = (),
        keys: Sequence[ImaKey] = (),
        ima_buf: Mapping[str, Iterable[tuple[str, bytes]]] | None = None,
    ) -> None:
        def tags(pairs: Iterable[tuple[str, bytes]], where: str) -> Any:
            out = []
            for algo, digest in pairs:
                if DIGEST_SIZES.get(algo) != len(digest):
                    raise _bad(f"{where}: bad {algo!r} digest")
                out.append(_TAGS[algo] + digest)
            if not out:
                raise _bad(f"{where}: no digests")
            return _pack(out)

        allow = {p: tags(v, p) for p, v in (allowlist or {}).items()}
        buf = {p: tags(v, p) for p, v in (ima_buf or {}).items()}
        total = _count(allow) + _count(buf) + len(excludes) + len(keys)
        self._init(name, version, allow, excludes, tuple(keys), buf, total, None)

    def _init(
        self,
        name: str,
        version: int,
        allow: dict[str, bytes | tuple[bytes, ...]],
        excludes: Sequence[str],
        keys: tuple[ImaKey, ...],
        buf: dict[str, bytes | tuple[bytes, ...]],
        total: int,
        base: RuntimePolicy | None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise _bad("name must be a non-empty string")
        if type(version) is not int or not 0 <= version <= MAX_VERSION:
            raise _bad(f"version must be an integer from 0 to {MAX_VERSION}")
        for pattern in excludes:
            if not isinstance(pattern, str):
                raise _bad("excludes must be strings")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _bad(f"invalid exclude regex {pattern!r}: {exc}") from None
        allows: tuple[_Table, ...] = (allow,)
        bufs: tuple[_Table, ...] = (buf,)
        size, all_excl = len(allow), tuple(excludes)
        if base is not None:
            _check_base(name, version, base)
            allows, bufs = (allow, *base._allows), (buf, *base._bufs)
            size = base._size + sum(
                1 for p in allow if all(p not in t for t in base._allows)
            )
            all_excl, keys = base.excludes + all_excl, base._keys + keys
            total += base._total
        for attr, value in (
            ("name", name),
            ("version", version),
            ("_allow", allow),
            ("_allows", allows),
            ("_base", base),
            ("_buf", buf),
            ("_bufs", bufs),
            ("_keys", keys),
            ("_excl_src", tuple(excludes)),
            ("_excl", _compile(all_excl)),
            ("_digest", None),
            ("_size", size),
            ("_total", total),
        ):
            object.__setattr__(self, attr, value)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError("RuntimePolicy is immutable")

    @classmethod
    def from_dict(
        cls,
        data: Any,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        base: RuntimePolicy | None = None,
    ) -> RuntimePolicy:
        """Build a policy from its (already parsed) JSON form.

        Args:
            data: the JSON object (see the module doc).
            max_entries: refuse a policy with more digests, excludes, keys
                and ima-buf digests than this in total (a delta: with its
                base's chain); the caller should also bound the JSON
                document's size before parsing it.
            base: the policy a delta's ``"base"`` names (None for a full
                policy). The result shares its tables.

        Raises:
            MalformedError: on any deviation from the JSON form, a policy
                over ``max_entries``, a delta without its base or with
                another, of another name, of a version not above its
                base's, or deeper than :data:`MAX_DELTA_DEPTH`.
        """
        ref = base_digest(data)
        unknown = set(data) - _FIELDS - {"base"}
        if unknown:
            raise _bad(f"unknown fields {sorted(unknown)}")
        if ref is None and base is not None:
            raise _bad("not a delta: the policy names no base")
        if ref is not None and base is None:
            raise _bad(f"a delta needs its base policy {ref}")
        if base is not None and ref != base.digest.hex():
            raise _bad(f"base {ref} is not the given base {base.digest.hex()}")
        digests = data.get("digests", {})
        excludes = data.get("excludes", [])
        keys = data.get("keys", [])
        buf = data.get("ima_buf", {})
        if not (isinstance(digests, dict) and isinstance(buf, dict)):
            raise _bad("digests and ima_buf must be objects")
        if not (isinstance(excludes, list) and isinstance(keys, list)):
            raise _bad("excludes and keys must be lists")
        total = len(excludes) + len(keys) + _count(digests) + _count(buf)
        inherited = 0 if base is None else base._total
        if total + inherited > max_entries:
            more = f" (and {inherited} in its base)" if inherited else ""
            raise _bad(f"{total} entries{more}, more than the limit of {max_entries}")

        def load(mapping: dict[Any, Any]) -> dict[str, bytes | tuple[bytes, ...]]:
            out: dict[str, bytes | tuple[bytes, ...]] = {}
            for path, values in mapping.items():
                if not isinstance(values, list) or not values:
                    raise _bad(f"{path}: expected a non-empty list of digests")
                out[path] = _pack(_parse_digest(v, path) for v in values)
            return out

        policy = cls.__new__(cls)
        policy._init(
            data.get("name"),
            data.get("version"),
            load(digests),
            excludes,
            tuple(ImaKey.from_dict(k) for k in keys),
            load(buf),
            total,
            base,
        )
        return policy

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of this document (a delta: its own additions and
        its ``"base"``; digest lists sorted)."""
        out = {
            "name": self.name,
            "version": self.version,
            "digests": {
                p: [_show_digest(t) for t in _as_tuple(v)]
                for p, v in self._allow.items()
            },
            "excludes": list(self._excl_src),
            "keys": [k.to_dict() for k in self._own_keys()],
            "ima_buf": {
                p: [_show_digest(t) for t in _as_tuple(v)] for p, v in self._buf.items()
            },
        }
        if self._base is not None:
            out["base"] = self._base.digest.hex()
        return out

    def _own_keys(self) -> tuple[ImaKey, ...]:
        return self._keys[len(self._base._keys) :] if self._base else self._keys

    def canonical_json(self) -> bytes:
        """The signed form: JSON with sorted keys, no spaces, ASCII only."""
        return _canonical(self.to_dict())

    @property
    def digest(self) -> bytes:
        """SHA-256 of :meth:`canonical_json` (computed once, on demand)."""
        if self._digest is None:
            object.__setattr__(
                self, "_digest", hashlib.sha256(self.canonical_json()).digest()
            )
        assert self._digest is not None
        return self._digest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RuntimePolicy):
            return NotImplemented
        return self is other or self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __len__(self) -> int:
        """The paths the policy allows (a delta: with its base's)."""
        return self._size

    def __repr__(self) -> str:
        over = "" if self._base is None else f", delta over v{self._base.version}"
        return (
            f"RuntimePolicy({self.name!r}, version={self.version}, "
            f"{len(self)} paths{over})"
        )

    @property
    def base(self) -> RuntimePolicy | None:
        """The policy this delta extends (None: a full policy)."""
        return self._base

    @property
    def own_paths(self) -> int:
        """The paths this document lists itself (a delta: its additions)."""
        return len(self._allow)

    @property
    def keys(self) -> tuple[ImaKey, ...]:
        """The keys whose file signatures are accepted."""
        return self._keys

    @property
    def excludes(self) -> tuple[str, ...]:
        """The exclude patterns, as given (a delta: its base's first)."""
        if self._base is None:
            return self._excl_src
        return self._base.excludes + self._excl_src

    def allowed(self, path: str) -> frozenset[tuple[str, bytes]]:
        """The ``(algorithm, digest)`` pairs allowed for ``path``."""
        return frozenset(
            (_NAMES[t[0]], t[1:])
            for allow in self._allows
            for t in _as_tuple(allow.get(path, ()))
        )

    def is_excluded(self, path: str) -> bool:
        """Whether an exclude pattern matches ``path`` (at its start)."""
        excl = self._excl
        if excl is None:
            return False
        if isinstance(excl, tuple):
            return any(p.match(path) for p in excl)
        return excl.match(path) is not None


def _check_base(name: str, version: int, base: RuntimePolicy) -> None:
    if name != base.name:
        raise _bad(f"a delta's name {name!r} differs from its base's {base.name!r}")
    if version <= base.version:
        raise _bad(
            f"a delta's version {version} is not greater than its base's {base.version}"
        )
    if len(base._allows) > MAX_DELTA_DEPTH:
        raise _bad(f"more than {MAX_DELTA_DEPTH} deltas over a full policy")


def _compile(
    excludes: tuple[str, ...],
) -> re.Pattern[str] | tuple[re.Pattern[str], ...] | None:
    """One pattern of all (or each apart when they cannot be joined, e.g.
    the same group name in two); each was checked on its own already."""
    if not excludes:
        return None
    try:
        return re.compile("|".join(f"(?:{p})" for p in excludes))
    except re.error:
        return tuple(re.compile(p) for p in excludes)


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """An entry the policy does not allow.

    Attributes:
        index: the entry's index in the measurement list.
        path: its path (or ima-buf event name).
        reason: ``unknown_file``, ``digest_mismatch``, ``bad_signature``,
            ``buffer_not_allowed``, ``buffer_digest_mismatch`` or
            ``violation``.
        detail: a human-readable explanation.
    """

    index: int
    path: str
    reason: str
    detail: str
