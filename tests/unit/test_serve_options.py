"""``outbox serve``'s metrics options: served by one process, refused with several."""

from __future__ import annotations

from click.testing import CliRunner

from outbox.commands.serve import serve_command


def test_metrics_with_several_workers_are_refused_naming_the_way_out():
    result = CliRunner().invoke(serve_command, ["--metrics-port", "9464", "--workers", "2"])
    assert result.exit_code == 2
    assert "--metrics-port" in result.output
    assert "metrics are served by one process" in result.output
