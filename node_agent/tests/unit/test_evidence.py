"""node_agent.evidence: reading the IMA list from an index (both forms),
in parts, across a reboot, and the firmware log."""

from __future__ import annotations

import base64
import os
import tempfile

import testtools
from oslo_config import cfg

from node_agent import conf as agent_conf
from node_agent.evidence import (
    BINARY_IMA_LOG,
    DEFAULT_IMA_LOG,
    EvidenceReader,
    ImaLogReader,
    default_ima_log,
)
from node_agent.trial.ima import make_entry, to_ascii, to_binary
from trusted_testing.softtpm import SoftTpm
from verifier.protocol.evidence import ima_evidence
from verifier.protocol.messages.quote import ImaPart, QuoteAnswer


class ImaLogReaderTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.entries = [make_entry(f"/bin/f{i}", bytes([i]) * 9) for i in range(50)]

    def write(self, name: str, entries: list, append: bool = False) -> str:  # type: ignore[type-arg]
        path = os.path.join(self.dir, name)
        binary = "binary" in name
        data = to_binary(entries) if binary else to_ascii(entries).encode()
        with open(path, "ab" if append else "wb") as f:
            f.write(data)
        return path

    def paths(self, entries: list, answer: ImaPart) -> list[str]:  # type: ignore[type-arg]
        return [e.path for e in ima_evidence(answer).entries]

    def test_reads_from_an_index_in_both_forms(self) -> None:
        for name in ("ascii_runtime_measurements", "binary_runtime_measurements"):
            reader = ImaLogReader(self.write(name, self.entries))
            answer = reader.read_from(0)
            self.assertEqual(50, len(ima_evidence(answer).entries))
            answer = reader.read_from(47)
            self.assertEqual(47, answer.first)
            self.assertFalse(answer.more)
            self.assertEqual(
                ["/bin/f47", "/bin/f48", "/bin/f49"], self.paths([], answer)
            )

    def test_continues_from_where_the_last_read_started(self) -> None:
        for name in ("ascii_runtime_measurements", "binary_runtime_measurements"):
            path = self.write(name, self.entries[:10])
            reader = ImaLogReader(path)
            reader.read_from(4)
            self.write(name, self.entries[10:12], append=True)
            answer = reader.read_from(10)
            self.assertEqual(["/bin/f10", "/bin/f11"], self.paths([], answer))
            answer = reader.read_from(2)  # backwards: from the start again
            self.assertEqual(10, len(ima_evidence(answer).entries))

    def test_a_read_of_the_whole_list_keeps_the_regular_place(self) -> None:
        # the verifier's dry run of a policy asks for the list from entry 0
        # between two regular rounds: the next round still starts its read
        # where the last one did, not at the start of the file
        for name in ("ascii_runtime_measurements", "binary_runtime_measurements"):
            path = self.write(name, self.entries[:40])
            reader = ImaLogReader(path)
            reader.read_from(30)
            place = reader._mark
            self.assertEqual(30, place[0])
            whole = reader.read_from(0)
            self.assertEqual(40, len(ima_evidence(whole).entries))
            self.assertEqual(place, reader._mark)
            self.write(name, self.entries[40:42], append=True)
            answer = reader.read_from(40)
            self.assertEqual(["/bin/f40", "/bin/f41"], self.paths([], answer))
            self.assertEqual(40, reader._mark[0])

    def test_long_list_is_sent_in_whole_entries(self) -> None:
        for name in ("ascii_runtime_measurements", "binary_runtime_measurements"):
            reader = ImaLogReader(self.write(name, self.entries), max_bytes=4096)
            seen: list[str] = []
            index = 0
            while True:
                answer = reader.read_from(index)
                got = self.paths([], answer)
                self.assertTrue(got, name)
                seen += got
                index += len(got)
                if not answer.more:
                    break
            self.assertEqual([e.path for e in self.entries], seen)

    def test_a_shorter_list_after_a_reboot_is_sent_from_zero(self) -> None:
        path = self.write("ascii_runtime_measurements", self.entries)
        reader = ImaLogReader(path)
        reader.read_from(40)
        self.write("ascii_runtime_measurements", self.entries[:5])
        answer = reader.read_from(40)
        self.assertEqual(0, answer.first)
        self.assertEqual(5, len(ima_evidence(answer).entries))

    def test_a_line_being_written_is_left_for_next_time(self) -> None:
        path = self.write("ascii_runtime_measurements", self.entries[:3])
        with open(path, "a") as f:
            f.write("10 abcd ima-ng sha256:00")
        answer = ImaLogReader(path).read_from(0)
        self.assertEqual(3, len(ima_evidence(answer).entries))


class EvidenceReaderTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        quote = SoftTpm().quote(b"q", (16,))
        self.answer = QuoteAnswer(quote, bytes(32))

    def test_missing_sources_are_reported_not_raised(self) -> None:
        reader = EvidenceReader("/nonexistent/ima", "/nonexistent/bios")
        answer = reader.add_to(self.answer, 0, True)
        self.assertIn("No such file", str(answer.ima_error))
        self.assertIn("No such file", str(answer.mb_error))
        answer = EvidenceReader(None, None).add_to(self.answer, 0, True)
        self.assertIn("no IMA log configured", str(answer.ima_error))
        self.assertIn("no firmware event log", str(answer.mb_error))

    def test_firmware_log_is_sent_as_is(self) -> None:
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"\x00log bytes")
            f.flush()
            answer = EvidenceReader(None, f.name).add_to(self.answer, None, True)
        wire = answer.to_dict()
        self.assertEqual(b"\x00log bytes", base64.b64decode(str(wire["mb_log"])))
        self.assertNotIn("ima", wire)


class DefaultImaLogTest(testtools.TestCase):
    def test_binary_list_by_default_where_readable_else_ascii(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        binary = os.path.join(tmp.name, "binary_runtime_measurements")
        text = os.path.join(tmp.name, "ascii_runtime_measurements")
        self.assertEqual(DEFAULT_IMA_LOG, BINARY_IMA_LOG)
        self.assertIn("binary", os.path.basename(DEFAULT_IMA_LOG))
        # neither readable (no IMA): the binary path, whose error is sent
        self.assertEqual(binary, default_ima_log(binary, text))
        with open(text, "w") as f:
            f.write("")
        self.assertEqual(text, default_ima_log(binary, text))
        with open(binary, "wb") as f:
            f.write(b"")
        self.assertEqual(binary, default_ima_log(binary, text))
        self.assertTrue(ImaLogReader(binary).binary)

    def test_the_option_defaults_to_the_binary_list(self) -> None:
        conf = cfg.ConfigOpts()
        agent_conf.register_opts(conf)
        conf([], project="test")
        self.assertEqual(DEFAULT_IMA_LOG, conf.agent.ima_log_path)
