"""The `outbox` command line (thin: parses arguments and calls the library or the relay)."""

from __future__ import annotations


def main() -> None:
    raise SystemExit("not yet")
