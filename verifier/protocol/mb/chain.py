"""The measured-boot policy of a UEFI Secure Boot chain: shim, GRUB and a
signed kernel (the part of :class:`~verifier.protocol.mb.MeasuredBootPolicy`
for disk images booted under Secure Boot).

What OVMF (EDK2), shim and GRUB log, and what each field checks (every
field optional: absent or ``null`` = not checked):

* PCR 7, ``EV_EFI_VARIABLE_DRIVER_CONFIG`` of ``PK``, ``KEK`` (global
  variables), ``db`` and ``dbx`` (``EFI_IMAGE_SECURITY_DATABASE``), each an
  ``EFI_SIGNATURE_LIST`` sequence (:mod:`verifier.protocol.mb.efisig`):
  ``pk`` (the logged PK is one of these), ``kek`` and ``db`` (exactly these
  entries), ``dbx`` (at least these entries: a dbx as recent as the
  tenant's);
* PCR 7, ``EV_EFI_VARIABLE_AUTHORITY``: the entry that verified each
  binary -- firmware's ``db`` entry for shim, shim's ``Shim`` (its built-in
  certificate), ``vendor_db``, ``db`` or ``MokListRT`` entry for GRUB and the
  kernel -- ``authorities``; shim's ``SbatLevel`` -- ``sbat_level`` (at
  least the tenant's); shim's ``MokSBState`` (validation turned off by the
  machine owner) is refused whenever ``authorities`` is set;
* PCR 4, ``EV_EFI_BOOT_SERVICES_APPLICATION`` in order: shim (by firmware),
  GRUB (by shim), then kernels (by shim for GRUB): Authenticode digests
  ``shim``, ``grub``, ``kernels``;
* PCR 8, GRUB's ``kernel_cmdline:`` strings: ``kernel_cmdlines`` (exact
  strings, or ``{"pattern": ...}`` matched against the whole line);
* PCR 9, the files named by GRUB's ``initrd`` commands: ``initrds``
  (sha256 of the file);
* PCR 14, shim's ``MokList``, ``MokListX``, ``MokListTrusted`` (digest of
  the variable's contents): ``mok`` (``"empty"`` = shim's placeholder list
  when the variable and shim's built-in certificate are both absent).

Logged variable data and GRUB's strings are believed only when they hash
to their logged sha256 digest (the PCRs cover the digests, not the data).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from verifier.protocol.errors import MalformedError
from verifier.protocol.mb import efisig
from verifier.protocol.mb._failure import Failure
from verifier.protocol.mb.bootstrings import SbatLevel, ipl_string
from verifier.protocol.mb.eventlog import (
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_EFI_VARIABLE_AUTHORITY,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_IPL,
    EfiVariable,
    Event,
)

__all__ = ["CHAIN_KEYS", "DATABASES", "MOK_VARIABLES", "SecureBootChain", "mok_empty"]

#: The policy keys of this module.
CHAIN_KEYS = (
    "pk",
    "kek",
    "db",
    "dbx",
    "authorities",
    "sbat_level",
    "mok",
    "shim",
    "grub",
    "kernels",
    "kernel_cmdlines",
    "initrds",
)
#: Policy key -> (variable name, vendor GUID) of the key databases.
DATABASES = {
    "pk": ("PK", "8be4df61-93ca-11d2-aa0d-00e098032b8c"),
    "kek": ("KEK", "8be4df61-93ca-11d2-aa0d-00e098032b8c"),
    "db": ("db", str(efisig.EFI_IMAGE_SECURITY_DATABASE)),
    "dbx": ("dbx", str(efisig.EFI_IMAGE_SECURITY_DATABASE)),
}
MOK_VARIABLES = ("MokList", "MokListX", "MokListTrusted")
_SBAT_NAMES = ("SbatLevel", "SBAT")
_SHIM_STATE = ("MokListTrusted", "MokPolicy", "MokIgnoreDB", "MokDBState")
_STRUCT = "measured-boot policy"
_MAX_PATTERN = 4096


def _bad(detail: str) -> MalformedError:
    return MalformedError(_STRUCT, detail)


def mok_empty() -> bytes:
    """The digest shim logs for an empty MOK list without a built-in
    certificate: one ``EFI_CERT_SHA256`` entry of zeros owned by shim."""
    esl = efisig.signature_list(efisig.EFI_CERT_SHA256, efisig.SHIM_LOCK, [bytes(32)])
    return hashlib.sha256(esl).digest()


def _keys(value: Any, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list of entries or null")
    return frozenset(
        efisig.key_from_text(item, f"{where}[{i}]") for i, item in enumerate(value)
    )


def _digests(
    value: Any, where: str, words: Mapping[str, bytes] | None = None
) -> frozenset[bytes] | None:
    words = words or {}
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list of sha256 hex digests or null")
    out = set()
    for i, item in enumerate(value):
        if isinstance(item, str) and item in words:
            out.add(words[item])
            continue
        if not isinstance(item, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", item):
            raise _bad(f"{where}[{i}]: {str(item)[:80]!r} is not a sha256 hex digest")
        out.add(bytes.fromhex(item))
    return frozenset(out)


def _authorities(value: Any) -> frozenset[tuple[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad("authorities must be a list of {variable, entry} objects or null")
    out = set()
    for i, item in enumerate(value):
        where = f"authorities[{i}]"
        if not isinstance(item, dict) or set(item) != {"variable", "entry"}:
            raise _bad(f"{where} must be an object with exactly variable and entry")
        variable = item["variable"]
        if not isinstance(variable, str) or not 0 < len(variable) <= 64:
            raise _bad(f"{where}.variable must be a variable name")
        out.add((variable, efisig.key_from_text(item["entry"], f"{where}.entry")))
    return frozenset(out)


def _cmdlines(value: Any) -> tuple[frozenset[str], tuple[re.Pattern[str], ...]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad("kernel_cmdlines must be a list or null")
    exact, patterns = set(), []
    for i, item in enumerate(value):
        where = f"kernel_cmdlines[{i}]"
        if isinstance(item, str):
            exact.add(item)
            continue
        if not isinstance(item, dict) or set(item) != {"pattern"}:
            raise _bad(f'{where} must be a string or {{"pattern": regex}}')
        pattern = item["pattern"]
        if not isinstance(pattern, str) or len(pattern) > _MAX_PATTERN:
            raise _bad(f"{where}.pattern must be a string of at most {_MAX_PATTERN}")
        try:
            patterns.append(re.compile(pattern))
        except (re.error, RecursionError, OverflowError) as exc:
            raise _bad(f"{where}.pattern does not compile: {exc}") from None
    return frozenset(exact), tuple(patterns)


def _mok(value: Any) -> tuple[tuple[str, frozenset[bytes]], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("mok must be an object of MOK variable -> digests, or null")
    unknown = sorted(set(value) - set(MOK_VARIABLES))
    if unknown:
        raise _bad(
            f"mok: unknown MOK variables {unknown} (known: {list(MOK_VARIABLES)})"
        )
    out = {}
    for name, digests in value.items():
        allowed = _digests(digests, f"mok.{name}", {"empty": mok_empty()})
        if allowed is None:
            raise _bad(f"mok.{name} must be a list")
        out[name] = allowed
    return tuple(sorted(out.items()))


@dataclasses.dataclass(frozen=True, slots=True)
class SecureBootChain:
    """The Secure Boot chain part of a measured-boot policy (module doc)."""

    pk: frozenset[str] | None = None
    kek: frozenset[str] | None = None
    db: frozenset[str] | None = None
    dbx: frozenset[str] | None = None
    authorities: frozenset[tuple[str, str]] | None = None
    sbat_level: SbatLevel | None = None
    mok: tuple[tuple[str, frozenset[bytes]], ...] | None = None
    shim: frozenset[bytes] | None = None
    grub: frozenset[bytes] | None = None
    kernels: frozenset[bytes] | None = None
    kernel_cmdlines: tuple[frozenset[str], tuple[re.Pattern[str], ...]] | None = None
    initrds: frozenset[bytes] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SecureBootChain | None:
        """The chain part of a policy document (``None`` if it sets none).

        Raises:
            MalformedError: a bad value, or ``kek``, ``db``, ``dbx`` or
                ``authorities`` without ``pk``.
        """
        sbat = data.get("sbat_level")
        if sbat is not None and not isinstance(sbat, str):
            raise _bad("sbat_level must be SbatLevel CSV text or null")
        chain = cls(
            _keys(data.get("pk"), "pk"),
            _keys(data.get("kek"), "kek"),
            _keys(data.get("db"), "db"),
            _keys(data.get("dbx"), "dbx"),
            _authorities(data.get("authorities")),
            None if sbat is None else SbatLevel.from_text(sbat, "sbat_level"),
            _mok(data.get("mok")),
            _digests(data.get("shim"), "shim"),
            _digests(data.get("grub"), "grub"),
            _digests(data.get("kernels"), "kernels"),
            _cmdlines(data.get("kernel_cmdlines")),
            _digests(data.get("initrds"), "initrds"),
        )
        pinned = [
            k for k in ("kek", "db", "dbx", "authorities") if data.get(k) is not None
        ]
        if pinned and chain.pk is None:
            raise _bad(
                f"pk missing: a policy that pins {', '.join(pinned)} names the PK too"
            )
        if chain.pk is not None and not chain.pk:
            raise _bad("pk must name at least one PK")
        if all(getattr(chain, f.name) is None for f in dataclasses.fields(cls)):
            return None
        return chain

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the fields set (entries sorted)."""
        out: dict[str, Any] = {}
        for key in ("pk", "kek", "db", "dbx"):
            keys = getattr(self, key)
            if keys is not None:
                out[key] = sorted(keys)
        if self.authorities is not None:
            out["authorities"] = [
                {"variable": v, "entry": e} for v, e in sorted(self.authorities)
            ]
        if self.sbat_level is not None:
            out["sbat_level"] = self.sbat_level.to_text()
        if self.mok is not None:
            out["mok"] = {n: sorted(d.hex() for d in v) for n, v in self.mok}
        for key in ("shim", "grub", "kernels", "initrds"):
            digests = getattr(self, key)
            if digests is not None:
                out[key] = sorted(d.hex() for d in digests)
        if self.kernel_cmdlines is not None:
            exact, patterns = self.kernel_cmdlines
            out["kernel_cmdlines"] = sorted(exact) + [
                {"pattern": p.pattern} for p in patterns
            ]
        return out

    def evaluate(self, events: Sequence[Event]) -> list[Failure]:
        """Every violation of the chain policy by ``events``.

        Raises:
            MalformedError: a signature list, variable, SbatLevel or
                ``EV_IPL`` string the policy reads does not parse (naming
                the event index and field).
        """
        failures: list[Failure] = []
        failures += self._databases(events)
        failures += self._authority_events(events)
        failures += self._boot_applications(events)
        if self.kernel_cmdlines is not None or self.initrds is not None:
            failures += _grub(self, events)
        if self.mok is not None:
            failures += self._mok_lists(events)
        return failures

    # -- PCR 7: the key databases -----------------------------------------

    def _databases(self, events: Sequence[Event]) -> list[Failure]:
        failures: list[Failure] = []
        for key, (name, guid) in DATABASES.items():
            want: frozenset[str] | None = getattr(self, key)
            if want is None:
                continue
            found = [
                (e, v)
                for e, v in _variables(events, EV_EFI_VARIABLE_DRIVER_CONFIG)
                if v.name == name and str(v.guid) == guid
            ]
            if not found:
                failures.append(
                    Failure(
                        None, "EV_EFI_VARIABLE_DRIVER_CONFIG", f"{name} not measured", 7
                    )
                )
            for event, var in found:
                failure = _forged(event) or _compare_db(key, name, want, event, var)
                if failure is not None:
                    failures.append(failure)
        return failures

    # -- PCR 7: who verified each binary, SBAT ----------------------------

    def _authority_events(self, events: Sequence[Event]) -> list[Failure]:
        failures: list[Failure] = []
        saw_sbat = False
        for event, var in _variables(events, EV_EFI_VARIABLE_AUTHORITY):
            if var.name in _SBAT_NAMES and var.guid == efisig.SHIM_LOCK:
                saw_sbat = True
                if self.sbat_level is not None:
                    failures += _check_sbat(self.sbat_level, event, var)
                continue
            if self.authorities is None or var.name in _SHIM_STATE:
                continue
            failure = _forged(event) or _check_authority(self.authorities, event, var)
            if failure is not None:
                failures.append(failure)
        if self.sbat_level is not None and not saw_sbat:
            failures.append(
                Failure(None, "EV_EFI_VARIABLE_AUTHORITY", "SbatLevel not measured", 7)
            )
        return failures

    # -- PCR 4: shim, GRUB, kernels ---------------------------------------

    def _boot_applications(self, events: Sequence[Event]) -> list[Failure]:
        stages = (("shim", self.shim), ("GRUB", self.grub))
        if all(v is None for _, v in stages) and self.kernels is None:
            return []
        apps = [
            e
            for e in events
            if e.event_type == EV_EFI_BOOT_SERVICES_APPLICATION and e.pcr == 4
        ]
        failures: list[Failure] = []
        for i, event in enumerate(apps):
            what, allowed = stages[i] if i < len(stages) else ("kernel", self.kernels)
            if allowed is None:
                continue
            digest = event.digests.get("sha256", b"")
            if digest not in allowed:
                shown = digest.hex() or "missing"
                failures.append(
                    _fail(
                        event,
                        f"{what} Authenticode digest {shown} is not among the "
                        f"policy's {len(allowed)} {what} digest(s)",
                    )
                )
        needed = [w for w, v in (*stages, ("kernel", self.kernels)) if v is not None]
        names = ("shim", "GRUB", "kernel")
        for what in needed:
            if names.index(what) >= len(apps):
                failures.append(
                    Failure(
                        None,
                        "EV_EFI_BOOT_SERVICES_APPLICATION",
                        f"no {what} measured in PCR 4 ({len(apps)} boot applications)",
                        4,
                    )
                )
        return failures

    # -- PCR 14: shim's MOK lists -----------------------------------------

    def _mok_lists(self, events: Sequence[Event]) -> list[Failure]:
        assert self.mok is not None
        mok = dict(self.mok)
        failures: list[Failure] = []
        seen = set()
        for event in events:
            if event.event_type != EV_IPL or event.pcr != 14:
                continue
            name = ipl_string(event).text
            if name not in MOK_VARIABLES:
                continue
            seen.add(name)
            allowed = mok.get(name)
            digest = event.digests.get("sha256", b"")
            if allowed is None:
                failures.append(
                    _fail(event, f"{name} measured; the policy allows no {name}")
                )
            elif digest not in allowed:
                failures.append(
                    _fail(
                        event,
                        f"{name} contents (sha256 {digest.hex() or 'missing'}) are not "
                        f"among the policy's {len(allowed)} allowed",
                    )
                )
        for name in sorted(set(mok) - seen):
            failures.append(
                Failure(None, "EV_IPL", f"{name} not measured in PCR 14", 14)
            )
        return failures


