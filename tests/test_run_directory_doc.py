"""docs/run_directory.md documents run.db for people who analyse runs themselves: it must stay the schema the code makes."""

import re
from pathlib import Path

DOC = (Path(__file__).parents[1] / "docs" / "run_directory.md").read_text()


def _tables(schema: str) -> dict[str, list[str]]:
    out = {}
    for statement in schema.split(";"):
        found = re.match(r"\s*CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)\s*$", statement, flags=re.S)
        if found:
            parts = re.split(r",\s*(?![^()]*\))", found.group(2).strip())  # commas outside parentheses
            out[found.group(1)] = [p.split()[0] for p in parts if p.split()[0] not in ("UNIQUE", "PRIMARY", "CHECK")]
    return out


def test_every_table_and_column_of_run_db_is_documented():
    from kernelscout.tools import archive, rundir

    tables = {**_tables(rundir.SCHEMA), **_tables(archive.SCHEMA)}
    assert {"meta", "ledger", "measurements", "candidates", "forecasts", "tool_forecasts", "confirmations"} <= set(tables)
    missing = [f"{t}.{c}" for t, columns in tables.items() for c in columns if f"`{c}`" not in DOC]
    assert not [t for t in tables if f"**`{t}`**" not in DOC] and not missing, missing


def test_the_json_columns_and_meta_keys_are_documented():
    from kernelscout.agent.cli_chat import PROBLEM_META
    from kernelscout.agent.factory import HISTORY_KEY
    from kernelscout.agent.llm_pricing import CHAT_USAGE_META, RUN_USAGE_META
    from kernelscout.agent.runner import SCALING_KEY
    from kernelscout.agent.search_spec import SPEC_KEY
    from kernelscout.agent.targets import REPLAY_REFERENCE_KEY
    from kernelscout.tools.predict import Forecast
    from kernelscout.tools.schema import Measurement

    keys = [PROBLEM_META, HISTORY_KEY, CHAT_USAGE_META, RUN_USAGE_META, SCALING_KEY, SPEC_KEY, REPLAY_REFERENCE_KEY,
            "measurement_cap", "sol_bounds", "sol_dropped"]
    fields = [f for f in [*Measurement.model_fields, *Forecast.model_fields]
              if f not in ("status", "device", "speedup", "charged", "measurement_id", "candidate_sha", "surrogate")]  # columns too
    assert not [k for k in keys + fields if f"`{k}`" not in DOC]
