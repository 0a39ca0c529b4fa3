"""Verification classes: the scheduler's order (:class:`Deadlines`) keeps
per-node quote intervals apart, with and without overload.

Pure simulations on a clock the test drives (no wall-clock time): a
verifier that can start ``capacity`` rounds per second, nodes of two
classes, and counts of the rounds each class got.
"""

from __future__ import annotations

import asyncio

import testtools

from verifier.attest.scheduler import MAX_LAG, ClassLag, Deadlines, QuoteScheduler


def simulate(
    classes: dict[float, int], capacity: float, seconds: float
) -> tuple[dict[float, float], dict[float, float]]:
    """Rounds per node per second of each class, and the largest lateness
    (seconds past its deadline) a round of each class started with."""
    deadlines: Deadlines[tuple[float, int]] = Deadlines()
    rounds = dict.fromkeys(classes, 0)
    late = dict.fromkeys(classes, 0.0)
    now = 0.0
    for interval, count in classes.items():
        for i in range(count):
            deadlines.start((interval, i), now, 0.0)
    tick = 1.0 / capacity
    while now < seconds:
        now += tick
        due = deadlines.pop_due(now)
        if due is None:
            continue
        deadline, (interval, i) = due
        rounds[interval] += 1
        late[interval] = max(late[interval], now - deadline)
        deadlines.again((interval, i), deadline, interval, now)
    rates = {k: rounds[k] / classes[k] / seconds for k in classes}
    return rates, late


class TestVerificationClasses(testtools.TestCase):
    def test_without_overload_every_node_is_quoted_at_its_own_interval(self) -> None:
        # demand 10/s + 1/s on a capacity of 100/s
        rates, late = simulate({1.0: 10, 10.0: 10}, capacity=100, seconds=200)
        self.assertAlmostEqual(rates[1.0], 1.0, delta=0.02)
        self.assertAlmostEqual(rates[10.0], 0.1, delta=0.01)
        # nothing waits more than the few ticks that serve simultaneous deadlines
        self.assertLess(max(late.values()), 21 / 100)

    def test_overload_slows_every_class_by_the_same_factor(self) -> None:
        # demand 100/s + 10/s on a capacity of 55/s: each node gets half its
        # nominal rate, so the fast class stays ten times as often quoted
        # (first come, first served would give every node the same wait and
        # the fast class only about five times the slow one's rate)
        rates, _ = simulate({1.0: 100, 10.0: 100}, capacity=55, seconds=400)
        self.assertAlmostEqual(rates[1.0] / rates[10.0], 10.0, delta=1.0)
        self.assertAlmostEqual(rates[1.0], 0.5, delta=0.05)
        self.assertAlmostEqual(rates[10.0], 0.05, delta=0.006)

    def test_a_long_overload_leaves_a_bounded_backlog(self) -> None:
        # demand 10x the capacity for longer than MAX_LAG: no deadline is
        # set further behind the clock than MAX_LAG
        # (plus the 10 s it takes to serve the 100 nodes clamped together;
        # unclamped, the last rounds would start about 800 s late)
        seconds = MAX_LAG * 3
        _, late = simulate({1.0: 100}, capacity=10, seconds=seconds)
        self.assertLessEqual(late[1.0], MAX_LAG + 100 / 10 + 1.0)

    def test_a_new_node_goes_ahead_of_an_overdue_queue(self) -> None:
        # 90 s behind: a newly enrolled node is quoted with the nodes due
        # at the frontier, before those due later
        deadlines: Deadlines[str] = Deadlines()
        for name, deadline in (("a", 10.0), ("b", 10.0), ("c", 50.0)):
            deadlines.add(name, deadline)
        self.assertEqual((10.0, "a"), deadlines.pop_due(100.0))
        deadlines.start("new", 100.0, 0.0)
        order = [deadlines.pop_due(100.0) for _ in range(3)]
        self.assertEqual([(10.0, "b"), (10.0, "new"), (50.0, "c")], order)

    def test_nothing_is_handed_out_before_its_deadline(self) -> None:
        deadlines: Deadlines[str] = Deadlines()
        deadlines.start("x", 0.0, 5.0)
        self.assertIsNone(deadlines.pop_due(4.999))
        self.assertEqual(5.0, deadlines.wait(0.0))
        self.assertEqual((5.0, "x"), deadlines.pop_due(5.0))
        self.assertIsNone(deadlines.wait(5.0))

    def test_class_lag_accounting(self) -> None:
        lag = ClassLag(2.0)
        for value in (0.0, 1.0, 2.0):
            lag.add(value)
        self.assertEqual(
            {"interval": 2.0, "rounds": 3, "lag_mean": 1.0, "lag_max": 2.0},
            lag.to_dict(),
        )


class _Node:
    def __init__(self, uuid: str, interval: float) -> None:
        self.uuid = uuid
        self.interval = interval
        self.unreachable = 0


class TestQuoteScheduler(testtools.TestCase):
    def test_the_heap_not_a_queue_picks_the_next_node(self) -> None:
        # one worker, and every node overdue: they are quoted by deadline,
        # not in the order they were scheduled, and each class accounted
        async def run() -> tuple[list[str], list[dict[str, float]]]:
            order: list[str] = []
            done = asyncio.Event()  # each node is quoted once
            nodes = [_Node(f"n{i}", 1.0 + i) for i in range(5)]

            async def attest(node: _Node) -> None:
                order.append(node.uuid)
                if len(order) == len(nodes):
                    done.set()
                await asyncio.sleep(0)

            scheduler = QuoteScheduler(
                attest,  # type: ignore[arg-type]
                lambda node: node.uuid not in order,  # type: ignore[attr-defined]
                lambda node: node.interval,  # type: ignore[attr-defined]
                workers=1,
            )
            now = asyncio.get_running_loop().time()
            for i in reversed(range(len(nodes))):  # n4 is put in first
                scheduler._deadlines.add(nodes[i], now - 10 + i)
            scheduler.start()
            try:
                await asyncio.wait_for(done.wait(), 30)
            finally:
                await asyncio.gather(*scheduler.stop(), return_exceptions=True)
            return order, scheduler.classes()

        order, classes = asyncio.run(run())
        self.assertEqual(["n0", "n1", "n2", "n3", "n4"], order)
        self.assertEqual([1.0, 2.0, 3.0, 4.0, 5.0], [c["interval"] for c in classes])
        self.assertEqual([1] * 5, [c["rounds"] for c in classes])

    def test_a_failing_connection_policy_still_reschedules_the_node(self) -> None:
        # the rest hook (closing idle connections) raising must not drop the
        # node from the loop or kill the worker: it is quoted again
        async def run() -> int:
            rounds = 0
            done = asyncio.Event()
            node = _Node("n0", 0.1)

            async def attest(node: _Node) -> None:
                nonlocal rounds
                rounds += 1
                if rounds == 3:
                    done.set()

            def rest(node: _Node, delay: float) -> None:
                raise RuntimeError("connection pool broke")

            scheduler = QuoteScheduler(
                attest,  # type: ignore[arg-type]
                lambda node: True,
                lambda node: node.interval,  # type: ignore[attr-defined]
                workers=1,
                rest=rest,  # type: ignore[arg-type]
            )
            scheduler._deadlines.add(node, asyncio.get_running_loop().time())
            scheduler.start()
            try:
                await asyncio.wait_for(done.wait(), 30)
            finally:
                await asyncio.gather(*scheduler.stop(), return_exceptions=True)
            return rounds

        self.assertEqual(3, asyncio.run(run()))
