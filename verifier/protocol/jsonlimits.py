"""JSON text with limits: what every API and stored document is parsed with.

RFC 8259 leaves nesting depth and the range of numbers to the
implementation (section 9). Python's :mod:`json` accepts any depth until
its C scanner runs out of stack (``RecursionError``), integers of any size
(which a database column then cannot hold) and the non-standard ``NaN``
and ``Infinity``. :func:`loads` refuses all of those, before anything
acts on the document, with a :class:`~verifier.protocol.errors.MalformedError`
naming the position:

* nesting deeper than ``max_depth`` arrays/objects (default
  :data:`MAX_DEPTH`), checked on the raw text before it is parsed;
* integers outside ``[-2**63, 2**64 - 1]`` (they fit a signed or unsigned
  64-bit column), and floats that are not finite;
* text that is not UTF-8, not JSON, or (with ``object_only``) not an object.

Pure: bytes in, value out.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from verifier.protocol.errors import MalformedError, ProtocolError

__all__ = ["MAX_DEPTH", "MAX_INT", "MIN_INT", "loads", "too_deep"]

#: Deepest nesting of arrays and objects accepted (our documents use < 8).
MAX_DEPTH = 64
#: Largest integer accepted (an unsigned 64-bit value).
MAX_INT = 2**64 - 1
#: Smallest integer accepted (a signed 64-bit value).
MIN_INT = -(2**63)
#: Integer literals longer than this are refused before conversion.
_MAX_INT_DIGITS = 21

# A JSON string (quotes included), or an unterminated one to the end of the
# text: possessive and always matching once begun, so it runs in linear time.
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_PAIRS = (b"[]", b"{}", b"[}", b"{]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


class _BadLiteralError(ProtocolError):
    """A literal out of range (turned into MalformedError by loads)."""


def too_deep(text: bytes, max_depth: int) -> bool:
    """Whether ``text`` nests arrays/objects deeper than ``max_depth``.

    Only brackets outside strings count (an unterminated string runs to the
    end), so the answer is exact for valid JSON and errs towards refusal
    otherwise. Linear in ``len(text)`` per level, each level a C-speed pass.
    """
    if text.count(b"[") + text.count(b"{") <= max_depth:
        return False  # the usual case: too few brackets to nest that deep
    brackets = _STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        inner = brackets
        for pair in _PAIRS:
            inner = inner.replace(pair, b"")
        if len(inner) == len(brackets):
            break
        brackets = inner
    if any(pair in brackets for pair in _PAIRS):
        return True  # a pair still nested inside max_depth others
    return brackets.count(b"[") + brackets.count(b"{") > max_depth


def _parse_int(literal: str) -> int:
    if len(literal) > _MAX_INT_DIGITS:
        raise _BadLiteralError(f"integer {literal[:24]}... is out of range")
    value = int(literal)
    if not MIN_INT <= value <= MAX_INT:
        raise _BadLiteralError(f"integer {literal} is out of range")
    return value


def _parse_float(literal: str) -> float:
    if len(literal) > 64:
        raise _BadLiteralError(f"number {literal[:24]}... is too long")
    value = float(literal)
    if not math.isfinite(value):
        raise _BadLiteralError(f"number {literal} is not finite")
    return value


def _parse_constant(name: str) -> Any:
    raise _BadLiteralError(f"{name} is not JSON")


def loads(
    data: bytes | str,
    what: str = "JSON document",
    *,
    max_depth: int = MAX_DEPTH,
    object_only: bool = False,
) -> Any:
    """Parse ``data`` as JSON within the limits of the module docstring.

    Args:
        data: the text (bytes must be UTF-8).
        what: names the document in errors (e.g. ``request body``).
        max_depth: the deepest nesting accepted.
        object_only: refuse anything but a JSON object.

    Returns:
        The parsed value.

    Raises:
        MalformedError: naming what is wrong and, for syntax errors, where.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if too_deep(raw, max_depth):
        raise MalformedError(
            what, f"nested more than {max_depth} levels deep (the limit)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError(what, f"not UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except _BadLiteralError as exc:
        raise MalformedError(what, str(exc)) from None
    except json.JSONDecodeError as exc:
        raise MalformedError(
            what,
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except (ValueError, RecursionError) as exc:  # belt and braces
        raise MalformedError(what, f"not valid JSON: {exc}") from None
    if object_only and not isinstance(value, dict):
        raise MalformedError(what, "must be a JSON object")
    return value
