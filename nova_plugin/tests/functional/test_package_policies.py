"""Runtime policies from a real signed apt repository:
``policy generate runtime --apt-repo DIR|URL --keyring FILE``.

The repository is real: ``.deb`` files built by ``dpkg-deb``, indexed by
``apt-ftparchive``, its Release signed by ``gpg`` with a throwaway key,
verified by ``gpgv``; served over http on 127.0.0.1 for the URL case.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess

import fixtures
import testtools

from nova_plugin import cmd
from nova_plugin.aptindex import installed_set, parse_release
from nova_plugin.aptrepo import Repository
from nova_plugin.debpolicy import from_repository
from nova_plugin.exceptions import PackageError
from trusted_testing.debrepo import (
    build_deb,
    build_repository,
    serve,
    sign_release,
    signing_key,
)


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class TestAptRepository(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.key = signing_key(os.path.join(self.dir, "gnupg"))
        debs = os.path.join(self.dir, "debs")
        os.makedirs(debs)
        self.debs = [
            build_deb(debs, "tool", "1.0-1", {"/usr/bin/tool": b"tool 1"}),
            build_deb(debs, "tool", "1.10-1", {"/usr/bin/tool": b"tool 1.10"},
                      scripts={"postinst": b"#!/bin/sh\necho 1.10\n"}),
            build_deb(debs, "data", "2", {"/usr/share/data/x": b"x"}, arch="all"),
            build_deb(debs, "lib", "3", {"/usr/lib/x86_64-linux-gnu/libx.so.3": b"so"},
                      multi_arch="same"),
        ]  # fmt: skip
        self.repo = os.path.join(self.dir, "repo")
        build_repository(self.repo, self.debs, self.key, suite="bookworm")
        self.out = os.path.join(self.dir, "policy.json")
        self.err = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", self.err.stream))

    def _generate(self, *argv: str, repo: str | None = None) -> int:
        return cmd.main([
            "policy", "generate", "runtime", "--name", "pkgs", "-o", self.out,
            "--apt-repo", repo or self.repo, "--keyring", self.key.keyring, *argv,
        ])  # fmt: skip

    def _document(self) -> dict[str, object]:
        with open(self.out, encoding="utf-8") as handle:
            document: dict[str, object] = json.load(handle)
        return document

    def _refused(self, *argv: str, naming: str, repo: str | None = None) -> str:
        self.assertEqual(2, self._generate(*argv, repo=repo))
        self.assertFalse(os.path.exists(self.out))
        self.err.stream.seek(0)
        message = self.err.stream.read()
        self.err.stream.seek(0)
        self.err.stream.truncate()
        self.assertEqual(1, len(message.strip().splitlines()), message)
        self.assertIn(naming, message)
        return message

    def _release(self) -> str:
        return os.path.join(self.repo, "dists", "bookworm", "Release")

    def test_named_packages_newest_version_from_a_directory(self) -> None:
        self.assertEqual(0, self._generate("--packages", "tool,data"))
        digests = self._document()["digests"]
        assert isinstance(digests, dict)
        self.assertEqual(
            [f"sha256:{_sha(b'tool 1.10').hex()}"], digests["/usr/bin/tool"]
        )
        self.assertIn("/usr/share/data/x", digests)
        self.assertNotIn("/usr/lib/x86_64-linux-gnu/libx.so.3", digests)
        self.assertIn("/var/lib/dpkg/info/tool.postinst", digests)
        with open(self.debs[1], "rb") as handle:
            deb = _sha(handle.read()).hex()
        self.assertEqual(
            [f"sha256:{deb}"], digests["/var/cache/apt/archives/tool_1.10-1_amd64.deb"]
        )

    def test_name_equals_version_picks_that_version(self) -> None:
        self.assertEqual(0, self._generate("--packages", "tool=1.0-1"))
        digests = self._document()["digests"]
        assert isinstance(digests, dict)
        self.assertEqual([f"sha256:{_sha(b'tool 1').hex()}"], digests["/usr/bin/tool"])

    def test_every_package_by_default_over_http(self) -> None:
        with serve(self.repo) as url:
            self.assertEqual(0, self._generate("--suite", "bookworm", repo=url))
        digests = self._document()["digests"]
        assert isinstance(digests, dict)
        self.assertIn("/usr/lib/x86_64-linux-gnu/libx.so.3", digests)
        self.assertIn("/var/cache/apt/archives/lib_3_amd64.deb", digests)

    def test_dpkg_status_selects_exactly_the_installed_versions(self) -> None:
        status = os.path.join(self.dir, "status")
        with open(status, "w", encoding="utf-8") as out:
            out.write(
                "Package: tool\nStatus: install ok installed\nVersion: 1.0-1\n"
                "Architecture: amd64\n\n"
                "Package: data\nStatus: deinstall ok config-files\nVersion: 2\n"
                "Architecture: all\n\n"
                "Package: lib\nStatus: install ok installed\nVersion: 3\n"
                "Architecture: amd64\nMulti-Arch: same\n"
            )
        self.assertEqual(0, self._generate("--dpkg-status", status))
        digests = self._document()["digests"]
        assert isinstance(digests, dict)
        self.assertEqual([f"sha256:{_sha(b'tool 1').hex()}"], digests["/usr/bin/tool"])
        self.assertNotIn("/usr/share/data/x", digests)
        self.assertIn("/usr/lib/x86_64-linux-gnu/libx.so.3", digests)

    def test_detached_release_signature_is_verified(self) -> None:
        os.remove(os.path.join(self.repo, "dists", "bookworm", "InRelease"))
        self.assertEqual(0, self._generate("--packages", "data"))

    def test_unsigned_release_is_refused(self) -> None:
        for name in ("InRelease", "Release.gpg"):
            os.remove(os.path.join(self.repo, "dists", "bookworm", name))
        self._refused(naming="Release: not signed")

    def test_inrelease_that_is_not_clearsigned_is_refused(self) -> None:
        shutil.copy(self._release(), self._release().replace("Release", "InRelease"))
        self._refused(naming="InRelease: not signed")

    def test_release_signed_by_a_key_not_in_the_keyring_is_refused(self) -> None:
        other = signing_key(os.path.join(self.dir, "other"), "Other <o@example.org>")
        sign_release(other, self._release())
        message = self._refused(naming="InRelease: signed by a key not in the keyring")
        self.assertIn(other.fingerprint[-16:], message)

    def test_release_signed_by_an_expired_key_is_refused(self) -> None:
        old = signing_key(
            os.path.join(self.dir, "old"), "Old <old@example.org>",
            expire="1d", faked_time="20200101T000000",
        )  # fmt: skip
        sign_release(old, self._release())
        self._refused(
            "--keyring", old.keyring, naming="signature not valid (EXPKEYSIG)"
        )

    def test_release_signed_with_sha1_is_refused(self) -> None:
        sign_release(self.key, self._release(), digest="SHA1")
        self._refused(naming="signed with a weak digest")

    def test_good_signature_beside_one_by_an_unknown_key_is_accepted(self) -> None:
        home = os.path.join(self.dir, "two")
        known = signing_key(home, "Known <k@example.org>")
        keyring = os.path.join(self.dir, "known.gpg")
        shutil.copy(known.keyring, keyring)
        unknown = signing_key(home, "Unknown <u@example.org>")
        release = self._release()
        subprocess.run(
            ["gpg", "--batch", "--yes", "-u", known.fingerprint, "-u",
             unknown.fingerprint, "--clearsign", "-o",
             release.replace("Release", "InRelease"), release],
            check=True, capture_output=True, env={**os.environ, "GNUPGHOME": home},
        )  # fmt: skip
        self.assertEqual(0, self._generate("--packages", "data", "--keyring", keyring))

    def test_tampered_release_is_refused(self) -> None:
        inrelease = self._release().replace("Release", "InRelease")
        with open(inrelease, encoding="utf-8") as handle:
            text = handle.read()
        with open(inrelease, "w", encoding="utf-8") as out:
            out.write(text.replace("Suite: bookworm", "Suite: bookwork"))
        self._refused(naming="InRelease: bad signature")

    def test_packages_digest_differs_from_release_is_refused(self) -> None:
        packages = os.path.join(
            self.repo, "dists/bookworm/main/binary-amd64/Packages.xz"
        )
        with open(packages, "rb") as handle:
            text = lzma.decompress(handle.read())
        with open(packages, "wb") as out:
            out.write(lzma.compress(text.replace(b"Package: tool", b"Package: tooo")))
        self._refused(naming="Packages.xz: digest differs from the signed Release")

    def test_deb_digest_differs_from_packages_is_refused(self) -> None:
        name = os.path.basename(self.debs[2])
        pooled = os.path.join(self.repo, "pool", "main", name)
        with open(pooled, "r+b") as handle:
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
            handle.seek(-1, os.SEEK_END)
            handle.write(bytes([last[0] ^ 1]))
        self._refused("--packages", "data", naming=f"{name}: digest differs")

    def test_truncated_deb_in_the_repository_is_refused(self) -> None:
        name = os.path.basename(self.debs[2])
        pooled = os.path.join(self.repo, "pool", "main", name)
        with open(pooled, "r+b") as handle:
            handle.truncate(100)
        self._refused("--packages", "data", naming=f"{name}: size differs")

    def test_package_the_repository_lacks_is_refused(self) -> None:
        self._refused("--packages", "tool nothere", naming="has no package 'nothere'")
        self._refused("--packages", "tool=9", naming="has no package 'tool=9'")

    def test_installed_version_the_repository_lacks_is_refused(self) -> None:
        status = os.path.join(self.dir, "status")
        with open(status, "w", encoding="utf-8") as out:
            out.write("Package: tool\nStatus: install ok installed\nVersion: 0.9\n"
                      "Architecture: amd64\n")  # fmt: skip
        self._refused("--dpkg-status", status, naming="has no tool=0.9 (amd64)")

    def test_deb_larger_than_the_bound_is_refused(self) -> None:
        big = build_deb(
            os.path.join(self.dir, "debs"),
            "big",
            "1",
            {"/usr/share/big": os.urandom(200_000)},
        )
        build_repository(self.repo, [*self.debs, big], self.key, suite="bookworm")
        self._refused(
            "--packages",
            "big",
            "--max-bytes",
            "100000",
            naming="larger than 100000 bytes",
        )

    def test_release_of_another_suite_is_refused(self) -> None:
        os.rename(
            os.path.join(self.repo, "dists", "bookworm"),
            os.path.join(self.repo, "dists", "trixie"),
        )
        self._refused("--suite", "trixie", naming="a Release of ['bookworm']")

    def test_missing_gpgv_is_one_line_and_exit_2(self) -> None:
        empty = os.path.join(self.dir, "empty-path")
        os.makedirs(empty)
        self.useFixture(fixtures.EnvironmentVariable("PATH", empty))
        self._refused(naming="gpgv: not found")

    def test_armored_keyring_is_accepted(self) -> None:
        armored = os.path.join(self.dir, "key.asc")
        with open(armored, "wb") as out:
            subprocess.run(
                ["gpg", "--batch", "--armor", "--export", self.key.fingerprint],
                check=True, stdout=out, env={**os.environ, "GNUPGHOME": self.key.home},
            )  # fmt: skip
        code = cmd.main([
            "policy", "generate", "runtime", "--name", "p", "-o", self.out,
            "--apt-repo", self.repo, "--keyring", armored, "--packages", "data",
        ])  # fmt: skip
        self.assertEqual(0, code)

    def test_expired_release_is_refused(self) -> None:
        text = "Suite: s\nValid-Until: Sat, 01 Jan 2000 00:00:00 UTC\nSHA256:\n"
        text += f" {'0' * 64} 1 main/binary-amd64/Packages\n"
        self.assertRaisesRegex(
            PackageError, "expired", parse_release, text, "s", "Release", 1e9
        )

    def test_status_without_installed_packages_is_refused(self) -> None:
        self.assertRaises(PackageError, installed_set, b"garbage\xff", "status")
        self.assertRaises(PackageError, installed_set, b"Package: x\n", "status")

    def test_library_call(self) -> None:
        packages = from_repository(
            Repository(self.repo), self.key.keyring, packages=["lib"]
        )
        self.assertEqual(["lib:amd64"], [p.dpkg_name for p in packages])
