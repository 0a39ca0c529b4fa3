"""The opt-in memory diagnostic (:mod:`verifier.attest.memdiag`): off
unless asked, one JSON line a sample, growth told apart by kind."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import tracemalloc

import fixtures
import testtools

from verifier.attest import memdiag


class _Grown:
    """A type of this test only, so its growth is unambiguous."""


class MemoryDiagnosticTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.path = os.path.join(tempfile.mkdtemp(), "mem.jsonl")

    def _lines(self) -> list[dict[str, object]]:
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def test_off_unless_a_file_is_named(self) -> None:
        self.assertIsNone(memdiag.from_environment({}))
        self.assertIsNone(memdiag.from_environment({"TRUSTED_MEMDIAG_FILE": ""}))
        found = memdiag.from_environment(
            {"TRUSTED_MEMDIAG_FILE": self.path, "TRUSTED_MEMDIAG_INTERVAL": "5"}
        )
        assert found is not None
        sampler, interval = found
        self.assertEqual((self.path, 5.0, 0), (sampler.path, interval, sampler.trace))

    def test_bad_numbers_are_refused(self) -> None:
        for name, value in (("INTERVAL", "0"), ("TRACE", "-1"), ("INTERVAL", "x")):
            env = {"TRUSTED_MEMDIAG_FILE": self.path, f"TRUSTED_MEMDIAG_{name}": value}
            self.assertRaises(ValueError, memdiag.from_environment, env)

    def test_a_growing_type_is_named_with_its_growth(self) -> None:
        sampler = memdiag.MemorySampler(self.path, top=50)
        sampler.sample()
        kept = [_Grown() for _ in range(5000)]
        row = sampler.sample()
        grown = {name: (count, n) for name, count, n in row["types_grown"]}
        self.assertEqual((5000, 5000), grown["_Grown"])
        self.assertEqual(2, len(self._lines()))
        self.assertGreater(row["rss_kib"], 0)
        self.assertGreater(row["blocks"], 0)
        del kept

    def test_kinds_of_memory_are_sampled(self) -> None:
        row = memdiag.MemorySampler(self.path).sample()
        smaps = row["smaps"]
        self.assertGreater(smaps["file"], 0)  # the interpreter's own code
        self.assertGreater(smaps["anon"], 0)  # Python's arenas at least
        pymalloc = row["pymalloc"]
        self.assertGreater(pymalloc["arenas"], 0)
        self.assertGreater(pymalloc["used_kib"], 0)
        if row["mallinfo"] is not None:  # glibc
            self.assertGreater(row["mallinfo"]["used"], 0)

    def test_traced_growth_names_the_allocating_line(self) -> None:
        was_tracing = tracemalloc.is_tracing()
        sampler = memdiag.MemorySampler(self.path, top=5, trace=1)
        self.addCleanup(lambda: was_tracing or tracemalloc.stop())
        sampler.sample()
        kept = [bytes(1000) + bytes([i % 256]) for i in range(3000)]  # ~3 MB
        row = sampler.sample()
        top = row["traced_grown"][0]
        self.assertIn("test_memdiag.py", top[0])
        self.assertGreater(top[2], 2000)  # KiB grown
        del kept

    def test_the_loop_samples_until_cancelled(self) -> None:
        async def main() -> bool:
            task = asyncio.create_task(memdiag.MemorySampler(self.path).run(0.01))
            for _ in range(3000):  # a sample takes a while on a loaded machine
                await asyncio.sleep(0.01)
                if os.path.exists(self.path) and len(self._lines()) >= 2:
                    break
            running = not task.done()
            task.cancel()
            return running

        self.assertTrue(asyncio.run(main()))
        self.assertGreaterEqual(len(self._lines()), 2)

    def test_the_service_logs_a_bad_number_and_goes_on(self) -> None:
        logged = self.useFixture(fixtures.FakeLogger(name=memdiag.__name__))
        env = {"TRUSTED_MEMDIAG_FILE": self.path, "TRUSTED_MEMDIAG_TOP": "x"}
        self.assertIsNone(memdiag.configured(env))
        self.assertIn("Memory diagnostic off", logged.output)
