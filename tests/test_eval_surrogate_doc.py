"""benchmarks/eval_surrogate.py refreshes docs/surrogate.md without losing what was written there by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "eval_surrogate.py"
spec = importlib.util.spec_from_file_location("eval_surrogate", SCRIPT)
eval_surrogate = importlib.util.module_from_spec(spec)
sys.modules["eval_surrogate"] = eval_surrogate  # its dataclasses look their module up there
spec.loader.exec_module(eval_surrogate)


def test_a_rerun_replaces_the_numbers_and_keeps_the_sections_written_by_hand():
    marker = eval_surrogate.HAND_WRITTEN
    before = "# Results\n\npair acc 0.70\n\n" + marker + "\n\n## An experiment written up by hand\n\nIt gave 3.\n"

    after = eval_surrogate.keep_written_by_hand(before, "# Results\n\npair acc 0.72\n")

    assert "pair acc 0.72" in after and "0.70" not in after
    assert after.endswith(marker + "\n\n## An experiment written up by hand\n\nIt gave 3.\n")
    # A second rerun changes nothing more: the hand-written part is neither lost nor doubled.
    assert eval_surrogate.keep_written_by_hand(after, "# Results\n\npair acc 0.72\n") == after


def test_the_first_run_writes_the_marker_so_that_later_hand_edits_survive():
    first = eval_surrogate.keep_written_by_hand("", "# Results\n\npair acc 0.72\n")

    assert first == "# Results\n\npair acc 0.72\n\n" + eval_surrogate.HAND_WRITTEN + "\n"


def test_the_committed_document_has_the_marker_above_its_hand_written_sections():
    doc = (SCRIPT.parents[1] / "docs" / "surrogate.md").read_text()

    generated, hand = doc.split(eval_surrogate.HAND_WRITTEN)
    assert "## Measure/skip gate replay" in generated
    assert "## Code problems: a prior from earlier runs" in hand
