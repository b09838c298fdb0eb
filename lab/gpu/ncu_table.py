"""Print an Nsight Compute ``--csv --page details`` file as one line per (launch, section, metric).

    python3 lab/gpu/ncu_table.py FILE.csv
"""

from __future__ import annotations

import csv
import io
import sys


def main(path: str) -> None:
    text = open(path).read()
    start = text.find('"ID"')  # ncu prints its own log lines before the table
    rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
    seen = set()
    for r in rows:
        key = (r["ID"], r["Section Name"], r["Metric Name"])
        if key in seen:
            continue
        seen.add(key)
        print(f'{r["ID"]:>3} {r["Kernel Name"][:24]:<24} {r["Section Name"][:22]:<22} {r["Metric Name"][:48]:<48} '
              f'{r["Metric Value"]:>14} {r["Metric Unit"]}')


if __name__ == "__main__":
    main(sys.argv[1])
