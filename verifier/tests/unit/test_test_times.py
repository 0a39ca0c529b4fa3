"""The test command's worker balance: tests' seconds seeded into stestr."""

from __future__ import annotations

import os
import tempfile

import testtools

from trusted_testing import test_times


class TestTimesTest(testtools.TestCase):
    def _file(self, text: str) -> str:
        fd, path = tempfile.mkstemp(suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.addCleanup(os.remove, path)
        return path

    def test_seeded_stream_carries_each_tests_seconds(self) -> None:
        times = {"a.b.C.test_1": 12.5, "a.b.C.test_2": 0.5, "x.Y.test_z[id]": 300.0}
        self.assertEqual(times, test_times.measured(test_times.seed_stream(times)))

    def test_times_file_reads_ids_and_seconds_and_skips_comments(self) -> None:
        path = self._file("# header\n\na.B.test_c 4.5  # slow\nd.E.test_f 1\n")
        self.assertEqual(
            {"a.B.test_c": 4.5, "d.E.test_f": 1.0}, test_times.read_times(path)
        )

    def test_a_bad_line_names_the_file_and_line(self) -> None:
        path = self._file("a.B.test_c 4.5\na.B.test_d\n")
        exc = self.assertRaises(test_times.TimesFileError, test_times.read_times, path)
        self.assertIn(f"{path}:2", str(exc))

    def test_class_of_a_test_id(self) -> None:
        self.assertEqual("a.b.C", test_times.class_of("a.b.C.test_x"))
        self.assertEqual("a.b.C", test_times.class_of("a.b.C.test_x[id,smoke]"))

    def test_the_shipped_times_file_parses(self) -> None:
        self.assertTrue(test_times.read_times())
