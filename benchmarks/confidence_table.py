"""Measure each finding code's record on the corpus's dev split: how often the claim was right.

    python benchmarks/confidence_table.py                 # runs the dev split (about 15 min)
    python benchmarks/confidence_table.py --from dev.json # reuses `corpus_accuracy.py --json`

For every dev script, each code the report made as a possible cause (severity error or
warning) counts once: right when its category is the script's label, wrong on any other label
and on every healthy script. The table is written to src/nandoctor/confidence.json, which
`nandoctor.codes.measured_confidence` reads: a finding's confidence is its own prior moved
towards its code's rate. Only the dev split is used: the test split measures the result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import corpus_accuracy

from nandoctor.codes import CODES

TABLE = corpus_accuracy.ROOT / "src" / "nandoctor" / "confidence.json"


def records(results: list[dict], labels: dict[str, str]) -> dict[str, dict]:
    table: dict[str, dict] = {}
    for result in results:
        label = labels.get(result["path"])
        if label is None or result.get("skipped"):
            continue
        for code, category in result.get("claims") or []:
            entry = table.setdefault(code, {"right": 0, "seen": 0})
            entry["seen"] += 1
            entry["right"] += category == label
    return dict(sorted(table.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path,
                        help="a `corpus_accuracy.py --json` file of a dev-split run")  # fmt: skip
    args = parser.parse_args(argv)
    entries = corpus_accuracy.load_manifest("dev")
    if args.source is None:
        args.source = Path("dev-accuracy.json")
        corpus_accuracy.main(["--split", "dev", "--json", str(args.source)])
    results = json.loads(args.source.read_text())["results"]
    table = records(results, {e.path: e.category for e in entries})
    unknown = sorted(set(table) - set(CODES))
    if unknown:
        print(f"codes not in the registry: {', '.join(unknown)}", file=sys.stderr)
        return 1
    TABLE.write_text(json.dumps({
        "about": "each code's record on the corpus's dev split "
                 f"({len(results)} scripts): benchmarks/confidence_table.py",
        "codes": table,
    }, indent=2) + "\n")  # fmt: skip
    for code, entry in table.items():
        print(f"{code}  {entry['right']:3} / {entry['seen']:3}  {CODES[code].claim}")
    print(f"\nwritten to {TABLE.relative_to(corpus_accuracy.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
