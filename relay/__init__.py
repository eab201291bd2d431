"""Relay workers: claim outbox rows under leases and perform each row's one effect."""