def _fail(event: Event, reason: str) -> Failure:
    return Failure(event.index, event.type_name, reason, event.pcr)


def _variables(
    events: Iterable[Event], event_type: int
) -> Iterable[tuple[Event, EfiVariable]]:
    for event in events:
        if event.event_type == event_type and event.pcr == 7:
            var = event.variable
            assert var is not None
            yield event, var


def _forged(event: Event) -> Failure | None:
    """The variable data must hash to the logged digest (EDK2 and shim
    measure the whole ``UEFI_VARIABLE_DATA``)."""
    if not event.data_matches_digest():
        return _fail(event, "event data does not match its logged digest")
    return None


def _compare_db(
    key: str, name: str, want: frozenset[str], event: Event, var: EfiVariable
) -> Failure | None:
    where = f"event {event.index} ({name})"
    have = [entry.key for entry in efisig.parse_signature_lists(var.data, where)]
    got = frozenset(have)
    if key == "pk":
        if len(have) != 1 or have[0] not in want:
            return _fail(
                event, f"PK {sorted(got) or 'empty'} is not one of {sorted(want)}"
            )
        return None
    if key == "dbx":
        missing = sorted(want - got)
        if missing:
            return _fail(
                event,
                f"dbx lacks {len(missing)} of the policy's {len(want)} entries "
                f"(older than the tenant's dbx): {', '.join(missing[:3])}"
                + (" ..." if len(missing) > 3 else ""),
            )
        return None
    if got != want:
        extra, missing = sorted(got - want), sorted(want - got)
        return _fail(
            event,
            f"{name} differs from the policy: extra {extra[:3]}, missing {missing[:3]}",
        )
    return None


