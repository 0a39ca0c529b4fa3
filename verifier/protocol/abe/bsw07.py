"""BSW07 ciphertext-policy attribute-based encryption over BLS12-381.

Bethencourt, Sahai and Waters, "Ciphertext-Policy Attribute-Based
Encryption", IEEE S&P 2007, instantiated on the asymmetric (type-3)
pairing of BLS12-381 (about 120-bit security) through pymcl (mcl).

Placement of elements (``H`` hashes an attribute's canonical encoding to
G1 with a domain separation tag; ``g1``, ``g2`` are the standard
generators)::

    Setup:    alpha, beta <- Fr
              PP  = (h = g1^beta, Y = e(g1, g2)^alpha)
              MSK = (alpha, beta)
    KeyGen:   r <- Fr;  D = g2^((alpha + r) / beta)
              per attribute j: r_j <- Fr
                  D_j = g1^r * H(j)^r_j  (G1),  D'_j = g2^r_j  (G2)
    Encrypt:  s <- Fr; share s over the policy tree (Shamir at each
              threshold gate, additive shares at "and" gates)
              C = h^s (G1); per leaf y with share q_y:
                  C_y = g2^q_y (G2),  C'_y = H(att(y))^q_y (G1)
              key Y^s (KEM), or C~ = M * Y^s for a GT message M
    Decrypt:  A = prod_y (e(D_j, C_y) / e(C'_y, D'_j))^w_y = e(g1,g2)^(r s)
              Y^s = e(C, D) / A

Collusion resistance comes from the per-key ``r``: components of two keys
carry different ``r`` and do not recombine. Decryption costs two pairings
per used leaf plus one; Lagrange coefficients are applied as G1 scalar
multiplications, and "and"/"or" gates need none. This module is pure: no
I/O, randomness only from mcl's CSPRNG.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Iterable

import pymcl
from pymcl import G1, G2, GT, Fr

from verifier.protocol.abe import _codec as c
from verifier.protocol.abe.errors import AbeError, PolicyError
from verifier.protocol.abe.policy import (
    Attribute,
    PolicyNode,
    leaves,
    parse_attribute,
    parse_attributes,
    parse_policy,
)
from verifier.protocol.errors import MalformedError

__all__ = [
    "Ciphertext",
    "MasterKey",
    "PublicParams",
    "SecretKey",
    "decapsulate",
    "decrypt",
    "encapsulate",
    "encrypt",
    "keygen",
    "setup",
]

HASH_DST = b"trusted-cloud/abe/bsw07/v1/H:G1\x00"
_ID_BYTES = 32
_MAX_ATTRIBUTES = 1024


def hash_attribute(attr: Attribute) -> G1:
    """Hash an attribute's canonical encoding to G1 (domain separated)."""
    return G1.hash(HASH_DST + attr.encode())


@dataclasses.dataclass(frozen=True)
class PublicParams:
    """Public parameters: ``h = g1^beta`` and ``Y = e(g1, g2)^alpha``."""

    h: G1
    y: GT

    def to_bytes(self) -> bytes:
        """Canonical encoding."""
        w = c.Writer(c.KIND_PUBLIC_PARAMS)
        w.element(self.h)
        w.element(self.y)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> PublicParams:
        """Decode; raises MalformedError on any defect."""
        r = c.Reader(data, c.KIND_PUBLIC_PARAMS, "ABE public parameters")
        pp = cls(r.element(G1, "h"), r.element(GT, "Y"))
        r.end()
        return pp

    @functools.cached_property
    def id(self) -> bytes:
        """SHA-256 of the encoding; names these parameters in keys and ciphertexts."""
        return hashlib.sha256(self.to_bytes()).digest()


