"""Relay settings: one frozen object, built from the CLI or the environment, and the
machine's limits its defaults are derived from."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from outbox import config as outbox_config
from outbox.relay.capacity import default_concurrency

ALL_KINDS = ("model_turn", "tool_call", "deliver_batch", "webhook")
CGROUP_MEMORY_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def open_files_limit() -> int:
    """The open files this process may have now (the soft RLIMIT_NOFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return hard if soft == resource.RLIM_INFINITY else soft


def raisable_open_files_limit() -> int:
    """The open files a relay process will have once ``raise_open_files_limit`` ran."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if hard == resource.RLIM_INFINITY else hard


def raise_open_files_limit() -> int:
    """Let a worker process open as many sockets as the system allows it (every effect in
    flight over HTTP holds one, and thousands may be in flight); returns the new limit.

    Only a relay process does this (``outbox relay``): an application embedding ``Worker``
    keeps its limits (a low soft limit protects code that still uses ``select()``). A hard
    limit of "unlimited" (macOS) cannot be the soft one: the soft limit stays."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and hard != resource.RLIM_INFINITY and soft < hard:
        # A platform that caps it lower refuses: the limit in force is then the answer.
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return open_files_limit()


def memory_limit() -> int | None:
    """Bytes of memory this process's relays may use: the machine's, or less when a
    container's cgroup caps it (None when neither is known)."""
    limits = []
    with contextlib.suppress(OSError, ValueError):  # not every platform tells
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for path in CGROUP_MEMORY_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1) when unlimited
            limits.append(int(text))
    return min(limits) if limits else None


def machine_concurrency(processes: int = 1, open_files: int | None = None) -> int:
    """``relay.capacity.default_concurrency`` for this machine: its memory, and the open
    files limit in force (or ``open_files``)."""
    files = open_files_limit() if open_files is None else open_files
    return default_concurrency(files, memory_limit(), processes)


def worker_id_of(pid: int, tag: str) -> str:
    """A worker's id: host, process id and a tag (a pid alone may be reused)."""
    return f"{socket.gethostname()}:{pid}:{tag}"


def new_worker_id(tag: str | None = None) -> str:
    return worker_id_of(os.getpid(), tag or uuid.uuid4().hex[:6])


@dataclass(frozen=True)
class RelayConfig:
    database_url: str
    schema: str = "outbox"
    # Effects in flight per process (model turns, HTTP tools): by default what this process
    # can hold with the limits it has now (``machine_concurrency``).
    concurrency: int = field(default_factory=machine_concurrency)
    tenant_share: float = 0.95  # the most of `concurrency` one tenant's rows may hold
    inprocess_slots: int = 512  # in-process tool calls in flight per process, beside the slots
    inprocess_threads: int = 64  # threads running in-process tools per process
    lease_s: float = 30.0  # seconds a claim is valid without a heartbeat
    poll_interval_s: float = 1.0  # fallback poll when no NOTIFY arrives
    listen: bool = True  # LISTEN/NOTIFY wake-ups (off behind a transaction-mode pooler)
    rescue_interval_s: float = 2.0  # how often expired leases and stalled batches are swept
    stalled_batch_grace_s: float = 5.0  # a complete batch this old with no delivery is stalled
    retention_interval_s: float = 60.0  # how often idle conversations are retained (0: never)
    retention_chunk: int = 200  # threads retained per transaction
    grace_s: float = 20.0  # on SIGTERM, how long in-flight rows may finish
    retry_base_s: float = 0.5  # first retry delay; doubles per attempt, with jitter
    retry_cap_s: float = 60.0  # longest retry delay
    completion_batch: int = 256  # most outcomes written in one transaction
    completers: int = 4  # threads writing outcomes, each with its own connection
    max_lost_leases: int = 10  # a row whose lease was lost this often is quarantined
    max_model_answer_bytes: int = outbox_config.MAX_MODEL_ANSWER_BYTES  # read no further
    # Headers that carry a request's prompt_cache_key, for routers that pin a conversation
    # to the replica holding its cache: "NAME" (every base URL) or "BASE_URL=NAME".
    affinity_headers: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ALL_KINDS
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"  # the address the metrics are served on
    worker_id: str = field(default_factory=new_worker_id)

    @property
    def db_connections(self) -> int:
        """Connections one worker process holds: the claim loop, the preparer, the
        completers, maintenance and the listener (plus one briefly at shutdown)."""
        return 3 + self.completers + int(self.listen)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 < self.tenant_share <= 1:
            raise ValueError("tenant_share must be over 0 and at most 1")
        if self.completers < 1:
            raise ValueError("completers must be at least 1")
        if self.inprocess_slots < 1:
            raise ValueError("inprocess_slots must be at least 1")
        if self.inprocess_threads < 1:
            raise ValueError("inprocess_threads must be at least 1")
        if self.max_lost_leases < 1:
            raise ValueError("max_lost_leases must be at least 1")
        if self.max_model_answer_bytes < 1024:
            raise ValueError("max_model_answer_bytes must be at least 1024 bytes")
        affinity_headers(self.affinity_headers)  # raises for a malformed one
        if self.retention_interval_s < 0:
            raise ValueError("retention_interval_s must be 0 (off) or more")
        if not 1 <= self.retention_chunk <= 10000:
            raise ValueError("retention_chunk must be 1 to 10000 threads")
        if self.lease_s <= 1:
            raise ValueError("lease_s must be over 1 second")
        unknown = set(self.kinds) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}; known: {ALL_KINDS}")


HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token


def affinity_headers(given: tuple[str, ...]) -> dict[str | None, str]:
    """``--affinity-header`` values as {base URL (None: any other): header name}; a
    ValueError naming one that is not ``NAME`` or ``BASE_URL=NAME``."""
    found: dict[str | None, str] = {}
    for entry in given:
        url, _, name = entry.rpartition("=")
        if not HEADER_NAME.match(name) or (url and not url.startswith(("http://", "https://"))):
            raise ValueError(
                f"--affinity-header {entry!r}: give a header NAME, or BASE_URL=NAME for the "
                "model server at BASE_URL only"
            )
        found[url.rstrip("/") or None] = name.lower()
    return found
