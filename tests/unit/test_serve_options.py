"""``outbox serve``'s options refused before it starts: metrics with several processes, a
queue timeout that is not positive."""

from __future__ import annotations

from click.testing import CliRunner

from outbox.commands.serve import serve_command


def test_metrics_with_several_workers_are_refused_naming_the_way_out():
    result = CliRunner().invoke(serve_command, ["--metrics-port", "9464", "--workers", "2"])
    assert result.exit_code == 2
    assert "--metrics-port" in result.output
    assert "metrics are served by one process" in result.output


def test_a_queue_timeout_that_is_not_positive_is_refused_naming_the_option():
    result = CliRunner().invoke(serve_command, ["--queue-timeout", "0"])
    assert result.exit_code == 2
    assert "--queue-timeout" in result.output
