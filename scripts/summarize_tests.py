#!/usr/bin/env python3
"""Adds up JUnit XML reports (lit, ctest, pytest) into one closing line.

Prints a per-suite table and then "N passed, N failed[, N skipped]"; exits 1
when any test failed or errored, or when no test ran at all.
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def count(path: Path) -> tuple[int, int, int]:
    passed = failed = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        status = case.get("status", "")
        if tags & {"failure", "error"} or status == "fail":
            failed += 1
        elif "skipped" in tags or status in ("notrun", "disabled"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(paths: list[str]) -> int:
    totals = [0, 0, 0]
    for name in paths:
        path = Path(name)
        if not path.exists():
            print(f"{path.stem:>8}: no report (the runner did not finish)")
            totals[1] += 1
            continue
        p, f, s = count(path)
        print(f"{path.stem:>8}: {p} passed, {f} failed, {s} skipped")
        totals = [totals[0] + p, totals[1] + f, totals[2] + s]
    passed, failed, skipped = totals
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
