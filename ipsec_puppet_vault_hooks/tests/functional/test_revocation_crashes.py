"""Crashes during revocation (issue 18): the verifier, the database and the
broker are SIGKILLed at the worst moments, for every notifier driver that
delivers out of the verifier's transaction (``webhook``, ``messaging``,
``inprocess``, ``keyservice``): no event is lost, and an event delivered
again carries its id and is acted on once (the consumer's processed-events
file lists it once; the key service bumps the node's epoch once).

Real parts: the registrar and verifier processes on a private PostgreSQL
cluster, an emulated fleet of TPM agents attested by them, a private
RabbitMQ node and a ``trusted-revocation-listener`` process
(:mod:`trusted_testing.crash`). The delivery guarantee is described in
doc/source/admin/event-delivery.rst.
"""

from __future__ import annotations

import tempfile
import time
from typing import TYPE_CHECKING

import testtools

from trusted_testing import postgres
from trusted_testing.crash import CrashRig

if TYPE_CHECKING:
    _Base = testtools.TestCase
else:
    _Base = object


class _CrashCase(_Base):
    """The scenarios; one rig per driver, shared by the class's tests (each
    tampers with nodes of its own). Mixed into a TestCase per driver."""

    driver = ""
    rig: CrashRig

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory(prefix=f"trusted-crash-{cls.driver}-")
        try:
            cls.rig = CrashRig(cls._tmp.name, cls.driver)
            cls.rig.start()
        except Exception:
            if hasattr(cls, "rig"):
                cls.rig.close()
            cls._tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.rig.close()
        cls._tmp.cleanup()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        if postgres.missing():
            self.skipTest(f"needs {postgres.missing()}")
        rig = self.rig
        if not rig.pg.running:
            rig.pg.start()
        if rig.rabbit is not None and not rig.rabbit.running:
            rig.rabbit.start()
        if not rig.verifier_alive():
            rig.restart_verifier()
        if not rig.consumer_alive():
            rig.start_consumer()

    def _consumer_down(self) -> None:
        """The events cannot be published: the listener or the key service
        is stopped (webhook, keyservice) or the broker crashed (messaging).
        Nothing for inprocess: its delivery races the kill."""
        rig = self.rig
        if rig.driver in ("webhook", "keyservice"):
            rig.stop_consumer()
        elif rig.rabbit is not None:
            rig.rabbit.kill()

    def _consumer_up(self) -> None:
        rig = self.rig
        if rig.rabbit is not None and not rig.rabbit.running:
            rig.rabbit.start()
        if rig.driver in ("webhook", "keyservice"):
            rig.start_consumer()

    def test_verifier_killed_after_the_revocation_commits_loses_no_event(
        self,
    ) -> None:
        rig = self.rig
        self._consumer_down()
        nodes = rig.tamper(3)
        rig.wait_staged(nodes)
        rig.kill_verifier()  # committed, not published
        self._consumer_up()
        rig.restart_verifier()
        rig.delivered_once()

    def test_verifier_killed_mid_publish_delivers_once(self) -> None:
        rig = self.rig
        if rig.driver in ("webhook", "keyservice"):
            rig.pause_consumer()  # the POST is sent and never answered
        elif rig.rabbit is not None:
            rig.rabbit.pause()  # the publish is sent and never confirmed
        nodes = rig.tamper(3)
        rig.wait_staged(nodes)
        time.sleep(1.0)  # the verifier is inside its delivery
        rig.kill_verifier()
        if rig.driver in ("webhook", "keyservice"):
            rig.resume_consumer()  # it may now process the first copy
        elif rig.rabbit is not None:
            rig.rabbit.resume()
        rig.restart_verifier()  # and this one delivers it again
        rig.delivered_once()

    def test_database_killed_after_the_revocation_commits_loses_no_event(
        self,
    ) -> None:
        rig = self.rig
        self._consumer_down()
        nodes = rig.tamper(3)
        rig.wait_staged(nodes)
        rig.pg.kill()  # committed; marking it delivered will fail
        self._consumer_up()
        time.sleep(3)  # the verifier meets the dead database
        rig.pg.start()
        rig.delivered_once()
        self.assertTrue(rig.verifier_alive(), "the verifier died with the database")

    def test_database_killed_before_the_revocation_commits_revokes_later(
        self,
    ) -> None:
        rig = self.rig
        rig.pg.kill()
        rig.tamper(2)  # judged while the revocation cannot be written
        time.sleep(3)
        rig.pg.start()
        rig.delivered_once()
        self.assertTrue(rig.verifier_alive(), "the verifier died with the database")


class WebhookCrashTest(_CrashCase, testtools.TestCase):
    driver = "webhook"


class MessagingCrashTest(_CrashCase, testtools.TestCase):
    driver = "messaging"

    def test_broker_killed_right_after_the_revocation_commits(self) -> None:
        rig = self.rig
        assert rig.rabbit is not None
        nodes = rig.tamper(3)
        rig.wait_staged(nodes)
        rig.rabbit.kill()  # before, during or after the publish
        rig.rabbit.start()
        rig.delivered_once()


class InProcessCrashTest(_CrashCase, testtools.TestCase):
    driver = "inprocess"


class KeyServiceCrashTest(_CrashCase, testtools.TestCase):
    driver = "keyservice"
