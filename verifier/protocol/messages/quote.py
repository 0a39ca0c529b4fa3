"""The quote exchange: ``GET /v1/quote`` on a node agent (flows 3 and 4).

The verifier (continuous attestation) and the tenant (identity quote) ask a
node's agent for a quote with a :class:`QuoteRequest`, sent as the query
string::

    ?nonce=<hex, 8..32 bytes>&pcrs=16,17&csr=0|1[&ima_from=N][&mb=1]
     [&banks=sha256,sha1]

``banks`` asks for the PCRs in the sha1 bank as well as sha256 (for a
legacy SHA-1 event log or a sha1 IMA boot aggregate); without it the quote
covers sha256 only, so agents and verifiers that do not know it keep
working: an older agent ignores it and answers with a sha256 quote.

The agent answers with a :class:`QuoteAnswer`::

    {"quote": {"attest", "signature", "pcrs"},   # verifier.protocol.Quote
     "nk": "<b64 X25519 public key, 32 bytes>",  # bound in the quote
     "csr": "<b64 DER>",                          # if asked, bound too
     "ima": {"from": N, "format": "ascii" | "binary",
             "entries": "<text | b64>", "more": false},
     "ima_error": "...",                          # instead of "ima"
     "mb_log": "<b64 binary_bios_measurements>",
     "mb_error": "..."}                           # instead of "mb_log"

Both validate once, in their constructors (they are built per quote, so
they are plain slotted dataclasses rather than frozen ones, which cost a
microsecond more each: build them, never change them), and raise only
:class:`~verifier.protocol.errors.MalformedError` (a request's errors are a
:class:`QuoteRequestError` carrying the agent's error code). The content of
the evidence (IMA entries, firmware events) is parsed by
:mod:`verifier.protocol.evidence` when a policy needs it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import MalformedError
from verifier.protocol.quote import EXTRA_BANKS, Quote

__all__ = [
    "MAX_IMA_BYTES",
    "MAX_MB_LOG_BYTES",
    "ImaPart",
    "QuoteAnswer",
    "QuoteRequest",
    "QuoteRequestError",
    "mb_log_from_wire",
]

#: The most IMA list one answer may carry (encoded); the agent sends less
#: and the verifier asks for the rest on the next round.
MAX_IMA_BYTES = 32 << 20
#: The largest firmware event log accepted (real ones are 20-100 KiB).
MAX_MB_LOG_BYTES = 1 << 20
NONCE_MIN, NONCE_MAX = 8, 32
MAX_PCRS = 24
_NK_BYTES = 32
_MAX_CSR_BYTES = 16384
_MAX_INDEX_DIGITS = 12
_ANSWER = "agent answer"
_EVIDENCE = "runtime evidence"


class QuoteRequestError(MalformedError):
    """A quote request that does not parse.

    Attributes:
        code: the agent's stable error code (``bad_nonce``, ``bad_pcrs``,
            ``bad_csr``, ``bad_mb``, ``bad_ima_from``, ``bad_banks``).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__("quote request", detail)
        self.code = code


