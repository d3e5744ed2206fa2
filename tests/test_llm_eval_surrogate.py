"""Scoring the LLM surrogate on a recorded space: `kscout eval-surrogate --surrogate llm`.

A chat model that knows the space's times must score near perfectly, one that knows nothing must
score like a coin, one whose answers are unusable must defer on every configuration without a
crash, and the whole command must run through a real SDK client against a local HTTP server.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from kernelscout.agent.llm import ScriptedChatModel
from kernelscout.sandbox.replay import ReplaySpace
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES
from kernelscout.tools.surrogates.evaluation import EvalSettings, evaluate
from kernelscout.tools.surrogates.synthetic import write_synthetic_cache

from test_surrogate_cli import app  # noqa: F401, E402 - fixture: `kscout eval-surrogate` as a Typer app

try:
    from fake_llm_server import fake_llm_server, reply_text  # noqa: F401 - fixture
except ImportError:  # pragma: no cover
    from tests.fake_llm_server import fake_llm_server, reply_text  # type: ignore  # noqa: F401

SETTINGS = EvalSettings(surrogate="llm", train=20, seeds=2, llm_configs=12)
N_BINS = len(DEFAULT_EDGES) + 1


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> ReplaySpace:
    return ReplaySpace.load(write_synthetic_cache(tmp_path_factory.mktemp("llm-eval") / "syn_A.json", "GPU A", seed=3))


def _config_in(prompt: str, heading: str) -> tuple:
    block = prompt.split(f"## {heading}")[1].split("```")[1]
    return tuple(eval(v) for v in re.findall(r"^\w+ = (.+)$", block, flags=re.M))  # the assignments describe_config wrote


def oracle(space: ReplaySpace):
    """Answers every forecast with all the mass on the bin the recorded times put the speedup in."""
    times = {tuple(c): t for c, t in zip(space.configs, space.median_times)}

    def answer(request) -> str:
        prompt = next(m.content for m in request.messages if m.role == "user")
        speedup = times[_config_in(prompt, "Parent")] / times[_config_in(prompt, "Child")]
        probs = [0.0] * N_BINS
        probs[int(np.searchsorted(DEFAULT_EDGES, speedup, side="right"))] = 1.0
        return json.dumps({"probs": probs, "rationale": "read off the recorded times"})

    return answer


def test_a_model_that_knows_the_times_ranks_and_forecasts_almost_perfectly(space: ReplaySpace) -> None:
    model = ScriptedChatModel([oracle(space)] * 1000)
    res = evaluate([space], SETTINGS, model=model).spaces[space.name]

    assert len(model.requests) == 2 * SETTINGS.llm_configs * SETTINGS.seeds  # a forecast and its critique per configuration
    assert res.informative == 1.0 and res.heldout == SETTINGS.llm_configs
    assert res.direction_accuracy > 0.9 and res.pairwise_accuracy > 0.85 and res.spearman > 0.8
    assert res.ece_p_faster < 0.1 and res.top10_recovery > 0.9
    first = next(m.content for m in model.requests[0].messages if m.role == "user")
    assert "GPU A" in first and "measured" in first and "(none yet)" not in first  # device and training examples shown


def test_a_model_that_knows_nothing_scores_like_a_coin(space: ReplaySpace) -> None:
    flat = json.dumps({"probs": [1 / N_BINS] * N_BINS, "rationale": "no idea"})
    res = evaluate([space], SETTINGS, model=ScriptedChatModel([flat] * 1000)).spaces[space.name]

    assert res.pairwise_accuracy == pytest.approx(0.5) and res.spearman == 0.0
    assert 0.3 < res.direction_accuracy < 0.7


def test_unusable_answers_defer_on_every_configuration_without_a_crash(space: ReplaySpace) -> None:
    res = evaluate([space], SETTINGS, model=ScriptedChatModel(["I'd rather not say."] * 1000)).spaces[space.name]

    assert res.informative == 0.0 and res.direction_accuracy == 0.5 and res.aurc == pytest.approx(0.5)
    assert math.isfinite(res.brier)


def test_the_command_talks_to_an_openai_compatible_server(app: typer.Typer, space: ReplaySpace, fake_llm_server, monkeypatch) -> None:
    answer = json.dumps({"probs": [0.05, 0.05, 0.1, 0.2, 0.3, 0.2, 0.05, 0.05], "rationale": "larger tiles"})
    fake_llm_server.script(*[reply_text(answer) for _ in range(2 * 6)])
    for k, v in {"KSCOUT_PROVIDER": "openai-compatible", "KSCOUT_BASE_URL": fake_llm_server.openai_base_url,
                 "KSCOUT_MODEL": "served-model", "KSCOUT_API_KEY": "sk-local"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(space.path.parent)  # no kscout.toml here

    out = CliRunner().invoke(app, ["eval-surrogate", str(space.path), "--surrogate", "llm", "--train", "10", "--seeds", "1",
                                   "--configs", "6", "--json", "--no-plots"])

    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["settings"]["surrogate"] == "llm" and report["spaces"][space.name]["informative"] == 1.0
    assert fake_llm_server.request_count == 12 and fake_llm_server.requests[0].path.endswith("/chat/completions")
    assert fake_llm_server.requests[0].body["model"] == "served-model"


def test_without_a_provider_the_command_says_how_to_configure_one(app: typer.Typer, space: ReplaySpace, tmp_path: Path,
                                                                   monkeypatch) -> None:
    for k in ("KSCOUT_PROVIDER", "KSCOUT_BASE_URL", "KSCOUT_MODEL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)

    out = CliRunner().invoke(app, ["eval-surrogate", str(space.path), "--surrogate", "llm", "--no-plots"])

    assert out.exit_code == 2 and "KSCOUT_PROVIDER" in out.output


def test_optimize_on_a_recorded_space_with_the_llm_surrogate(space: ReplaySpace, other_gpu: ReplaySpace, fake_llm_server,
                                                             tmp_path: Path, monkeypatch) -> None:
    """`kscout optimize --space FILE --surrogate llm --warm-start OTHER`: the LLM reads parameter values as the
    parent's and child's code, and what the other GPU measured for the same pair; once the learned
    surrogate can rank the space, its ranking proposes and the LLM's forecasts decide."""
    from kernelscout.agent.runner import start_search
    from kernelscout.tools.archive import Archive
    from kernelscout.tools.rundir import RunDir

    unsure = json.dumps({"probs": [0.05, 0.05, 0.1, 0.3, 0.3, 0.1, 0.05, 0.05], "rationale": "could go either way"})
    fake_llm_server.script(*[reply_text(unsure) for _ in range(600)])
    for k, v in {"KSCOUT_PROVIDER": "openai-compatible", "KSCOUT_BASE_URL": fake_llm_server.openai_base_url,
                 "KSCOUT_MODEL": "served-model"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)

    result = start_search(None, str(space.path), budget=16, surrogate="llm", run_dir=str(tmp_path / "run"), quiet=True, report=False,
                          warm_start=[str(other_gpu.path)])

    assert result.measurements_used == 16
    archive = Archive(RunDir(tmp_path / "run"))
    forecasts = archive.forecasts()
    assert forecasts and all(f["surrogate"] == "llm" for f in forecasts)
    screened = [r for r in archive.all() if r.origin == "screened"]
    assert screened and "expected improvement" in screened[0].hypothesis
    prompt = json.dumps(fake_llm_server.requests[0].body)
    first_param = space.param_names[0]
    assert prompt.count(f"{first_param} = ") == 2 and space.device_label in prompt  # parent and child as parameter values
    assert any("- syn_B (GPU B): measured" in json.dumps(r.body) for r in fake_llm_server.requests)