@dataclasses.dataclass(frozen=True)
class MasterKey:
    """The authority's secret: ``alpha`` and ``beta`` (and the pp id)."""

    pp_id: bytes
    alpha: Fr
    beta: Fr

    def to_bytes(self) -> bytes:
        """Canonical encoding (secret!)."""
        w = c.Writer(c.KIND_MASTER_KEY)
        w.blob(self.pp_id)
        w.element(self.alpha)
        w.element(self.beta)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> MasterKey:
        """Decode; raises MalformedError on any defect."""
        r = c.Reader(data, c.KIND_MASTER_KEY, "ABE master key")
        pp_id = _read_id(r)
        msk = cls(pp_id, r.element(Fr, "alpha"), r.element(Fr, "beta"))
        r.end()
        if msk.beta.is_zero():
            raise MalformedError("ABE master key", "beta is zero")
        return msk


@dataclasses.dataclass(frozen=True)
class SecretKey:
    """A node's decryption key for a set of attributes.

    Attributes:
        pp_id: id of the public parameters the key belongs to.
        d: ``g2^((alpha + r) / beta)``.
        components: per attribute, ``(D_j in G1, D'_j in G2)``.
    """

    pp_id: bytes
    d: G2
    components: dict[Attribute, tuple[G1, G2]]

    @property
    def attributes(self) -> frozenset[Attribute]:
        """The attributes this key carries."""
        return frozenset(self.components)

    def to_bytes(self) -> bytes:
        """Canonical encoding (secret!); attributes sorted by encoding."""
        w = c.Writer(c.KIND_SECRET_KEY)
        w.blob(self.pp_id)
        w.element(self.d)
        items = sorted(self.components.items(), key=lambda kv: kv[0].encode())
        w.u16(len(items))
        for attr, (dj, dpj) in items:
            w.blob(attr.text.encode("utf-8"))
            w.element(dj)
            w.element(dpj)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SecretKey:
        """Decode; raises MalformedError on any defect."""
        r = c.Reader(data, c.KIND_SECRET_KEY, "ABE secret key")
        pp_id = _read_id(r)
        d = r.element(G2, "D")
        n = r.u16("attribute count")
        components: dict[Attribute, tuple[G1, G2]] = {}
        prev = b""
        for i in range(n):
            attr = _decode_attribute(r, r.blob(f"attribute {i}", 1024))
            if attr.encode() <= prev:
                raise MalformedError(r.structure, "attributes not sorted and unique")
            prev = attr.encode()
            components[attr] = (r.element(G1, f"D_{i}"), r.element(G2, f"D'_{i}"))
        r.end()
        return cls(pp_id, d, components)


@dataclasses.dataclass(frozen=True)
class Ciphertext:
    """A CP-ABE ciphertext under a policy.

    Attributes:
        pp_id: id of the public parameters it was made under.
        policy: the policy string (canonical source of the access tree).
        c: ``h^s`` in G1.
        leaves: per policy leaf, depth-first: ``(C_y in G2, C'_y in G1)``.
        c_tilde: ``M * Y^s`` when a GT message was encrypted; None for a
            key encapsulation (the key is ``Y^s`` itself).
    """

    pp_id: bytes
    policy: str
    c: G1
    leaves: tuple[tuple[G2, G1], ...]
    c_tilde: GT | None = None

    @functools.cached_property
    def tree(self) -> PolicyNode:
        """The parsed policy."""
        return parse_policy(self.policy)

    def to_bytes(self) -> bytes:
        """Canonical encoding."""
        w = c.Writer(c.KIND_CIPHERTEXT)
        w.blob(self.pp_id)
        w.blob(self.policy.encode("utf-8"))
        w.u8(0 if self.c_tilde is None else 1)
        if self.c_tilde is not None:
            w.element(self.c_tilde)
        w.element(self.c)
        w.u16(len(self.leaves))
        for cy, cpy in self.leaves:
            w.element(cy)
            w.element(cpy)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Ciphertext:
        """Decode; raises MalformedError on any defect."""
        r = c.Reader(data, c.KIND_CIPHERTEXT, "ABE ciphertext")
        pp_id = _read_id(r)
        raw_policy = r.blob("policy", 1 << 16)
        try:
            policy = raw_policy.decode("utf-8")
            tree = parse_policy(policy)
        except (UnicodeDecodeError, PolicyError) as exc:
            raise MalformedError(r.structure, f"bad policy: {exc}")
        flag = r.u8("C~ flag")
        if flag not in (0, 1):
            raise MalformedError(r.structure, f"bad C~ flag {flag}")
        c_tilde = r.element(GT, "C~") if flag else None
        c_elt = r.element(G1, "C")
        n = r.u16("leaf count")
        if n != sum(1 for _ in leaves(tree)):
            raise MalformedError(r.structure, "leaf count does not match the policy")
        items = tuple(
            (r.element(G2, f"C_{i}"), r.element(G1, f"C'_{i}")) for i in range(n)
        )
        r.end()
        ct = cls(pp_id, policy, c_elt, items, c_tilde)
        ct.__dict__["tree"] = tree  # cache the parse (cached_property slot)
        return ct