def _check_flag(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise QuoteRequestError(f"bad_{name}", f"'{name}' must be 0 or 1")


@dataclasses.dataclass(slots=True)
class QuoteRequest:
    """What a quote is asked for with.

    Attributes:
        nonce: the asker's fresh nonce (8..32 bytes).
        pcrs: the sha256-bank PCRs to quote (1..24 indexes, 0..23).
        csr: bind the agent's identity CSR too, and send it.
        ima_from: send the IMA list from this entry index (None: no list).
        mb: send the firmware (measured-boot) event log.
        banks: the banks to quote ``pcrs`` in: ``("sha256",)``, or
            ``("sha256", "sha1")``.

    Raises:
        QuoteRequestError: naming the bad field.
    """

    nonce: bytes
    pcrs: tuple[int, ...]
    csr: bool = False
    ima_from: int | None = None
    mb: bool = False
    banks: tuple[str, ...] = ("sha256",)

    def __post_init__(self) -> None:
        if not isinstance(self.nonce, bytes) or not (
            NONCE_MIN <= len(self.nonce) <= NONCE_MAX
        ):
            size = len(self.nonce) if isinstance(self.nonce, bytes) else "no"
            raise QuoteRequestError(
                "bad_nonce",
                f"'nonce' must be {NONCE_MIN}..{NONCE_MAX} bytes, got {size}",
            )
        pcrs = self.pcrs
        if not isinstance(pcrs, tuple) or not 0 < len(pcrs) <= MAX_PCRS:
            raise QuoteRequestError(
                "bad_pcrs", f"'pcrs' must list 1..{MAX_PCRS} PCR indexes"
            )
        for i in pcrs:
            if type(i) is not int or not 0 <= i < MAX_PCRS:
                raise QuoteRequestError(
                    "bad_pcrs", f"'pcrs': {i!r} is not a PCR index 0..23"
                )
        _check_flag(self.csr, "csr")
        _check_flag(self.mb, "mb")
        index = self.ima_from
        if index is not None and (type(index) is not int or index < 0):
            raise QuoteRequestError("bad_ima_from", "'ima_from' must be an entry index")
        banks = self.banks
        if (
            not isinstance(banks, tuple)
            or not banks
            or banks[0] != "sha256"
            or len(set(banks)) != len(banks)
            or any(b not in EXTRA_BANKS for b in banks[1:])
        ):
            raise QuoteRequestError(
                "bad_banks", "'banks' must be sha256, or sha256,sha1"
            )

    def to_query(self) -> dict[str, str]:
        """The query string's parameters (``csr`` always, the others when
        asked)."""
        query = {
            "nonce": self.nonce.hex(),
            "pcrs": ",".join(map(str, self.pcrs)),
            "csr": "1" if self.csr else "0",
        }
        if self.ima_from is not None:
            query["ima_from"] = str(self.ima_from)
        if self.mb:
            query["mb"] = "1"
        if self.banks != ("sha256",):
            query["banks"] = ",".join(self.banks)
        return query

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> QuoteRequest:
        """Parse a request's query parameters (PCRs sorted, duplicates
        dropped).

        Raises:
            QuoteRequestError: naming the bad parameter, checked in the order
                nonce, pcrs, csr, ima_from, mb, banks.
        """
        banks = query.get("banks")
        return cls(
            _parse_nonce(query.get("nonce")),
            _parse_pcrs(query.get("pcrs")),
            _parse_flag(query.get("csr"), "csr"),
            _parse_index(query.get("ima_from")),
            _parse_flag(query.get("mb"), "mb"),
            tuple(banks.split(",")) if banks else ("sha256",),
        )


def _parse_nonce(text: str | None) -> bytes:
    if not text:
        raise QuoteRequestError("bad_nonce", "'nonce' is required (hex)")
    try:
        nonce = bytes.fromhex(text)
    except ValueError:
        raise QuoteRequestError("bad_nonce", "'nonce' is not hex") from None
    if not NONCE_MIN <= len(nonce) <= NONCE_MAX:
        raise QuoteRequestError(
            "bad_nonce",
            f"'nonce' must be {NONCE_MIN}..{NONCE_MAX} bytes, got {len(nonce)}",
        )
    return nonce


def _parse_pcrs(text: str | None) -> tuple[int, ...]:
    if not text:
        raise QuoteRequestError("bad_pcrs", "'pcrs' is required (e.g. pcrs=16,17)")
    items = text.split(",")
    if len(items) > MAX_PCRS:
        raise QuoteRequestError("bad_pcrs", f"'pcrs' lists more than {MAX_PCRS} PCRs")
    pcrs: set[int] = set()
    for item in items:
        item = item.strip()
        if not (item.isascii() and item.isdigit()) or not 0 <= int(item) < MAX_PCRS:
            raise QuoteRequestError(
                "bad_pcrs", f"'pcrs': {item!r} is not a PCR index 0..23"
            )
        pcrs.add(int(item))
    return tuple(sorted(pcrs))


def _parse_flag(text: str | None, name: str) -> bool:
    if text in (None, "", "0"):
        return False
    if text == "1":
        return True
    raise QuoteRequestError(f"bad_{name}", f"'{name}' must be 0 or 1")


def _parse_index(text: str | None) -> int | None:
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_INDEX_DIGITS:
        raise QuoteRequestError("bad_ima_from", "'ima_from' must be an entry index")
    return int(text)


def _b64(text: str, structure: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedError(structure, f"'{field}' is not base64") from None


def _b64text(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclasses.dataclass(frozen=True, slots=True)
class ImaPart:
    """IMA measurement-list entries from index :attr:`first` on, as the
    agent read them.

    Attributes:
        first: the index of the first entry.
        entries: the ``ascii_runtime_measurements`` lines (str), or the
            ``binary_runtime_measurements`` bytes (bytes).
        more: the agent stopped early; the rest comes next round.

    Raises:
        MalformedError: a bad field, or more than :data:`MAX_IMA_BYTES`.
    """

    first: int
    entries: str | bytes
    more: bool = False

    def __post_init__(self) -> None:
        if type(self.first) is not int or self.first < 0:
            raise MalformedError(_EVIDENCE, "'ima.from' must be a non-negative integer")
        if not isinstance(self.entries, str | bytes):
            raise MalformedError(_EVIDENCE, "'ima.entries' must be a string")
        if len(self.entries) > MAX_IMA_BYTES:
            raise MalformedError(
                _EVIDENCE, f"'ima.entries' exceeds {MAX_IMA_BYTES} bytes"
            )
        if not isinstance(self.more, bool):
            raise MalformedError(_EVIDENCE, "'ima.more' must be true or false")

    @property
    def binary(self) -> bool:
        return isinstance(self.entries, bytes)

    def to_dict(self) -> dict[str, Any]:
        entries = self.entries
        return {
            "from": self.first,
            "format": "binary" if isinstance(entries, bytes) else "ascii",
            "entries": _b64text(entries) if isinstance(entries, bytes) else entries,
            "more": self.more,
        }

    @classmethod
    def from_dict(cls, data: object) -> ImaPart:
        """Parse the ``ima`` object of an answer.

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError(_EVIDENCE, "'ima' must be an object")
        first: Any = data.get("from")
        if isinstance(first, bool):
            raise MalformedError(_EVIDENCE, "'ima.from' must be a non-negative integer")
        text = data.get("entries")
        if not isinstance(text, str):
            raise MalformedError(_EVIDENCE, "'ima.entries' must be a string")
        if len(text) > MAX_IMA_BYTES:
            raise MalformedError(
                _EVIDENCE, f"'ima.entries' exceeds {MAX_IMA_BYTES} bytes"
            )
        form = data.get("format")
        if form == "binary":
            entries: str | bytes = _b64(text, _EVIDENCE, "ima.entries")
        elif form == "ascii":
            entries = text
        else:
            raise MalformedError(_EVIDENCE, "'ima.format' must be 'ascii' or 'binary'")
        return cls(first, entries, data.get("more", False))


@dataclasses.dataclass(slots=True)
class QuoteAnswer:
    """A node agent's answer to a :class:`QuoteRequest`.

    Attributes:
        quote: the quote (not verified yet: that is the asker's job).
        nk: the agent's X25519 share-transport key, bound in the quote.
        csr: the DER identity CSR (bound too), when asked.
        ima: IMA entries, when asked and readable.
        ima_error: why the IMA list could not be read, instead.
        mb_log: the firmware event log, when asked and readable.
        mb_error: why the firmware log could not be read, instead.

    Raises:
        MalformedError: a bad field (e.g. an NK that is not 32 bytes).
    """

    quote: Quote
    nk: bytes
    csr: bytes | None = None
    ima: ImaPart | None = None
    ima_error: str | None = None
    mb_log: bytes | None = None
    mb_error: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.quote, Quote):
            raise MalformedError(_ANSWER, "'quote' must be a quote")
        if not isinstance(self.nk, bytes) or len(self.nk) != _NK_BYTES:
            raise MalformedError(_ANSWER, "'nk' is not a 32-byte X25519 key")
        if self.csr is not None and (
            not isinstance(self.csr, bytes) or len(self.csr) > _MAX_CSR_BYTES
        ):
            raise MalformedError(_ANSWER, f"'csr' exceeds {_MAX_CSR_BYTES} bytes")
        if self.ima is not None and not isinstance(self.ima, ImaPart):
            raise MalformedError(_ANSWER, "'ima' must be IMA entries")
        if self.mb_log is not None and (
            not isinstance(self.mb_log, bytes) or len(self.mb_log) > MAX_MB_LOG_BYTES
        ):
            raise MalformedError(
                _EVIDENCE, f"'mb_log' exceeds {MAX_MB_LOG_BYTES} bytes"
            )
        for field in ("ima_error", "mb_error"):
            value = getattr(self, field)
            if value is not None and not isinstance(value, str):
                raise MalformedError(_ANSWER, f"'{field}' must be a string")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"quote": self.quote.to_dict(), "nk": _b64text(self.nk)}
        if self.csr is not None:
            out["csr"] = _b64text(self.csr)
        if self.ima is not None:
            out["ima"] = self.ima.to_dict()
        if self.ima_error is not None:
            out["ima_error"] = self.ima_error
        if self.mb_log is not None:
            out["mb_log"] = _b64text(self.mb_log)
        if self.mb_error is not None:
            out["mb_error"] = self.mb_error
        return out

    @classmethod
    def from_dict(cls, data: object) -> QuoteAnswer:
        """Parse an agent's JSON answer.

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError(_ANSWER, "must be an object")
        quote = Quote.from_dict(data.get("quote"))
        nk = _b64_field(data, "nk")
        if nk is None:
            raise MalformedError(_ANSWER, "'nk' missing")
        ima, mb_log = data.get("ima"), data.get("mb_log")
        return cls(
            quote,
            nk,
            _b64_field(data, "csr"),
            ImaPart.from_dict(ima) if ima is not None else None,
            data.get("ima_error"),
            mb_log_from_wire(mb_log) if mb_log is not None else None,
            data.get("mb_error"),
        )


def _b64_field(data: Mapping[str, Any], field: str) -> bytes | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedError(_ANSWER, f"'{field}' must be a base64 string")
    return _b64(value, _ANSWER, field)


def mb_log_from_wire(text: object) -> bytes:
    """Decode the ``mb_log`` field of an answer.

    Raises:
        MalformedError: not base64 or too large.
    """
    if not isinstance(text, str):
        raise MalformedError(_EVIDENCE, "'mb_log' must be a base64 string")
    if len(text) > MAX_MB_LOG_BYTES * 4 // 3 + 4:
        raise MalformedError(_EVIDENCE, f"'mb_log' exceeds {MAX_MB_LOG_BYTES} bytes")
    return _b64(text, _EVIDENCE, "mb_log")
