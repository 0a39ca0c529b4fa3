"""``trusted-tenant policy generate measured-boot --image``: the Secure Boot
chain of a whole-disk image built by the real tools (Debian's signed shim
and GRUB when apt can fetch them), the OVMF variable store's keys, kernel
rollover, and each unreadable input as one line with exit status 2."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import struct
import tempfile
from typing import Any

import fixtures
import testtools

from nova_plugin import cmd
from nova_plugin.imagepolicy import key_databases
from nova_plugin.policygen import measured_boot_from_image
from trusted_testing import bootimage
from trusted_testing.docpages import named_block
from verifier.common.diskimage import DiskImageError
from verifier.protocol.mb import MeasuredBootPolicy, efisig
from verifier.protocol.mb.authenticode import pe_authenticode_digest
from verifier.protocol.mb.chain import SecureBootChain
from verifier.protocol.mb.shim import mok_digests, shim_builtins

_MS_VARS = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
_BLANK_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
_OLD, _NEW = "6.1.0-18-amd64", "6.1.0-20-amd64"


def _chain() -> tuple[bytes, bytes]:
    signed = bootimage.debian_signed_chain()
    if signed is not None:
        return signed
    return bootimage.synthetic_pe(b"shim"), bootimage.synthetic_pe(b"grub")


def _disk(
    path: str,
    version: str,
    *,
    grub_cfg: str | None = None,
    esp_type: str = "ef00",
    shim_dir: str = "EFI/debian",
    extra_esp: dict[str, bytes] | None = None,
) -> dict[str, bytes]:
    """An image of one kernel ``version``; its boot files by name."""
    shim, grub = _chain()
    files = {
        "shim": shim,
        "grub": grub,
        "kernel": bootimage.synthetic_pe(b"linux " + version.encode()),
        "initrd": b"initramfs of " + version.encode(),
    }
    shim_name = "shimx64.efi" if shim_dir == "EFI/debian" else "BOOTX64.EFI"
    esp = {
        f"{shim_dir}/{shim_name}": shim,
        f"{shim_dir}/grubx64.efi": grub,
        f"{shim_dir}/grub.cfg": bootimage.debian_esp_cfg().encode(),
        **(extra_esp or {}),
    }
    root = {
        f"boot/vmlinuz-{version}": files["kernel"],
        f"boot/initrd.img-{version}": files["initrd"],
        "boot/grub/grub.cfg": (grub_cfg or bootimage.debian_grub_cfg(version)).encode(),
    }
    bootimage.build_disk(path, esp, root, root_mb=24, esp_type=esp_type)
    return files


class TestImagePolicy(testtools.TestCase):
    tmp: str
    raw: str
    files: dict[str, bytes]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="imagepolicy-")
        cls.raw = os.path.join(cls.tmp, "debian.raw")
        cls.files = _disk(cls.raw, _OLD)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.out = os.path.join(self.dir, "mb.json")
        self.err = io.StringIO()
        self.stdout = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", self.err))
        self.useFixture(fixtures.MonkeyPatch("sys.stdout", self.stdout))

    def _generate(self, *extra: str) -> dict[str, Any]:
        argv = ["policy", "generate", "measured-boot", *extra, "-o", self.out]
        self.assertEqual(0, cmd.main(argv), self.err.getvalue())
        with open(self.out, encoding="utf-8") as handle:
            document: dict[str, Any] = json.load(handle)
        return document

    def test_policy_from_a_qcow2_image_pins_its_chain_and_keys(self) -> None:
        qcow2 = os.path.join(self.tmp, "debian.qcow2")
        bootimage.qcow2(self.raw, qcow2, compress=True)
        document = self._generate("--image", qcow2, "--vars", _MS_VARS)
        pe = ("shim", "grub", "kernel")
        hexdigest = {k: pe_authenticode_digest(self.files[k]).hex() for k in pe}
        self.assertEqual([hexdigest["shim"]], document["shim"])
        self.assertEqual([hexdigest["grub"]], document["grub"])
        self.assertEqual([hexdigest["kernel"]], document["kernels"])
        self.assertEqual(
            [hashlib.sha256(self.files["initrd"]).hexdigest()], document["initrds"]
        )
        kernel = f"/boot/vmlinuz-{_OLD} root=UUID={bootimage.ROOT_UUID} ro"
        self.assertEqual(
            [f"{kernel} console=ttyS0 quiet", f"{kernel} single console=ttyS0"],
            document["kernel_cmdlines"],
        )
        self.assertIs(True, document["secure_boot"])
        with open(_MS_VARS, "rb") as handle:
            keys = key_databases(handle.read())
        for key in ("pk", "kek", "db", "dbx"):
            self.assertEqual(keys[key], document[key])
        # shim's own lists and SBAT level; who verified what
        builtins = shim_builtins(self.files["shim"])
        self.assertEqual(
            {k: [v.hex()] for k, v in mok_digests(builtins).items()}, document["mok"]
        )
        self.assertEqual(builtins.sbat_previous, document["sbat_level"])
        vendor = efisig.entry_key(efisig.EFI_CERT_X509, builtins.vendor_cert or b"")
        self.assertIn(
            {"variable": "MokListRT", "entry": vendor}, document["authorities"]
        )
        self.assertEqual(
            sorted(k for k in keys["db"] if k.startswith("x509:")),
            [a["entry"] for a in document["authorities"] if a["variable"] == "db"],
        )
        self.assertIsNotNone(SecureBootChain.from_dict(document))
        policy = MeasuredBootPolicy.from_dict(document)
        self.assertEqual(
            document, {k: v for k, v in policy.to_dict().items() if v is not None}
        )
        self.assertIn("PK, KEK, db and dbx pinned", self.stdout.getvalue())

    def test_without_vars_the_keys_are_not_pinned_and_the_message_says_so(self) -> None:
        document = self._generate("--image", self.raw)
        self.assertNotIn("pk", document)
        self.assertIn("key databases not pinned", self.stdout.getvalue())
        self.assertEqual(document, measured_boot_from_image(self.raw))

    def test_kernel_rollover_keeps_the_old_kernel_allowed(self) -> None:
        old = self._generate("--image", self.raw)
        old_path = os.path.join(self.dir, "v1.json")
        shutil.copy(self.out, old_path)
        new_image = os.path.join(self.dir, "new.raw")
        new_files = _disk(new_image, _NEW)
        new = self._generate("--image", new_image, "--keep", old_path)
        new_kernel = pe_authenticode_digest(new_files["kernel"]).hex()
        self.assertEqual(sorted([*old["kernels"], new_kernel]), sorted(new["kernels"]))
        self.assertEqual(4, len(new["kernel_cmdlines"]))
        self.assertEqual(2, len(new["initrds"]))
        alone = measured_boot_from_image(new_image)
        self.assertEqual([new_kernel], alone["kernels"])

    def test_removable_media_path_is_found(self) -> None:
        path = os.path.join(self.dir, "removable.raw")
        files = _disk(path, _OLD, shim_dir="EFI/BOOT")
        document = measured_boot_from_image(path)
        self.assertEqual(
            [pe_authenticode_digest(files["shim"]).hex()], document["shim"]
        )

    def test_the_user_guide_command_runs_as_written(self) -> None:
        (line,) = named_block("user/measured-boot.rst", "image-policy")
        argv = shlex.split(line)
        self.assertEqual("trusted-tenant", argv[0])
        bootimage.qcow2(self.raw, os.path.join(self.dir, "debian-12.qcow2"))
        shutil.copy(_MS_VARS, os.path.join(self.dir, "OVMF_VARS_4M.ms.fd"))
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(self.dir)
        self.assertEqual(0, cmd.main(argv[1:]), self.err.getvalue())
        with open(os.path.join(self.dir, "debian-mb.json"), encoding="utf-8") as f:
            document = json.load(f)
        self.assertEqual(measured_boot_from_image(self.raw, _MS_VARS), document)
        self.assertIn("1 kernels, 2 command lines, 1 initrds", self.stdout.getvalue())

    def test_debian_grub_reads_efi_debian_also_from_the_removable_path(self) -> None:
        path = os.path.join(self.dir, "both.raw")
        _disk(
            path,
            _OLD,
            shim_dir="EFI/BOOT",
            extra_esp={
                "EFI/BOOT/grub.cfg": b"menuentry 'x' {\n\tfwsetup\n}\n",
                "EFI/debian/grub.cfg": bootimage.debian_esp_cfg().encode(),
            },
        )
        self.assertEqual(2, len(measured_boot_from_image(path)["kernel_cmdlines"]))

    def test_grub_device_spellings_name_the_same_partition(self) -> None:
        from verifier.common.bootdisk import BootDisk
        from verifier.common.diskimage import FileImage

        with open(self.raw, "rb") as handle:
            disk = BootDisk(FileImage(handle))
            want = disk.read("hd0,gpt2", "/boot/grub/grub.cfg")
            for device in ("hd0,2", "(hd0,gpt2)", "(hd0,2)"):
                self.assertEqual(want, disk.read(device, "/boot/grub/grub.cfg"))
            self.assertFalse(disk.exists("hd1,gpt2", "/boot/grub/grub.cfg"))

    # -- bad input: one line, exit status 2 ----------------------------------

    def _refused(self, words: str, *argv: str) -> None:
        full = ["policy", "generate", "measured-boot", *argv, "-o", self.out]
        self.assertEqual(2, cmd.main(full))
        message = self.err.getvalue()
        self.assertIn(words, message)
        self.assertEqual(1, len(message.strip().splitlines()), message)
        self.assertNotIn("Traceback", message)
        self.assertFalse(os.path.exists(self.out))
        self.err.seek(0)
        self.err.truncate()

    def test_not_an_image_is_refused(self) -> None:
        path = os.path.join(self.dir, "notes.txt")
        with open(path, "w", encoding="utf-8") as out:
            out.write("not a disk image\n" * 100)
        self._refused("not a partitioned disk image", "--image", path)
        self._refused("No such file", "--image", os.path.join(self.dir, "missing"))

    def test_a_gpt_without_esp_is_refused(self) -> None:
        path = os.path.join(self.dir, "no-esp.raw")
        _disk(path, _OLD, esp_type="8300")
        self._refused("no EFI system partition", "--image", path)

    def test_a_truncated_qcow2_is_refused(self) -> None:
        qcow2 = os.path.join(self.dir, "cut.qcow2")
        bootimage.qcow2(self.raw, qcow2, compress=True)
        with open(qcow2, "r+b") as handle:
            handle.truncate(os.path.getsize(qcow2) // 2)
        self._refused("beyond", "--image", qcow2)

    def test_a_grub_cfg_without_linux_is_refused(self) -> None:
        path = os.path.join(self.dir, "nolinux.raw")
        cfg = "menuentry 'Firmware' {\n\tfwsetup\n}\n"
        _disk(path, _OLD, grub_cfg=cfg)
        self._refused("no menu entry with a linux command", "--image", path)

    def test_bad_vars_and_keep_are_refused(self) -> None:
        self._refused("no PK enrolled", "--image", self.raw, "--vars", _BLANK_VARS)
        self._refused("not a firmware volume", "--image", self.raw, "--vars", self.raw)
        keep = os.path.join(self.dir, "keep.json")
        with open(keep, "w", encoding="utf-8") as out:
            json.dump({"kernels": ["not hex"]}, out)
        self._refused("kernels[0]", "--image", self.raw, "--keep", keep)
        self._refused(
            "no --qemu-direct-boot", "--image", self.raw, "--secure-boot", "on"
        )


class TestVariableStore(testtools.TestCase):
    def test_debian_ms_vars_have_microsoft_keys(self) -> None:
        with open(_MS_VARS, "rb") as handle:
            keys = key_databases(handle.read())
        self.assertEqual(1, len(keys["pk"]))
        self.assertEqual(2, len(keys["db"]))  # Windows PCA 2011, UEFI CA 2011
        self.assertTrue(all(k.startswith("x509:") for k in keys["kek"] + keys["db"]))

    def test_a_damaged_store_is_refused(self) -> None:
        with open(_MS_VARS, "rb") as handle:
            data = bytearray(handle.read())
        (header,) = struct.unpack_from("<H", data, 48)
        # the first record's NameSize made huge
        struct.pack_into("<I", data, header + 28 + 36, 0x7FFFFFFF)
        self.assertRaises(DiskImageError, key_databases, bytes(data))
        self.assertRaises(DiskImageError, key_databases, bytes(data[:100]))
