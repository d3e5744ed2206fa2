"""The plain-log progress a headless run prints: what a user reads in a CI log or a tmux scrollback."""

import io

from rich.console import Console

from kernelscout.agent.progress import SearchProgress


def _log(events, capsys) -> list[str]:
    with SearchProgress(budget=4, title="softmax", live=False) as progress:
        for kind, data in events:
            progress(kind, data)
    return [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines()]


def test_the_best_is_the_reference_until_a_candidate_beats_it(capsys):
    lines = _log([("measure", {"candidate": 1, "status": "ok", "speedup": 0.88, "timing_valid": True, "used": 1, "best": None}),
                  ("measure", {"candidate": 2, "status": "ok", "speedup": 1.7, "timing_valid": True, "used": 2, "best": 1.7}),
                  ("measure", {"candidate": 3, "status": "incorrect", "speedup": None, "timing_valid": False, "used": 3})], capsys)
    assert lines == ["measured #1: ok 0.880x; budget 1/4, best still the reference",
                     "measured #2: ok 1.700x; budget 2/4, best 1.700x",
                     "measured #3: incorrect; budget 3/4, best 1.700x"]


def test_a_measurement_that_does_not_count_says_why_on_its_line(capsys):
    wrong = "trial with seed 7: output 0 has shape (2, 8, 256, 1023), expected (2, 8, 256, 1024)"
    busy = "the machine was busy: in 35 of 35 timed rounds the reference's threads waited for a CPU " + "for long " * 30
    lines = _log([("measure", {"candidate": 1, "status": "incorrect", "timing_valid": False, "used": 1, "why": wrong}),
                  ("measure", {"candidate": 2, "status": "ok", "speedup": 4.74, "timing_valid": False, "used": 2, "why": busy})], capsys)
    assert lines[0] == f"measured #1: incorrect; budget 1/4, best still the reference - {wrong}"
    assert lines[1].startswith("measured #2: ok 4.740x (timing not valid); budget 2/4, best still the reference - the machine was busy: in 35")
    assert lines[1].endswith("...") and len(lines[1]) < 260  # one line; `kscout show` has the whole message


def test_a_cap_raised_during_the_search_shows_in_the_next_line(capsys):
    # `kscout budget DIR --set 6` while the search runs: the log said "budget 5/4"
    lines = _log([("measure", {"candidate": 1, "status": "ok", "speedup": 1.2, "timing_valid": True, "used": 4, "cap": 4, "best": 1.2}),
                  ("measure", {"candidate": 2, "status": "ok", "speedup": 1.3, "timing_valid": True, "used": 5, "cap": 6, "best": 1.3})], capsys)
    assert lines == ["measured #1: ok 1.200x; budget 4/4, best 1.200x", "measured #2: ok 1.300x; budget 5/6, best 1.300x"]


def test_an_iteration_says_which_candidates_are_new_and_which_came_back_from_the_shelf():
    from kernelscout.agent.progress import SearchProgress

    progress = SearchProgress(10, "space", live=False)
    assert progress._describe("propose", {"parent": 4, "new": 6, "revived": 3, "pending": 2}) == \
        "iteration from parent #4: 6 new candidates, 3 shelved earlier and back, 2 pending"
    assert progress._describe("propose", {"parent": 4, "new": 1, "pending": 0}) == "iteration from parent #4: 1 new candidate, 0 pending"


def test_before_the_surrogate_can_forecast_the_log_does_not_say_a_forecast_chose(tmp_path, capsys):
    """A cold start's forecasts are uninformative: "forecast 5 candidates, measuring [1]" read as if one had chosen."""
    import json

    import pytest

    from kernelscout.agent.runner import start_search
    from kernelscout.sandbox.replay import recorded_spaces_dir

    space = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"
    if not space.exists():
        pytest.skip("recorded spaces (shared/data/benchmark_hub) not found")
    start_search(problem=None, space=str(space), budget=12, run_dir=str(tmp_path / "run"), quiet=True, seed=1)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    predicts = [e for e in events if e["event"] == "predict"]
    assert predicts[0]["uninformative"] == predicts[0]["considered"] and "cold start" in predicts[0]["why_uninformative"]
    assert predicts[-1]["uninformative"] < predicts[-1]["considered"]  # 8 timed configurations later, the model forecasts

    lines = _log([("predict", {k: v for k, v in e.items() if k not in ("ts", "event", "pid")}) for e in (predicts[0], predicts[-1])],
                 capsys)
    assert lines[0].startswith(f"{predicts[0]['considered']} candidates, no usable forecast (cold start")
    assert lines[0].endswith(f"measuring {predicts[0]['measure']} in the policy's order")
    again = _log([("predict", {k: v for k, v in e.items() if k not in ("ts", "event", "pid")}) for e in predicts[:2]], capsys)
    assert again[1].endswith(f"measuring {predicts[1]['measure']} in the same order")  # said in full once per log
    shown = io.StringIO()
    with SearchProgress(budget=4, title="pnpoly", console=Console(file=shown, width=400), live=True) as view:
        for e in predicts[:2]:
            view("predict", {k: v for k, v in e.items() if k not in ("ts", "event", "pid")})
    assert "in the same order" not in shown.getvalue()  # a live view's few lines scroll: it says the order each time
    assert lines[1] == f"forecast {predicts[-1]['considered']} candidates, measuring {predicts[-1]['measure']}"
