"""Lines and branches of src/ covered, apart, from a combined coverage data file (.ci/run's last step).

coverage's own report gives one figure per module, lines and branches mixed. This prints each
module of ``trainstatus.integrations`` (they run only in the traced integrations and Ray steps),
then the totals, each as lines and branches, and exits 1 if either total is below ``--fail-under``.

    python .ci/coverage_totals.py DATA_FILE [--fail-under PERCENT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import coverage

INTEGRATIONS = os.path.join("src", "trainstatus", "integrations", "")


def _figures(summary: dict[str, float]) -> str:
    lines = f"{summary['percent_statements_covered']:5.1f}% of {summary['num_statements']:5d} lines"
    branches = f"{summary['percent_branches_covered']:5.1f}% of {summary['num_branches']:5d} branches"
    return f"{lines}, {branches}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="coverage_totals.py")
    parser.add_argument("data_file")
    parser.add_argument("--fail-under", type=float, default=0.0)
    options = parser.parse_args(argv)
    cov = coverage.Coverage(data_file=options.data_file, config_file=False)
    cov.load()
    with tempfile.TemporaryDirectory() as where:
        report = os.path.join(where, "coverage.json")
        cov.json_report(outfile=report)
        with open(report) as f:
            data = json.load(f)
    names = {os.path.relpath(path): fields["summary"] for path, fields in data["files"].items()}
    ours = sorted(name for name in names if name.startswith(INTEGRATIONS))
    if not ours:
        print(f"{options.data_file}: no module of {INTEGRATIONS} was measured", file=sys.stderr)
        return 1
    width = max(map(len, ours))
    for name in ours:
        print(f"{name:{width}}  {_figures(names[name])}")
    totals = data["totals"]
    print(f"{'TOTAL':{width}}  {_figures(totals)}")
    low = [what for what, key in (("lines", "percent_statements_covered"), ("branches", "percent_branches_covered"))
           if totals[key] < options.fail_under]
    if low:
        print(f"coverage of {' and '.join(low)} is below {options.fail_under:g}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
