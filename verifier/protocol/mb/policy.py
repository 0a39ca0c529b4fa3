"""Measured-boot policies and their evaluation against a boot event log.

A :class:`MeasuredBootPolicy` holds, each optional (``null`` or absent =
not checked):

* ``boot_applications``: allowed SHA-256 digests of
  ``EV_EFI_BOOT_SERVICES_APPLICATION`` events (shim, boot loader, kernel);
* ``firmware``: allowed SHA-256 digests of ``EV_S_CRTM_VERSION``,
  ``EV_EFI_PLATFORM_FIRMWARE_BLOB`` and ``EV_EFI_PLATFORM_FIRMWARE_BLOB2``
  events;
* ``secure_boot``: the required Secure Boot state, read from the
  ``EV_EFI_VARIABLE_DRIVER_CONFIG`` event of the EFI global variable
  ``SecureBoot`` (data ``01`` = enabled). ``true`` requires it enabled;
  ``false`` requires it absent or disabled;
* the Secure Boot chain of a disk image (shim, GRUB, a signed kernel):
  ``pk``, ``kek``, ``db``, ``dbx``, ``authorities``, ``sbat_level``,
  ``mok``, ``shim``, ``grub``, ``kernels``, ``kernel_cmdlines``,
  ``initrds`` -- see :mod:`verifier.protocol.mb.chain`. Pinning any key
  database requires ``pk`` and ``secure_boot: true``.

JSON form::

    {"boot_applications": ["<sha256 hex>", ...],
     "firmware": ["<sha256 hex>", ...],
     "secure_boot": true,
     "pk": ["x509:<sha256 of the certificate>"], ...}

Unknown keys are refused, naming them; a document of the first three keys
only keeps the meaning it always had.

The digests compared are the logged sha256-bank digests; replay the log
against quoted PCRs first (:mod:`verifier.protocol.mb.replay`) so they can
be trusted.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.mb._failure import Failure
from verifier.protocol.mb.chain import CHAIN_KEYS, SecureBootChain
from verifier.protocol.mb.eventlog import (
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_EFI_PLATFORM_FIRMWARE_BLOB,
    EV_EFI_PLATFORM_FIRMWARE_BLOB2,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_S_CRTM_VERSION,
    Event,
)

__all__ = [
    "EFI_GLOBAL_VARIABLE",
    "Failure",
    "MeasuredBootPolicy",
    "check",
    "evaluate",
    "policy_from_log",
    "secure_boot_state",
]

#: ``EFI_GLOBAL_VARIABLE`` vendor GUID (``SecureBoot``, ``PK``, ``KEK``...).
EFI_GLOBAL_VARIABLE = uuid.UUID("8be4df61-93ca-11d2-aa0d-00e098032b8c")
_STRUCT = "measured-boot policy"
_FIRMWARE_EVENTS = frozenset(
    {EV_S_CRTM_VERSION, EV_EFI_PLATFORM_FIRMWARE_BLOB, EV_EFI_PLATFORM_FIRMWARE_BLOB2}
)
_KEYS = frozenset({"boot_applications", "firmware", "secure_boot", *CHAIN_KEYS})


def _bad(detail: str) -> MalformedError:
    return MalformedError(_STRUCT, detail)


def _digests(value: Any, where: str) -> frozenset[bytes] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list of sha256 hex digests or null")
    out = set()
    for item in value:
        if not isinstance(item, str):
            raise _bad(f"{where}: digest must be a string")
        try:
            digest = bytes.fromhex(item)
        except ValueError:
            raise _bad(f"{where}: {item[:80]!r} is not hex") from None
        if len(digest) != 32:
            raise _bad(f"{where}: {item[:80]!r} is not a sha256 digest")
        out.add(digest)
    return frozenset(out)


@dataclasses.dataclass(frozen=True, slots=True)
class MeasuredBootPolicy:
    """A measured-boot policy; see the module doc.

    Attributes:
        boot_applications: allowed sha256 digests of boot applications, or
            ``None`` to allow any.
        firmware: allowed sha256 digests of firmware events, or ``None``.
        secure_boot: the required Secure Boot state, or ``None``.
        chain: the Secure Boot chain checks, or ``None``.
    """

    boot_applications: frozenset[bytes] | None = None
    firmware: frozenset[bytes] | None = None
    secure_boot: bool | None = None
    chain: SecureBootChain | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredBootPolicy:
        """Build from the JSON form.

        Raises:
            MalformedError: unknown keys, wrong types, bad digests or
                entries, a key database pinned without ``pk``, or ``pk``
                without ``secure_boot: true``.
        """
        if not isinstance(data, Mapping):
            raise _bad("must be a JSON object")
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise _bad(f"unknown keys {unknown}")
        secure_boot = data.get("secure_boot")
        if secure_boot is not None and not isinstance(secure_boot, bool):
            raise _bad("secure_boot must be true, false or null")
        chain = SecureBootChain.from_dict(data)
        if chain is not None and chain.pk is not None and secure_boot is not True:
            raise _bad("secure_boot must be true when pk is set")
        return cls(
            _digests(data.get("boot_applications"), "boot_applications"),
            _digests(data.get("firmware"), "firmware"),
            secure_boot,
            chain,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (digests sorted)."""

        def show(digests: frozenset[bytes] | None) -> list[str] | None:
            return None if digests is None else sorted(d.hex() for d in digests)

        out: dict[str, Any] = {
            "boot_applications": show(self.boot_applications),
            "firmware": show(self.firmware),
            "secure_boot": self.secure_boot,
        }
        if self.chain is not None:
            out.update(self.chain.to_dict())
        return out


