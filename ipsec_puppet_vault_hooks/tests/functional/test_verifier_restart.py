"""Events survive a verifier crash: the real ``trusted-verifier`` process
delivers its outbox through the ``webhook`` notifier to a real
``trusted-revocation-listener``; it is SIGKILLed while the listener is
down and every event flows once both are back."""

from __future__ import annotations

import os
import tempfile
import uuid as uuid_mod

import sqlalchemy as sa
import testtools
from sqlalchemy.orm import Session

from trusted_testing.cluster import LocalCluster, wait_until
from trusted_testing.revocation import Pipeline
from verifier import db


class VerifierRestartTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory(prefix="trusted-verifier-restart-")
        self.addCleanup(tmp.cleanup)
        os.makedirs(os.path.join(tmp.name, "pipeline"))
        cluster_dir = os.path.join(tmp.name, "cluster")
        db_url = f"sqlite:///{cluster_dir}/verifier.sqlite"
        self.pipeline = Pipeline(os.path.join(tmp.name, "pipeline"), db_url=None)
        self.addCleanup(self.pipeline.close)
        self.cluster = LocalCluster(
            cluster_dir,
            nodes=0,
            notifiers=("webhook",),
            verifier_options={
                "signing_key": self.pipeline.signing_key_file,
                "outbox_retry_delay": 0.2,
                "outbox_max_retry_delay": 0.5,
            },
            verifier_sections={"notifier_webhook": self.pipeline.webhook_section()},
            database_url=db_url,
        )
        self.addCleanup(self.cluster.stop)
        self.cluster.start_services()
        # Events are staged in the verifier's own database.
        self.pipeline.engine.dispose()
        self.pipeline.engine = db.make_engine(db_url)

    def attempts(self) -> list[int]:
        with Session(self.pipeline.engine) as session:
            return list(session.scalars(sa.select(db.OutboxEvent.attempts)))

    def test_events_survive_a_verifier_crash(self) -> None:
        p = self.pipeline
        events = [p.revoke(str(uuid_mod.uuid4())) for _ in range(3)]
        # The listener is down: the verifier tries and fails.
        wait_until(lambda: all(a >= 1 for a in self.attempts()), 30)
        self.assertEqual(3, p.undelivered())
        self.cluster.kill_verifier(0)
        p.start_listener(["webhook"])
        self.assertEqual(3, p.undelivered())
        self.cluster.start_verifier(0)
        wait_until(lambda: p.undelivered() == 0, 60)
        recorded = [r["event_id"] for r in p.records()]
        self.assertEqual(sorted(e.event.id for e in events), sorted(recorded))
