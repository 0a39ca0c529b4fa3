"""Policy language of policy-sealed data (Excalibur-style CP-ABE).

A policy is a boolean formula over node attributes::

    region=eu and (hv=kvm-9 or hv=xen-4.5)
    2 of (region=eu-west, tpm=2.0, image=sha256:abcd)

Grammar (``and`` binds tighter than ``or``; keywords are lower case and
reserved in any case; whitespace separates tokens)::

    policy    := or_expr END
    or_expr   := and_expr ("or" and_expr)*
    and_expr  := atom ("and" atom)*
    atom      := ATTRIBUTE
               | "(" or_expr ")"
               | INTEGER "of" "(" or_expr ("," or_expr)* ")"
    ATTRIBUTE := NAME ["=" VALUE]
    NAME      := [A-Za-z_][A-Za-z0-9_.-]*        (at most 64 characters)
    VALUE     := [A-Za-z0-9_.:/+@-]+              (at most 128 characters)

A threshold ``k of (c1, ..., cn)`` needs 1 <= k <= n. The parser consumes
the whole string or raises :class:`~verifier.protocol.abe.errors.PolicyError`
with the 0-based position and what it expected there; it never truncates,
folds case or drops characters.

``and``/``or`` are thresholds n-of-n and 1-of-n; :func:`parse_policy`
returns a tree of :class:`Gate` and :class:`Attribute` nodes that the
scheme (:mod:`verifier.protocol.abe.bsw07`) shares a secret over with
Shamir's scheme at each gate.

Each attribute has one canonical byte encoding (:meth:`Attribute.encode`):
a tag, then the length-prefixed UTF-8 name and value, so ``hv=kvm-9.2``
and, say, name ``hv=kvm-9`` plus ``.2`` can never collide.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Iterable, Iterator

from verifier.protocol.abe.errors import PolicyError

__all__ = [
    "MAX_LEAVES",
    "MAX_POLICY_CHARS",
    "Attribute",
    "Gate",
    "PolicyNode",
    "leaves",
    "parse_attribute",
    "parse_attributes",
    "parse_policy",
    "satisfies",
]

MAX_POLICY_CHARS = 8192
MAX_LEAVES = 256
MAX_POLICY_DEPTH = 32
MAX_NAME = 64
MAX_VALUE = 128

KEYWORDS = frozenset({"and", "or", "of"})
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_VALUE_RE = re.compile(r"[A-Za-z0-9_.:/+@\-]+")
_INT_RE = re.compile(r"[0-9]+")
_SPACE = " \t\r\n"


@dataclasses.dataclass(frozen=True, order=True)
class Attribute:
    """One node attribute: ``name`` or ``name=value``.

    Attributes:
        name: the attribute name (e.g. ``hv``).
        value: its value (e.g. ``kvm-9.2``), or None for a bare flag.
    """

    name: str
    value: str | None = None

    @property
    def text(self) -> str:
        """The attribute as written in a policy."""
        return self.name if self.value is None else f"{self.name}={self.value}"

    def encode(self) -> bytes:
        """Canonical, injective byte encoding (hashed to the curve)."""
        name = self.name.encode("utf-8")
        out = b"\x01" + struct.pack(">H", len(name)) + name
        if self.value is None:
            return out + b"\x00"
        value = self.value.encode("utf-8")
        return out + b"\x01" + struct.pack(">H", len(value)) + value

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class Gate:
    """A threshold gate: at least ``k`` of ``children`` must hold.

    Attributes:
        k: the threshold, 1 <= k <= len(children).
        children: sub-policies (gates or attributes).
    """

    k: int
    children: tuple[PolicyNode, ...]


PolicyNode = Gate | Attribute


def _fail(structure: str, text: str, pos: int, expected: str) -> PolicyError:
    return PolicyError(structure, text, pos, expected)


def _scan_attribute(text: str, pos: int, structure: str) -> tuple[Attribute, int]:
    """Scan ``NAME ["=" VALUE]`` at ``pos``; return it and the end offset."""
    m = _NAME_RE.match(text, pos)
    if m is None:
        raise _fail(structure, text, pos, "an attribute name")
    name = m.group()
    if name.lower() in KEYWORDS:
        raise _fail(structure, text, pos, "an attribute name (not a keyword)")
    if len(name) > MAX_NAME:
        raise _fail(structure, text, pos, f"a name of at most {MAX_NAME} characters")
    end = m.end()
    if end < len(text) and text[end] == "=":
        vm = _VALUE_RE.match(text, end + 1)
        if vm is None:
            raise _fail(structure, text, end + 1, "an attribute value")
        if len(vm.group()) > MAX_VALUE:
            raise _fail(
                structure, text, end + 1, f"a value of at most {MAX_VALUE} characters"
            )
        return Attribute(name, vm.group()), vm.end()
    return Attribute(name), end


def parse_attribute(text: str) -> Attribute:
    """Parse one attribute (``name`` or ``name=value``), strictly.

    Args:
        text: the attribute string, without surrounding whitespace.

    Returns:
        The attribute.

    Raises:
        PolicyError: the string is not exactly one well-formed attribute.
    """
    if not isinstance(text, str):
        raise _fail("attribute", repr(text), 0, "a string")
    attr, end = _scan_attribute(text, 0, "attribute")
    if end != len(text):
        raise _fail("attribute", text, end, "end of attribute")
    return attr


def parse_attributes(items: Iterable[str | Attribute]) -> frozenset[Attribute]:
    """Parse a node's attribute set (strings or :class:`Attribute`).

    Raises:
        PolicyError: one of the items does not parse.
    """
    out: set[Attribute] = set()
    for item in items:
        if isinstance(item, Attribute):
            item = item.text
        out.add(parse_attribute(item))
    return frozenset(out)


class _Parser:
    """Recursive-descent parser over a string; positions are offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.n_leaves = 0

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
            self.pos += 1

    def _fail(self, expected: str, pos: int | None = None) -> PolicyError:
        return _fail("policy", self.text, self.pos if pos is None else pos, expected)

    def _peek_word(self) -> str | None:
        m = _NAME_RE.match(self.text, self.pos)
        if m is None:
            return None
        # A word followed by "=" is an attribute, never a keyword.
        end = m.end()
        if end < len(self.text) and self.text[end] == "=":
            return None
        return m.group()

    def _keyword(self, word: str) -> bool:
        self._skip()
        if self._peek_word() == word:
            self.pos += len(word)
            return True
        return False

    def _char(self, ch: str) -> bool:
        self._skip()
        if self.text.startswith(ch, self.pos):
            self.pos += 1
            return True
        return False

    def parse(self) -> PolicyNode:
        self._skip()
        if self.pos == len(self.text):
            raise self._fail("an attribute, '(' or a threshold")
        node = self._or(0)
        self._skip()
        if self.pos != len(self.text):
            raise self._fail("'and', 'or' or end of policy")
        return node

    def _or(self, depth: int) -> PolicyNode:
        children = [self._and(depth)]
        while self._keyword("or"):
            children.append(self._and(depth))
        return children[0] if len(children) == 1 else Gate(1, tuple(children))

    def _and(self, depth: int) -> PolicyNode:
        children = [self._atom(depth)]
        while self._keyword("and"):
            children.append(self._atom(depth))
        if len(children) == 1:
            return children[0]
        return Gate(len(children), tuple(children))

    def _atom(self, depth: int) -> PolicyNode:
        if depth >= MAX_POLICY_DEPTH:
            raise self._fail(f"nesting of at most {MAX_POLICY_DEPTH} levels")
        self._skip()
        start = self.pos
        if self.pos == len(self.text):
            raise self._fail("an attribute, '(' or a threshold")
        if self._char("("):
            node = self._or(depth + 1)
            if not self._char(")"):
                raise self._fail("')' or an operator")
            return node
        m = _INT_RE.match(self.text, self.pos)
        if m is not None:
            return self._threshold(m, depth)
        word = self._peek_word()
        if word is not None and word.lower() in KEYWORDS:
            raise self._fail("an attribute, '(' or a threshold (not a keyword)")
        if _NAME_RE.match(self.text, self.pos) is None:
            raise self._fail("an attribute, '(' or a threshold")
        attr, self.pos = _scan_attribute(self.text, start, "policy")
        self.n_leaves += 1
        if self.n_leaves > MAX_LEAVES:
            raise self._fail(f"at most {MAX_LEAVES} attributes", start)
        return attr

    def _threshold(self, m: re.Match[str], depth: int) -> PolicyNode:
        start = self.pos
        if len(m.group()) > 3:
            raise self._fail("a threshold of at most 3 digits")
        k = int(m.group())
        self.pos = m.end()
        if not self._keyword("of"):
            raise self._fail("'of' after the threshold")
        if not self._char("("):
            raise self._fail("'(' after 'of'")
        children = [self._or(depth + 1)]
        while self._char(","):
            children.append(self._or(depth + 1))
        if not self._char(")"):
            raise self._fail("',' or ')'")
        if not 1 <= k <= len(children):
            raise self._fail(
                f"a threshold between 1 and {len(children)} (got {k})", start
            )
        return Gate(k, tuple(children))


