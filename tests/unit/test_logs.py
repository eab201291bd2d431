"""A log line's time is UTC, as its ``Z`` says, whatever the machine's time zone."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator

import pytest

from outbox.logs import JsonFormatter


@pytest.fixture
def new_york() -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


@pytest.mark.usefixtures("new_york")
def test_a_line_s_time_is_utc_in_another_time_zone() -> None:
    record = logging.LogRecord("relay", logging.INFO, __file__, 1, "tool_call.done", None, None)
    record.created, record.msecs = 1_800_000_000.25, 250.0  # 2027-01-15T08:00:00.250 UTC
    line = json.loads(JsonFormatter().format(record))
    assert line["ts"] == "2027-01-15T08:00:00.250Z"


def test_lines_of_one_second_and_the_next_each_carry_their_own_second() -> None:
    formatter = JsonFormatter()
    times = []
    for created, msecs in ((1_800_000_000.9, 900.0), (1_800_000_001.1, 100.0)):
        record = logging.LogRecord("relay", logging.INFO, __file__, 1, "e", None, None)
        record.created, record.msecs = created, msecs
        times.append(json.loads(formatter.format(record))["ts"])
    assert times == ["2027-01-15T08:00:00.900Z", "2027-01-15T08:00:01.100Z"]
