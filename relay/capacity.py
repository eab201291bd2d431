"""How many rows the next claim may take: a pure policy, apart from the claim loop.

A relay process holds two kinds of effects in flight: I/O effects on the event loop
(``relay.engine``: model turns, HTTP tools, tools that need a dispatch mark), at most
``concurrency`` of them, and calls of in-process ``key`` tools in chunks, at most
``inprocess_slots``. Deliveries take neither (they go straight to a completer).

Rules, each with its reason:

- never more I/O rows than ``concurrency`` at once, nor in-process calls than their slots;
- while I/O rows are in flight, claim only once ``gulp`` places are free: a claim or a
  completion of one or two rows costs a statement's fixed price for little work (over HTTP
  PostgreSQL spent 440 us a call in tiny claims, 100 us in bulk). The gulp is capped at
  ``GULP_MAX`` so a relay with thousands in flight still starts a newcomer within a few
  completions;
- in-process room is offered only while the last claim held in-process calls: the claim
  cannot ask for "I/O rows up to n, in-process rows up to m", so room for both is asked for
  when the queue holds both;
- rows claimed and not yet *written* never exceed both capacities together: fast effects
  cannot run the claims ahead of the completers (backpressure);
- one claim takes at most ``CLAIM_MAX`` rows: a bigger one holds its locks longer and
  delays the first effect for little gain;
- one tenant's rows hold at most ``tenant_cap`` of the I/O places (``tenant_share`` of
  them): a tenant with a backlog never fills the relay, so another tenant's first row finds
  a place as soon as it is due, not when the busy tenant's calls end (the claim query
  applies the cap; at 1.0 there is none).
"""

from __future__ import annotations

from dataclasses import dataclass

GULP_MAX = 32  # rows: the most free places a busy relay waits for before claiming
CLAIM_MAX = 1000  # rows per claim statement

# The default --concurrency: what one process can hold (``default_concurrency``).
EFFECT_MEMORY_B = 20_000  # bytes an I/O effect in flight holds (measured 15-21 kB)
MEMORY_SHARE = 0.25  # of the memory the relays may use, the most their effects may hold
FILES_KEPT = 256  # descriptors left for the rest: links, listener, metrics, MCP servers, logs
SOCKETS_PER_EFFECT = 2  # its own, and as many kept alive idle for later (relay.poster)
CONCURRENCY_MAX = 10_000  # the most one process was measured holding (docs/benchmarks.md)
CONCURRENCY_MIN = 16  # below this a relay is of little use; too few files then fail calls


def default_concurrency(open_files: int, memory_b: int | None, processes: int = 1) -> int:
    """The I/O effects in flight one of ``processes`` relay processes can hold, by default.

    Each effect in flight over HTTP holds a socket, a file descriptor of the process: the
    open-files limit (``open_files``, RLIMIT_NOFILE) bounds them, less ``FILES_KEPT``, with
    room for as many idle kept-alive connections (the poster closes those after 30 s, but
    a burst to one origin may leave them while effects go to another). Each effect also
    holds about ``EFFECT_MEMORY_B`` of memory: the effects of all ``processes`` together
    stay within ``MEMORY_SHARE`` of ``memory_b`` (None: unknown, not bounded). Never over
    ``CONCURRENCY_MAX``, the most measured in one process (and well below the about 28,000
    ephemeral ports a machine has per destination), nor under ``CONCURRENCY_MIN``.

    Why derived, not fixed: a cap below the work in flight holds runs back silently; 10,000
    runs with a 10 s model take 241.6 s at 1,000 and 40.1 s at 10,000 (same machine, same 9
    database connections).
    """
    by_files = (open_files - FILES_KEPT) // SOCKETS_PER_EFFECT
    most = min(by_files, CONCURRENCY_MAX)
    if memory_b is not None:
        most = min(most, int(memory_b * MEMORY_SHARE / max(1, processes) / EFFECT_MEMORY_B))
    return max(CONCURRENCY_MIN, most)


def files_needed(concurrency: int) -> int:
    """The open files a process with ``concurrency`` places may need at most (the reverse
    of ``default_concurrency``'s bound by files)."""
    return concurrency * SOCKETS_PER_EFFECT + FILES_KEPT


@dataclass(frozen=True)
class Capacity:
    concurrency: int  # I/O effects in flight, at most
    inprocess_slots: int  # in-process tool calls in flight, at most
    tenant_share: float = 1.0  # the most of the I/O places one tenant's rows may hold

    def tenant_cap(self, claims_inprocess: bool) -> int:
        """Rows of one tenant claimed and not yet written, at most: ``tenant_share`` of the
        I/O places, plus the in-process slots while the queue holds in-process calls (the
        claim cannot tell the two apart, so the reserve is exact for I/O work only)."""
        if self.tenant_share >= 1.0:
            return self.total
        io_cap = max(1, int(self.concurrency * self.tenant_share))
        return io_cap + (self.inprocess_slots if claims_inprocess else 0)

    @property
    def total(self) -> int:
        """Rows claimed and not yet written, at most."""
        return self.concurrency + self.inprocess_slots

    @property
    def gulp(self) -> int:
        """The fewest free I/O places worth a claim while others are in flight."""
        return max(1, min(GULP_MAX, self.concurrency // 2))

    def io_full(self, io_executing: int) -> bool:
        """Whether no I/O row may be claimed for want of places (fewer than a gulp free):
        with due rows waiting, ``concurrency`` is what holds the relay back."""
        return self.concurrency - io_executing < self.gulp

    def room(
        self,
        *,
        io_executing: int,
        inprocess_executing: int,
        unwritten: int,
        claims_inprocess: bool,
    ) -> int:
        """How many rows the next claim may take (0: do not claim now)."""
        io_room = max(0, self.concurrency - io_executing)
        if io_executing and io_room < self.gulp:
            io_room = 0
        free = io_room
        if claims_inprocess:
            free += max(0, self.inprocess_slots - inprocess_executing)
        return max(0, min(free, self.total - unwritten, CLAIM_MAX))
