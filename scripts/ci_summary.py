#!/usr/bin/env python3
"""What a CI leg ran, from its console output and its build's CTest log.

  python3 scripts/ci_summary.py --leg "leg 1" --console LOG --build build [--skipped-line TEXT]

Prints one line: the tests run (passed, failed, skipped), the tests the leg
excluded (defined in the build but not run), and each skipped test with the
reason its GTEST_SKIP gave (from <build>/Testing/Temporary/LastTest.log).
A leg whose console says "=== SKIPPED: ... ===" did not run at all: that is
its line. .ci/run prints these lines last, so a log's tail says what did not run.
"""
import argparse
import os
import re
import subprocess
import sys

# "12/40 Test #7: Name[  # GetParam() = ...] ....***Skipped   0.92 sec": the name is
# the first word; the status is the word before the time.
RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+).*?(?:\*\*\*|\s)(Passed|Failed|Skipped|Not Run|Timeout|"
                    r"Exception|SegFault|Subprocess aborted|Subprocess killed|\w+)\s+[\d.]+ sec\s*$")


JUNIT = os.path.join("Testing", "ctest-results.xml")  # scripts/test.sh: ctest --output-junit


def gtest_skip_reason(lines):
    """The line after GoogleTest's "<file>:<line>: Skipped" in a test's output, or None."""
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return None


def junit_skip_reasons(build):
    """The same from the JUnit file the leg's ctest wrote. LastTest.log holds
    whichever ctest ran last in the build folder, which need not be the
    leg's (stop 58's CI found no reason for any of its 16 skips there)."""
    import xml.etree.ElementTree as ET
    reasons = {}
    try:
        root = ET.parse(os.path.join(build, JUNIT)).getroot()
    except (OSError, ET.ParseError):
        return reasons
    for case in root.iter("testcase"):
        if case.find("skipped") is None:
            continue
        reason = gtest_skip_reason((case.findtext("system-out") or "").splitlines())
        if reason is not None:
            # A parameterised test's name carries "  # GetParam() = ..." there.
            reasons[case.get("name").split("  # ")[0]] = reason
    return reasons


def skip_reasons(build):
    """Test name -> the reason its output gave for skipping ("" when none)."""
    reasons = junit_skip_reasons(build)
    if reasons:
        return reasons
    path = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return reasons
    for block in re.split(r"\n(?=\d+/\d+ Testing: )", text):
        m = re.match(r"\d+/\d+ Testing: (\S+)", block)
        if not m:
            continue
        reason = gtest_skip_reason(block.splitlines())
        if reason is not None:
            reasons[m.group(1)] = reason
    return reasons


def defined_tests(build):
    try:
        out = subprocess.run(["ctest", "--test-dir", build, "-N"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Total Tests: (\d+)", out)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--leg", required=True)
    ap.add_argument("--console", required=True)
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    try:
        console = open(a.console, errors="replace").read()
    except OSError as e:
        print(f"=== CI {a.leg}: no console output to summarise ({e}) ===")
        return 0
    skipped_leg = re.findall(r"^=== SKIPPED: (.*) ===$", console, re.M)
    if skipped_leg:
        print(f"=== CI {a.leg}: DID NOT RUN: {skipped_leg[-1]} ===")
        return 0
    status = {}
    for line in console.splitlines():
        m = RESULT.match(line)
        if m:
            status[m.group(1)] = m.group(2)
    if not status:
        fuzz = re.findall(r"^=== (?:FUZZ|TSAN): (.*) ===$", console, re.M)
        if fuzz:  # scripts/fuzz.sh (harnesses), scripts/tsan.sh (race checks): no tests
            print(f"=== CI {a.leg}: {fuzz[-1]} ===")
            return 0
        print(f"=== CI {a.leg}: ran no test (no CTest results in its output) ===")
        return 0
    counts = {}
    for s in status.values():
        key = s if s in ("Passed", "Failed", "Skipped") else "Failed"
        counts[key] = counts.get(key, 0) + 1
    reasons = skip_reasons(a.build)  # first: `ctest -N` below rewrites LastTest.log
    defined = defined_tests(a.build) if os.path.isfile(os.path.join(a.build, "CTestTestfile.cmake")) else None
    excluded = "" if not defined else f", {max(0, defined - len(status))} of {defined} defined excluded"
    print(f"=== CI {a.leg}: {len(status)} tests run: {counts.get('Passed', 0)} passed, "
          f"{counts.get('Failed', 0)} failed, {counts.get('Skipped', 0)} skipped{excluded} ===")
    for name in sorted(n for n, s in status.items() if s == "Skipped"):
        print(f"=== CI {a.leg}: skipped {name}: {reasons.get(name) or '(no reason printed)'} ===")
    return 0


if __name__ == "__main__":
    sys.exit(main())
