"""The opt-in CPU profile of a service (:mod:`verifier.common.cpuprofile`):
off unless the environment names a directory; then the body's CPU profile
is written there when it ends, even when it ends with an error."""

from __future__ import annotations

import os
import pstats
import tempfile

import testtools

from verifier.common.cpuprofile import ENV, profiled


def _busy() -> int:
    return sum(i * i for i in range(20000))


class CpuProfileTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = os.path.join(tmp.name, "prof")

    def test_off_without_the_variable(self) -> None:
        with profiled("trusted-test", {}):
            _busy()
        self.assertFalse(os.path.exists(self.dir))

    def test_the_profile_names_what_ran(self) -> None:
        with profiled("trusted-test", {ENV: self.dir}):
            _busy()
        (name,) = os.listdir(self.dir)
        self.assertEqual(f"trusted-test-{os.getpid()}.pstats", name)
        stats = pstats.Stats(os.path.join(self.dir, name))
        functions = {func for _, _, func in stats.stats}  # type: ignore[attr-defined]
        self.assertIn("_busy", functions)

    def test_written_when_the_body_fails(self) -> None:
        with self.assertRaises(RuntimeError):
            with profiled("trusted-test", {ENV: self.dir}):
                raise RuntimeError("stopped")
        self.assertEqual(1, len(os.listdir(self.dir)))
