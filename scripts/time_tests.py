"""Time the test tiers and write the README's sentence about them from the measurement.

    python scripts/time_tests.py                      # make test-fast, then make test
    python scripts/time_tests.py --targets test-fast  # one tier
    python scripts/time_tests.py --report-only        # the README block from the JSON alone

Each target runs as ``make TARGET`` in the repository (its real commands, from the Makefile)
after an untimed ``make setup`` (a warm ``.venv``) and is timed by the wall clock; its pytest
summaries give the counts (summed when a target runs pytest more than once). The report,
``docs/test_times.json``, holds per target the command, the pytest commands ``make -n`` shows,
seconds, counts and exit status, and the machine (processor and kernels, cores, torch, load
average before the run) and the date. It is written atomically once every target has run, then
``--readme``'s ``test-times`` block is rebuilt from it. Measure on a machine with nothing else
running: the times depend on the processor and on the other work it does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "test_times.json"
TARGETS = ("test-fast", "test")
SETUP = "setup"  # what every target depends on, made before the clock starts
# pytest's last line: "== 3 passed, 1 skipped in 2.01s ==" (with -q, without the = signs)
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) (\w+)")


def pytest_counts(output: str) -> dict[str, int]:
    """The outcomes of every pytest summary line in ``output``, summed (``error`` and
    ``errors`` as one)."""
    counts: dict[str, int] = {}
    for line in output.splitlines():
        if m := SUMMARY.match(line.strip()):
            for n, outcome in COUNT.findall(m.group(1)):
                key = {"error": "errors", "warning": "warnings"}.get(outcome, outcome)
                counts[key] = counts.get(key, 0) + int(n)
    return counts


def make(target: str, makefile: Path | None, variables: list[str],
         dry_run: bool = False) -> subprocess.CompletedProcess:
    cmd = ["make", *(["-f", str(makefile)] if makefile else []), *(["-n"] if dry_run else []),
           target, *variables]
    return subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def warm_up(makefile: Path | None, variables: list[str]) -> None:
    """``make setup`` before any clock starts, where the makefile has that target: the tiers
    depend on it, and a reinstall (pyproject.toml or the Makefile newer than the .venv) is not
    the tests' time."""
    if make(SETUP, makefile, variables, dry_run=True).returncode != 0:
        return
    print(f"== make {SETUP} (not timed)", flush=True)
    proc = make(SETUP, makefile, variables)
    if proc.returncode != 0:
        raise SystemExit(f"make {SETUP} failed:\n{proc.stdout[-3000:]}")


def time_target(target: str, makefile: Path | None, variables: list[str]) -> dict:
    """Run ``make TARGET`` once, its output shown as it comes, and time it."""
    plan = make(target, makefile, variables, dry_run=True)
    if plan.returncode != 0:
        raise SystemExit(f"make -n {target} failed: is {target} a target of "
                         f"{makefile or 'the Makefile'}?\n{plan.stdout[-2000:]}")
    print(f"== make {target}", flush=True)
    start = time.perf_counter()
    proc = make(target, makefile, variables)
    seconds = time.perf_counter() - start
    print(proc.stdout[-3000:], flush=True)
    counts = pytest_counts(proc.stdout)
    if not counts:
        raise SystemExit(f"make {target}: no pytest summary line in its output; is it a pytest "
                         "target?")
    return {"target": target, "command": " ".join(["make", target, *variables]),
            "pytest": [line for line in plan.stdout.splitlines() if "pytest" in line],
            "seconds": round(seconds, 1), "counts": counts, "returncode": proc.returncode}


def machine() -> dict:
    import torch  # lazily: --report-only needs no torch

    from fairseq_tying.common.reproducible import cpu_name

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "load_avg_start": list(os.getloadavg())}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _counts(counts: dict[str, int]) -> str:
    order = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
    return ", ".join(f"{counts[k]:,} {k}" for k in order if counts.get(k))


def readme_block(report: dict | None) -> str:
    """The README's sentence on the test tiers' times: empty without a report."""
    if report is None:
        return ""
    runs = "; ".join(f"`{r['command']}` {_duration(r['seconds'])} ({_counts(r['counts'])})"
                     for r in report["runs"])
    m = report["machine"]
    return (f"Measured on {m['cores']} cores ({m['cpu']}), torch {m['torch']}, "
            f"{report['date']}: {runs}; from [docs/test_times.json](docs/test_times.json) "
            "(`python scripts/time_tests.py`).\n")


def load(path: Path = REPORT) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    from fairseq_tying.common.atomic import write_json
    from fairseq_tying.common.blocks import replace_block

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", nargs="+", default=list(TARGETS),
                        help="make targets to time, in order (default: test-fast test)")
    parser.add_argument("--makefile", type=Path, help="another makefile (default: the "
                        "repository's)")
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="rebuild this file's test-times block from --out")
    parser.add_argument("--report-only", action="store_true",
                        help="no tests: rebuild --readme's block from --out")
    parser.add_argument("variables", nargs="*", help="make variables, e.g. TEST_WORKERS=auto")
    args = parser.parse_args(argv)
    if not args.readme.is_file():
        parser.error(f"--readme {args.readme}: no such file")
    if not args.report_only:
        warm_up(args.makefile, args.variables)
        report = {"schema": 1, "date": time.strftime("%Y-%m-%d"), "machine": machine(),
                  "runs": [time_target(t, args.makefile, args.variables) for t in args.targets]}
        write_json(args.out, report)
        print(f"wrote {args.out}")
    replace_block(args.readme, "test-times", readme_block(load(args.out)))
    print(f"wrote the test-times block of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
