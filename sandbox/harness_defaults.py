"""The measurement harness's defaults, in a module that imports nothing.

`kscout measure`, `chat` and `serve` show them in `--help`, which must answer without importing the harness
(its pool and statistics take a tenth of a second or more, tests/test_cli_import_cost.py); HarnessConfig takes
them from here too, so that a changed default changes what the help says.
"""

TIMEOUT_S = 120.0  # running the candidate: checks and timing, beyond the reference's own calls
COMPILE_TIMEOUT_S = 600.0  # importing and building it
TIMING_BUDGET_S = 2.0  # timed seconds to aim for, both sides together
