"""The operator's guest image as a whole disk booted under UEFI Secure Boot:
an EFI system partition with Debian's Microsoft-signed shim and
Debian-signed GRUB, and the image's root file system (Debian's signed
kernel and its initramfs in ``/boot``), as distribution cloud images boot.

Built from :mod:`trusted_testing.guest_vm`'s image (the root file system
partition image) and two Debian packages fetched with ``apt-get download``
(never installed on the host): ``shim-signed``
(``/usr/lib/shim/shimx64.efi.signed``) and ``grub-efi-amd64-signed``
(``/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed``). No loop device,
no device-mapper, no mount (the machines that build it have neither): the
EFI system partition is a FAT file made by ``mkfs.vfat`` and filled with
mtools; ``sgdisk`` writes the GPT of a sparse file; both partitions are
then written at their offsets and the whole disk converted to qcow2.

The ESP holds shim as ``EFI/BOOT/BOOTX64.EFI`` (the removable-media path
OVMF boots when it has no boot entry), GRUB as ``EFI/BOOT/grubx64.efi``
(shim loads it from its own directory) and :data:`GRUB_CFG` as
``EFI/debian/grub.cfg`` (Debian's signed GRUB has the prefix
``/EFI/debian``) and beside GRUB. The configuration is what an operator's
image would carry: one entry, the root found by its label, the kernel and
initramfs of ``/boot``, the image's own command line.

The firmware is Debian's OVMF Secure Boot build with Microsoft's keys
enrolled (:data:`OVMF_CODE_SB`, :data:`OVMF_VARS_SB`; SMM required); the
same code with :data:`OVMF_VARS_PLAIN` (no PK: setup mode) boots with
Secure Boot off. :class:`trusted_testing.guest_vm_boot.VmGuest` boots it
with ``firmware=`` :class:`Firmware`.

The result is cached in the guest image's own cache directory, keyed on
the two packages' versions and the recipe below.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

from trusted_testing.guest_image import cache_lock
from trusted_testing.guest_vm import ROOT_LABEL, ImageError, VmImage, build
from trusted_testing.guest_vm_boot import Firmware
from verifier.protocol.mb.authenticode import pe_authenticode_digest
from verifier.protocol.mb.shim import mok_digests, shim_builtins

__all__ = [
    "GRUB_CFG",
    "OVMF_CODE_SB",
    "OVMF_VARS_PLAIN",
    "OVMF_VARS_SB",
    "SECURE_BOOT",
    "SbImage",
    "build_secure_boot",
    "grub_cfg",
    "reference_policy",
]

OVMF_CODE_SB = "/usr/share/OVMF/OVMF_CODE_4M.ms.fd"
OVMF_VARS_SB = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
OVMF_VARS_PLAIN = "/usr/share/OVMF/OVMF_VARS_4M.fd"
PACKAGES = ("shim-signed", "grub-efi-amd64-signed")
SHIM = "usr/lib/shim/shimx64.efi.signed"
GRUB = "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"
ESP_MIB = 64
#: GRUB's configuration on the ESP ({kernel}, {initrd}, {cmdline} filled in).
GRUB_CFG = """\
set default=0
set timeout=0
menuentry 'Debian GNU/Linux (trusted-agent image)' {{
	search --no-floppy --label --set=root {label}
	linux {kernel} {cmdline}
	initrd {initrd}
}}
"""
#: The kernel command line: the direct-boot guest's (IMA tcb, sha256).
CMDLINE = (
    f"root=LABEL={ROOT_LABEL} ro console=ttyS0 "
    "ima_policy=tcb ima_hash=sha256 no_timer_check panic=-1"
)
_RECIPE = "1"
_STAMP = ".complete"


#: Debian's OVMF Secure Boot build with Microsoft's keys enrolled.
SECURE_BOOT = Firmware(OVMF_CODE_SB, OVMF_VARS_SB)


@dataclasses.dataclass(frozen=True)
class SbImage:
    """The built Secure Boot disk.

    Attributes:
        image: The guest image it was made from, its ``qcow2`` replaced by
            the whole disk (what :class:`VmGuest` boots).
        disk: The whole-disk qcow2 (GPT: ESP, root).
        shim: shim as installed on the ESP.
        grub: GRUB as installed on the ESP.
        kernel: The kernel's path in the root (GRUB's ``linux``).
        initrd: The initramfs' path in the root (GRUB's ``initrd``).
        kernel_file: A copy of the kernel (Debian-signed) beside the disk.
        initrd_file: A copy of the initramfs beside the disk.
        cmdline: The arguments after the kernel's path.
        versions: Package name -> version of the signed boot loaders.
    """

    image: VmImage
    disk: str
    shim: str
    grub: str
    kernel: str
    initrd: str
    kernel_file: str
    initrd_file: str
    cmdline: str
    versions: dict[str, str]

    @property
    def grub_kernel_cmdline(self) -> str:
        """What GRUB measures into PCR 8 after ``kernel_cmdline: ``."""
        return f"{self.kernel} {self.cmdline}"


def reference_policy(sb: SbImage) -> dict[str, Any]:
    """The chain policy of the files the build put into the image, computed
    here from the files themselves (a cross-check of the generator)."""

    def authenticode(path: str) -> str:
        with open(path, "rb") as handle:
            return pe_authenticode_digest(handle.read()).hex()

    with open(sb.shim, "rb") as handle:
        builtins = shim_builtins(handle.read())
    with open(sb.initrd_file, "rb") as handle:
        initrd = hashlib.sha256(handle.read()).hexdigest()
    return {
        "secure_boot": True,
        "shim": [authenticode(sb.shim)],
        "grub": [authenticode(sb.grub)],
        "kernels": [authenticode(sb.kernel_file)],
        "kernel_cmdlines": [sb.grub_kernel_cmdline],
        "initrds": [initrd],
        "mok": {k: [v.hex()] for k, v in mok_digests(builtins).items()},
        "sbat_level": builtins.sbat_previous,
    }


def grub_cfg(kernel: str, initrd: str, cmdline: str = CMDLINE) -> str:
    """The ESP's grub.cfg for ``kernel`` and ``initrd`` (paths in the root)."""
    return GRUB_CFG.format(
        label=ROOT_LABEL, kernel=kernel, initrd=initrd, cmdline=cmdline
    )


