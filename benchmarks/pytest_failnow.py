"""A pytest plugin for runs that a time limit may cut: each failure's traceback goes to $OUT/failures.txt as it
happens, where pytest prints them only at the end. Used by gpu_check.sh's suite step (`-p pytest_failnow`)."""

import os


def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.path.join(os.environ.get("OUT", "."), "failures.txt"), "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
