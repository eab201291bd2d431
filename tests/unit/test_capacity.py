"""The claim capacity policy (relay.capacity) and the default --concurrency, without a
database."""

from __future__ import annotations

from outbox.relay.capacity import (
    CLAIM_MAX,
    CONCURRENCY_MAX,
    CONCURRENCY_MIN,
    EFFECT_MEMORY_B,
    FILES_KEPT,
    GULP_MAX,
    Capacity,
    default_concurrency,
    files_needed,
)


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


# -- the default --concurrency: what one process can hold --------------------------------

GB = 1_000_000_000


def test_the_default_follows_the_open_files_limit_with_headroom():
    # a systemd service's soft limit: half of what is left after the files kept for the rest
    assert default_concurrency(1024, None) == (1024 - FILES_KEPT) // 2 == 384
    assert files_needed(384) <= 1024
    for open_files in (300, 1024, 4096, 20_000):
        assert files_needed(default_concurrency(open_files, None)) <= open_files


def test_the_default_takes_what_a_raised_limit_allows_up_to_the_measured_most():
    # soft 1024 raised to a hard 524288 (systemd's): the cap, not 1,000
    assert default_concurrency(524_288, 16 * GB) == CONCURRENCY_MAX == 10_000
    assert default_concurrency(20_000, 16 * GB) == 9_872


def test_the_default_keeps_the_effects_within_a_share_of_the_memory():
    # a 256 MB container: a quarter of it at 20 kB an effect
    assert default_concurrency(524_288, 256_000_000) == 3_200
    # shared by the processes of one `outbox relay --processes N`
    assert default_concurrency(524_288, 256_000_000, processes=4) == 800
    assert default_concurrency(524_288, 256_000_000) * EFFECT_MEMORY_B <= 256_000_000 / 4


def test_the_default_never_falls_under_the_least_useful():
    assert default_concurrency(256, None) == CONCURRENCY_MIN
    assert default_concurrency(100_000, 10_000_000, processes=8) == CONCURRENCY_MIN


def test_places_are_full_when_fewer_than_a_gulp_are_free():
    assert Capacity(2, 512).io_full(2) and not Capacity(2, 512).io_full(1)
    cap = Capacity(1000, 512)
    assert cap.io_full(1000 - GULP_MAX + 1) and not cap.io_full(1000 - GULP_MAX)
