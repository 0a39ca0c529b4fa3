"""Fuzz targets of the disk image readers (``policy generate measured-boot
--image``): qcow2, GPT, FAT, ext4, GRUB's configuration and the OVMF
variable store. Each lets only
:class:`~verifier.common.diskimage.DiskImageError` (and the protocol's own
errors) through.

An image target pads its input with zeros to a small whole image, so the
seeds (tiny images the real tools build, trailing zeros cut) fit the
fuzzer's input size (:data:`IMAGE_MAX_LEN`).
"""

from __future__ import annotations

import functools
import os
import struct
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

from trusted_testing.fuzz_common import Target

__all__ = ["IMAGE_MAX_LEN", "diskimage_targets"]

#: The input size of the image targets (``run.py`` raises ``--max-len``).
IMAGE_MAX_LEN = 1 << 16
_VOLUME = 1 << 17
_PATHS = ("EFI/debian/shimx64.efi", "/boot/grub/grub.cfg", "/vmlinuz", "/a/b/c")


def _guard(run: Callable[[bytes], object]) -> Callable[[bytes], object]:
    """Turn the readers' own error into a normal return."""

    def guarded(data: bytes) -> object:
        from verifier.common.diskimage import DiskImageError

        try:
            return run(data)
        except DiskImageError as exc:
            return exc

    return guarded


def _padded(data: bytes) -> bytes:
    return data[:_VOLUME].ljust(_VOLUME, b"\0")


def _qcow2(data: bytes) -> object:
    from verifier.common.diskimage import BytesImage, Qcow2Image

    disk = Qcow2Image(BytesImage(data))
    return [disk.read(at, 4096) for at in (0, 65536) if at + 4096 <= disk.size]


def _gpt(data: bytes) -> object:
    from verifier.common.diskimage import BytesImage, gpt_partitions

    parts = gpt_partitions(BytesImage(_padded(data)))
    return [p.disk.read(0, min(512, p.disk.size)) for p in parts]


def _read_paths(fs: Any) -> list[bytes]:
    """Each of :data:`_PATHS` the file system has."""
    from verifier.common.diskimage import MissingFileError

    out = []
    for path in _PATHS:
        try:
            out.append(fs.read_file(path))
        except MissingFileError:
            pass
    return out


def _fat(data: bytes) -> object:
    from verifier.common.diskimage import BytesImage
    from verifier.common.fatfs import FatFileSystem

    return _read_paths(FatFileSystem(BytesImage(_padded(data))))


def _ext4(data: bytes) -> object:
    from verifier.common.diskimage import BytesImage
    from verifier.common.ext4fs import Ext4FileSystem

    return _read_paths(Ext4FileSystem(BytesImage(_padded(data))))


class _Files:
    """GRUB's devices: the fuzzed text as the root's grub.cfg."""

    def __init__(self, cfg: bytes) -> None:
        self.cfg = cfg

    def read(self, device: str, path: str) -> bytes:
        from verifier.common.diskimage import MissingFileError

        if path.endswith("grub.cfg"):
            return self.cfg if device == "hd0,gpt2" else _esp_cfg()
        if path.endswith("grubenv"):
            return b"# GRUB Environment Block\nsaved_entry=0\n"
        raise MissingFileError(path)

    def exists(self, device: str, path: str) -> bool:
        return path.endswith(("grub.cfg", "grubenv"))

    def search(self, kind: str, key: str) -> str | None:
        return "hd0,gpt2" if kind != "file" else None


@functools.lru_cache(maxsize=1)
def _esp_cfg() -> bytes:
    from trusted_testing.bootimage import debian_esp_cfg

    return debian_esp_cfg().encode()


def _grub_cfg(data: bytes) -> object:
    from verifier.common.grubcfg import grub_menu

    return grub_menu(_Files(data), "hd0,gpt1", "/EFI/debian/grub.cfg", "(hd0,gpt1)/x")


