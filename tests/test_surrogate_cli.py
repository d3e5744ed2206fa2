"""`kscout eval-surrogate` as a user runs it: spaces in, scores and plots out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kernelscout.agent.cli_surrogate import register
from kernelscout.tools.surrogates.evaluation import METRIC_NAMES
from kernelscout.tools.surrogates.synthetic import write_synthetic_cache


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def version() -> None:  # a second command, so that Typer keeps sub-command names
        print("0")

    register(app)
    return app


@pytest.fixture(scope="module")
def space_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("cli")
    return [
        write_synthetic_cache(d / "syn_A.json.gz", "GPU A", seed=1),
        write_synthetic_cache(d / "syn_B.json.gz", "GPU B", device_skew=0.5, seed=2),
    ]


def test_json_has_per_space_scores_and_their_mean_and_plots_are_written(
    app: typer.Typer, space_files: list[Path], tmp_path: Path
) -> None:
    args = ["eval-surrogate", *map(str, space_files), "--train", "20", "--seeds", "1", "--pairs", "2000"]
    result = CliRunner().invoke(app, [*args, "--json", "--plots", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["spaces"]) == {"syn_A", "syn_B"}
    assert set(METRIC_NAMES) <= set(report["mean"])
    for name in METRIC_NAMES:
        values = [report["spaces"][s][name] for s in ("syn_A", "syn_B")]
        assert report["mean"][name] == pytest.approx(sum(values) / 2)
    assert report["mean"]["pairwise_accuracy"] > 0.7
    assert 0 <= report["mean"]["ece_p_faster"] <= 0.2
    assert (tmp_path / "eval-surrogate-reliability.png").stat().st_size > 1000
    assert (tmp_path / "eval-surrogate-risk-coverage.png").stat().st_size > 1000


def test_warm_start_uses_the_other_gpu_of_the_same_kernel(app: typer.Typer, space_files: list[Path]) -> None:
    args = ["eval-surrogate", *map(str, space_files), "-n", "10", "-s", "1", "--pairs", "1000", "--warm-start"]
    result = CliRunner().invoke(app, [*args, "--json", "--no-plots"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spaces"]["syn_A"]["priors"] == ["syn_B (GPU B)"]
    assert report["spaces"]["syn_B"]["priors"] == ["syn_A (GPU A)"]


def test_table_output_and_the_none_baseline(app: typer.Typer, space_files: list[Path]) -> None:
    args = ["eval-surrogate", str(space_files[0]), "-n", "10", "-s", "1", "--pairs", "1000", "--surrogate", "none"]
    result = CliRunner().invoke(app, [*args, "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "mean" in result.stdout and "syn_A" in result.stdout
    assert "0.500" in result.stdout  # no forecast: coin-flip ranking and direction


def test_unknown_surrogate_is_a_usage_error(app: typer.Typer, space_files: list[Path]) -> None:
    result = CliRunner().invoke(app, ["eval-surrogate", str(space_files[0]), "--surrogate", "oracle", "--no-plots"])
    assert result.exit_code == 2
    assert "not available" in result.output and "llm" in result.output  # the message lists what there is


def test_under_json_an_input_error_is_answered_in_json(app: typer.Typer, space_files: list[Path], tmp_path: Path) -> None:
    """A script reading stdout gets a JSON answer it can parse, not an empty stream."""
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    result = CliRunner().invoke(app, ["eval-surrogate", str(bad), "--json", "--no-plots"])
    assert result.exit_code == 2
    answer = json.loads(result.stdout)
    assert answer["status"] == "failed" and "Kernel Tuner cache" in answer["message"]
    unknown = CliRunner().invoke(app, ["eval-surrogate", str(space_files[0]), "--surrogate", "oracle", "--json"])
    assert unknown.exit_code == 2 and "not available" in json.loads(unknown.stdout)["message"]