def _run(argv: list[str], package: str, cwd: str | None = None) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, cwd=cwd
        )
    except FileNotFoundError as exc:
        raise ImageError(
            f"{argv[0]} is missing: install the Debian package {package}"
        ) from exc
    if done.returncode:
        raise ImageError(
            f"{' '.join(argv[:3])}... failed ({done.returncode}): "
            f"{(done.stderr or done.stdout)[-800:]}"
        )
    return done.stdout


def _versions() -> dict[str, str]:
    versions = {}
    for package in PACKAGES:
        out = _run(["apt-cache", "policy", package], "apt")
        found = re.search(r"Candidate:\s*(\S+)", out)
        if found is None or found.group(1) == "(none)":
            raise ImageError(f"apt-cache knows no {package} (run apt-get update)")
        versions[package] = found.group(1)
    return versions


def _fetch_loaders(work: str) -> tuple[str, str]:
    """shim and GRUB from their Debian packages (extracted, not installed)."""
    for package in PACKAGES:
        _run(["apt-get", "download", package], "apt", cwd=work)
    tree = os.path.join(work, "debs")
    for deb in glob.glob(os.path.join(work, "*.deb")):
        _run(["dpkg-deb", "-x", deb, tree], "dpkg")
    return os.path.join(tree, SHIM), os.path.join(tree, GRUB)


def _boot_files(image: VmImage) -> tuple[str, str]:
    """The kernel's and initramfs' paths in the root (from the image's tar)."""
    with tarfile.open(image.tar) as archive:
        names = ["/" + n.lstrip("./") for n in archive.getnames()]
    kernels = sorted(n for n in names if re.fullmatch(r"/boot/vmlinuz-[^/]+", n))
    initrds = sorted(n for n in names if re.fullmatch(r"/boot/initrd\.img-[^/]+", n))
    if len(kernels) != 1 or len(initrds) != 1:
        raise ImageError(
            f"expected one kernel and one initrd in /boot: {kernels} {initrds}"
        )
    return kernels[0], initrds[0]


def _make_esp(path: str, shim: str, grub: str, config: str) -> None:
    _run(["mkfs.vfat", "-C", "-n", "ESP", path, str(ESP_MIB * 1024)], "dosfstools")
    image = ["-i", path]
    _run(["mmd", *image, "::/EFI", "::/EFI/BOOT", "::/EFI/debian"], "mtools")
    cfg = path + ".grub.cfg"
    with open(cfg, "w", encoding="utf-8") as handle:
        handle.write(config)
    for source, target in (
        (shim, "::/EFI/BOOT/BOOTX64.EFI"),
        (grub, "::/EFI/BOOT/grubx64.efi"),
        (cfg, "::/EFI/BOOT/grub.cfg"),
        (cfg, "::/EFI/debian/grub.cfg"),
    ):
        _run(["mcopy", *image, source, target], "mtools")
    os.unlink(cfg)


