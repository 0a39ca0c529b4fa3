"""The UEFI Secure Boot chain of a whole-disk image: shim and GRUB on the
EFI system partition, and every kernel, command line and initrd GRUB's
configuration would boot (the input of ``trusted-tenant policy generate
measured-boot --image``).

* shim: ``EFI/debian/shimx64.efi``, else the removable-media path
  ``EFI/BOOT/BOOTX64.EFI``; GRUB: ``grubx64.efi`` beside it; its first
  configuration: ``EFI/debian/grub.cfg`` (Debian's signed GRUB has the
  prefix ``/EFI/debian`` built in, also when started from ``EFI/BOOT``),
  else ``grub.cfg`` beside GRUB;
* the other partitions are GRUB's ``hd0,gptN`` devices (the ESP's
  number too), read as ext2/3/4 when GRUB's ``search`` or a path names
  them; :mod:`verifier.common.grubcfg` runs the configuration.

Pure Python over :mod:`verifier.common.diskimage`: no mount, no loop
device. Any defect raises :class:`~verifier.common.diskimage.DiskImageError`.
"""

from __future__ import annotations

import dataclasses
import re

from verifier.common.diskimage import (
    ESP_TYPE,
    Disk,
    DiskImageError,
    MissingFileError,
    Partition,
    gpt_partitions,
    open_disk,
)
from verifier.common.ext4fs import Ext4FileSystem
from verifier.common.fatfs import FatFileSystem
from verifier.common.grubcfg import GrubMenu, grub_menu

__all__ = ["BootChainFiles", "BootDisk", "read_boot_chain"]

_SHIMS = (("EFI/debian", "shimx64.efi"), ("EFI/BOOT", "BOOTX64.EFI"))
_FileSystem = FatFileSystem | Ext4FileSystem


class BootDisk:
    """The file systems of a GPT disk, as GRUB names them (``hd0,gptN``)."""

    def __init__(self, disk: Disk) -> None:
        self._parts = {f"hd0,gpt{p.number}": p for p in gpt_partitions(disk)}
        esps = [n for n, p in self._parts.items() if p.type_guid == ESP_TYPE]
        if not esps:
            raise DiskImageError(
                "the disk has no EFI system partition "
                f"(GPT type {ESP_TYPE}; {len(self._parts)} partitions)"
            )
        self.esp = esps[0]
        self._fs: dict[str, _FileSystem | None] = {}

    def _open(self, device: str) -> _FileSystem | None:
        # GRUB takes (hd0,2) for (hd0,gpt2), with or without parentheses
        match = re.fullmatch(r"\(?hd0,(?:gpt)?([0-9]{1,4})\)?", device)
        device = f"hd0,gpt{int(match.group(1))}" if match else device
        if device in self._fs:
            return self._fs[device]
        part: Partition | None = self._parts.get(device)
        fs: _FileSystem | None = None
        if part is not None and part.type_guid == ESP_TYPE:
            fs = FatFileSystem(part.disk)
        elif part is not None and part.disk.size >= 2048:
            if part.disk.read(1024 + 56, 2) == b"\x53\xef":
                fs = Ext4FileSystem(part.disk)
        self._fs[device] = fs
        return fs

    def esp_fs(self) -> FatFileSystem:
        """The EFI system partition's FAT file system."""
        fs = self._open(self.esp)
        assert isinstance(fs, FatFileSystem)
        return fs

    def read(self, device: str, path: str) -> bytes:
        """A file on ``device`` (see :class:`verifier.common.grubcfg.Devices`)."""
        fs = self._open(device)
        if fs is None:
            raise MissingFileError(f"({device}){path}")
        return fs.read_file(path)

    def exists(self, device: str, path: str) -> bool:
        fs = self._open(device)
        return fs is not None and fs.exists(path)

    def search(self, kind: str, key: str) -> str | None:
        for device in self._parts:
            fs = self._open(device)
            if fs is None:
                continue
            if kind == "file" and fs.exists(key):
                return device
            if kind == "fs_label" and fs.label == key:
                return device
            if kind == "fs_uuid":
                have = fs.serial if isinstance(fs, FatFileSystem) else fs.uuid
                if have.lower() == key.lower():
                    return device
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class BootChainFiles:
    """What the chain loads: shim and GRUB, GRUB's menu, and the disk to
    read each entry's kernel and initrds from.

    Attributes:
        shim_path: where shim was found on the ESP.
        shim: its bytes.
        grub: GRUB's bytes (beside shim).
        menu: the Linux entries GRUB offers.
        disk: the disk's file systems (``read(device, path)``).
    """

    shim_path: str
    shim: bytes
    grub: bytes
    menu: GrubMenu
    disk: BootDisk


def read_boot_chain(image: Disk) -> BootChainFiles:
    """Find and read the Secure Boot chain of a raw or qcow2 disk image.

    Raises:
        DiskImageError: not a GPT disk, no ESP, no shim or GRUB, a GRUB
            configuration this reader refuses, or no Linux menu entry.
    """
    disk = BootDisk(open_disk(image))
    esp = disk.esp_fs()
    for directory, name in _SHIMS:
        if esp.exists(f"{directory}/{name}"):
            break
    else:
        raise DiskImageError(
            "the EFI system partition has no shim (EFI/debian/shimx64.efi or "
            "EFI/BOOT/BOOTX64.EFI)"
        )
    shim = esp.read_file(f"{directory}/{name}")
    try:
        grub = esp.read_file(f"{directory}/grubx64.efi")
    except MissingFileError:
        raise DiskImageError(f"no GRUB ({directory}/grubx64.efi) beside shim") from None
    # Debian's signed GRUB has /EFI/debian built in as its prefix, wherever
    # it was loaded from; another GRUB reads the directory it is in
    where = "EFI/debian" if esp.exists("EFI/debian/grub.cfg") else directory
    prefix = f"({disk.esp})/{where}"
    config = f"/{where}/grub.cfg"
    menu = grub_menu(disk, disk.esp, config, prefix)
    if not menu.entries:
        raise DiskImageError(
            "GRUB's configuration has no menu entry with a linux command "
            f"(entries without one: {list(menu.skipped)})"
        )
    return BootChainFiles(f"{directory}/{name}", shim, grub, menu, disk)
