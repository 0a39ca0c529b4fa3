"""IMA measurement list parsing and PCR 10 replay."""

import hashlib
import struct

import testtools
from hypothesis import given, settings
from hypothesis import strategies as st

from node_agent.trial.ima import (
    boot_aggregate_entry,
    make_entry,
    pcr_values,
    to_ascii,
    to_binary,
)
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.ima import (
    ImaEntry,
    ReplayState,
    boot_aggregate,
    check_against_pcr,
    check_boot_aggregate,
    parse_ascii,
    parse_binary,
    replay,
    replay_to_pcr,
)

PCRS = [bytes([i]) * 32 for i in range(10)]


def sample_log() -> list[ImaEntry]:
    return [
        boot_aggregate_entry(PCRS),
        make_entry("/usr/bin/a", b"a"),
        make_entry("/usr/bin/b", b"b", algorithm="sha1"),
        make_entry("/usr/lib/c.so", b"c", template="ima-sig", signature=b"\x03\x02s"),
        make_entry("/usr/lib/unsigned.so", b"u", template="ima-sig"),
        make_entry("kexec-cmdline", template="ima-buf", buffer=b"root=/dev/vda ro"),
        make_entry("/usr/bin/legacy", b"l", template="ima"),
        make_entry("/tmp/written", violation=True),
        make_entry("/usr/bin/with space", b"s", algorithm="sha512"),
    ]


def _u32(n: int) -> bytes:
    return struct.pack("<I", n)


class TemplateFormatTest(testtools.TestCase):
    """The template data matches the kernel's layout, byte for byte."""

    def test_ima_ng_layout(self) -> None:
        digest = hashlib.sha256(b"x").digest()
        entry = make_entry("/bin/x", b"x")
        dng = b"sha256:\x00" + digest
        expected = _u32(len(dng)) + dng + _u32(7) + b"/bin/x\x00"
        self.assertEqual(expected, entry.template_data)
        self.assertEqual(hashlib.sha1(expected).digest(), entry.template_hash)
        self.assertEqual(
            ("sha256", digest, "/bin/x"),
            (entry.digest_algorithm, entry.digest, entry.path),
        )
        self.assertIsNone(entry.signature)
        self.assertIsNone(entry.buffer)

    def test_ima_sig_and_buf_layout(self) -> None:
        sig = make_entry("/bin/x", b"x", template="ima-sig", signature=b"SIG")
        self.assertTrue(sig.template_data.endswith(_u32(3) + b"SIG"))
        self.assertEqual(b"SIG", sig.signature)
        unsigned = make_entry("/bin/x", b"x", template="ima-sig")
        self.assertTrue(unsigned.template_data.endswith(b"/bin/x\x00" + _u32(0)))
        self.assertEqual(b"", unsigned.signature)
        buf = make_entry("kexec-cmdline", template="ima-buf", buffer=b"ro")
        self.assertEqual(b"ro", buf.buffer)
        self.assertEqual(hashlib.sha256(b"ro").digest(), buf.digest)

    def test_ima_template_hash_pads_name_to_256(self) -> None:
        entry = make_entry("/bin/old", b"o", template="ima")
        digest = hashlib.sha1(b"o").digest()
        hashed = digest + b"/bin/old" + bytes(256 - 8)
        self.assertEqual(hashed, entry.template_data)
        self.assertEqual(hashlib.sha1(hashed).digest(), entry.template_hash)
        # The binary form has no data length and an unpadded, unterminated name.
        self.assertTrue(
            entry.to_binary().endswith(b"ima" + digest + _u32(8) + b"/bin/old")
        )


