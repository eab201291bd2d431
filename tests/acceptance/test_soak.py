"""The soak (bench/soak.py): steady agent traffic with retention at a short age and a long
reader transaction now and then. Nothing is lost, and the hot tables stop growing once
retention runs.

The bounded version runs in `make test` for about a minute and compresses time: periods of
10 s, a retention age of 3 s, the journal pruned past 15 s, and a VACUUM at the end of each
period where autovacuum (whose naptime is a minute) would run. The long one (`make soak`,
marked soak) runs OUTBOX_SOAK_MINUTES (30) with periods of a minute and real autovacuum,
and writes its report and chart to OUTBOX_SOAK_DIR (default: the test's temporary folder).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import psycopg
import pytest

from bench.soak import SoakConfig, SoakReport, run_soak, write_report


def check(report: SoakReport, growth: float) -> None:
    assert report.started > 0
    assert report.lost == []
    assert report.not_completed == []
    assert report.accounted == report.completed == report.started
    first = report.first_retention_period
    assert first is not None, "retention never ran"
    # Settled once conversations and then the journal's events of them have been retained:
    # the journal keeps what retention leaves it (the accounts) for its own keep.
    warm = first + math.ceil(report.config.journal_keep_s / report.config.period_s)
    settled = report.periods[warm:]
    assert len(settled) >= 2, "too short to settle"
    # Sizes swing with the reader transaction (vacuum waits for it): compare the means of
    # the first and the last window of settled periods, a reader cycle each when it fits.
    window = min(5, len(settled) // 2)
    early, late = settled[:window], settled[-window:]
    for measure in (lambda p: p.hot_runs, lambda p: p.hot_bytes()):
        before = sum(map(measure, early)) / window
        after = sum(map(measure, late)) / window
        assert after <= growth * before, [measure(p) for p in settled]


@pytest.mark.timeout(300)
def test_a_bounded_soak_loses_nothing_and_the_hot_tables_stop_growing(db_url, tmp_path):
    config = SoakConfig(
        minutes=1.0,
        period_s=10.0,
        rate=3.0,
        retention_age_s=3.0,
        retention_interval_s=1.0,
        reader_every_s=25.0,
        reader_hold_s=8.0,
        vacuum_each_period=True,
        journal_keep_s=15.0,
        journal_partition_width_s=5,
    )
    report = run_soak(db_url, config)
    # The journal was partitioned at the soak's width and pruned a partition at a time.
    with psycopg.connect(db_url) as conn:
        (dropped,) = conn.execute(
            "SELECT detail->'partitions_dropped' FROM outbox.journal "
            "WHERE event = 'journal.pruned' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    assert dropped and all(len(name) == len("journal_20261127_150005") for name in dropped)
    written = write_report(report, tmp_path)
    assert (tmp_path / "soak.md") in written
    check(report, growth=1.5)


MINUTES = float(os.environ.get("OUTBOX_SOAK_MINUTES", "30"))


@pytest.mark.soak
@pytest.mark.timeout(int(MINUTES * 60) + 600)
def test_soak(db_url, tmp_path):
    out = Path(os.environ.get("OUTBOX_SOAK_DIR", str(tmp_path)))
    report = run_soak(
        db_url,
        SoakConfig(minutes=MINUTES, journal_keep_s=300.0, journal_partition_width_s=60),
        log=print,
    )
    for path in write_report(report, out):
        print(path)
    check(report, growth=1.2)
