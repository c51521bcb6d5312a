#!/usr/bin/env python3
"""Merge the CSVs of repeated runs of one benchmark command into one CSV of medians.

    scripts/bench_medians.py OUT.csv RUN1.csv RUN2.csv RUN3.csv

A shared host's bandwidth and clock drift over minutes, so one run of `dcp bench decode` or
`dcp bench moe` can catch a slow minute. Run the same command several times, then merge: rows
are matched by position (the same command writes the same rows in the same order), a column
that differs between runs and holds numbers becomes the median of its values, and every other
column must be identical in all runs (it names the row). The docs' whole-step and MoE tables
are medians of three runs made this way.
"""
import csv
import statistics
import sys


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


def main(argv):
    if len(argv) < 4:
        sys.exit("usage: bench_medians.py OUT.csv RUN1.csv RUN2.csv [...]: at least two runs")
    out_path, run_paths = argv[1], argv[2:]
    runs = []
    for path in run_paths:
        with open(path, newline="") as f:
            runs.append(list(csv.reader(f)))
    header = runs[0][0]
    for path, run in zip(run_paths, runs):
        if run[0] != header:
            sys.exit(f"{path}: its columns differ from {run_paths[0]}'s")
        if len(run) != len(runs[0]):
            sys.exit(f"{path}: {len(run) - 1} rows, {run_paths[0]} has {len(runs[0]) - 1}")
    merged = [header]
    for i in range(1, len(runs[0])):
        row = []
        for j, name in enumerate(header):
            cells = [run[i][j] for run in runs]
            values = [number(c) for c in cells]
            if len(set(cells)) == 1:
                row.append(cells[0])
            elif all(v is not None for v in values):
                row.append(f"{statistics.median(values):.6g}")
            else:
                sys.exit(f"row {i}, column {name}: runs disagree on a label ({', '.join(cells)})")
        merged.append(row)
    with open(out_path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(merged)


if __name__ == "__main__":
    main(sys.argv)
