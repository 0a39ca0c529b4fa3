"""Images the Glance stand-in serves to a :class:`~trusted_testing.nova.
libvirt_deploy.LibvirtNovaDeployment`: the real guest image (a partition
image booted with its kernel and initramfs) and a blank disk (a guest
that boots no OS: enough where a test checks where Nova places a vTPM
guest, that libvirt starts it and how it moves, not what runs inside).
"""

from __future__ import annotations

import os
import subprocess
import uuid as uuid_mod
from typing import Any

from trusted_testing.nova.standins import StandIns

__all__ = ["blank_image", "guest_image"]


def _base() -> dict[str, Any]:
    """Glance v2 fields every served image has."""
    return {
        "status": "active",
        "visibility": "public",
        "min_disk": 0,
        "min_ram": 0,
        "protected": False,
        "tags": [],
        "owner": "provider",
        "checksum": None,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "schema": "/v2/schemas/image",
    }


def guest_image(
    standins: StandIns,
    qcow2: str,
    kernel: str,
    initrd: str,
    cmdline: str,
    properties: dict[str, str] | None = None,
) -> str:
    """Serve a partition image with its kernel and initramfs through the
    Glance stand-in; returns the root image's ID.

    The guest boots with SeaBIOS, Nova's default, not UEFI: for
    ``hw_firmware_type=uefi`` without Secure Boot Nova 34 writes ``<os
    firmware='efi'>`` together with ``<loader secure='no'>``, which
    libvirt 9.0 refuses ("loader attribute 'secure' cannot be specified
    when firmware autoselection is enabled"); with ``os_secure_boot=
    required`` OVMF enforces Secure Boot with Microsoft's keys (see
    doc/source/admin/vtpm.rst, "UEFI and Secure Boot"). ``properties``
    adds image properties (e.g. ``hw_qemu_guest_agent``)."""
    kernel_id, ramdisk_id, image_id = (str(uuid_mod.uuid4()) for _ in range(3))
    base = _base()
    for image_id_, name, fmt, path in (
        (kernel_id, "trusted-guest-kernel", "aki", kernel),
        (ramdisk_id, "trusted-guest-initrd", "ari", initrd),
    ):
        standins.add_image(
            {
                **base,
                "id": image_id_,
                "name": name,
                "disk_format": fmt,
                "container_format": fmt,
                "size": os.path.getsize(path),
                "file": f"/v2/images/{image_id_}/file",
            },
            path,
        )
    standins.add_image(
        {
            **base,
            "id": image_id,
            "name": "trusted-guest-vm",
            "disk_format": "qcow2",
            "container_format": "bare",
            "size": os.path.getsize(qcow2),
            "file": f"/v2/images/{image_id}/file",
            "kernel_id": kernel_id,
            "ramdisk_id": ramdisk_id,
            "os_command_line": cmdline,
            "hw_machine_type": "q35",
            **(properties or {}),
        },
        qcow2,
    )
    return image_id


def blank_image(
    standins: StandIns, path: str, properties: dict[str, str] | None = None
) -> str:
    """Serve a blank 1 MiB qcow2 (made at ``path`` if missing) through the
    Glance stand-in; returns its image ID. ``properties`` adds image
    properties (e.g. ``trait:CUSTOM_ATTESTATION_TRUSTED=required``)."""
    if not os.path.exists(path):
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", path, "1M"],
            check=True,
            timeout=60,
        )
    image_id = str(uuid_mod.uuid4())
    standins.add_image(
        {
            **_base(),
            "id": image_id,
            "name": f"blank-{image_id[:8]}",
            "disk_format": "qcow2",
            "container_format": "bare",
            "size": os.path.getsize(path),
            "file": f"/v2/images/{image_id}/file",
            **(properties or {}),
        },
        path,
    )
    return image_id
