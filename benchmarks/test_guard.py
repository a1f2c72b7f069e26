"""The time guard's headroom, read from a JUnit XML report of the suite (``pytest --junitxml=REPORT``): the CPU
seconds of the costliest tests held to each limit (the quick limit: tests outside ``slow``; the 30-second limit:
tests not marked ``long``), beside the limit.

    python -m pytest -n 2 --dist loadgroup -m "not slow" --junitxml=quick.xml ...   # make quick's tests
    python benchmarks/test_guard.py quick.xml --limit 8 --own
    python benchmarks/test_guard.py full.xml --limit 30

Each test's ``cpu_seconds`` and ``shared_fixture_seconds`` are the properties tests/conftest.py writes into the report;
the quick limit holds a test's own seconds (without its shared fixtures'), the 30-second limit all of them.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET


def costs(report: str) -> list[tuple[float, float, str]]:
    """``(cpu_seconds, shared_fixture_seconds, test id)`` of each test in ``report``, costliest first."""
    rows = []
    for case in ET.parse(report).getroot().iter("testcase"):
        props = {p.get("name"): float(p.get("value")) for p in case.iter("property")}
        if "cpu_seconds" in props:
            rows.append((props["cpu_seconds"], props.get("shared_fixture_seconds", 0.0),
                         f"{case.get('classname')}::{case.get('name')}"))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("report")
    parser.add_argument("--limit", type=float, required=True, help="the limit the report's tests were held to")
    parser.add_argument("--own", action="store_true", help="a test's own seconds, without its shared fixtures' "
                                                           "(what the quick limit holds)")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    rows = sorted(((cpu - shared if args.own else cpu, test) for cpu, shared, test in costs(args.report)), reverse=True)
    print(f"{len(rows)} tests, {sum(r[0] for r in rows):.0f} CPU s in all; the costliest against the {args.limit:g} s "
          "limit:")
    print("| CPU s | headroom | test |\n|--:|--:|:--|")
    for cpu, test in rows[:args.top]:
        headroom = f"{args.limit / cpu:.2f}x" if cpu > 0 else "-"  # a test that waited without computing
        print(f"| {cpu:.2f} | {headroom} | `{test.split('@')[0]}` |")


if __name__ == "__main__":
    main()
