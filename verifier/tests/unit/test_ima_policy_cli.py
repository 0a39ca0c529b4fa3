"""trusted-ima-policy: policies from a file tree and from a known-good log."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile

import testtools
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from node_agent.trial.ima import (
    boot_aggregate_entry,
    make_entry,
    to_ascii,
    to_binary,
)
from verifier.cmd import ima_policy
from verifier.protocol.ima import RuntimePolicy, verify


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ima_policy.main(list(argv))
    return code, out.getvalue(), err.getvalue()


class ImaPolicyCliTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp()
        self.root = os.path.join(self.dir, "root")
        os.makedirs(os.path.join(self.root, "usr", "bin"))
        os.makedirs(os.path.join(self.root, "tmp"))
        self.files = {
            "/usr/bin/app": b"app v1",
            "/usr/bin/tool": b"tool",
            "/tmp/x": b"x",
        }
        for path, content in self.files.items():
            with open(self.root + path, "wb") as f:
                f.write(content)
        os.symlink("/etc/passwd", os.path.join(self.root, "usr", "bin", "link"))

    def _policy(self, path: str) -> RuntimePolicy:
        with open(path, encoding="utf-8") as f:
            return RuntimePolicy.from_dict(json.load(f))

    def _log(self, entries: list, ascii_form: bool) -> str:  # type: ignore[type-arg]
        path = os.path.join(self.dir, "log.txt" if ascii_form else "log.bin")
        data = to_ascii(entries).encode() if ascii_form else to_binary(entries)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def test_from_tree_allows_every_regular_file_with_its_digest(self) -> None:
        out = os.path.join(self.dir, "p.json")
        code, text, _ = run(
            "from-tree",
            self.root,
            "--name",
            "web",
            "--version",
            "3",
            "--exclude",
            "/tmp/.*",
            "-o",
            out,
        )
        self.assertEqual(0, code, text)
        data = json.load(open(out, encoding="utf-8"))
        self.assertEqual(("web", 3), (data["name"], data["version"]))
        policy = self._policy(out)
        good = [boot_aggregate_entry([bytes(32)] * 10)] + [
            make_entry(p, c) for p, c in self.files.items()
        ]
        self.assertEqual([], ima_policy.evaluate(policy, good[1:], first_index=1))
        self.assertNotIn("/usr/bin/link", json.dumps(data))  # symlinks skipped

    def test_from_log_then_check_finds_the_changed_binary(self) -> None:
        good = [
            boot_aggregate_entry([bytes(32)] * 10),
            make_entry("/usr/bin/app", b"v1"),
        ]
        for ascii_form in (False, True):
            out = os.path.join(self.dir, f"p{ascii_form}.json")
            code, _, _ = run(
                "from-log",
                self._log(good, ascii_form),
                "--name",
                "n",
                "--version",
                "1",
                "-o",
                out,
            )
            self.assertEqual(0, code)
            bad = good + [make_entry("/usr/bin/app", b"trojan")]
            code, text, _ = run("check", out, self._log(bad, ascii_form))
            self.assertEqual(1, code)
            self.assertIn("entry 2 /usr/bin/app: digest_mismatch", text)
            code, text, _ = run("check", out, self._log(good, ascii_form))
            self.assertEqual(0, code, text)

    def test_signed_policy_verifies_with_the_public_key(self) -> None:
        key = ed25519.Ed25519PrivateKey.generate()
        key_file = os.path.join(self.dir, "k.pem")
        with open(key_file, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        out = os.path.join(self.dir, "s.json")
        code, _, _ = run(
            "from-tree",
            self.root,
            "--name",
            "s",
            "--version",
            "1",
            "-o",
            out,
            "--sign-key",
            key_file,
        )
        self.assertEqual(0, code)
        with open(out + ".sig", "rb") as f:
            verify(self._policy(out), f.read(), key.public_key())

    def test_bad_input_is_a_clear_error(self) -> None:
        out = os.path.join(self.dir, "p.json")
        code, _, err = run(
            "from-tree",
            self.root,
            "--name",
            "n",
            "--version",
            "1",
            "--exclude",
            "([",
            "-o",
            out,
        )
        self.assertEqual(2, code)
        self.assertIn("([", err)
        garbage = os.path.join(self.dir, "garbage")
        with open(garbage, "wb") as f:
            f.write(b"\x0a\x00\x00\x00" + hashlib.sha1(b"").digest()[:7])
        code, _, err = run(
            "from-log", garbage, "--name", "n", "--version", "1", "-o", out
        )
        self.assertEqual(2, code)
        self.assertIn("entry 0", err)
        code, _, err = run("check", os.path.join(self.dir, "missing.json"), garbage)
        self.assertEqual(2, code)
        self.assertIn("missing.json", err)


class MissingTreeTest(testtools.TestCase):
    def test_from_tree_of_a_missing_directory_is_one_line_and_exit_2(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "p.json")
            missing = os.path.join(d, "no-such-tree")
            code, _, err = run(
                "from-tree", missing, "--name", "n", "--version", "1", "-o", out
            )
        self.assertEqual(2, code)
        self.assertIn("no-such-tree", err)
        self.assertEqual(1, len(err.strip().splitlines()), err)
