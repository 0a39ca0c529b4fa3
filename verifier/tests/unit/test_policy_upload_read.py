"""A policy upload is read whole, however the body arrives."""

from __future__ import annotations

import asyncio
from typing import Any

import testtools

from verifier.api.policies_app import _read_limited
from verifier.common.errors import RequestError


class _Content:
    """A request body that arrives a few bytes at a time (like a socket)."""

    def __init__(self, body: bytes, piece: int) -> None:
        self._body, self._piece = body, piece

    async def read(self, n: int) -> bytes:
        chunk = self._body[: min(n, self._piece)]
        self._body = self._body[len(chunk) :]
        return chunk


class _Request:
    def __init__(self, body: bytes, piece: int, length: int | None) -> None:
        self.content = _Content(body, piece)
        self.content_length = length


def _read(body: bytes, limit: int, length: int | None = None) -> Any:
    request: Any = _Request(body, 1000, length)
    return asyncio.run(_read_limited(request, limit))


class TestReadLimited(testtools.TestCase):
    def test_a_body_in_many_pieces_is_read_whole(self) -> None:
        body = b"x" * 150_000  # a runtime policy of an image is megabytes
        self.assertEqual(body, _read(body, 1 << 20))

    def test_a_body_over_the_limit_is_refused(self) -> None:
        exc = self.assertRaises(RequestError, _read, b"x" * 5000, 4096)
        self.assertEqual(413, exc.status)
        self.assertEqual("policy_too_large", exc.code)

    def test_a_declared_length_over_the_limit_is_refused_unread(self) -> None:
        exc = self.assertRaises(RequestError, _read, b"", 4096, 5000)
        self.assertEqual("policy_too_large", exc.code)
