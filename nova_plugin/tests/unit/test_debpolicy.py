"""Runtime policies from ``.deb`` files: ``policy generate runtime --deb``.

The packages are real: built with ``dpkg-deb --build`` (and one fetched
from Debian with ``apt-get download``), the bad ones made by damaging
real ones or by writing the ar and tar layers by hand.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import subprocess
import tarfile

import fixtures
import testtools

from nova_plugin import cmd
from nova_plugin.aptindex import installed_set, parse_packages, parse_release, select
from nova_plugin.debpolicy import (
    DEFAULT_RULES,
    RULES,
    package_allowlist,
    rule_digests,
    rule_excludes,
)
from nova_plugin.debs import Limits, read_deb
from nova_plugin.exceptions import PackageError
from trusted_testing.debrepo import build_deb, fetch_debian_debs
from verifier.protocol.ima import ImaEntry, RuntimePolicy, evaluate

DEBIAN_CACHE = os.path.expanduser("~/.cache/trusted-cloud/debs")
POSTINST = b"#!/bin/sh\nset -e\necho configured\n"
CONFIG = b"#!/bin/sh\n. /usr/share/debconf/confmodule\n"


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    """An ar archive (the .deb container) written by hand."""
    out = b"!<arch>\n"
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out += header.encode() + data + (b"\n" if len(data) % 2 else b"")
    return out


def _tar(entries: list[tarfile.TarInfo], contents: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info in entries:
            data = contents.get(info.name)
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _control_tar() -> bytes:
    control = b"Package: bad\nVersion: 1\nArchitecture: amd64\nDescription: x\n"
    return _tar([tarfile.TarInfo("./control")], {"./control": control})


def _entry(path: str, data: bytes) -> ImaEntry:
    return ImaEntry(
        10, "ima-ng", b"\x01" * 20, "sha256", _sha(data), path, None, None, b""
    )


class TestDebFiles(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.out = os.path.join(self.dir, "policy.json")

    def _tool(self, **kwargs: object) -> str:
        files = {
            "/usr/bin/tool": b"#!/bin/sh\necho tool\n",
            "/bin/oldtool": b"old tool",
            "/etc/tool.conf": b"setting=1\n",
            "/usr/share/doc/tool/README": b"readme",
        }
        options: dict[str, object] = {
            "scripts": {
                "postinst": POSTINST,
                "config": CONFIG,
                "prerm": b"#!/bin/sh\n",
            },
            "conffiles": ["/etc/tool.conf"],
        }
        options.update(kwargs)
        return build_deb(self.dir, "tool", "1:2.0-1", files, **options)  # type: ignore[arg-type]

    def _generate(self, *argv: str) -> int:
        return cmd.main(
            ["policy", "generate", "runtime", "--name", "pkgs", "-o", self.out, *argv]
        )

    def _refused(self, deb: str, *argv: str) -> str:
        err = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err.stream))
        self.assertEqual(2, self._generate("--deb", deb, *argv))
        self.assertFalse(os.path.exists(self.out))
        err.stream.seek(0)
        message = err.stream.read()
        self.assertEqual(1, len(message.strip().splitlines()), message)
        self.assertIn(deb, message)
        return message

    def test_every_file_is_admitted_at_its_installed_path_by_sha256(self) -> None:
        deb = self._tool()
        root = os.path.join(self.dir, "root")
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        expected = {}
        for folder, _, names in os.walk(root):
            for name in names:
                full = os.path.join(folder, name)
                with open(full, "rb") as handle:
                    expected["/" + os.path.relpath(full, root)] = _sha(handle.read())
        package = read_deb(deb)
        self.assertEqual(expected, package.files)
        self.assertEqual(("tool", "1:2.0-1", "amd64"), (
            package.package, package.version, package.architecture))  # fmt: skip
        with open(deb, "rb") as handle:
            self.assertEqual(_sha(handle.read()), package.sha256)

    def test_file_under_bin_is_admitted_under_usr_too(self) -> None:
        allow = package_allowlist([read_deb(self._tool())])
        for path in ("/bin/oldtool", "/usr/bin/oldtool"):
            self.assertEqual({("sha256", _sha(b"old tool"))}, allow[path])
        self.assertNotIn("/bin/tool", allow)

    def test_maintainer_scripts_are_admitted_by_digest_never_excluded(self) -> None:
        package = read_deb(self._tool())
        allow = package_allowlist([package])
        excludes = rule_excludes(RULES, [package])
        for script, body in (("postinst", POSTINST), ("config", CONFIG)):
            for path in (
                f"/var/lib/dpkg/info/tool.{script}",
                f"/var/lib/dpkg/tmp.ci/{script}",
            ):
                self.assertEqual({("sha256", _sha(body))}, allow[path])
                self.assertFalse(any(re.match(e, path) for e in excludes), path)
        policy = RuntimePolicy("p", 1, allow, excludes)
        bad = evaluate(policy, [_entry("/var/lib/dpkg/info/tool.postinst", b"evil")])
        self.assertEqual(["/var/lib/dpkg/info/tool.postinst"], [f.path for f in bad])

    def test_multi_arch_same_package_uses_pkg_colon_arch(self) -> None:
        package = read_deb(self._tool(multi_arch="same"))
        allow = package_allowlist([package])
        self.assertIn("/var/lib/dpkg/info/tool:amd64.postinst", allow)
        self.assertNotIn("/var/lib/dpkg/info/tool.postinst", allow)
        excludes = rule_excludes(["dpkg-db"], [package])
        self.assertTrue(
            any(re.match(e, "/var/lib/dpkg/info/tool:amd64.list") for e in excludes)
        )

    def test_downloaded_deb_is_admitted_with_its_epoch_escaped(self) -> None:
        deb = self._tool()
        with open(deb, "rb") as handle:
            digest = _sha(handle.read())
        allow = package_allowlist([read_deb(deb)])
        path = "/var/cache/apt/archives/tool_1%3a2.0-1_amd64.deb"
        self.assertEqual({("sha256", digest)}, allow[path])

    def test_conffile_is_admitted_as_dpkg_new_and_dpkg_dist(self) -> None:
        allow = package_allowlist([read_deb(self._tool())])
        for suffix in ("", ".dpkg-new", ".dpkg-dist"):
            self.assertEqual(
                {("sha256", _sha(b"setting=1\n"))}, allow["/etc/tool.conf" + suffix]
            )

    def test_default_rules_cover_what_apt_made_root_read_in_a_guest(self) -> None:
        # Every path an apt-get install and upgrade of libonig5, libjq1, jq
        # and tree made root read in a Debian 12 guest under ima_policy=tcb
        # that is regenerated on the node (not a package's file), as IMA
        # logged it (the repository at http://10.0.2.2:44117, suite story).
        lists = "/var/lib/apt/lists/"
        regenerated = [
            lists + "partial/.apt-acquire-privs-test.G4dauD",
            "/var/cache/apt/archives/partial/.apt-acquire-privs-test.Xy12Ab",
            "/var/cache/apt/srcpkgcache.bin.wzaY3O",
            "/var/cache/apt/pkgcache.bin.a1B2c3",
            "/var/lib/apt/extended_states.Q9w8E7",
            "/var/lib/PackageKit/transactions.db",
            "/var/lib/PackageKit/transactions.db-journal",
            lists + "partial/10.0.2.2:44117_dists_story_InRelease",
            lists + "10.0.2.2:44117_dists_story_main_binary-amd64_Packages",
            "/var/cache/apt/pkgcache.bin",
            "/var/cache/apt/srcpkgcache.bin",
            "/var/lib/apt/extended_states",
            "/var/lib/dpkg/info/libonig5:amd64.list",
            "/var/lib/dpkg/info/tool.list",
            "/var/lib/dpkg/status",
            "/etc/ld.so.cache",
            "/var/cache/ldconfig/aux-cache",
            "/var/cache/debconf/config.dat",
            "/var/cache/debconf/templates.dat",
        ]
        packages = [
            read_deb(self._tool()),
            read_deb(build_deb(self.dir, "libonig5", "6.9.8-1",
                               {"/usr/lib/libonig.so.5": b"so"}, multi_arch="same")),
        ]  # fmt: skip
        excludes = rule_excludes(DEFAULT_RULES, packages)
        for pattern in excludes:
            self.assertTrue(pattern.startswith("^") and pattern.endswith("$"), pattern)
        for path in regenerated:
            self.assertTrue(any(re.match(e, path) for e in excludes), path)
        self.assertEqual(
            [("/var/lib/apt/lists/lock", _sha(b""))], rule_digests(DEFAULT_RULES)
        )

    def test_default_rules_name_nothing_wider(self) -> None:
        excludes = rule_excludes(DEFAULT_RULES, [read_deb(self._tool())])
        refused = [
            "/etc/ld.so.cache.d/evil",
            "/etc/ld.so.cachex",
            "/var/cache/ldconfig/evil",
            "/var/lib/dpkg/info/tool.postinst",
            "/var/lib/dpkg/info/tool.config",
            "/var/lib/dpkg/info/tool.md5sums",
            "/var/lib/dpkg/info/other.list",
            "/var/lib/dpkg/tmp.ci/postinst",
            "/var/lib/dpkg/tmp.ci/control",
            "/var/lib/dpkg/status-old",
            "/var/lib/dpkg/status/evil",
            "/var/lib/dpkg/diversions",
            "/var/lib/dpkg/triggers/File",
            "/var/lib/apt/lists/evil",
            "/var/lib/apt/lists/lock",
            "/var/lib/apt/lists/partial/x_Packages.xz",
            "/var/lib/apt/lists/sub/x_InRelease",
            "/var/cache/apt/archives/evil.deb",
            "/var/cache/apt/archives/partial/evil",
            "/var/cache/apt/pkgcache.bin.evil-program",
            "/var/cache/debconf/evil",
            "/var/cache/debconf/passwords.dat",
            "/var/cache/debconf/config.dat-old",
            "/var/lib/PackageKit/evil",
            "/boot/initrd.img-6.1.0-13-amd64",
            "/usr/bin/evil",
            "/tmp/evil",
        ]
        for path in refused:
            self.assertFalse(any(re.match(e, path) for e in excludes), path)

    def test_opt_in_rules(self) -> None:
        self.assertNotIn("initramfs", DEFAULT_RULES)
        self.assertNotIn("dpkg-extra", DEFAULT_RULES)
        excludes = rule_excludes(["initramfs", "dpkg-extra"], [])
        for path in (
            "/boot/initrd.img-6.1.0-13-amd64",
            "/var/lib/dpkg/diversions",
            "/var/lib/dpkg/updates/0001",
            "/var/lib/dpkg/triggers/File",
        ):
            self.assertTrue(any(re.match(e, path) for e in excludes), path)  # fmt: skip
        for path in ("/boot/vmlinuz-6.1.0-13-amd64", "/var/lib/dpkg/updates/tmp.i"):
            self.assertFalse(any(re.match(e, path) for e in excludes), path)

    def test_trigger_interests_get_their_trigger_file_only(self) -> None:
        triggers = b"interest-noawait trig-update\ninterest /usr/lib/x\n"
        deb = build_deb(
            self.dir,
            "trig",
            "1",
            {"/usr/bin/trig": b"t"},
            scripts={"triggers": triggers},
        )
        excludes = rule_excludes(["dpkg-extra"], [read_deb(deb)])
        self.assertTrue(
            any(re.match(e, "/var/lib/dpkg/triggers/trig-update") for e in excludes)
        )
        self.assertFalse(
            any(re.match(e, "/var/lib/dpkg/triggers/other") for e in excludes)
        )

    def test_options_that_do_not_go_together_are_refused(self) -> None:
        err = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err.stream))
        deb = self._tool()
        for argv, naming in (
            (["--apt-repo", self.dir], "--apt-repo needs --keyring"),
            (["--deb", deb, "--packages", "x"], "go with --apt-repo"),
            (["--deb", deb, "--initrd", deb], "go with --rootfs/--tar"),
            (["--deb", deb, "--max-bytes", "0"], "--max-bytes"),
            (["--apt-repo", "/nonexistent", "--keyring", deb], "not a directory"),
        ):
            err.stream.seek(0)
            err.stream.truncate()
            self.assertEqual(2, self._generate(*argv), argv)
            err.stream.seek(0)
            message = err.stream.read()
            self.assertEqual(1, len(message.strip().splitlines()), message)
            self.assertIn(naming, message)
        self.assertFalse(os.path.exists(self.out))

    def test_unknown_rule_is_refused(self) -> None:
        err = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err.stream))
        self.assertEqual(
            2, self._generate("--deb", self._tool(), "--rules", "ld-cache,wide")
        )
        err.stream.seek(0)
        self.assertIn("unknown rule 'wide'", err.stream.read())
        self.assertFalse(os.path.exists(self.out))

    def test_cli_writes_a_policy_the_verifier_loads(self) -> None:
        self.assertEqual(
            0, self._generate("--deb", self._tool(), "--rules", "ld-cache")
        )
        with open(self.out, encoding="utf-8") as handle:
            document = json.load(handle)
        policy = RuntimePolicy.from_dict(document)
        self.assertEqual(rule_excludes(["ld-cache"], []), document["excludes"])
        good = [
            _entry("/usr/bin/tool", b"#!/bin/sh\necho tool\n"),
            _entry("/etc/ld.so.cache", b"anything"),
        ]
        self.assertEqual([], evaluate(policy, good))
        bad = evaluate(policy, [_entry("/usr/bin/tool", b"changed")])
        self.assertEqual(["/usr/bin/tool"], [f.path for f in bad])

    def test_extra_file_is_admitted_by_digest_at_its_guest_path(self) -> None:
        source = os.path.join(self.dir, "repo.list")
        with open(source, "wb") as out:
            out.write(b"deb [signed-by=/etc/apt/keyrings/r.gpg] http://r stable main\n")
        guest = "/etc/apt/sources.list.d/repo.list"
        argv = ["--deb", self._tool(), "--file", f"{guest}={source}"]
        self.assertEqual(0, self._generate(*argv))
        with open(self.out, encoding="utf-8") as handle:
            digests = json.load(handle)["digests"]
        with open(source, "rb") as handle:
            self.assertEqual([f"sha256:{_sha(handle.read()).hex()}"], digests[guest])
        os.remove(self.out)
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", io.StringIO()))
        self.assertEqual(
            2, self._generate(argv[0], argv[1], "--file", f"etc/x={source}")
        )
        self.assertFalse(os.path.exists(self.out))

    def test_default_rules(self) -> None:
        deb = self._tool()
        self.assertEqual(0, self._generate("--deb", deb))
        with open(self.out, encoding="utf-8") as handle:
            document = json.load(handle)
        expected = rule_excludes(DEFAULT_RULES, [read_deb(deb)])
        self.assertEqual(expected, document["excludes"])

    def test_every_compression_dpkg_writes_is_read(self) -> None:
        for compression in ("xz", "gzip", "zstd", "none"):
            folder = os.path.join(self.dir, compression)
            os.makedirs(folder)
            deb = build_deb(
                folder, "c", "1", {"/usr/bin/c": b"c"}, compression=compression
            )
            self.assertEqual(
                {"/usr/bin/c": _sha(b"c")}, read_deb(deb).files, compression
            )

    def test_truncated_deb_is_refused_naming_it(self) -> None:
        with open(self._tool(), "rb") as handle:
            data = handle.read()
        bad = os.path.join(self.dir, "truncated.deb")
        for cut in (len(data) - 100, len(data) // 2, 200, 60, 10):
            with open(bad, "wb") as out:
                out.write(data[:cut])
            self._refused(bad)

    def test_corrupt_compression_is_refused(self) -> None:
        data = bytearray(_ar([
            ("debian-binary", b"2.0\n"),
            ("control.tar", _control_tar()),
            ("data.tar.xz", b"\xfd7zXZ\x00" + bytes(200)),
        ]))  # fmt: skip
        bad = os.path.join(self.dir, "corrupt.deb")
        with open(bad, "wb") as out:
            out.write(data)
        self.assertIn("corrupt", self._refused(bad))

    def test_corrupt_ar_is_refused(self) -> None:
        data = _ar([("debian-binary", b"2.0\n"), ("control.tar", _control_tar())])
        bad = os.path.join(self.dir, "ar.deb")
        for damaged in (
            b"!<arkh>\n" + data[8:],
            data.replace(b"`\n", b"XX", 1),
            data.replace(b"4         `", b"-68       `", 1),
            data.replace(b"4         `", b"99999999  `", 1),
        ):
            with open(bad, "wb") as out:
                out.write(damaged)
            self._refused(bad)

    def test_path_with_dotdot_is_refused(self) -> None:
        info = tarfile.TarInfo("./usr/../../etc/evil")
        data = _tar([info], {"./usr/../../etc/evil": b"x"})
        bad = os.path.join(self.dir, "dotdot.deb")
        with open(bad, "wb") as out:
            out.write(_ar([
                ("debian-binary", b"2.0\n"),
                ("control.tar", _control_tar()),
                ("data.tar", data),
            ]))  # fmt: skip
        self.assertIn("'..'", self._refused(bad))

    def test_device_node_is_refused(self) -> None:
        for kind in (tarfile.CHRTYPE, tarfile.FIFOTYPE):
            info = tarfile.TarInfo("./dev/evil")
            info.type = kind
            bad = os.path.join(self.dir, "device.deb")
            with open(bad, "wb") as out:
                out.write(_ar([
                    ("debian-binary", b"2.0\n"),
                    ("control.tar", _control_tar()),
                    ("data.tar", _tar([info], {})),
                ]))  # fmt: skip
            self.assertIn("not a file, link or directory", self._refused(bad))

    def test_hard_link_to_a_missing_file_is_refused(self) -> None:
        info = tarfile.TarInfo("./usr/bin/link")
        info.type, info.linkname = tarfile.LNKTYPE, "./usr/bin/missing"
        bad = os.path.join(self.dir, "link.deb")
        with open(bad, "wb") as out:
            out.write(_ar([
                ("debian-binary", b"2.0\n"),
                ("control.tar", _control_tar()),
                ("data.tar", _tar([info], {})),
            ]))  # fmt: skip
        self._refused(bad)

    def test_archive_decompressing_past_the_bound_is_refused(self) -> None:
        deb = build_deb(self.dir, "big", "1", {"/usr/share/big": bytes(4 << 20)})
        self.assertLess(os.path.getsize(deb), 64 << 10)
        self.assertIn("size limit", self._refused(deb, "--max-bytes", str(1 << 20)))
        self.assertEqual(1, len(read_deb(deb, Limits(max_bytes=8 << 20)).files))

    def test_fuzzed_debs_raise_only_package_error(self) -> None:
        with open(self._tool(), "rb") as handle:
            xz = handle.read()
        with open(self._tool(compression="gzip"), "rb") as handle:
            gz = handle.read()
        with open(build_deb(self.dir, "z", "1", {"/z": b"z" * 999},
                            compression="zstd"), "rb") as handle:  # fmt: skip
            zst = handle.read()
        rng = random.Random(28)
        path = os.path.join(self.dir, "fuzz.deb")
        outcomes = {"ok": 0, "refused": 0}
        for round_ in range(600):
            data = bytearray(rng.choice((gz, xz, zst)))
            for _ in range(rng.randint(1, 8)):
                action = rng.randrange(4)
                where = rng.randrange(len(data) + 1)
                if action == 0 and where < len(data):
                    data[where] = rng.randrange(256)
                elif action == 1:
                    del data[where:]
                elif action == 2:
                    data[where:where] = rng.randbytes(rng.randint(1, 64))
                else:
                    data[where : where + 10] = str(rng.randint(-99, 10**9)).encode()
            with open(path, "wb") as out:
                out.write(data)
            try:
                read_deb(path, Limits(max_bytes=1 << 20))
                outcomes["ok"] += 1
            except PackageError as exc:
                self.assertEqual(path, exc.where, round_)
                outcomes["refused"] += 1
        self.assertGreater(outcomes["refused"], 300)

    def test_real_debian_package(self) -> None:
        debs = fetch_debian_debs(DEBIAN_CACHE, ["hello"])
        if not debs:
            self.skipTest("apt-get download hello failed: no Debian mirror reachable")
        package = read_deb(debs[0])
        root = os.path.join(self.dir, "hello")
        subprocess.run(["dpkg-deb", "-x", debs[0], root], check=True)
        with open(os.path.join(root, "usr/bin/hello"), "rb") as handle:
            self.assertEqual(_sha(handle.read()), package.files["/usr/bin/hello"])
        self.assertEqual("hello", package.package)
        fields = subprocess.run(
            ["dpkg-deb", "-f", debs[0], "Version", "Architecture"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        self.assertIn(f"Version: {package.version}", fields)
        self.assertEqual(0, self._generate("--deb", debs[0]))


class TestIndexParsers(testtools.TestCase):
    """Release, Packages and status files: only PackageError comes out."""

    RELEASE = (
        "Origin: Test\nSuite: stable\nCodename: bookworm\nComponents: main\n"
        "Architectures: amd64\nDate: Fri, 27 Nov 2026 17:00:00 UTC\n"
        "Valid-Until: Sat, 27 Nov 2027 17:00:00 UTC\nSHA256:\n"
        f" {'ab' * 32} 1234 main/binary-amd64/Packages\n"
        f" {'cd' * 32} 345 main/binary-amd64/Packages.xz\n"
    )
    PACKAGES = (
        "Package: tool\nVersion: 1:2.0-1\nArchitecture: amd64\n"
        "Filename: pool/main/t/tool/tool_2.0-1_amd64.deb\n"
        f"Size: 1000\nSHA256: {'ef' * 32}\n"
        "\nPackage: data\nVersion: 2\nArchitecture: all\n"
        f"Filename: pool/main/d/data_2_all.deb\nSize: 10\nSHA256: {'01' * 32}\n"
    )
    STATUS = (
        "Package: tool\nStatus: install ok installed\nVersion: 1:2.0-1\n"
        "Architecture: amd64\n\nPackage: gone\nStatus: deinstall ok config-files\n"
        "Version: 1\nArchitecture: all\n"
    )

    def test_valid_inputs_parse(self) -> None:
        release = parse_release(self.RELEASE, "bookworm", "Release", 1.7e9)
        self.assertEqual(("main",), release.components)
        self.assertEqual((345, bytes.fromhex("cd" * 32)),
                         release.sha256["main/binary-amd64/Packages.xz"])  # fmt: skip
        entries = parse_packages(self.PACKAGES.encode(), "Packages")
        self.assertEqual(["tool", "data"], [e.package for e in entries])
        self.assertEqual(
            [("tool", "1:2.0-1", "amd64")], installed_set(self.STATUS.encode(), "s")
        )
        self.assertEqual(["tool"], [e.package for e in select(entries, ["tool"], "r")])

    def test_newest_version_by_debian_ordering(self) -> None:
        def entry(version: str) -> str:
            return (
                f"Package: p\nVersion: {version}\nArchitecture: amd64\n"
                f"Filename: pool/p_{version}.deb\nSize: 1\nSHA256: {'00' * 32}\n"
            )

        for versions, newest in (
            (["1.9-1", "1.10-1"], "1.10-1"),
            (["2.0", "1:0.5"], "1:0.5"),
            (["2.0~rc1", "2.0"], "2.0"),
            (["2.0+deb12u3", "2.0+deb12u2"], "2.0+deb12u3"),
        ):
            index = "\n".join(entry(v) for v in versions).encode()
            chosen = select(parse_packages(index, "P"), ["p"], "r")
            self.assertEqual([newest], [e.version for e in chosen])

    def test_unsafe_filename_in_packages_is_refused(self) -> None:
        bad = self.PACKAGES.replace("pool/main/d/", "pool/../../etc/")
        self.assertRaisesRegex(PackageError, "unsafe path", parse_packages,
                               bad.encode(), "Packages")  # fmt: skip

    def test_fuzzed_indexes_raise_only_package_error(self) -> None:
        rng = random.Random(2028)
        alphabet = ":\n \t-=.0123456789abcdefSHA256Package/\xff\x00"
        for round_ in range(1500):
            kind = rng.randrange(3)
            text = (self.RELEASE, self.PACKAGES, self.STATUS)[kind]
            data = bytearray(text.encode())
            for _ in range(rng.randint(1, 6)):
                where = rng.randrange(len(data) + 1)
                if rng.randrange(2):
                    data[where : where + rng.randint(0, 20)] = b""
                else:
                    piece = "".join(
                        rng.choice(alphabet) for _ in range(rng.randint(1, 9))
                    )
                    data[where:where] = piece.encode("utf-8", "surrogateescape")
            try:
                if kind == 0:
                    parse_release(
                        data.decode("utf-8", "replace"), "bookworm", "R", 1.7e9
                    )
                elif kind == 1:
                    select(parse_packages(bytes(data), "P"), [], "P")
                else:
                    installed_set(bytes(data), "S")
            except PackageError:
                pass
            except Exception as exc:  # noqa: BLE001 - the point of the test
                self.fail(f"round {round_}: {type(exc).__name__}: {exc}")
