"""The dry run of a runtime policy: judge nodes' whole current IMA lists
against a candidate version before publishing it, changing nothing.

``POST /v1/policies/runtime/{ref}/check``  :class:`PolicyCheckRequest`
-> :class:`PolicyCheckReport`::

    {"nodes": ["<uuid>", ...]}  or  {"all": true}

    {"policy": {"name", "version", "digest"},
     "results": [{"node": "<uuid>", "result": "pass" | "fail" | "error",
                  "entries": N, "failures": [{"index", "path", "reason",
                  "detail"}], "failures_total": N, "error": str | null}]}

A result is ``pass`` when the node's list replays to its freshly quoted
PCR 10 and the candidate allows every entry, ``fail`` when it replays and
the candidate refuses entries (each named; at most
:data:`MAX_FAILURES_SHOWN` are listed, ``failures_total`` counts all), and
``error`` when the list could not be fetched or proven (``error`` starts
with the reason code, e.g. ``ima_pcr_mismatch: ...``): never ``pass``.
The judging is :mod:`verifier.protocol.attestation.dryrun`'s.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.ima.policy import Failure
from verifier.protocol.messages._fields import (
    Reader,
    canonical_uuid_field,
    check_int,
    check_str,
)

__all__ = [
    "MAX_CHECK_NODES",
    "MAX_FAILURES_SHOWN",
    "CheckResult",
    "NodeCheck",
    "PolicyCheckReport",
    "PolicyCheckRequest",
    "PolicyRef",
]

#: The most nodes one request may list (``all`` has no such limit).
MAX_CHECK_NODES = 1000
#: The most failing entries listed per node (``failures_total`` counts all).
MAX_FAILURES_SHOWN = 1000
_REQUEST = "policy check request"
_REPORT = "policy check report"
_MAX_TEXT = 4096
_MAX_INDEX = 1 << 40


class CheckResult(enum.StrEnum):
    """A node's outcome: the candidate allows its whole list (``pass``),
    refuses entries of it (``fail``), or the list could not be fetched or
    proven (``error``)."""

    PASS = "pass"  # noqa: S105 (a verdict, not a password)
    FAIL = "fail"
    ERROR = "error"


@dataclasses.dataclass(frozen=True)
class PolicyCheckRequest:
    """Which nodes to judge: ``nodes`` (1..:data:`MAX_CHECK_NODES` UUIDs,
    canonical, duplicates dropped) or ``all`` of the caller's project.

    Raises:
        FieldError: both or neither, too many nodes, a field of the wrong
            type.
        MalformedError: a string that is not a UUID.
    """

    nodes: tuple[str, ...] = ()
    all: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.all, bool):
            raise FieldError(_REQUEST, "all", "must be true or false")
        if not isinstance(self.nodes, tuple):
            raise FieldError(_REQUEST, "nodes", "must be a list of node UUIDs")
        if self.all and self.nodes:
            raise FieldError(
                _REQUEST, "nodes", "give either 'nodes' or 'all': true, not both"
            )
        if not self.all and not self.nodes:
            raise FieldError(
                _REQUEST,
                "nodes",
                "give the nodes to check ('nodes': a list of UUIDs) or 'all': true",
            )
        if len(self.nodes) > MAX_CHECK_NODES:
            raise FieldError(
                _REQUEST,
                "nodes",
                f"lists {len(self.nodes)} nodes; at most {MAX_CHECK_NODES} "
                "(use 'all': true for the whole project)",
            )
        for i, uuid in enumerate(self.nodes):
            if canonical_uuid_field(_REQUEST, f"nodes.{i}", uuid) != uuid:
                raise FieldError(_REQUEST, f"nodes.{i}", "must be a canonical UUID")

    def to_dict(self) -> dict[str, Any]:
        return {"all": True} if self.all else {"nodes": list(self.nodes)}

    @classmethod
    def from_dict(cls, data: object) -> PolicyCheckRequest:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, _REQUEST)
        raw_nodes, everything = r.get("nodes"), r.get("all")
        r.finish()
        nodes: list[str] = []
        if raw_nodes is not None:
            if not isinstance(raw_nodes, list):
                raise FieldError(_REQUEST, "nodes", "must be a list of node UUIDs")
            if len(raw_nodes) > MAX_CHECK_NODES:
                raise FieldError(
                    _REQUEST,
                    "nodes",
                    f"lists {len(raw_nodes)} nodes; at most {MAX_CHECK_NODES} "
                    "(use 'all': true for the whole project)",
                )
            for i, value in enumerate(raw_nodes):
                uuid = canonical_uuid_field(_REQUEST, f"nodes.{i}", value)
                if uuid not in nodes:
                    nodes.append(str(uuid))
        if everything is not None and not isinstance(everything, bool):
            raise FieldError(_REQUEST, "all", "must be true or false")
        return cls(tuple(nodes), bool(everything))


@dataclasses.dataclass(frozen=True)
class PolicyRef:
    """The candidate version that was judged with."""

    name: str
    version: int
    digest: str

    def __post_init__(self) -> None:
        check_str(_REPORT, "policy.name", self.name, 255)
        check_int(_REPORT, "policy.version", self.version, 0, (1 << 31) - 1)
        check_str(_REPORT, "policy.digest", self.digest, 64, min_len=64)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "digest": self.digest}

    @classmethod
    def from_dict(cls, data: object) -> PolicyRef:
        if not isinstance(data, Mapping):
            raise FieldError(_REPORT, "policy", "must be an object")
        return cls(data.get("name"), data.get("version"), data.get("digest"))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


def _failure_dict(failure: Failure) -> dict[str, Any]:
    return {
        "index": failure.index,
        "path": failure.path,
        "reason": failure.reason,
        "detail": failure.detail,
    }


def _failure(data: object, where: str) -> Failure:
    if not isinstance(data, Mapping):
        raise FieldError(_REPORT, where, "must be an object")
    index = data.get("index")
    check_int(_REPORT, f"{where}.index", index, 0, _MAX_INDEX)
    for name in ("path", "reason", "detail"):
        check_str(_REPORT, f"{where}.{name}", data.get(name), _MAX_TEXT, min_len=0)
    return Failure(index, data["path"], data["reason"], data["detail"])  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class NodeCheck:
    """One node's outcome.

    Attributes:
        node: its UUID.
        result: pass, fail or error.
        entries: the list entries judged (those the fresh quote covers).
        failures: the entries the candidate refuses, in list order (at
            most :data:`MAX_FAILURES_SHOWN`).
        failures_total: how many it refuses in all.
        error: for ``error``, the reason code and what went wrong.

    Raises:
        FieldError: fields that contradict the result (a ``pass`` with
            failures or an error, an ``error`` without one, ...).
    """

    node: str
    result: CheckResult
    entries: int = 0
    failures: tuple[Failure, ...] = ()
    failures_total: int = 0
    error: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.result, CheckResult):
            raise FieldError(_REPORT, "result", "must be pass, fail or error")
        check_int(_REPORT, "entries", self.entries, 0, _MAX_INDEX)
        check_int(_REPORT, "failures_total", self.failures_total, 0, _MAX_INDEX)
        check_str(_REPORT, "error", self.error, _MAX_TEXT, optional=True)
        if len(self.failures) > min(self.failures_total, MAX_FAILURES_SHOWN):
            raise FieldError(_REPORT, "failures", "more than failures_total")
        failing = self.result is CheckResult.FAIL
        if failing != (self.failures_total > 0) or failing != bool(self.failures):
            raise FieldError(_REPORT, "failures", f"do not agree with {self.result}")
        if (self.result is CheckResult.ERROR) != (self.error is not None):
            raise FieldError(_REPORT, "error", f"does not agree with {self.result}")

    @classmethod
    def judged(cls, node: str, entries: int, failures: list[Failure]) -> NodeCheck:
        """The outcome of a list that replayed: pass, or fail naming the
        first :data:`MAX_FAILURES_SHOWN` refused entries."""
        if not failures:
            return cls(node, CheckResult.PASS, entries)
        shown = tuple(failures[:MAX_FAILURES_SHOWN])
        return cls(node, CheckResult.FAIL, entries, shown, len(failures))

    @classmethod
    def error_of(cls, node: str, reason: str, detail: str) -> NodeCheck:
        """An ``error`` outcome naming ``reason``."""
        text = f"{reason}: {detail}"
        return cls(node, CheckResult.ERROR, error=text[:_MAX_TEXT])

    @property
    def reason(self) -> str | None:
        """The reason code of an ``error`` outcome."""
        return None if self.error is None else self.error.split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "result": self.result.value,
            "entries": self.entries,
            "failures": [_failure_dict(f) for f in self.failures],
            "failures_total": self.failures_total,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "results") -> NodeCheck:
        if not isinstance(data, Mapping):
            raise FieldError(_REPORT, where, "must be an object")
        node = canonical_uuid_field(_REPORT, f"{where}.node", data.get("node"))
        try:
            result = CheckResult(str(data.get("result")))
        except ValueError:
            raise FieldError(
                _REPORT, f"{where}.result", "must be pass, fail or error"
            ) from None
        failures = data.get("failures", [])
        if not isinstance(failures, list) or len(failures) > MAX_FAILURES_SHOWN:
            raise FieldError(
                _REPORT, f"{where}.failures", "must be a list of failing entries"
            )
        parsed = tuple(
            _failure(f, f"{where}.failures.{i}") for i, f in enumerate(failures)
        )
        return cls(
            str(node),
            result,
            data.get("entries", 0),
            parsed,
            data.get("failures_total", len(parsed)),
            data.get("error"),
        )


@dataclasses.dataclass(frozen=True)
class PolicyCheckReport:
    """What the candidate would do to each node checked."""

    policy: PolicyRef
    results: tuple[NodeCheck, ...]

    @property
    def passed(self) -> bool:
        """Whether every node checked passes."""
        return all(r.result is CheckResult.PASS for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "results": [r.to_dict() for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: object) -> PolicyCheckReport:
        """Parse the verifier's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError(_REPORT, "must be a JSON object")
        results = data.get("results")
        if not isinstance(results, list):
            raise FieldError(_REPORT, "results", "must be a list")
        return cls(
            PolicyRef.from_dict(data.get("policy")),
            tuple(
                NodeCheck.from_dict(r, f"results.{i}") for i, r in enumerate(results)
            ),
        )
