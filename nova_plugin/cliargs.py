"""What the tenant's command lines have in common: ``trusted-tenant``
(:mod:`nova_plugin.cmd`) and the trusted boot of ``trusted-nova boot`` and
``openstack trusted server create`` (:mod:`nova_plugin.bootcli`).

Both take the same connection settings, each defaulting to an environment
variable, and both read the PCR policy a node is judged by either from a
JSON file (``{"pcrs": {"16": ["<hex>"]}}``) or from repeated
``--pcr N=HEX`` options. Bad input becomes a :class:`UsageError` whose
one line names the option and the file.
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Iterable, Sequence
from typing import Any

from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant, TenantConfig
from verifier.protocol import MalformedError, PcrPolicy, jsonlimits
from verifier.protocol.attestation import AttestationMode

__all__ = [
    "MAX_POLICY_FILE",
    "SETTINGS_ENV",
    "attestation_mode",
    "certificate_tenant",
    "missing_settings",
    "pcr_policy",
    "policy_file",
    "with_base",
]

#: The connection settings (each an option ``--NAME``) and the environment
#: variable each one defaults to.
SETTINGS_ENV = {
    "registrar": "TRUSTED_REGISTRAR_URL",
    "verifier": "TRUSTED_VERIFIER_URL",
    "cert": "TRUSTED_CERT",
    "key": "TRUSTED_KEY",
    "ca": "TRUSTED_CA",
}

#: A PCR policy file larger than this is refused unread (a policy takes a
#: few KiB).
MAX_POLICY_FILE = 1 << 20


def attestation_mode(text: str) -> AttestationMode:
    """The ``--mode`` option, parsed where it is read.

    Raises:
        argparse.ArgumentTypeError: not ``pull`` or ``push`` (argparse
            prints it as its own one-line usage error).
    """
    try:
        return AttestationMode(text)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in AttestationMode)
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {choices})"
        ) from None


def missing_settings(names: Iterable[str]) -> UsageError:
    """The error for connection settings given neither as an option nor
    in the environment (each named with its variable)."""
    return UsageError(
        "missing settings: "
        + ", ".join(f"--{name} (or ${SETTINGS_ENV[name]})" for name in names)
    )


def certificate_tenant(args: argparse.Namespace, direct_agents: bool) -> Tenant:
    """The tenant client over mTLS with the tenant certificate of the
    settings (``--cert``, ``--key``, ``--ca``; the ``noauth`` demo's
    identity).

    Args:
        args: the parsed settings (``--verifier`` given).
        direct_agents: reach polled nodes' agents directly.

    Raises:
        UsageError: the certificate, key or CA is not usable PEM.
    """
    try:
        return Tenant(
            TenantConfig(
                (args.registrar or "").rstrip("/"),
                args.verifier.rstrip("/"),
                args.cert,
                args.key,
                args.ca,
                direct_agents=direct_agents,
            )
        )
    except ssl.SSLError as exc:
        raise UsageError(
            f"--cert {args.cert}, --key {args.key}, --ca {args.ca}: not a usable "
            f"certificate, key and CA (PEM): {exc}"
        ) from None


def policy_file(option: str, path: str) -> PcrPolicy:
    """The PCR policy in the JSON file ``path``, given with ``option``.

    Raises:
        UsageError: unreadable, too large or invalid; the message starts
            with the option and the path, and places a JSON error.
    """
    where = f"{option} {path}"
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_POLICY_FILE + 1)
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror or exc}") from None
    if len(text) > MAX_POLICY_FILE:
        raise UsageError(f"{where}: larger than {MAX_POLICY_FILE} bytes")
    try:
        return PcrPolicy.from_dict(jsonlimits.loads(text, where))
    except MalformedError as exc:
        raise UsageError(f"{where}: {exc.detail}") from None


def pcr_policy(
    path: str | None,
    pcrs: Sequence[str],
    *,
    file_option: str,
    stored: bool,
    missing: str,
    invalid_pcr: str = "--pcr",
) -> PcrPolicy:
    """The PCR policy of a command line: the file ``path`` if given, else
    the ``--pcr N=HEX`` values ``pcrs`` (several values of one PCR are
    alternatives).

    Args:
        path: the policy file's path, or None.
        pcrs: the ``--pcr`` values.
        file_option: the option that names the file (for messages).
        stored: a stored runtime or measured-boot policy is named, which
            judges every quote: with neither a file nor ``--pcr`` the PCR
            policy is then empty instead of missing.
        missing: the message when no policy at all is given.
        invalid_pcr: how the message about an invalid PCR value begins.

    Raises:
        UsageError: no policy, an unreadable or invalid file, a value that
            is not ``N=HEX``, or an invalid PCR index or digest.
    """
    if path:
        return policy_file(file_option, path)
    values: dict[str, list[str]] = {}
    for item in pcrs:
        index, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--pcr {item!r}: expected N=HEX")
        values.setdefault(index, []).append(value)
    if not values:
        if stored:
            return PcrPolicy({})
        raise UsageError(missing)
    try:
        return PcrPolicy.from_dict({"pcrs": values})
    except MalformedError as exc:
        raise UsageError(f"{invalid_pcr}: {exc.detail}") from None


def with_base(
    document: dict[str, Any], digest: str, ref: str, where: str
) -> dict[str, Any]:
    """``document`` (a runtime policy) made a delta over the policy
    ``ref`` resolved to (``digest``), as ``policy add --base REF`` sends it.

    Raises:
        UsageError: the document already names another base (both named).
    """
    have = document.get("base")
    if have is not None and have != digest:
        raise UsageError(
            f"{where}: the file's base {str(have)[:64]!r} is not {ref} "
            f"({digest}); remove one of them"
        )
    return {**document, "base": digest}
