"""``outbox demo``: the duplicate-ticket incident replayed under faults, the outbox beside a
naive loop.

The demo runs from a checkout only (``_demo_module`` says why) and is imported when the
command runs, so no other command loads it or the OpenAI SDK its naive loop needs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from outbox import db
from outbox.errors import OutboxError


def _demo_module() -> Any:
    """``demo.run`` from the checkout this command runs from: the demo is not in the wheel
    (it would be a top-level ``demo`` package in everyone's site-packages)."""
    checkout = Path(__file__).resolve().parent.parent
    if not (checkout / "demo" / "run.py").is_file():
        raise OutboxError(
            "`outbox demo` runs from a checkout of agent-outbox; the installed package "
            "does not include the demo",
            hint="clone the repository and run `make demo` there",
        )
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    import importlib

    try:
        return importlib.import_module("demo.run")
    except ModuleNotFoundError as err:
        # The demo's naive side is an OpenAI SDK loop; the product itself does not need the
        # SDK, so a plain `pip install -e .` leaves it out.
        if err.name != "openai":
            raise
        raise OutboxError(
            "`outbox demo` needs the openai package, which agent-outbox installs only with "
            "its demo extra",
            hint=f"run `make demo`, or `pip install -e '{checkout}[demo]'`",
        ) from err


@click.command("demo")
@click.option("--runs", default=200, show_default=True, help="Conversations to drive.")
@click.option("--processes", default=3, show_default=True, help="Relay processes to run.")
@click.option("--seed", default=7, show_default=True, help="Seed of the scenario and faults.")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write JSON."
)
@click.option(
    "--database-url",
    help="Server to use (default OUTBOX_DATABASE_URL, else embedded); the demo drops and "
    "re-creates its own database `outbox_demo` there.",
)
@click.option("--database-name", default="outbox_demo", hidden=True)
@click.option("--no-naive", is_flag=True, help="Skip the naive coordinator's run.")
def demo(
    runs: int,
    processes: int,
    seed: int,
    json_path: Path | None,
    database_url: str | None,
    database_name: str,
    no_naive: bool,
) -> None:
    """Replay the duplicate-ticket incident under faults: the outbox beside a naive loop.

    Starts a scripted model and three audited tool services over HTTP, PROCESSES relay
    processes, and RUNS conversations with parallel tool calls, client-run approvals and
    double-submitted turns; injects stalls past the tool timeout, kill -9 of relay
    processes and duplicate callbacks. Prints what the services' own audits saw, for the
    outbox and for a naive coordinator under the same faults. Exit status 1 when the
    outbox side shows any duplicate side effect, orphan tool result or stuck run.
    """
    demo_module = _demo_module()
    if runs < 1 or processes < 1:
        raise click.BadParameter("--runs and --processes must be at least 1")
    if database_url is not None:
        db.check_url(database_url, "--database-url")
    cfg = demo_module.DemoConfig(
        runs=runs,
        processes=processes,
        seed=seed,
        server_url=database_url,
        database=database_name,
        naive=not no_naive,
    )
    sys.exit(demo_module.run(cfg, json_path))
