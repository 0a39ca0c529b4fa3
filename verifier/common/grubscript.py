"""GRUB's configuration language, parsed (GRUB manual, "Shell-like
scripting"): words with GRUB's quoting, commands, ``menuentry`` /
``submenu`` / ``function`` blocks and ``if``/``elif``/``else``/``fi``.

Words keep their quoting (a variable outside double quotes is split on
white space when expanded, as GRUB does); :mod:`verifier.common.grubcfg`
runs the result. Loops (``for``, ``while``, ``until``) are refused naming
the line. Any defect raises
:class:`~verifier.common.diskimage.DiskImageError`.
"""

from __future__ import annotations

import dataclasses
import re

from verifier.common.diskimage import DiskImageError

__all__ = ["Block", "Command", "If", "Segment", "Statement", "Word", "parse"]

_MAX_TEXT = 1 << 20
_MAX_DEPTH = 32
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[?#]")
_SPECIAL = " \t\r\n;{}"
#: Runs of characters that are only text: unquoted, in '...', in "...".
_RUNS = {
    "": re.compile(r"[^\s;'\"\\$]+"),
    "'": re.compile(r"[^']+"),
    '"': re.compile(r'[^"\\$]+'),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a word: literal text, or a variable (``is_var``), and
    whether it was inside double quotes (a quoted variable is not split)."""

    text: str
    is_var: bool = False
    quoted: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Word:
    """One word as written."""

    segments: tuple[Segment, ...]

    @property
    def literal(self) -> str | None:
        """The text of a word without variables (else ``None``)."""
        if any(s.is_var for s in self.segments):
            return None
        return "".join(s.text for s in self.segments)

    @property
    def bare(self) -> str | None:
        """The text of an unquoted literal word (keywords are bare)."""
        if len(self.segments) == 1 and not self.segments[0].quoted:
            seg = self.segments[0]
            return None if seg.is_var else seg.text
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """A simple command at ``line``."""

    line: int
    words: tuple[Word, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    """``menuentry``/``submenu``/``function`` with its header words."""

    line: int
    kind: str
    words: tuple[Word, ...]
    body: tuple[Statement, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class If:
    """``if`` ... ``fi``: (condition, body) pairs, then the ``else`` body."""

    line: int
    branches: tuple[tuple[tuple[Statement, ...], tuple[Statement, ...]], ...]
    orelse: tuple[Statement, ...]


Statement = Command | Block | If


@dataclasses.dataclass(slots=True)
class _Token:
    kind: str  # "word", "sep", "{", "}"
    line: int
    word: Word | None = None


def _lex(text: str, where: str) -> list[_Token]:
    if len(text) > _MAX_TEXT:
        raise DiskImageError(f"GRUB: {where}: over {_MAX_TEXT} bytes")
    tokens: list[_Token] = []
    i, line, n = 0, 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and text[i + 1 : i + 2] == "\n":
            i, line = i + 2, line + 1
        elif ch in " \t\r":
            i += 1
        elif ch in "\n;":
            tokens.append(_Token("sep", line))
            line += ch == "\n"
            i += 1
        elif ch == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif ch in "{}" and (i + 1 == n or text[i + 1] in _SPECIAL):
            tokens.append(_Token(ch, line))
            i += 1
        else:
            start_line = line
            word, i, line = _lex_word(text, i, line, where)
            tokens.append(_Token("word", start_line, word))
    return tokens


def _lex_word(text: str, i: int, line: int, where: str) -> tuple[Word, int, int]:
    segs: list[Segment] = []
    quote = ""
    n = len(text)
    while i < n:
        ch = text[i]
        if not quote and ch in " \t\r\n;":
            break
        run = _RUNS[quote].match(text, i)
        if run is not None:  # plain characters, taken at once
            chunk = run.group(0)
            line += chunk.count("\n")
            segs.append(Segment(chunk, quoted=bool(quote)))
            i = run.end()
            continue
        if ch == "\n":
            line += 1
        if quote == "'":
            if ch == "'":
                quote = ""
            else:
                segs.append(Segment(ch, quoted=True))
            i += 1
        elif ch == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "\n":
                line += 1
            elif quote and nxt not in '$"\\':
                segs.append(Segment("\\" + nxt, quoted=True))
            else:
                segs.append(Segment(nxt, quoted=bool(quote)))
            i += 2
        elif ch == "$":
            name, i = _variable(text, i, line, where)
            segs.append(Segment(name, is_var=True, quoted=bool(quote)))
        elif ch == '"':
            if not quote:
                segs.append(Segment("", quoted=True))
            quote = "" if quote else '"'
            i += 1
        elif ch == "'" and not quote:
            quote = "'"
            segs.append(Segment("", quoted=True))
            i += 1
        else:
            segs.append(Segment(ch, quoted=bool(quote)))
            i += 1
    if quote:
        raise DiskImageError(f"GRUB: {where} line {line}: unterminated {quote} quote")
    return Word(_merge(segs)), i, line


def _variable(text: str, i: int, line: int, where: str) -> tuple[str, int]:
    if text[i + 1 : i + 2] == "{":
        end = text.find("}", i + 2)
        name = text[i + 2 : end] if end > 0 else ""
        if not _NAME.fullmatch(name):
            raise DiskImageError(f"GRUB: {where} line {line}: bad variable ${{{name}")
        return name, end + 1
    match = _NAME.match(text, i + 1)
    if match is None:
        return "$", i + 1  # a lone dollar is literal
    return match.group(0), match.end()


def _merge(segs: list[Segment]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for seg in segs:
        prev = out[-1] if out else None
        if prev and not prev.is_var and not seg.is_var and prev.quoted == seg.quoted:
            out[-1] = Segment(prev.text + seg.text, quoted=prev.quoted)
        else:
            out.append(seg)
    return tuple(out)


class _Parser:
    def __init__(self, tokens: list[_Token], where: str) -> None:
        self._tokens, self._pos, self._where = tokens, 0, where

    def _error(self, line: int, detail: str) -> DiskImageError:
        return DiskImageError(f"GRUB: {self._where} line {line}: {detail}")

    def statements(
        self, stop: frozenset[str], depth: int
    ) -> tuple[tuple[Statement, ...], str]:
        if depth > _MAX_DEPTH:
            raise self._error(self._line(), "blocks nested too deep")
        out: list[Statement] = []
        while True:
            while self._peek("sep"):
                self._pos += 1
            if self._pos >= len(self._tokens):
                if stop:
                    raise self._error(self._line(), f"missing {'/'.join(sorted(stop))}")
                return tuple(out), ""
            tok = self._tokens[self._pos]
            if tok.kind == "}":
                if "}" not in stop:
                    raise self._error(tok.line, "unexpected }")
                self._pos += 1
                return tuple(out), "}"
            if tok.kind == "{":
                raise self._error(tok.line, "unexpected {")
            assert tok.word is not None
            key = tok.word.bare
            if key is not None and key in stop:
                self._pos += 1
                return tuple(out), key
            if key in ("for", "while", "until", "case", "select"):
                raise self._error(tok.line, f"{key} loops are not supported")
            if key in ("then", "else", "elif", "fi", "do", "done"):
                raise self._error(tok.line, f"unexpected {key}")
            if key == "if":
                out.append(self._if(depth))
            elif key in ("menuentry", "submenu", "function"):
                out.append(self._block(key, depth))
            else:
                out.append(self._command())

    def _line(self) -> int:
        if self._pos < len(self._tokens):
            return self._tokens[self._pos].line
        return self._tokens[-1].line if self._tokens else 1

    def _peek(self, kind: str) -> bool:
        return self._pos < len(self._tokens) and self._tokens[self._pos].kind == kind

    def _command(self) -> Command:
        line, words = self._line(), []
        while self._peek("word"):
            word = self._tokens[self._pos].word
            assert word is not None
            words.append(word)
            self._pos += 1
        return Command(line, tuple(words))

    def _if(self, depth: int) -> If:
        line = self._line()
        self._pos += 1
        branches = []
        orelse: tuple[Statement, ...] = ()
        while True:
            cond, _ = self.statements(frozenset({"then"}), depth + 1)
            body, end = self.statements(frozenset({"elif", "else", "fi"}), depth + 1)
            branches.append((cond, body))
            if end == "else":
                orelse, _ = self.statements(frozenset({"fi"}), depth + 1)
                break
            if end == "fi":
                break
        return If(line, tuple(branches), orelse)

    def _block(self, kind: str, depth: int) -> Block:
        line = self._line()
        self._pos += 1
        words = self._command().words
        if not self._peek("{"):
            raise self._error(line, f"{kind} without {{")
        self._pos += 1
        body, _ = self.statements(frozenset({"}"}), depth + 1)
        if not words:
            raise self._error(line, f"{kind} without a title")
        return Block(line, kind, words, body)


def parse(text: str, where: str) -> tuple[Statement, ...]:
    """The statements of a configuration file named ``where`` in errors.

    Raises:
        DiskImageError: a construct this parser does not read, naming the
            line.
    """
    tokens = _lex(text, where)
    body, _ = _Parser(tokens, where).statements(frozenset(), 0)
    return body