def _read_id(r: c.Reader) -> bytes:
    pp_id = r.blob("public parameters id", _ID_BYTES)
    if len(pp_id) != _ID_BYTES:
        raise MalformedError(r.structure, "public parameters id is not 32 bytes")
    return pp_id


def _decode_attribute(r: c.Reader, raw: bytes) -> Attribute:
    try:
        return parse_attribute(raw.decode("utf-8"))
    except (UnicodeDecodeError, PolicyError) as exc:
        raise MalformedError(r.structure, f"bad attribute: {exc}")


def setup() -> tuple[PublicParams, MasterKey]:
    """Generate fresh public parameters and the master key."""
    alpha, beta = Fr.random(), Fr.random()
    while beta.is_zero():  # pragma: no cover - probability 2^-255
        beta = Fr.random()
    pp = PublicParams(pymcl.g1 * beta, pymcl.pairing(pymcl.g1, pymcl.g2) ** alpha)
    return pp, MasterKey(pp.id, alpha, beta)


def keygen(msk: MasterKey, attributes: Iterable[str | Attribute]) -> SecretKey:
    """Issue a key for an attribute set.

    Args:
        msk: the master key.
        attributes: an iterable of attribute strings (``hv=kvm-9.2``) or
            :class:`Attribute` objects.

    Raises:
        PolicyError: an attribute does not parse.
        AbeError: no attributes, or too many.
    """
    if isinstance(attributes, str | bytes):
        raise AbeError("attributes must be a collection, not a single string")
    attrs = parse_attributes(attributes)
    if not attrs or len(attrs) > _MAX_ATTRIBUTES:
        raise AbeError(f"a key needs 1 to {_MAX_ATTRIBUTES} attributes")
    r = Fr.random()
    d = pymcl.g2 * ((msk.alpha + r) / msk.beta)
    g1r = pymcl.g1 * r
    components: dict[Attribute, tuple[G1, G2]] = {}
    for attr in attrs:
        rj = Fr.random()
        components[attr] = (g1r + hash_attribute(attr) * rj, pymcl.g2 * rj)
    return SecretKey(msk.pp_id, d, components)


def _share(node: PolicyNode, secret: Fr, out: list[Fr]) -> None:
    """Append the leaf shares of ``secret`` over ``node``, depth-first."""
    if isinstance(node, Attribute):
        out.append(secret)
        return
    n, k = len(node.children), node.k
    if k == 1:
        shares = [secret] * n
    elif k == n:  # additive n-of-n sharing: reconstruction weights are all 1
        shares = [Fr.random() for _ in range(n - 1)]
        last = secret
        for s in shares:
            last = last - s
        shares.append(last)
    else:  # Shamir: q(0) = secret, degree k - 1, child i gets q(i)
        coeffs = [Fr.random() for _ in range(k - 1)]
        shares = []
        for i in range(1, n + 1):
            x, acc = Fr(i), Fr()
            for a in reversed(coeffs):
                acc = (acc + a) * x
            shares.append(acc + secret)
    for child, s in zip(node.children, shares, strict=True):
        _share(child, s, out)


