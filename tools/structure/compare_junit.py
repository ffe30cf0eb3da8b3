#!/usr/bin/env python3
"""Compare two JUnit XML files of the main job case for case (before/after a change).

Usage: python3 compare_junit.py BEFORE.xml AFTER.xml
Prints the outcome counts of each, then every test whose outcome (passed, failed, skipped, error)
differs or that is in one file only, and every skip whose reason's words changed. Exit 1 when any
outcome differs. Reads only the standard library.
"""
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path):
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                text = (child.get("message") or child.text or "").strip().splitlines()[0:1]
                text = text[0] if text else ""
                break
        result[test] = (outcome, text)
    return result


def main():
    before, after = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    for label, found in (("before", before), ("after", after)):
        print(f"{label}: {len(found)} tests, " + ", ".join(f"{n} {o}" for o, n in sorted(Counter(o for o, _ in found.values()).items())))
    differ = 0
    for test in sorted(set(before) | set(after)):
        b, a = before.get(test), after.get(test)
        if b is None or a is None or b[0] != a[0]:
            differ += 1
            print(f"OUTCOME  {test}: {b[0] if b else 'absent'} -> {a[0] if a else 'absent'}  {(a or b)[1][:120]}")
        elif b[0] == "skipped" and b[1] != a[1]:
            print(f"REASON   {test}: {b[1][:80]!r} -> {a[1][:80]!r}")
    print(f"{differ} test(s) differ in outcome")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