class ParseTest(testtools.TestCase):
    def test_binary_round_trip(self) -> None:
        log = sample_log()
        self.assertEqual(log, parse_binary(to_binary(log)))

    def test_ascii_round_trip(self) -> None:
        log = sample_log()
        text = to_ascii(log)
        self.assertEqual(log, parse_ascii(text))
        self.assertEqual(log, parse_ascii(text.encode()))

    def test_ascii_line_format(self) -> None:
        entry = make_entry("/bin/x", b"x", template="ima-sig")
        pcr, thash, name, rest = entry.to_ascii().split(" ", 3)
        self.assertEqual(
            ("10", entry.template_hash.hex(), "ima-sig"), (pcr, thash, name)
        )
        self.assertEqual(f"sha256:{entry.digest.hex()} /bin/x ", rest)
        # A line whose empty signature field lost its trailing space.
        self.assertEqual([entry], parse_ascii(entry.to_ascii().rstrip() + "\n"))

    def test_empty(self) -> None:
        self.assertEqual([], parse_binary(b""))
        self.assertEqual([], parse_ascii(""))

    def test_binary_truncated_names_index(self) -> None:
        data = to_binary(sample_log())
        last = len(sample_log()) - 1
        for cut in (1, 5, 30, 40):
            exc = self.assertRaises(MalformedError, parse_binary, data[:-cut])
            self.assertIn(f"entry {last}", exc.detail)
            self.assertIn("truncated", exc.detail)
        exc = self.assertRaises(MalformedError, parse_binary, data[:-1], 100)
        self.assertIn(f"entry {100 + last}", exc.detail)

    def test_every_binary_prefix_fails_cleanly(self) -> None:
        log = sample_log()[:3]
        data = to_binary(log)
        boundaries = {len(to_binary(log[:i])) for i in range(len(log) + 1)}
        for cut in range(len(data)):
            if cut in boundaries:
                continue
            self.assertRaises(MalformedError, parse_binary, data[:cut])

    def test_ascii_truncated_line(self) -> None:
        text = to_ascii(sample_log())
        exc = self.assertRaises(MalformedError, parse_ascii, text[:-10])
        self.assertIn(f"entry {len(sample_log()) - 1}", exc.detail)
        exc = self.assertRaises(MalformedError, parse_ascii, "10 abcd\n")
        self.assertIn("entry 0", exc.detail)

    def test_ascii_line_with_non_ascii_algorithm_is_malformed(self) -> None:
        # Issue 18: raised UnicodeEncodeError, outside the project's errors.
        line = "10 " + "00" * 20 + " ima-ng sha256\u00e9:" + "00" * 32 + " /bin/sh\n"
        exc = self.assertRaises(MalformedError, parse_ascii, line)
        self.assertIn(
            "entry 0: digest algorithm 'sha256\u00e9' is not ASCII", exc.detail
        )

    def test_ascii_line_with_non_ascii_pcr_digits_is_malformed(self) -> None:
        line = "\u0661\u0660 " + "00" * 20 + " ima-ng sha256:" + "00" * 32 + " /x\n"
        exc = self.assertRaises(MalformedError, parse_ascii, line)
        self.assertIn("entry 0: bad PCR", exc.detail)

    def test_unknown_template(self) -> None:
        entry = make_entry("/bin/x", b"x")
        data = to_binary([entry]) + to_binary([entry]).replace(b"ima-ng", b"ima-xx")
        exc = self.assertRaises(MalformedError, parse_binary, data)
        self.assertIn("entry 1", exc.detail)
        self.assertIn("'ima-xx'", exc.detail)
        text = entry.to_ascii().replace("ima-ng", "ima-foo") + "\n"
        exc = self.assertRaises(MalformedError, parse_ascii, text, 7)
        self.assertIn("entry 7", exc.detail)
        self.assertIn("'ima-foo'", exc.detail)

    def test_bad_fields(self) -> None:
        good = make_entry("/bin/x", b"x").template_data
        for data in (
            good + b"\x00",  # trailing data
            good[:-1] + b"x",  # name not NUL-terminated
            good.replace(b"sha256", b"sha384"),  # digest of the wrong size
        ):
            self.assertRaises(
                MalformedError, ImaEntry.from_template, 10, "ima-ng", bytes(20), data
            )
        self.assertRaises(MalformedError, parse_ascii, "10 zz ima-ng sha256:00 /x\n")

    def test_ascii_path_with_lone_surrogate_is_malformed(self) -> None:
        # A JSON string may carry one ("\ud800"): it raised
        # UnicodeEncodeError, outside the project's errors.
        line = "10 " + "00" * 20 + " ima-ng sha256:" + "00" * 32 + " /a\ud800b\n"
        exc = self.assertRaises(MalformedError, parse_ascii, line, 4)
        self.assertIn("entry 4: path is not UTF-8", exc.detail)

    def test_ascii_escaped_utf8_path_reads_as_its_bytes(self) -> None:
        # Escaped bytes that form UTF-8 name the file those bytes name.
        line = "10 " + "00" * 20 + " ima-ng sha256:" + "00" * 32 + " /\udcc3\udca9\n"
        self.assertEqual("/\u00e9", parse_ascii(line)[0].path)

    def test_binary_fast_path_equals_the_general_one(self) -> None:
        # parse_binary decodes well-formed ng entries itself; each must be
        # the entry from_template builds from the same bytes.
        log = sample_log()
        log += [make_entry("/x", b"x", algorithm=a) for a in ("md5", "sm3", "sha224")]
        log.append(make_entry("k", template="ima-buf", buffer=b""))
        for entry, parsed in zip(log, parse_binary(to_binary(log)), strict=True):
            name, data = entry.template_name, entry.template_data
            if name != "ima":
                general = ImaEntry.from_template(10, name, entry.template_hash, data)
                self.assertEqual(general, parsed)
                self.assertEqual([type(f) for f in general], [type(f) for f in parsed])
            self.assertEqual(entry, parsed)

    def test_binary_legacy_digest_field_is_read_as_sha1(self) -> None:
        digest = hashlib.sha1(b"x").digest()
        data = _u32(20) + digest + _u32(3) + b"/x\x00"
        head = _u32(10) + bytes(20) + _u32(6) + b"ima-ng" + _u32(len(data))
        (entry,) = parse_binary(head + data)
        self.assertEqual(("sha1", digest, "/x"), entry[3:6])

    def test_binary_ima_sig_without_its_signature_field_is_malformed(self) -> None:
        data = make_entry("/bin/x", b"x").template_data  # two fields
        head = _u32(10) + bytes(20) + _u32(7) + b"ima-sig" + _u32(len(data))
        exc = self.assertRaises(MalformedError, parse_binary, head + data, 3)
        self.assertIn("entry 3: template fields do not add up", exc.detail)

    def test_huge_length_is_refused(self) -> None:
        head = _u32(10) + bytes(20) + _u32(6) + b"ima-ng" + _u32(0xFFFFFFFF)
        exc = self.assertRaises(MalformedError, parse_binary, head)
        self.assertIn("entry 0", exc.detail)