def _check_authority(
    allowed: frozenset[tuple[str, str]], event: Event, var: EfiVariable
) -> Failure | None:
    where = f"event {event.index} ({var.name})"
    if var.name == "MokSBState":
        if any(var.data):
            return _fail(event, "shim validation is disabled (MokSBState set)")
        return None
    if var.name == "Shim":  # shim's built-in certificate, DER alone
        key = efisig.entry_key(efisig.EFI_CERT_X509, var.data)
    else:
        key = efisig.parse_signature_data(var.data, None, where).key
    if (var.name, key) not in allowed:
        shown = ", ".join(f"{v} {e}" for v, e in sorted(allowed)[:4])
        return _fail(
            event,
            f"authority {var.name} {key} is not allowed (policy allows: {shown})",
        )
    return None


def _check_sbat(want: SbatLevel, event: Event, var: EfiVariable) -> list[Failure]:
    forged = _forged(event)
    if forged is not None:
        return [forged]
    where = f"event {event.index} ({var.name})"
    have = SbatLevel.from_bytes(var.data, where)
    short = have.shortfalls(want)
    if short:
        return [_fail(event, f"SbatLevel lower than the policy's: {'; '.join(short)}")]
    return []


def _grub(chain: SecureBootChain, events: Sequence[Event]) -> list[Failure]:
    """PCR 8 command lines and PCR 9 initrds (see the module doc)."""
    failures: list[Failure] = []
    cmdlines = 0
    initrd_paths: list[tuple[Event, str]] = []
    files: dict[str, list[Event]] = {}
    for event in events:
        if event.event_type != EV_IPL or event.pcr not in (8, 9):
            continue
        text = ipl_string(event)
        if event.pcr == 9:
            files.setdefault(text.text, []).append(event)
            continue
        if not text.kind:
            continue
        if not text.matches_digest(event):
            failures.append(_fail(event, f"{text.kind} text does not match its digest"))
            continue
        if text.kind == "kernel_cmdline" and chain.kernel_cmdlines is not None:
            cmdlines += 1
            exact, patterns = chain.kernel_cmdlines
            if text.text not in exact and not any(
                p.fullmatch(text.text) for p in patterns
            ):
                failures.append(
                    _fail(
                        event,
                        f"kernel command line {text.text[:200]!r} is not allowed "
                        f"({len(exact)} exact, {len(patterns)} patterns)",
                    )
                )
        elif text.kind == "grub_cmd" and text.text.split(" ", 1)[0] == "initrd":
            args = text.text.split()[1:]
            initrd_paths += [(event, a) for a in args if not a.startswith("-")]
    if chain.kernel_cmdlines is not None and not cmdlines:
        failures.append(Failure(None, "EV_IPL", "no kernel command line measured", 8))
    if chain.initrds is not None:
        failures += _initrds(chain.initrds, initrd_paths, files)
    return failures


def _initrds(
    allowed: frozenset[bytes],
    paths: list[tuple[Event, str]],
    files: Mapping[str, list[Event]],
) -> list[Failure]:
    if not paths:
        return [Failure(None, "EV_IPL", "no initrd command measured in PCR 8", 8)]
    failures: list[Failure] = []
    for command, path in paths:
        measured = files.get(path, [])
        if not measured:
            failures.append(
                _fail(command, f"initrd {path!r} was not measured in PCR 9")
            )
        for event in measured:
            digest = event.digests.get("sha256", b"")
            if digest not in allowed:
                failures.append(
                    _fail(
                        event,
                        f"initrd {path!r} (sha256 {digest.hex() or 'missing'}) is not "
                        f"among the policy's {len(allowed)} initrds",
                    )
                )
    return failures