def _ovmf_vars(data: bytes) -> object:
    from verifier.common.ovmfvars import read_variables
    from verifier.protocol.mb import efisig

    out = []
    for (name, _), value in read_variables(data).items():
        if name in ("PK", "KEK", "db", "dbx"):
            out.append(efisig.parse_signature_lists(value, name))
    return out


# -- seeds: tiny images the real tools build ------------------------------------


def _tool(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _cut(data: bytes) -> bytes:
    return data.rstrip(b"\0")[:IMAGE_MAX_LEN]


@functools.lru_cache(maxsize=1)
def _images() -> dict[str, list[bytes]]:
    from trusted_testing import bootimage

    with tempfile.TemporaryDirectory() as tmp:
        fat, ext4, gpt = (os.path.join(tmp, n) for n in ("fat", "ext4", "gpt"))
        _tool("mkfs.vfat", "-r", "16", "-C", fat, "64")
        os.makedirs(os.path.join(tmp, "f", "EFI", "debian"))
        with open(os.path.join(tmp, "f", "EFI", "debian", "shimx64.efi"), "wb") as f:
            f.write(b"shim" * 300)
        _tool("mcopy", "-s", "-i", fat, os.path.join(tmp, "f", "EFI"), "::/")
        files = {"boot/grub/grub.cfg": b"set timeout=1\n", "a/b/c": b"c" * 3000}
        links = {"vmlinuz": "boot/grub/grub.cfg"}
        bootimage.ext4_volume(
            ext4, files, links, "128k", bootimage.ROOT_UUID,
            ("-b", "1024", "-N", "32", "-O", "^resize_inode,^has_journal"),
        )  # fmt: skip
        with open(gpt, "wb") as f:
            f.truncate(_VOLUME)
        _tool("sgdisk", "-a", "1", "-n", "1:40:100", "-t", "1:ef00",
              "-n", "2:101:200", "-t", "2:8300", gpt)  # fmt: skip
        qcows = []
        for extra in ([], ["-c"]):
            out = os.path.join(tmp, f"q{len(extra)}")
            _tool("qemu-img", "convert", "-O", "qcow2", "-o", "cluster_size=512",
                  *extra, gpt, out)  # fmt: skip
            with open(out, "rb") as f:
                qcows.append(f.read())
        images = {}
        for name in ("fat", "ext4", "gpt"):
            with open(os.path.join(tmp, name), "rb") as f:
                images[name] = [_cut(f.read())]
    images["qcow2"] = qcows
    return images


def _vars_seed() -> list[bytes]:
    path = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    with open(path, "rb") as f:
        data = bytearray(f.read())
    (header,) = struct.unpack_from("<H", data, 48)
    end = data.find(b"\xff" * 64, header + 28)  # past the last record
    end = min(len(data), (end + 64) & ~3)
    struct.pack_into("<Q", data, 32, end)
    struct.pack_into("<I", data, header + 16, end - header)
    return [bytes(data[:end])]


def _grub_seeds() -> list[bytes]:
    from trusted_testing.bootimage import debian_grub_cfg

    return [
        debian_grub_cfg("6.1.0-18-amd64").encode(),
        b"set o='a b'\nexport o\nmenuentry x {\n linux /v \"$o\" ${o} \\$x\n"
        b" initrd /i\n}\nif [ -e /x ]; then set y=1; elif true; then fi\n",
    ]


def diskimage_targets() -> list[Target]:
    """The image readers' targets."""
    images = _images
    return [
        Target("qcow2", _guard(_qcow2), lambda: images()["qcow2"], IMAGE_MAX_LEN),
        Target("gpt", _guard(_gpt), lambda: images()["gpt"], IMAGE_MAX_LEN),
        Target("fat", _guard(_fat), lambda: images()["fat"], IMAGE_MAX_LEN),
        Target("ext4", _guard(_ext4), lambda: images()["ext4"], IMAGE_MAX_LEN),
        Target("grub_cfg", _guard(_grub_cfg), _grub_seeds),
        Target("ovmf_vars", _guard(_ovmf_vars), _vars_seed, IMAGE_MAX_LEN),
    ]
