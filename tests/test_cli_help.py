"""`--help` shows the defaults and extras written in square brackets, which rich would otherwise read as markup and drop."""

from typer.testing import CliRunner

from kernelscout.agent.cli import app


def help_text(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_optimize_help_names_the_run_directory_default_the_ray_extra_and_the_confirm_default():
    text = help_text("optimize")
    assert "[default: runs/<name>-<time>]" in text
    assert "kernelscout[ray]" in text
    assert "default: 1 for a problem with --budget 5 or more" in text


def test_measure_and_run_help_name_their_run_directory_defaults():
    assert "[default: runs/scratch]" in help_text("measure")
    assert "[default: runs/run-<time>]" in help_text("run")


def test_flags_that_take_no_value_show_none():
    # typer 0.29 printed "<bool>" after every such flag (--json, --again, --help); pyproject.toml skips it
    for command in ((), ("measure",), ("optimize",), ("show",)):
        text = help_text(*command)
        assert "--help" in text and "<bool>" not in text, command
