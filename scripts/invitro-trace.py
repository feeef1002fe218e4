#!/usr/bin/env python3
"""Makes an InVitro loader trace directory from one of traces/.

    scripts/invitro-trace.py traces/azure_500 250 /tmp/trace250

copies the first N functions' rows of invocations.csv, durations.csv and
memory.csv (matched by HashFunction) and writes the dirigent.json the
loader's Dirigent mode reads (traces/ carry it as dirigent.csv). Point
the loader's TracePath at the output directory (docs/compatibility.md,
"The InVitro loader").
"""
import csv
import json
import os
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(src, "invocations.csv"), newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1 : count + 1]
    fn = header.index("HashFunction")
    hashes = [r[fn] for r in rows]
    with open(os.path.join(out, "invocations.csv"), "w", newline="") as f:
        csv.writer(f).writerows([header] + rows)
    for name in ("durations.csv", "memory.csv"):
        with open(os.path.join(src, name), newline="") as f:
            table = list(csv.reader(f))
        i = table[0].index("HashFunction")
        by = {r[i]: r for r in table[1:]}
        with open(os.path.join(out, name), "w", newline="") as f:
            csv.writer(f).writerows([table[0]] + [by[h] for h in hashes])
    with open(os.path.join(src, "dirigent.csv"), newline="") as f:
        meta = {r["HashFunction"]: r for r in csv.DictReader(f)}
    specs = []
    for h in hashes:
        r = meta[h]
        specs.append({
            "HashFunction": h, "Image": r["Image"], "Port": int(r["Port"]), "Protocol": r["Protocol"],
            "ScalingUpperBound": int(r["ScalingUpperBound"]), "ScalingLowerBound": int(r["ScalingLowerBound"]),
            "IterationMultiplier": int(r["IterationMultiplier"]), "IOPercentage": 0, "EnvVars": [], "ProgramArgs": [],
        })
    with open(os.path.join(out, "dirigent.json"), "w") as f:
        json.dump(specs, f, indent=1)
    print(f"{len(hashes)} functions in {out}")


if __name__ == "__main__":
    main()
