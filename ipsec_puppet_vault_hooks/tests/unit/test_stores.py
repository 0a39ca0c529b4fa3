"""Tests of the file-backed consumer state stores."""

from __future__ import annotations

import logging
import os

import fixtures
from oslotest import base

from ipsec_puppet_vault_hooks import (
    DeadLetter,
    DeadLetterStore,
    DedupStore,
    HooksError,
)


class StoresTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def test_memory_dedup(self) -> None:
        store = DedupStore()
        self.assertNotIn("a", store)
        store.add("a")
        store.add("a")
        self.assertIn("a", store)
        self.assertEqual(1, len(store))

    def test_file_dedup_survives_restart_and_torn_line(self) -> None:
        logger = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        path = os.path.join(self.tmp, "seen.jsonl")
        DedupStore(path).add("a")
        with open(path, "a") as f:
            f.write('{"event_id": "b')  # crash mid-write
        store = DedupStore(path)
        self.assertIn("a", store)
        self.assertNotIn("b", store)
        self.assertIn("Skipping unreadable line 2", logger.output)
        store.add("c")
        self.assertIn("c", DedupStore(path))

    def test_unreadable_dedup_file(self) -> None:
        exc = self.assertRaises(HooksError, DedupStore, self.tmp)  # a directory
        self.assertIn(self.tmp, str(exc))

    def test_dead_letters_round_trip(self) -> None:
        path = os.path.join(self.tmp, "dead.jsonl")
        letter = DeadLetter({"id": "e1", "detail": "x"}, "vault", "boom", 3)
        DeadLetterStore(path).add(letter)
        self.assertEqual([letter], list(DeadLetterStore(path)))
        self.assertEqual("e1", letter.event_id)
        self.assertEqual(0, len(DeadLetterStore()))
