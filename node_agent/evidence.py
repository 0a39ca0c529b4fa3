"""Runtime evidence the agent sends with a quote: IMA measurement-list
entries from the index the verifier asks for, and the firmware event log.

The IMA list only grows during a boot, so the reader remembers where the
furthest requested index starts in the file and continues from there: each
quote costs reading the new entries, not the whole list (a request for the
whole list, the verifier's dry run of a policy, does not move that place
back). The list is read
after the quote, so it holds at least what the quote covers (the kernel
appends an entry before extending PCR 10).
"""

from __future__ import annotations

import dataclasses
import os
from typing import BinaryIO

from verifier.protocol import MalformedError
from verifier.protocol.ima.log import iter_binary_spans
from verifier.protocol.messages.quote import MAX_MB_LOG_BYTES, ImaPart, QuoteAnswer

__all__ = [
    "ASCII_IMA_LOG",
    "BINARY_IMA_LOG",
    "DEFAULT_IMA_LOG",
    "EvidenceReader",
    "ImaLogReader",
    "default_ima_log",
]

IMA_DIR = "/sys/kernel/security/ima"
#: The binary list: the default (the verifier parses it at about half the
#: cost of the ascii one, and it names every path unambiguously).
BINARY_IMA_LOG = IMA_DIR + "/binary_runtime_measurements"
ASCII_IMA_LOG = IMA_DIR + "/ascii_runtime_measurements"
DEFAULT_IMA_LOG = BINARY_IMA_LOG
DEFAULT_MB_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
#: Send at most this much of the list per answer (the verifier asks again).
DEFAULT_MAX_BYTES = 4 << 20
_MB_MAX = MAX_MB_LOG_BYTES
_READ = 1 << 16


def default_ima_log(
    binary: str = BINARY_IMA_LOG, ascii_list: str = ASCII_IMA_LOG
) -> str:
    """The list the agent reads when ``ima_log_path`` is left at its
    default: the binary list where it can be read, else the ascii list
    (the verifier accepts both), else the binary path still (its read
    error goes to the verifier as ``ima_error``, as for any path)."""
    if os.access(binary, os.R_OK) or not os.access(ascii_list, os.R_OK):
        return binary
    return ascii_list


class ImaLogReader:
    """Reads an IMA list (ascii or binary form) from a given entry index.

    Args:
        path: the list's file (``binary`` in the name selects the binary
            form).
        max_bytes: the most list bytes returned by one :meth:`read_from`.
    """

    def __init__(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.binary = "binary" in os.path.basename(path)
        self.max_bytes = max_bytes
        self._mark = (0, 0)  # (entry index, byte offset) of a known entry start

    def read_from(self, index: int) -> ImaPart:
        """The entries from ``index`` on. A list shorter than ``index`` was
        restarted by a reboot: it is sent from entry 0.

        Raises:
            OSError: the list cannot be read.
            MalformedError: a binary list that does not parse.
        """
        with open(self.path, "rb") as f:
            start = self._seek(f, index)
            if start is None:
                self._mark = (0, 0)
                f.seek(0)
                start = 0
            offset = f.tell()
            data, more = self._take(f)
        if start >= self._mark[0]:
            # never back: a read from an earlier entry (the verifier's dry
            # run of a policy asks for the whole list) leaves the place of
            # the regular rounds, which go on from there
            self._mark = (start, offset)
        if self.binary:
            return ImaPart(start, data, more)
        return ImaPart(start, data.decode("utf-8", "surrogateescape"), more)

    def _seek(self, f: BinaryIO, index: int) -> int | None:
        """Position ``f`` at entry ``index``; None if the list is shorter."""
        mark_index, mark_offset = self._mark
        if mark_offset:  # still there? (a reboot restarts the list shorter)
            f.seek(mark_offset - 1)
            if not f.read(1):
                mark_index, mark_offset = self._mark = (0, 0)
        if index >= mark_index:
            f.seek(mark_offset)
            skip = index - mark_index
        else:
            f.seek(0)
            skip = index
        if self.binary:
            return index if self._skip_binary(f, skip) else None
        while skip:
            if not f.readline():
                return None
            skip -= 1
        return index

    def _skip_binary(self, f: BinaryIO, count: int) -> bool:
        if not count:
            return True
        start = f.tell()
        data = f.read()
        done = 0
        pos = 0
        for end in iter_binary_spans(data):
            pos = end
            done += 1
            if done == count:
                f.seek(start + pos)
                return True
        return False

    def _take(self, f: BinaryIO) -> tuple[bytes, bool]:
        """Whole entries from the current position, at most max_bytes."""
        data = f.read(self.max_bytes + 1)
        if len(data) <= self.max_bytes:
            if self.binary or not data or data.endswith(b"\n"):
                return data, False
            return data[: data.rfind(b"\n") + 1], False  # a line being written
        data = data[: self.max_bytes]
        if self.binary:
            cut = 0
            try:
                for end in iter_binary_spans(data, partial=True):
                    cut = end
            except MalformedError:
                pass
            return data[:cut], True
        return data[: data.rfind(b"\n") + 1], True


class EvidenceReader:
    """The agent's evidence sources (either may be absent)."""

    def __init__(
        self,
        ima_path: str | None = DEFAULT_IMA_LOG,
        mb_path: str | None = DEFAULT_MB_LOG,
        ima_max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.ima = ImaLogReader(ima_path, ima_max_bytes) if ima_path else None
        self.mb_path = mb_path

    def add_to(
        self, answer: QuoteAnswer, ima_from: int | None, mb: bool
    ) -> QuoteAnswer:
        """A quote answer with what the verifier asked for added; what
        cannot be read is reported as ``ima_error``/``mb_error`` (the
        verifier fails the node: it asked because its policy needs it)."""
        ima, ima_error = None, None
        if ima_from is not None:
            if self.ima is None:
                ima_error = "this agent has no IMA log configured"
            else:
                try:
                    ima = self.ima.read_from(ima_from)
                except (OSError, MalformedError) as exc:
                    ima_error = f"{self.ima.path}: {exc}"
        mb_log, mb_error = None, None
        if mb:
            mb_log, mb_error = self._read_mb_log()
        return dataclasses.replace(
            answer, ima=ima, ima_error=ima_error, mb_log=mb_log, mb_error=mb_error
        )

    def _read_mb_log(self) -> tuple[bytes | None, str | None]:
        if not self.mb_path:
            return None, "this agent has no firmware event log configured"
        try:
            with open(self.mb_path, "rb") as f:
                log = f.read(_MB_MAX + 1)
        except OSError as exc:
            return None, f"{self.mb_path}: {exc}"
        if len(log) > _MB_MAX:
            return None, f"{self.mb_path}: larger than {_MB_MAX} bytes"
        return log, None
