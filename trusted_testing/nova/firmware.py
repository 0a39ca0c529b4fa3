"""A Nova guest's firmware, as Nova asked for it and as libvirt chose it.

For the tests of ``hw_firmware_type=uefi`` and ``os_secure_boot`` with
Nova 34's libvirt driver (doc/source/admin/vtpm.rst, "UEFI and Secure
Boot"):

* :func:`nova_guest_xml`: the domain XML Nova handed libvirt, read back
  from nova-compute's debug log (``End _get_guest_xml xml=``): with
  firmware auto-selection libvirt's live XML no longer shows what Nova
  wrote, only what libvirt picked;
* :func:`firmware_descriptor`: the QEMU firmware descriptor (QEMU's
  ``docs/interop/firmware.json``) whose executable libvirt picked, from
  the directories libvirt 9.0 reads, an operator's ``/etc/qemu/firmware``
  first;
* :func:`wait_for_console`: the guest's serial console (Nova's
  ``console.log``) once it shows a line, e.g. OVMF's boot manager.
"""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET
from typing import Any

__all__ = ["FIRMWARE_DIRS", "firmware_descriptor", "nova_guest_xml", "wait_for_console"]

#: where libvirt 9.0 (running as root) reads firmware descriptors; a file
#: in an earlier directory overrides (an empty one masks) a later one's
FIRMWARE_DIRS = ("/etc/qemu/firmware", "/usr/share/qemu/firmware")


def nova_guest_xml(log_path: str, uuid: str) -> ET.Element:
    """The last domain XML Nova's libvirt driver generated for ``uuid``.

    Args:
        log_path: nova-compute's log (``debug = true``).
        uuid: the instance.

    Returns:
        The ``<domain>`` element Nova passed to libvirt's ``defineXML``.

    Raises:
        LookupError: the log has no XML for that instance.
    """
    with open(log_path, encoding="utf-8") as f:
        log = f.read()
    marker = f"[instance: {uuid}] End _get_guest_xml xml="
    start = log.rfind(marker)
    if start < 0:
        raise LookupError(f"no guest XML for {uuid} in {log_path}")
    start += len(marker)
    end = log.find("</domain>", start)
    if end < 0:
        raise LookupError(f"the guest XML for {uuid} is cut short in {log_path}")
    return ET.fromstring(log[start : end + len("</domain>")])


def firmware_descriptor(
    executable: str, dirs: tuple[str, ...] = FIRMWARE_DIRS
) -> tuple[str, dict[str, Any]]:
    """The firmware descriptor whose executable is ``executable``.

    Args:
        executable: a ``<loader>`` path from a running domain's XML.
        dirs: the descriptor directories, highest priority first.

    Returns:
        The descriptor's file name and its JSON.

    Raises:
        LookupError: no (unmasked) descriptor names that executable.
    """
    seen: set[str] = set()
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        for name in names:
            if name in seen or not name.endswith(".json"):
                continue
            seen.add(name)
            path = os.path.join(directory, name)
            if os.path.getsize(path) == 0:  # masked
                continue
            with open(path, encoding="utf-8") as f:
                descriptor = json.load(f)
            mapping = descriptor.get("mapping", {})
            if mapping.get("executable", {}).get("filename") == executable:
                return name, descriptor
    raise LookupError(f"no firmware descriptor for {executable}")


def wait_for_console(path: str, text: str, timeout: float) -> str:
    """The console log once it contains ``text``, or as it is at the end
    of ``timeout`` seconds (the caller asserts on it)."""
    deadline = time.monotonic() + timeout
    content = ""
    while True:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                content = f.read()
        except FileNotFoundError:
            pass
        if text in content or time.monotonic() > deadline:
            return content
        time.sleep(1)
