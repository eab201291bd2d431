"""The claim capacity policy (relay.capacity), without a database."""

from __future__ import annotations

from relay.capacity import CLAIM_MAX, GULP_MAX, Capacity


def room(cap: Capacity, io: int = 0, inproc: int = 0, unwritten: int = 0, mixed: bool = False):
    return cap.room(
        io_executing=io, inprocess_executing=inproc, unwritten=unwritten, claims_inprocess=mixed
    )


def test_an_idle_relay_claims_up_to_its_concurrency():
    assert room(Capacity(100, 512)) == 100


def test_never_more_io_rows_in_flight_than_the_concurrency():
    cap = Capacity(100, 512)
    for io in range(0, 101):
        assert io + room(cap, io=io, unwritten=io) <= 100


def test_a_busy_relay_waits_for_a_gulp_of_free_places():
    cap = Capacity(1000, 512)
    assert cap.gulp == GULP_MAX
    assert room(cap, io=1000 - GULP_MAX + 1, unwritten=1000 - GULP_MAX + 1) == 0
    assert room(cap, io=1000 - GULP_MAX, unwritten=1000 - GULP_MAX) == GULP_MAX


def test_small_relays_gulp_half_their_places():
    cap = Capacity(16, 512)
    assert cap.gulp == 8
    assert room(cap, io=9, unwritten=9) == 0
    assert room(cap, io=8, unwritten=8) == 8
    assert Capacity(1, 1).gulp == 1


def test_inprocess_room_only_while_the_queue_holds_inprocess_calls():
    cap = Capacity(16, 512)
    assert room(cap) == 16
    assert room(cap, mixed=True) == 16 + 512
    assert room(cap, inproc=500, unwritten=500, mixed=True) == 16 + 12


def test_unwritten_outcomes_hold_claims_back():
    cap = Capacity(16, 32)
    assert room(cap, unwritten=cap.total) == 0
    assert room(cap, unwritten=cap.total - 3, mixed=True) == 3


def test_one_claim_is_bounded():
    assert room(Capacity(20000, 512)) == CLAIM_MAX


def test_one_tenant_may_hold_its_share_of_the_io_places():
    assert Capacity(1000, 512, 0.95).tenant_cap(False) == 950
    assert Capacity(1000, 512, 0.95).tenant_cap(True) == 950 + 512  # in-process slots too
    assert Capacity(1, 512, 0.5).tenant_cap(False) == 1  # never no place at all
    assert Capacity(1000, 512, 1.0).tenant_cap(False) == 1512  # no reserve: everything
