"""The plain-log progress a headless run prints: what a user reads in a CI log or a tmux scrollback."""

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
                     "measured #3: incorrect - (timing not valid); budget 3/4, best 1.700x"]