class ReplayTest(testtools.TestCase):
    def test_matches_independent_computation(self) -> None:
        log = sample_log()
        state = replay(ReplayState(), log)
        self.assertEqual(len(log), state.count)
        self.assertEqual(pcr_values(log), (state.sha1, state.sha256))
        check_against_pcr(state, pcr_values(log)[1])

    def test_violation_extends_ff(self) -> None:
        log = [boot_aggregate_entry(PCRS), make_entry("/x", violation=True)]
        self.assertTrue(log[1].is_violation)
        state = replay(ReplayState(), log)
        first = replay(ReplayState(), log[:1])
        self.assertEqual(
            hashlib.sha256(first.sha256 + b"\xff" * 32).digest(), state.sha256
        )
        self.assertEqual(hashlib.sha1(first.sha1 + b"\xff" * 20).digest(), state.sha1)

    def test_mismatch(self) -> None:
        state = replay(ReplayState(), sample_log())
        exc = self.assertRaises(EvidenceError, check_against_pcr, state, bytes(32))
        self.assertEqual("ima_pcr_mismatch", exc.reason)

    def test_forged_template_hash_is_refused(self) -> None:
        log = sample_log()
        e = log[3]
        forged = ImaEntry.from_template(
            e.pcr, e.template_name, b"\x01" * 20, e.template_data
        )
        exc = self.assertRaises(
            EvidenceError, replay, ReplayState(), [*log[:3], forged]
        )
        self.assertEqual("ima_template_hash", exc.reason)
        self.assertIn("entry 3", exc.detail)

    def test_boot_aggregate_must_be_first(self) -> None:
        exc = self.assertRaises(
            EvidenceError, replay, ReplayState(), [make_entry("/x", b"x")]
        )
        self.assertEqual("ima_boot_aggregate", exc.reason)
        # Only entry 0 is checked: a later chunk starts anywhere.
        state = replay(ReplayState(), [boot_aggregate_entry(PCRS)])
        replay(state, [make_entry("/x", b"x")])

    def test_boot_aggregate_value(self) -> None:
        entry = boot_aggregate_entry(PCRS)
        self.assertEqual(hashlib.sha256(b"".join(PCRS)).digest(), entry.digest)
        self.assertEqual(entry.digest, boot_aggregate(PCRS))
        check_boot_aggregate(entry, PCRS)
        exc = self.assertRaises(
            EvidenceError, check_boot_aggregate, entry, [bytes(32)] * 10
        )
        self.assertEqual("ima_boot_aggregate", exc.reason)
        self.assertRaises(ValueError, boot_aggregate, PCRS[:8])

    def test_other_pcr_is_refused(self) -> None:
        log = [boot_aggregate_entry(PCRS), make_entry("/x", b"x", pcr=11)]
        exc = self.assertRaises(EvidenceError, replay, ReplayState(), log)
        self.assertEqual("ima_unexpected_pcr", exc.reason)

    def test_replay_to_pcr_stops_at_the_quote(self) -> None:
        log = sample_log()
        for n in range(len(log) + 1):
            quoted = pcr_values(log[:n])[1]
            state = replay_to_pcr(ReplayState(), log, quoted)
            self.assertEqual(n, state.count)
        exc = self.assertRaises(
            EvidenceError, replay_to_pcr, ReplayState(), log, b"\x02" * 32
        )
        self.assertEqual("ima_pcr_mismatch", exc.reason)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=9), max_size=9))
    def test_incremental_equals_full(self, cuts: list[int]) -> None:
        log = sample_log()
        full = replay(ReplayState(), log)
        data = to_binary(log)
        offsets = [len(to_binary(log[:i])) for i in range(len(log) + 1)]
        state = ReplayState()
        start = 0
        for cut in [*sorted(cuts), len(log)]:
            # The verifier parses only the new bytes, starting at its count.
            chunk = parse_binary(data[offsets[start] : offsets[cut]], state.count)
            state = replay(state, chunk)
            self.assertEqual(cut, state.count)
            start = cut
        self.assertEqual(full, state)


