"""``outbox serve``'s options refused before it starts: metrics with several processes, a
queue timeout that is not positive, console options that do not fit together (a provider's
settings, a trace URL template)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outbox.commands.serve import serve_command
from outbox.server.app import oidc_settings
from outbox.server.console.trace_links import template_problem


def test_metrics_with_several_workers_are_refused_naming_the_way_out():
    result = CliRunner().invoke(serve_command, ["--metrics-port", "9464", "--workers", "2"])
    assert result.exit_code == 2
    assert "--metrics-port" in result.output
    assert "metrics are served by one process" in result.output


def test_a_queue_timeout_that_is_not_positive_is_refused_naming_the_option():
    result = CliRunner().invoke(serve_command, ["--queue-timeout", "0"])
    assert result.exit_code == 2
    assert "--queue-timeout" in result.output


def test_serve_refuses_console_options_that_do_not_fit_before_it_starts(monkeypatch):
    monkeypatch.delenv("NO_SUCH_SECRET", raising=False)
    runner = CliRunner()
    alone = runner.invoke(serve_command, ["--no-password-sign-in"])
    assert alone.exit_code == 2 and "needs --oidc-issuer" in alone.output
    unset = runner.invoke(
        serve_command,
        ["--oidc-issuer", "https://idp.example", "--oidc-client-id", "c",
         "--oidc-client-secret-env", "NO_SUCH_SECRET"],
    )  # fmt: skip
    assert unset.exit_code == 2 and "export NO_SUCH_SECRET=" in unset.output


def test_the_provider_settings_are_checked_and_the_secret_comes_from_the_environment(
    monkeypatch,
):
    monkeypatch.setenv("CONSOLE_SECRET", "s3cret")
    made = oidc_settings("https://idp.example", "console", "CONSOLE_SECRET")
    assert made is not None and made.client_secret == "s3cret" and "s3cret" not in repr(made)
    monkeypatch.delenv("CONSOLE_SECRET")
    with pytest.raises(ValueError, match="CONSOLE_SECRET is empty or not set"):
        oidc_settings("https://idp.example", "console", "CONSOLE_SECRET")
    with pytest.raises(ValueError, match="needs --oidc-client-id"):
        oidc_settings("https://idp.example", None, None)
    with pytest.raises(ValueError, match="is not https"):
        oidc_settings("http://idp.example", "console", None)
    with pytest.raises(ValueError, match="need --oidc-issuer"):
        oidc_settings(None, "console", None)


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("https://jaeger.example/trace/", "has no {trace_id}"),
        ("https://jaeger.example/{trace_id}/{run_id}", "other than {trace_id}"),
        ("javascript:alert(1)//{trace_id}", "not an http:// or https:// URL"),
    ],
)
def test_a_trace_url_template_is_checked(template, said):
    assert said in (template_problem(template) or "")
    result = CliRunner().invoke(serve_command, ["--trace-url-template", template])
    assert result.exit_code == 2 and said in result.output