def _write_at(source: str, target: str, offset: int) -> None:
    """Copy ``source`` into ``target`` at ``offset``, leaving holes for zero
    blocks (the root file system is mostly empty)."""
    block = 1 << 20
    zero = bytes(block)
    with open(source, "rb") as src, open(target, "r+b") as dst:
        position = offset
        while chunk := src.read(block):
            if chunk != zero[: len(chunk)]:
                dst.seek(position)
                dst.write(chunk)
            position += len(chunk)


def _partition_start(disk: str, number: int) -> int:
    out = _run(["sgdisk", "-i", str(number), disk], "gdisk")
    found = re.search(r"First sector: (\d+)", out)
    if found is None:
        raise ImageError(f"sgdisk -i {number}: no first sector in {out!r}")
    return int(found.group(1)) * 512


def _assemble(work: str, image: VmImage, esp: str, out: str) -> None:
    root = os.path.join(work, "root.raw")
    _run(["qemu-img", "convert", "-O", "raw", image.qcow2, root], "qemu-utils")
    mib = 1 << 20
    root_mib = -(-os.path.getsize(root) // mib)
    disk = os.path.join(work, "disk.raw")
    with open(disk, "wb") as handle:
        handle.truncate((1 + ESP_MIB + root_mib + 1) * mib)
    _run(
        ["sgdisk", "-n", f"1:2048:+{ESP_MIB}M", "-t", "1:ef00", "-c", "1:EFI",
         "-n", "2:0:0", "-t", "2:8300", "-c", "2:root", disk],
        "gdisk",
    )  # fmt: skip
    _write_at(esp, disk, _partition_start(disk, 1))
    _write_at(root, disk, _partition_start(disk, 2))
    os.unlink(root)
    _run(["qemu-img", "convert", "-O", "qcow2", disk, out], "qemu-utils")
    os.unlink(disk)


def _extract(image: VmImage, member: str, out: str) -> None:
    with tarfile.open(image.tar) as archive:
        for info in archive:
            if "/" + info.name.lstrip("./") == member:
                source = archive.extractfile(info)
                if source is None:
                    break
                with open(out, "wb") as handle:
                    shutil.copyfileobj(source, handle)
                return
    raise ImageError(f"{member} is not a regular file in {image.tar}")


def build_secure_boot(image: VmImage | None = None, rebuild: bool = False) -> SbImage:
    """Build (or find in the cache) the Secure Boot disk of ``image``.

    Raises:
        ImageError: a tool or package is missing, or a step failed.
    """
    image = image or build()
    versions = _versions()
    recipe = [_RECIPE, GRUB_CFG, CMDLINE, json.dumps(versions, sort_keys=True)]
    key = hashlib.sha256("\0".join(recipe).encode()).hexdigest()[:12]
    directory = os.path.join(image.directory, f"secure-boot-{key}")
    kernel, initrd = _boot_files(image)
    result = SbImage(
        image=dataclasses.replace(image, qcow2=os.path.join(directory, "disk.qcow2")),
        disk=os.path.join(directory, "disk.qcow2"),
        shim=os.path.join(directory, "shimx64.efi"),
        grub=os.path.join(directory, "grubx64.efi"),
        kernel=kernel,
        initrd=initrd,
        kernel_file=os.path.join(directory, "vmlinuz"),
        initrd_file=os.path.join(directory, "initrd.img"),
        cmdline=CMDLINE,
        versions=versions,
    )
    stamp = os.path.join(directory, _STAMP)
    with cache_lock(image.directory):
        if os.path.exists(stamp) and not rebuild:
            return result
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        with tempfile.TemporaryDirectory(prefix="sb-build-", dir=directory) as work:
            shim, grub = _fetch_loaders(work)
            shutil.copyfile(shim, result.shim)
            shutil.copyfile(grub, result.grub)
            esp = os.path.join(work, "esp.img")
            _make_esp(esp, shim, grub, grub_cfg(kernel, initrd))
            _extract(image, kernel, result.kernel_file)
            _extract(image, initrd, result.initrd_file)
            _assemble(work, image, esp, result.disk)
        with open(stamp, "w", encoding="ascii") as handle:
            handle.write(repr(versions) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    try:
        sb = build_secure_boot(rebuild=args.rebuild)
    except ImageError as exc:
        print(f"guest_sb: {exc}", file=sys.stderr)
        return 1
    print(f"{sb.disk}\n  kernel {sb.kernel}\n  initrd {sb.initrd}\n  {sb.versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