class RealKernelLinesTest(testtools.TestCase):
    """Lines printed by real kernels (public mailing-list and doc samples):
    the template data rebuilt from ASCII hashes to the logged template hash."""

    LINES = (
        "10 0adefe762c149c7cec19da62f0da1297fcfbffff ima-ng sha256:"
        + "0" * 64
        + " boot_aggregate\n"
        "10 4e5d73ebadfd8f850cb93ce4de755ba148a9a7d5 ima-ng sha256:"
        + "0"
        * 64
        + " boot_aggregate_late\n"
        "10 2c7020ad8cab6b7419e4973171cb704bdbf52f77 ima "
        "e09e048c48301268ff38645f4c006137e42951d0 /init\n"
        "10 ef7a0aff83dd46603ebd13d1d789445365adb3b3 ima "
        "0f8b3432535d5eab912ad3ba744507e35e3617c1 /init\n"
    )

    def test_template_hashes(self) -> None:
        entries = parse_ascii(self.LINES)
        self.assertEqual(4, len(entries))
        for entry in entries:
            self.assertEqual(
                hashlib.sha1(entry.template_data).digest(), entry.template_hash
            )
        # Replay checks exactly this, so the whole list replays.
        replay(ReplayState(), entries)
        self.assertEqual(entries, parse_binary(to_binary(entries)))