def test_with_a_provider_configured_a_recorded_space_still_defaults_to_the_space_search(monkeypatch) -> None:
    from kernelscout.agent.runner import resolve_choices

    for k, v in {"KSCOUT_PROVIDER": "openai-compatible", "KSCOUT_BASE_URL": "http://127.0.0.1:9/v1", "KSCOUT_MODEL": "m"}.items():
        monkeypatch.setenv(k, v)  # configured; nothing is sent
    assert resolve_choices("auto", "auto")[:2] == ("llm", "llm")  # a problem file: the LLM edits code
    policy, surrogate, said = resolve_choices("auto", "auto", space=True)
    assert (policy, surrogate) == ("tuner", "learned")
    assert "no code for an LLM to write" in said and "--surrogate llm" in said  # why the configured LLM is not used
    assert resolve_choices("auto", "llm", space=True)[:2] == ("tuner", "llm")


@pytest.fixture(scope="module")
def other_gpu(space: ReplaySpace) -> ReplaySpace:
    """The same synthetic kernel recorded on a second device whose sweet spot sits elsewhere."""
    return ReplaySpace.load(write_synthetic_cache(space.path.parent / "syn_B.json", "GPU B", device_skew=0.3, seed=4))


def transfer_reader(request) -> str:
    """Knows nothing about this device; copies the speedup the prompt says the other device measured."""
    prompt = next(m.content for m in request.messages if m.role == "user")
    seen = re.findall(r"^- syn_B \(GPU B\): measured ([0-9.]+)x$", prompt, flags=re.M)
    probs = [1 / N_BINS] * N_BINS
    if seen:
        probs = [0.0] * N_BINS
        probs[int(np.searchsorted(DEFAULT_EDGES, float(seen[0]), side="right"))] = 1.0
    return json.dumps({"probs": probs, "rationale": "as on GPU B" if seen else "no idea"})


def test_warm_start_shows_the_llm_what_the_other_gpu_measured(space: ReplaySpace, other_gpu: ReplaySpace) -> None:
    warm = SETTINGS.model_copy(update={"warm_start": True})
    cold_model, warm_model = ScriptedChatModel([transfer_reader] * 1000), ScriptedChatModel([transfer_reader] * 1000)

    cold = evaluate([space, other_gpu], SETTINGS, model=cold_model).spaces[space.name]
    hot = evaluate([space, other_gpu], warm, model=warm_model).spaces[space.name]

    assert hot.priors == ["syn_B (GPU B)"] and cold.priors == []
    assert cold.pairwise_accuracy == pytest.approx(0.5)  # nothing to go on
    assert hot.pairwise_accuracy > 0.75 and hot.direction_accuracy > 0.75  # the other GPU's ranking carries over
    first = next(m.content for m in warm_model.requests[0].messages if m.role == "user")
    assert "measured on other devices" in first and "other devices" not in next(
        m.content for m in cold_model.requests[0].messages if m.role == "user")


def test_transfer_lines_show_only_what_the_other_device_timed(other_gpu: ReplaySpace) -> None:
    from kernelscout.tools.surrogates.llm import transfer_lines
    from kernelscout.tools.surrogates.warmstart import PriorSource

    prior = PriorSource.from_space(other_gpu)
    t = other_gpu.median_times
    ok = [other_gpu.config(i) for i in np.flatnonzero(np.isfinite(t))[:2]]
    failed = [other_gpu.config(i) for i in np.flatnonzero(~np.isfinite(t))[:1]]
    assert failed, "the synthetic space records failures"

    [line] = transfer_lines([prior], ok[0], ok[1])
    i, j = (other_gpu.index_of(c) for c in ok)
    assert line == f"- syn_B (GPU B): measured {t[i] / t[j]:.3f}x"
    assert transfer_lines([prior], ok[0], failed[0]) == []  # a failure there is not shown as a speed