def secure_boot_state(events: Iterable[Event]) -> tuple[Event, bool] | None:
    """The ``SecureBoot`` variable event and whether it says enabled.

    Returns:
        ``(event, enabled)`` for the first ``EV_EFI_VARIABLE_DRIVER_CONFIG``
        event of the global ``SecureBoot`` variable, else ``None``.

    Raises:
        MalformedError: a variable event whose data does not parse.
    """
    for event in events:
        if event.event_type != EV_EFI_VARIABLE_DRIVER_CONFIG:
            continue
        var = event.variable
        if var is not None and var.guid == EFI_GLOBAL_VARIABLE:
            if var.name == "SecureBoot":
                return event, var.data == b"\x01"
    return None


def policy_from_log(events: Iterable[Event]) -> MeasuredBootPolicy:
    """The policy a known-good boot's event log passes: its boot
    applications, its firmware events and its Secure Boot state (``None``
    where the log has none of a kind: that part is then not checked).

    Raises:
        MalformedError: an event of those kinds has no sha256 digest, or the
            SecureBoot variable event does not parse.
    """
    events = tuple(events)
    apps: set[bytes] = set()
    firmware: set[bytes] = set()
    for event in events:
        if event.event_type == EV_EFI_BOOT_SERVICES_APPLICATION:
            kind = apps
        elif event.event_type in _FIRMWARE_EVENTS:
            kind = firmware
        else:
            continue
        digest = event.digests.get("sha256")
        if digest is None:
            raise _bad(f"event {event.index} ({event.type_name}) has no sha256 digest")
        kind.add(digest)
    state = secure_boot_state(events)
    return MeasuredBootPolicy(
        frozenset(apps) or None,
        frozenset(firmware) or None,
        None if state is None else state[1],
    )


def _check_digest(
    event: Event, allowed: frozenset[bytes] | None, what: str
) -> Failure | None:
    if allowed is None:
        return None
    digest = event.digests.get("sha256")
    if digest is None:
        return Failure(event.index, event.type_name, "no sha256 digest", event.pcr)
    if digest not in allowed:
        return Failure(
            event.index,
            event.type_name,
            f"{what} digest {digest.hex()} not allowed",
            event.pcr,
        )
    return None


def evaluate(policy: MeasuredBootPolicy, events: Iterable[Event]) -> list[Failure]:
    """Every violation of ``policy`` by ``events`` (empty when it passes).

    Raises:
        MalformedError: the SecureBoot variable event, or a structure the
            chain policy reads, does not parse (naming the event and field).
    """
    events = tuple(events)
    failures: list[Failure] = []
    for event in events:
        failure: Failure | None = None
        if event.event_type == EV_EFI_BOOT_SERVICES_APPLICATION:
            failure = _check_digest(event, policy.boot_applications, "boot application")
        elif event.event_type in _FIRMWARE_EVENTS:
            failure = _check_digest(event, policy.firmware, "firmware")
        if failure is not None:
            failures.append(failure)
    if policy.secure_boot is not None:
        state = secure_boot_state(events)
        name = "EV_EFI_VARIABLE_DRIVER_CONFIG"
        if state is None:
            if policy.secure_boot:
                failures.append(
                    Failure(None, name, "SecureBoot variable not measured", 7)
                )
        elif not state[0].data_matches_digest():
            failures.append(
                Failure(
                    state[0].index,
                    name,
                    "SecureBoot event data does not match its logged digest",
                    state[0].pcr,
                )
            )
        elif state[1] != policy.secure_boot:
            want = "enabled" if policy.secure_boot else "disabled"
            have = "enabled" if state[1] else "disabled"
            failures.append(
                Failure(
                    state[0].index,
                    name,
                    f"Secure Boot is {have}, policy wants {want}",
                    state[0].pcr,
                )
            )
    if policy.chain is not None:
        failures += policy.chain.evaluate(events)
    return failures


def check(policy: MeasuredBootPolicy, events: Iterable[Event]) -> None:
    """Raise unless ``events`` satisfy ``policy``.

    Raises:
        EvidenceError: ``mb_policy`` listing the first failures.
        MalformedError: the SecureBoot variable event does not parse.
    """
    failures = evaluate(policy, events)
    if failures:
        shown = "; ".join(str(f) for f in failures[:5])
        more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
        raise EvidenceError("mb_policy", shown + more)
