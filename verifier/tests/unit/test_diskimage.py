"""The disk image readers against images the real tools build: sgdisk
(GPT), mkfs.vfat + mtools (FAT12/16/32), mke2fs -d (ext2/ext4), qemu-img
(qcow2, compressed or not)."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import tempfile

import testtools

from trusted_testing import bootimage
from verifier.common.diskimage import (
    ESP_TYPE,
    BytesImage,
    DiskImageError,
    FileImage,
    MissingFileError,
    Qcow2Image,
    gpt_partitions,
    open_disk,
)
from verifier.common.ext4fs import Ext4FileSystem
from verifier.common.fatfs import FatFileSystem

_LONG_TARGET = "/boot/" + "./" * 40 + "data.bin"  # over 60 bytes: a slow link


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


class _Images(testtools.TestCase):
    tmp: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="diskimage-")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()


class TestFat(_Images):
    FILES = {
        "EFI/debian/shimx64.efi": b"shim" * 5000,
        "EFI/debian/A Long File Name.cfg": b"long name",
        "EFI/BOOT/BOOTX64.EFI": b"",
    }

    def _volume(self, fat: int, size_mb: int) -> FatFileSystem:
        path = os.path.join(self.tmp, f"fat{fat}.img")
        bootimage.fat_volume(path, self.FILES, size_mb, fat)
        return FatFileSystem(BytesImage(_read(path)))

    def test_fat12_fat16_fat32_read_files_by_path_case_insensitively(self) -> None:
        for fat, size in ((12, 2), (16, 20), (32, 34)):
            fs = self._volume(fat, size)
            self.assertEqual(fat, fs._bits)
            self.assertEqual(b"shim" * 5000, fs.read_file("efi/DEBIAN/ShimX64.EFI"))
            self.assertEqual(
                b"long name", fs.read_file("/EFI/debian/a long file name.CFG")
            )
            self.assertEqual(b"", fs.read_file("EFI/BOOT/BOOTX64.EFI"))
            self.assertTrue(fs.exists("EFI/debian"))
            self.assertFalse(fs.exists("EFI/ubuntu/shimx64.efi"))
            self.assertRaises(MissingFileError, fs.read_file, "EFI/debian/nope")
            self.assertRaises(DiskImageError, fs.read_file, "EFI/debian")
            self.assertEqual("ESP", fs.label)

    def test_not_fat_is_refused(self) -> None:
        self.assertRaises(DiskImageError, FatFileSystem, BytesImage(bytes(4096)))


class TestExt4(_Images):
    def _fs(self, name: str, fs_type: str, options: tuple[str, ...]) -> Ext4FileSystem:
        big = bytes(random.Random(7).randbytes(700_000))
        files = {
            "boot/vmlinuz-6.1": b"kernel",
            "boot/data.bin": big,
            "boot/grub/grub.cfg": b"set timeout=5\n",
            **{f"boot/many/file-{i:04d}": b"%d" % i for i in range(400)},
        }
        links = {
            "vmlinuz": "boot/vmlinuz-6.1",
            "boot/slow-link": _LONG_TARGET,
            "boot/loop": "loop",
        }
        path = os.path.join(self.tmp, name)
        bootimage.ext4_volume(
            path, files, links, "16M", bootimage.ROOT_UUID, options, fs_type
        )
        # index the large directory (htree), as the kernel would
        subprocess.run(["e2fsck", "-fyD", path], capture_output=True, check=False)
        self.big = big
        return Ext4FileSystem(BytesImage(_read(path)))

    def _check(self, fs: Ext4FileSystem) -> None:
        self.assertEqual(bootimage.ROOT_UUID, fs.uuid)
        self.assertEqual("root", fs.label)
        self.assertEqual(b"kernel", fs.read_file("/boot/vmlinuz-6.1"))
        self.assertEqual(b"kernel", fs.read_file("/vmlinuz"))  # fast link
        self.assertEqual(self.big, fs.read_file("/boot/data.bin"))
        self.assertEqual(b"399", fs.read_file("/boot/many/file-0399"))
        self.assertEqual(b"0", fs.read_file("boot/./many/../many/file-0000"))
        self.assertRaises(MissingFileError, fs.read_file, "/boot/vmlinuz-9")
        self.assertRaises(DiskImageError, fs.read_file, "/boot/grub")
        self.assertRaises(DiskImageError, fs.read_file, "/boot/loop")

    def test_ext4_extents_64bit_htree_and_links(self) -> None:
        self._check(self._fs("ext4.img", "ext4", ("-O", "64bit")))

    def test_ext4_32bit_descriptors(self) -> None:
        self._check(self._fs("ext4-32.img", "ext4", ("-O", "^64bit")))

    def test_ext2_block_map_with_indirect_blocks(self) -> None:
        fs = self._fs("ext2.img", "ext2", ("-b", "1024"))
        self._check(fs)

    def test_slow_symlink(self) -> None:
        fs = self._fs("slow.img", "ext4", ())
        self.assertEqual(self.big, fs.read_file("/boot/slow-link"))

    def test_not_ext4_is_refused(self) -> None:
        self.assertRaises(DiskImageError, Ext4FileSystem, BytesImage(bytes(8192)))


class TestGptAndQcow2(_Images):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.raw = os.path.join(cls.tmp, "disk.raw")
        bootimage.build_disk(
            cls.raw,
            {"EFI/debian/grub.cfg": b"esp"},
            {"boot/grub/grub.cfg": b"root"},
            esp_mb=34,
            root_mb=20,
        )

    def _partitions(self, disk: object) -> None:
        parts = gpt_partitions(disk)  # type: ignore[arg-type]
        self.assertEqual([1, 2], [p.number for p in parts])
        self.assertEqual(ESP_TYPE, parts[0].type_guid)
        esp = FatFileSystem(parts[0].disk)
        self.assertEqual(b"esp", esp.read_file("EFI/debian/grub.cfg"))
        root = Ext4FileSystem(parts[1].disk)
        self.assertEqual(b"root", root.read_file("/boot/grub/grub.cfg"))

    def test_raw_gpt_partitions(self) -> None:
        with open(self.raw, "rb") as handle:
            self._partitions(open_disk(FileImage(handle)))

    def test_qcow2_plain_and_compressed_read_as_the_raw_disk(self) -> None:
        raw = _read(self.raw)
        for compress in (False, True):
            path = os.path.join(self.tmp, f"disk-{compress}.qcow2")
            bootimage.qcow2(self.raw, path, compress=compress)
            with open(path, "rb") as handle:
                disk = open_disk(FileImage(handle))
                self.assertIsInstance(disk, Qcow2Image)
                self.assertEqual(len(raw), disk.size)
                for offset in (0, 512, 1 << 20, 35 << 20, len(raw) - 4096):
                    self.assertEqual(
                        raw[offset : offset + 4096], disk.read(offset, 4096)
                    )
                self._partitions(disk)

    def _refused(self, path: str, words: str) -> None:
        with open(path, "rb") as handle:
            error = self.assertRaises(DiskImageError, open_disk, FileImage(handle))
        self.assertIn(words, str(error))

    def test_qcow2_backing_file_zstd_and_data_file_are_refused(self) -> None:
        base = os.path.join(self.tmp, "base.qcow2")
        bootimage.qcow2(self.raw, base)
        cases = {
            "backing file": ["-b", base, "-F", "qcow2"],
            "zstd compression": ["-o", "compression_type=zstd"],
            "external data file": ["-o", f"data_file={self.tmp}/data.raw"],
        }
        for words, options in cases.items():
            path = os.path.join(self.tmp, "refused.qcow2")
            subprocess.run(
                ["qemu-img", "create", "-f", "qcow2", *options, path, "64M"],
                check=True,
                capture_output=True,
            )
            self._refused(path, words)

    def test_qcow2_encryption_is_refused(self) -> None:
        path = os.path.join(self.tmp, "crypt.qcow2")
        bootimage.qcow2(self.raw, path)
        data = bytearray(_read(path))
        struct.pack_into(">I", data, 32, 1)  # crypt_method AES
        with open(path, "wb") as out:
            out.write(data)
        self._refused(path, "encrypted")

    def test_truncated_qcow2_is_refused(self) -> None:
        path = os.path.join(self.tmp, "disk-c.qcow2")
        bootimage.qcow2(self.raw, path, compress=True)
        data = _read(path)
        for cut in (100, len(data) // 2, len(data) - 4096):

            def whole(size: int = cut) -> None:
                disk = open_disk(BytesImage(data[:size]))
                disk.read(0, disk.size)

            self.assertRaises(DiskImageError, whole)

    def test_a_disk_without_gpt_is_refused(self) -> None:
        error = self.assertRaises(
            DiskImageError, gpt_partitions, BytesImage(bytes(1 << 16))
        )
        self.assertIn("MBR", str(error))

    def test_corrupted_images_raise_only_the_readers_error(self) -> None:
        raw = bytearray(_read(self.raw)[: 40 << 20])
        rng = random.Random(32)
        hot = [0x1C0, 0x200, 0x400, 1 << 20, (1 << 20) + 0x4000, (35 << 20) + 0x400]
        for _ in range(150):
            spots = [rng.choice(hot) + rng.randrange(512) for _ in range(8)]
            saved = [raw[at] for at in spots]
            for at in spots[: rng.randint(1, 8)]:
                raw[at] = rng.randrange(256)
            try:
                for part in gpt_partitions(BytesImage(raw)):
                    fs = (
                        FatFileSystem(part.disk)
                        if part.type_guid == ESP_TYPE
                        else Ext4FileSystem(part.disk)
                    )
                    fs.exists("EFI/debian/grub.cfg")
                    fs.exists("/boot/grub/grub.cfg")
            except DiskImageError:
                pass
            for at, byte in zip(reversed(spots), reversed(saved), strict=True):
                raw[at] = byte