def encapsulate(pp: PublicParams, policy: str) -> tuple[GT, Ciphertext]:
    """Make a random GT key ``Y^s`` and its ciphertext under ``policy``.

    Raises:
        PolicyError: the policy does not parse.
    """
    tree = parse_policy(policy)
    s = Fr.random()
    shares: list[Fr] = []
    _share(tree, s, shares)
    items = tuple(
        (pymcl.g2 * q, hash_attribute(attr) * q)
        for attr, q in zip(leaves(tree), shares, strict=True)
    )
    ct = Ciphertext(pp.id, policy, pp.h * s, items)
    ct.__dict__["tree"] = tree
    return pp.y**s, ct


def encrypt(pp: PublicParams, message: GT, policy: str) -> Ciphertext:
    """BSW07 Encrypt: a GT message under ``policy`` (``C~ = M * Y^s``)."""
    key, ct = encapsulate(pp, policy)
    return dataclasses.replace(ct, c_tilde=message * key)


def _lagrange(chosen: list[int]) -> list[Fr]:
    """Lagrange coefficients at 0 for the (1-based) points ``chosen``."""
    xs = [Fr(i) for i in chosen]
    out = []
    for i, xi in enumerate(xs):
        num, den = Fr(1), Fr(1)
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj
                den = den * (xj - xi)
        out.append(num / den)
    return out


_Plan = list[tuple[int, Attribute, Fr | None]]


def _plan(
    node: PolicyNode, attrs: frozenset[Attribute], index: list[int]
) -> _Plan | None:
    """Cheapest set of leaves (index, attribute, weight) that opens ``node``."""
    if isinstance(node, Attribute):
        i = index[0]
        index[0] += 1
        return [(i, node, None)] if node in attrs else None
    options: list[tuple[int, _Plan]] = []
    for pos, child in enumerate(node.children, start=1):
        sub = _plan(child, attrs, index)
        if sub is not None:
            options.append((pos, sub))
    if len(options) < node.k:
        return None
    options.sort(key=lambda o: len(o[1]))
    chosen = sorted(options[: node.k], key=lambda o: o[0])
    n, k = len(node.children), node.k
    if k == 1 or k == n:
        return [leaf for _, sub in chosen for leaf in sub]
    out: _Plan = []
    for lam, (_, sub) in zip(_lagrange([p for p, _ in chosen]), chosen, strict=True):
        for i, attr, w in sub:
            out.append((i, attr, lam if w is None else w * lam))
    return out


def _check_ids(pp: PublicParams, sk: SecretKey, ct: Ciphertext) -> None:
    if sk.pp_id != pp.id:
        raise AbeError("key is for other public parameters")
    if ct.pp_id != pp.id:
        raise AbeError("ciphertext is for other public parameters")


def decapsulate(pp: PublicParams, sk: SecretKey, ct: Ciphertext) -> GT:
    """Recover ``Y^s`` from a ciphertext with a key that satisfies its policy.

    Raises:
        AbeError: the key's attributes do not satisfy the policy, or the key
            or ciphertext is for other public parameters.
    """
    _check_ids(pp, sk, ct)
    plan = _plan(ct.tree, sk.attributes, [0])
    if plan is None:
        raise AbeError("the key's attributes do not satisfy the policy")
    acc = GT()
    for i, attr, w in plan:
        dj, dpj = sk.components[attr]
        cy, cpy = ct.leaves[i]
        if w is not None:
            dj, cpy = dj * w, cpy * w
        acc = acc * pymcl.pairing(dj, cy) * pymcl.pairing(-cpy, dpj)
    return pymcl.pairing(ct.c, sk.d) / acc


def decrypt(pp: PublicParams, sk: SecretKey, ct: Ciphertext) -> GT:
    """BSW07 Decrypt: the GT message of a ciphertext made by :func:`encrypt`.

    Raises:
        AbeError: as :func:`decapsulate`, or the ciphertext carries no message.
    """
    if ct.c_tilde is None:
        raise AbeError("ciphertext is a key encapsulation, not an encrypted message")
    return ct.c_tilde / decapsulate(pp, sk, ct)
