"""A measured-boot policy from a disk image's Secure Boot chain
(``trusted-tenant policy generate measured-boot --image``): what
:class:`verifier.protocol.mb.chain.SecureBootChain` judges, read offline
from a raw or qcow2 whole-disk image (:mod:`verifier.common.bootdisk`)
and, with ``--vars``, the OVMF variable store the VM starts with.

* ``shim``, ``grub``: Authenticode digests of shim and GRUB on the ESP
  (PCR 4, logged by firmware and shim);
* ``kernels``: Authenticode digests of every kernel a GRUB menu entry
  boots (PCR 4, shim verifies and logs it for GRUB);
* ``kernel_cmdlines``: the exact text GRUB measures in PCR 8 for each
  entry (``kernel_cmdline: <path> <args>``);
* ``initrds``: sha256 of each initrd file (PCR 9);
* ``mok``: what shim logs in PCR 14 when no machine owner key is enrolled
  (its vendor certificate and revocations, read from the shim binary:
  :mod:`verifier.protocol.mb.shim`); ``sbat_level``: the SBAT level shim
  applies by default (its *previous* level);
* ``secure_boot``: true; with the variable store, ``pk``, ``kek``, ``db``
  (exactly these entries), ``dbx`` (at least these) and ``authorities``
  (a ``db`` certificate verified shim, shim's vendor certificate GRUB and
  the kernels) -- without it the key databases are not pinned.

A kernel update is a new policy version: ``keep`` unions the previous
document's kernels, command lines and initrds so the old and the new
kernel both boot until the tenant drops the old.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping
from typing import Any

from verifier.common.bootdisk import read_boot_chain
from verifier.common.diskimage import DiskImageError, FileImage, MissingFileError
from verifier.common.ovmfvars import read_variables
from verifier.protocol.mb import MeasuredBootPolicy, efisig
from verifier.protocol.mb.authenticode import pe_authenticode_digest
from verifier.protocol.mb.chain import DATABASES
from verifier.protocol.mb.shim import mok_digests, shim_builtins

__all__ = ["KEPT_KEYS", "key_databases", "measured_boot_from_image"]

#: The keys ``keep`` carries over from the previous version.
KEPT_KEYS = ("kernels", "kernel_cmdlines", "initrds")


def key_databases(vars_data: bytes) -> dict[str, list[str]]:
    """``pk``, ``kek``, ``db``, ``dbx`` entries of an OVMF variable store.

    Raises:
        DiskImageError: not a variable store, or no PK (Secure Boot keys
            not enrolled).
        MalformedError: a signature list that does not parse.
    """
    variables = read_variables(vars_data)
    out: dict[str, list[str]] = {}
    for key, (name, guid) in DATABASES.items():
        data = variables.get((name, uuid.UUID(guid)))
        if data is None and key == "pk":
            raise DiskImageError(
                "OVMF variables: no PK enrolled (Secure Boot keys are not set)"
            )
        entries = efisig.parse_signature_lists(data or b"", f"OVMF variable {name}")
        out[key] = sorted({e.key for e in entries})
    return out


def measured_boot_from_image(
    image: str,
    vars_path: str | None = None,
    keep: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The measured-boot policy document of a disk image's boot chain.

    Args:
        image: a raw or qcow2 whole-disk image (GPT, an ESP with shim and
            GRUB, a root or ``/boot`` ext4 file system).
        vars_path: the OVMF variable store the VM starts with
            (``OVMF_VARS_4M.ms.fd``): pins ``pk``, ``kek``, ``db``, ``dbx``.
        keep: a previous version's document whose kernels, command lines
            and initrds stay allowed (kernel rollover).

    Returns:
        The JSON document (accepted by ``MeasuredBootPolicy.from_dict``).

    Raises:
        DiskImageError: the image or the variable store cannot be read,
            or GRUB's configuration uses what the reader refuses.
        MalformedError: a binary that is not a PE image, a signature list
            or a kept document that does not parse.
        OSError: a file cannot be opened.
    """
    with open(image, "rb") as handle:
        chain = read_boot_chain(FileImage(handle))
        kernels, cmdlines, initrds = set(), set(), set()
        for entry in chain.menu.entries:
            try:
                kernel = chain.disk.read(*entry.kernel)
                kernels.add(pe_authenticode_digest(kernel).hex())
                for device, path in entry.initrds:
                    data = chain.disk.read(device, path)
                    initrds.add(hashlib.sha256(data).hexdigest())
            except MissingFileError as exc:
                raise DiskImageError(
                    f"menu entry {entry.title!r}: {exc.path} not found"
                ) from None
            cmdlines.add(entry.cmdline)
    shim = shim_builtins(chain.shim)
    document: dict[str, Any] = {
        "secure_boot": True,
        "shim": [pe_authenticode_digest(chain.shim).hex()],
        "grub": [pe_authenticode_digest(chain.grub).hex()],
        "kernels": sorted(kernels),
        "kernel_cmdlines": sorted(cmdlines),
        "initrds": sorted(initrds),
        "mok": {name: [d.hex()] for name, d in mok_digests(shim).items()},
    }
    if shim.sbat_previous is not None:
        document["sbat_level"] = shim.sbat_previous
    if vars_path is not None:
        if os.path.getsize(vars_path) > 64 << 20:
            raise DiskImageError(f"{vars_path}: not an OVMF variable store (size)")
        with open(vars_path, "rb") as handle:
            document.update(key_databases(handle.read()))
        document["authorities"] = _authorities(document["db"], shim.vendor_cert)
    if keep is not None:
        _merge_kept(document, keep)
    MeasuredBootPolicy.from_dict(document)  # what the verifier will accept
    return document


def _authorities(db: list[str], vendor_cert: bytes | None) -> list[dict[str, str]]:
    """Who may verify each binary: a certificate of ``db`` (shim) and
    shim's vendor certificate (GRUB and the kernels, logged as
    ``MokListRT``)."""
    out = [{"variable": "db", "entry": key} for key in db if key.startswith("x509:")]
    if vendor_cert:
        key = efisig.entry_key(efisig.EFI_CERT_X509, vendor_cert)
        out.append({"variable": "MokListRT", "entry": key})
    return sorted(out, key=lambda a: (a["variable"], a["entry"]))


def _merge_kept(document: dict[str, Any], keep: Mapping[str, Any]) -> None:
    """Union the previous version's kernels, command lines and initrds."""
    old = MeasuredBootPolicy.from_dict(keep).chain
    if old is None:
        return
    old_doc = old.to_dict()
    for key in KEPT_KEYS:
        items = old_doc.get(key) or []
        merged = list(document[key])
        for item in items:
            if item not in merged:
                merged.append(item)
        document[key] = merged
