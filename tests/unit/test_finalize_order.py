"""`FinalizeOrder`: the worker's choice between chain-first and finalize-early."""

from __future__ import annotations

from worker_proc.finalize_order import FinalizeOrder

MS = 1e-3


def test_device_bound_steps_stay_chain_first():
    """Finalizes that block (the device is still running N) never switch the order."""
    order = FinalizeOrder(streak=4)
    for _ in range(100):
        order.chain_first_step(blocked_s=3 * MS, waited_s=0.2 * MS)
    assert not order.finalize_early


def test_host_bound_steps_switch_after_the_streak_and_stay():
    order = FinalizeOrder(streak=4)
    for _i in range(3):
        order.chain_first_step(blocked_s=0.01 * MS, waited_s=1.5 * MS)
        assert not order.finalize_early
    order.chain_first_step(blocked_s=0.01 * MS, waited_s=1.5 * MS)
    assert order.finalize_early and abs(order.round_trip_s - 1.5 * MS) < 1e-9
    for _ in range(50):  # short tails, well under the 1.5 ms round trip saved
        order.early_step(blocked_s=0.1 * MS)
    assert order.finalize_early


def test_a_finalize_that_only_copies_results_counts_as_unblocked():
    """On a GPU a finalize of a computed 64-row launch still waits ~75 us on the copy of its
    tokens to the host; against a 0.9 ms round trip that is a computed launch, against a
    0.2 ms one it is not."""
    order = FinalizeOrder(streak=4)
    for _ in range(4):
        order.chain_first_step(blocked_s=0.075 * MS, waited_s=0.9 * MS)
    assert order.finalize_early
    order = FinalizeOrder(streak=4)
    for _ in range(100):
        order.chain_first_step(blocked_s=0.075 * MS, waited_s=0.2 * MS)
    assert not order.finalize_early


def test_a_blocked_step_in_the_streak_restarts_it():
    order = FinalizeOrder(streak=4)
    for blocked in (0.01, 0.01, 0.01, 2.0, 0.01, 0.01, 0.01):
        order.chain_first_step(blocked_s=blocked * MS, waited_s=1.0 * MS)
    assert not order.finalize_early
    order.chain_first_step(blocked_s=0.01 * MS, waited_s=1.0 * MS)
    assert order.finalize_early


def test_switching_back_doubles_the_streak_and_good_steps_reset_it():
    order = FinalizeOrder(streak=2, max_streak=8)
    needed = []
    for _ in range(4):
        while not order.finalize_early:
            order.chain_first_step(blocked_s=0.0, waited_s=1.0 * MS)
        order.early_step(blocked_s=2.0 * MS)  # blocked longer than the 1 ms round trip
        assert not order.finalize_early
        needed.append(order.needed)
    assert needed == [4, 8, 8, 8]
    while not order.finalize_early:
        order.chain_first_step(blocked_s=0.0, waited_s=1.0 * MS)
    order.early_step(blocked_s=0.1 * MS)
    assert order.needed == 8  # one good step is not enough
    order.early_step(blocked_s=0.1 * MS)
    assert order.needed == 2 and order.finalize_early
