"""Policies built from a guest image: ``trusted-tenant policy generate``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile

import fixtures
import testtools

from node_agent.trial.eventlog import sample_log
from nova_plugin import cmd
from nova_plugin.policygen import (
    DEFAULT_EXCLUDES,
    PAYLOAD_PATH,
    measured_boot_policy,
    runtime_policy,
)
from verifier.common.imagefiles import (
    ImageFilesError,
    cpio_files,
    tar_files,
    tree_files,
)
from verifier.protocol import MalformedError
from verifier.protocol.ima import ImaEntry, evaluate
from verifier.tests.unit.test_authenticode import _image


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _tar(path: str) -> None:
    with tarfile.open(path, "w") as archive:
        for name, data in (("./usr/bin/tool", b"tool"), ("./root/.profile", b"p")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("./usr/bin/tool-again")
        link.type, link.linkname = tarfile.LNKTYPE, "./usr/bin/tool"
        archive.addfile(link)
        sym = tarfile.TarInfo("./bin")
        sym.type, sym.linkname = tarfile.SYMTYPE, "usr/bin"
        archive.addfile(sym)


def _excluded(path: str) -> bool:
    return any(re.match(p, path) for p in DEFAULT_EXCLUDES)


class TestImageFiles(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def test_tar_lists_files_and_hard_links_not_symlinks(self) -> None:
        path = os.path.join(self.dir, "image.tar")
        _tar(path)
        files = dict(tar_files(path))
        self.assertEqual(
            {"/usr/bin/tool", "/usr/bin/tool-again", "/root/.profile"}, set(files)
        )
        self.assertEqual({("sha256", _sha(b"tool"))}, files["/usr/bin/tool-again"])

    def test_tree_lists_regular_files(self) -> None:
        os.makedirs(os.path.join(self.dir, "etc"))
        with open(os.path.join(self.dir, "etc", "motd"), "wb") as out:
            out.write(b"hi")
        os.symlink("motd", os.path.join(self.dir, "etc", "link"))
        self.assertEqual(
            [("/etc/motd", {("sha256", _sha(b"hi"))})], list(tree_files(self.dir))
        )

    def test_unreadable_sources_are_named_errors(self) -> None:
        bad = os.path.join(self.dir, "not.tar")
        with open(bad, "wb") as out:
            out.write(b"not a tar archive at all" * 40)
        self.assertRaises(ImageFilesError, lambda: list(tar_files(bad)))
        self.assertRaises(ImageFilesError, lambda: list(tree_files(bad)))


class TestDefaultExcludes(testtools.TestCase):
    def test_boot_time_state_is_excluded(self) -> None:
        for path in (
            "/etc/machine-id",
            "/var/lib/cloud/instances/i-1/user-data.txt",
            "/var/lib/cloud/data/status.json",
            "/etc/trusted-cloud/bootstrap.json",
            "/var/lib/trusted-cloud-agent/tls-key.pem",
            "/var/lib/trusted-cloud-agent/payload.out",
            "/var/log/journal/8fae47cf6e5745b7bdeb3a856f4e21fa/system.journal",
            "/var/log/journal/8fae47cf6e5745b7bdeb3a856f4e21fa/"
            "system@000660facf73a916-1a8487ff9a866744.journal~",
            "/run/udev/data/.#c10:235PGlaoG",
            "/run/udev/data/c10:235",
            "/run/udev/data/+pci:0000:00:01.0",
        ):
            self.assertTrue(_excluded(path), path)

    def test_where_a_program_could_run_is_not_excluded(self) -> None:
        for path in (
            "/root/tool",
            "/var/tmp/tool",
            "/usr/local/bin/tool",
            "/usr/bin/tool",
            PAYLOAD_PATH,
            "/var/lib/trusted-cloud-agent/payload.sh",
            "/var/lib/cloud/instances/i-1/scripts/runcmd",
            "/var/lib/cloud/scripts/per-boot/tool",
            "/etc/machine-id.d/tool",
            "/var/log/journal/8fae47cf6e5745b7bdeb3a856f4e21fa/tool",
            "/run/tool",
            "/run/udev/tool",
            "/run/udev/data/sub/tool",
        ):
            self.assertFalse(_excluded(path), path)


class TestPolicies(testtools.TestCase):
    def test_runtime_policy_allows_the_image_and_the_payload(self) -> None:
        payload = b"#!/bin/sh\necho hi\n"
        policy = runtime_policy(
            [("/usr/bin/tool", {("sha256", _sha(b"tool"))})],
            "image",
            1,
            payloads=[payload],
        )

        def entry(path: str, data: bytes) -> ImaEntry:
            return ImaEntry(
                10, "ima-ng", b"\x01" * 20, "sha256", _sha(data), path, None, None, b""
            )

        good = [entry("/usr/bin/tool", b"tool"), entry(PAYLOAD_PATH, payload)]
        self.assertEqual([], evaluate(policy, good))
        bad = evaluate(policy, [entry("/root/unknown", b"x")])
        self.assertEqual(["/root/unknown"], [f.path for f in bad])

    def test_measured_boot_policy_pins_the_kernel(self) -> None:
        kernel, digest = _image()
        policy = measured_boot_policy(kernel, None, False)
        self.assertEqual(frozenset({digest}), policy.boot_applications)
        self.assertIsNone(policy.firmware)
        self.assertRaises(MalformedError, measured_boot_policy, b"not a kernel")


class TestGenerateCli(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.out = os.path.join(self.dir, "policy.json")
        self.err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", self.err))
        self.useFixture(fixtures.MonkeyPatch("sys.stdout", io.StringIO()))

    def test_runtime_from_tar_with_payload(self) -> None:
        tar = os.path.join(self.dir, "image.tar")
        _tar(tar)
        payload = os.path.join(self.dir, "payload")
        with open(payload, "wb") as out:
            out.write(b"#!/bin/sh\n")
        argv = ["policy", "generate", "runtime", "--tar", tar, "--name", "img"]
        code = cmd.main([*argv, "--payload", payload, "-o", self.out])
        self.assertEqual(0, code)
        with open(self.out, encoding="utf-8") as handle:
            document = json.load(handle)
        self.assertIn(PAYLOAD_PATH, document["digests"])
        self.assertIn("/usr/bin/tool", document["digests"])
        self.assertEqual(list(DEFAULT_EXCLUDES), document["excludes"])

    def test_measured_boot_from_kernel(self) -> None:
        kernel_path = os.path.join(self.dir, "vmlinuz")
        kernel, digest = _image()
        with open(kernel_path, "wb") as out:
            out.write(kernel)
        argv = ["policy", "generate", "measured-boot", "--kernel", kernel_path]
        self.assertEqual(0, cmd.main([*argv, "--secure-boot", "off", "-o", self.out]))
        with open(self.out, encoding="utf-8") as handle:
            document = json.load(handle)
        self.assertEqual([digest.hex()], document["boot_applications"])
        self.assertIs(False, document["secure_boot"])

    def test_measured_boot_from_a_known_good_event_log(self) -> None:
        log_path = os.path.join(self.dir, "binary_bios_measurements")
        with open(log_path, "wb") as out:
            out.write(sample_log(secure_boot=True, bootloader=b"grub", kernel=b"linux"))
        argv = ["policy", "generate", "measured-boot", "--event-log", log_path]
        self.assertEqual(0, cmd.main([*argv, "-o", self.out]))
        with open(self.out, encoding="utf-8") as handle:
            document = json.load(handle)
        self.assertEqual(
            sorted(hashlib.sha256(b).hexdigest() for b in (b"grub", b"linux")),
            sorted(document["boot_applications"]),
        )
        self.assertIs(True, document["secure_boot"])
        self.assertEqual(1, len(document["firmware"]))

    def test_event_log_takes_no_other_source_and_garbage_is_one_line(self) -> None:
        log_path = os.path.join(self.dir, "log")
        with open(log_path, "wb") as out:
            out.write(b"\x00garbage, not an event log")
        argv = ["policy", "generate", "measured-boot", "--event-log", log_path]
        self.assertEqual(1, cmd.main([*argv, "-o", self.out]))
        self.assertIn("policy generate measured-boot", self.err.getvalue())
        self.assertEqual(1, cmd.main([*argv, "--secure-boot", "on", "-o", self.out]))
        self.assertIn("takes everything from the log", self.err.getvalue())
        missing = ["policy", "generate", "measured-boot", "--event-log", "/nonexistent"]
        self.assertEqual(1, cmd.main([*missing, "-o", self.out]))
        self.assertNotIn("Traceback", self.err.getvalue())
        self.assertFalse(os.path.exists(self.out))

    def test_bad_input_is_one_line_not_a_traceback(self) -> None:
        argv = ["policy", "generate", "runtime", "--tar", self.out, "--name", "x"]
        self.assertEqual(1, cmd.main([*argv, "-o", self.out]))
        self.assertIn(
            "trusted-tenant: error: policy generate runtime", self.err.getvalue()
        )
        kernel = os.path.join(self.dir, "k")
        with open(kernel, "wb") as out:
            out.write(b"ELF")
        argv = ["policy", "generate", "measured-boot", "--kernel", kernel]
        self.assertEqual(1, cmd.main([*argv, "-o", self.out]))
        self.assertIn("PE image", self.err.getvalue())
        self.assertNotIn("Traceback", self.err.getvalue())


def _newc(name: str, data: bytes, mode: int = 0o100755, ino: int = 1) -> bytes:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    head = b"070701" + b"".join(b"%08X" % f for f in fields)
    blob = head + name.encode() + b"\0"
    blob += b"\0" * (-len(blob) % 4) + data
    return blob + b"\0" * (-len(blob) % 4)


def _cpio(*members: tuple[str, bytes]) -> bytes:
    body = b"".join(_newc(n, d, ino=i + 1) for i, (n, d) in enumerate(members))
    return body + _newc("TRAILER!!!", b"", 0, 0)


class TestInitramfs(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.path = self.useFixture(fixtures.TempDir()).join("initrd")

    def _write(self, data: bytes) -> dict[str, object]:
        with open(self.path, "wb") as out:
            out.write(data)
        return dict(cpio_files(self.path))

    def test_early_archive_then_a_compressed_one(self) -> None:
        import gzip

        early = _cpio(("kernel/x86/microcode/GenuineIntel.bin", b"ucode"))
        main = gzip.compress(_cpio(("init", b"#!/bin/sh\n"), ("./scripts/local", b"x")))
        files = self._write(early + b"\0" * 512 + main)
        self.assertEqual({("sha256", _sha(b"#!/bin/sh\n"))}, files["/init"])
        self.assertIn("/scripts/local", files)
        self.assertIn("/kernel/x86/microcode/GenuineIntel.bin", files)

    def test_zstd_and_garbage_are_named_errors(self) -> None:
        for data in (b"\x28\xb5\x2f\xfd" + bytes(60), b"not an initramfs" * 8):
            self.assertRaises(ImageFilesError, self._write, data)
        self.assertRaises(ImageFilesError, self._write, _cpio(("init", b"x"))[:100])


class TestQemuDirectBoot(testtools.TestCase):
    def _kernel(self, protocol: int = 0x20F) -> bytes:
        kernel = bytearray(0x1000)
        kernel[0x202:0x206] = b"HdrS"
        kernel[0x206:0x208] = protocol.to_bytes(2, "little")
        kernel[0x22C:0x230] = (0x7FFFFFFF).to_bytes(4, "little")
        kernel[0x236:0x238] = (0x7F).to_bytes(2, "little")  # above 4G
        return bytes(kernel)

    def test_qemu_writes_the_setup_header_fields(self) -> None:
        from nova_plugin.policygen import qemu_direct_boot_kernel

        loaded = qemu_direct_boot_kernel(self._kernel(), 0x123456, 1024)
        fields = {
            "type_of_loader": loaded[0x210],
            "heap": loaded[0x211] & 0x80,
            "ramdisk_image": int.from_bytes(loaded[0x218:0x21C], "little"),
            "ramdisk_size": int.from_bytes(loaded[0x21C:0x220], "little"),
            "heap_end_ptr": int.from_bytes(loaded[0x224:0x226], "little"),
            "cmd_line_ptr": int.from_bytes(loaded[0x228:0x22C], "little"),
        }
        top = (1024 << 20) - 0x28000 - 1
        self.assertEqual(
            {
                "type_of_loader": 0xB0,
                "heap": 0x80,
                "ramdisk_image": (top - 0x123456) & ~0xFFF,
                "ramdisk_size": 0x123456,
                "heap_end_ptr": 0xFE00,
                "cmd_line_ptr": 0x20000,
            },
            fields,
        )
        self.assertEqual(self._kernel()[0x240:], loaded[0x240:])

    def test_not_a_linux_kernel_is_refused(self) -> None:
        from nova_plugin.policygen import qemu_direct_boot_kernel

        self.assertRaises(MalformedError, qemu_direct_boot_kernel, bytes(0x400), 1, 512)
        old = self._kernel(0x201)
        self.assertRaises(MalformedError, qemu_direct_boot_kernel, old, 1, 512)
