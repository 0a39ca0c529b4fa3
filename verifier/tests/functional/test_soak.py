"""The soak's CI form (issue 18): ``tools/bench/soak.py`` against the real
registrar and verifier processes and an emulated fleet of 200 nodes for two
minutes, one node tampered with every 20 seconds. Every tampered node is
revoked (none missed) and no other node is revoked or failed. The figures
of the issue come from the same script at ``--n 10000 --minutes 30``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import testtools
from testtools import content

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


class SoakTest(testtools.TestCase):
    def test_short_soak_has_no_false_and_no_missed_revocations(self) -> None:
        proc = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "tools", "bench", "soak.py"),
                *("--n", "200", "--minutes", "2", "--tamper-every", "20"),
                *("--interval", "2", "--grace", "120"),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        out = proc.stdout
        self.addDetail("soak", content.text_content(out + proc.stderr))
        self.assertEqual(0, proc.returncode, proc.stderr[-3000:])

        def figure(name: str) -> int:
            match = re.search(rf"^{name}\s+(\d+)$", out, re.MULTILINE)
            self.assertIsNotNone(match, f"{name} missing from {out}")
            assert match is not None
            return int(match.group(1))

        tampered = figure("tampered")
        self.assertGreaterEqual(tampered, 5)
        self.assertEqual(tampered, figure(r"revoked \(detected\)"))
        self.assertEqual(0, figure("missed"))
        self.assertEqual(0, figure("false revocations"))
        self.assertIn("slope", out)
