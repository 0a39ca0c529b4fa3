"""The monitor batcher: nonces that wait together share one quote."""

from __future__ import annotations

import asyncio
import os

import testtools

from trusted_testing.softtpm import SoftTpm
from verifier.attest.monitor import MonitorBatcher, MonitorUnavailableError
from verifier.protocol import AttestationKey, MalformedError, PcrPolicy, Quote
from verifier.protocol.monitor import verify_monitor_attestation

PCR = 16


class BatcherTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tpm = SoftTpm()
        self.quotes = 0
        self.ak = AttestationKey(self.tpm.ak, True)
        self.policy = PcrPolicy.from_dict({"pcrs": {str(PCR): ["00" * 32]}})

    async def _quote(self, qualifying: bytes) -> Quote:
        self.quotes += 1
        await asyncio.sleep(0.01)  # the TPM takes a while
        return self.tpm.quote(qualifying, (PCR,))

    def _run(self, batcher: MonitorBatcher, nonces: list[bytes]) -> list[object]:
        async def main() -> list[object]:
            batcher.start()
            try:
                return await asyncio.gather(
                    *(batcher.attest(n) for n in nonces), return_exceptions=True
                )
            finally:
                await batcher.stop()

        return asyncio.run(main())

    def test_concurrent_requests_share_one_quote_and_each_verifies(self) -> None:
        nonces = [os.urandom(32) for _ in range(50)]
        replies = self._run(MonitorBatcher(self._quote, 0.005), nonces)
        self.assertEqual(1, self.quotes)
        for nonce, reply in zip(nonces, replies, strict=True):
            verify_monitor_attestation(
                reply,  # type: ignore[arg-type]
                nonce=nonce,
                ak=self.ak,
                policy=self.policy,
            )

    def test_max_batch_splits_batches(self) -> None:
        nonces = [os.urandom(32) for _ in range(10)]
        replies = self._run(MonitorBatcher(self._quote, 0.005, max_batch=4), nonces)
        self.assertEqual(3, self.quotes)
        self.assertEqual([4, 4, 4, 4, 4, 4, 4, 4, 2, 2], [r.size for r in replies])  # type: ignore[attr-defined]

    def test_unbatched_mode_quotes_each_request(self) -> None:
        nonces = [os.urandom(32) for _ in range(3)]
        self._run(MonitorBatcher(self._quote, 0.0, max_batch=1), nonces)
        self.assertEqual(3, self.quotes)

    def test_tpm_failure_reaches_every_waiter(self) -> None:
        async def broken(qualifying: bytes) -> Quote:
            raise OSError("swtpm went away")

        replies = self._run(MonitorBatcher(broken, 0.001), [os.urandom(32)] * 3)
        for reply in replies:
            self.assertIsInstance(reply, MonitorUnavailableError)
            self.assertIn("swtpm went away", str(reply))

    def test_bad_nonce_is_refused_before_batching(self) -> None:
        (reply,) = self._run(MonitorBatcher(self._quote), [b"short"])
        self.assertIsInstance(reply, MalformedError)
        self.assertEqual(0, self.quotes)

    def test_not_started_is_unavailable(self) -> None:
        batcher = MonitorBatcher(self._quote)
        self.assertRaises(
            MonitorUnavailableError, asyncio.run, batcher.attest(os.urandom(32))
        )