def parse_policy(text: str) -> PolicyNode:
    """Parse a policy string into a tree of gates and attributes.

    Args:
        text: the policy, e.g. ``region=eu and (hv=kvm-9 or hv=xen-4.5)``.

    Returns:
        The root :class:`Gate` (or a single :class:`Attribute`).

    Raises:
        PolicyError: the string does not parse in full; ``position`` says
            where and ``expected`` what was expected there.
    """
    if not isinstance(text, str):
        raise _fail("policy", repr(text), 0, "a string")
    if len(text) > MAX_POLICY_CHARS:
        raise _fail("policy", text[:32] + "...", MAX_POLICY_CHARS, "a shorter policy")
    return _Parser(text).parse()


def leaves(node: PolicyNode) -> Iterator[Attribute]:
    """The attributes of a policy tree, depth-first, left to right."""
    if isinstance(node, Attribute):
        yield node
        return
    for child in node.children:
        yield from leaves(child)


def satisfies(policy: PolicyNode | str, attributes: Iterable[str | Attribute]) -> bool:
    """Whether an attribute set satisfies a policy (plain boolean check).

    Args:
        policy: a parsed policy or a policy string.
        attributes: the node's attributes.
    """
    node = parse_policy(policy) if isinstance(policy, str) else policy
    return _sat(node, parse_attributes(attributes))


def _sat(node: PolicyNode, attrs: frozenset[Attribute]) -> bool:
    if isinstance(node, Attribute):
        return node in attrs
    return sum(1 for c in node.children if _sat(c, attrs)) >= node.k
