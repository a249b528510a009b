"""The command line shared by the A/B readers (experiments/runtime-grid/switch_ab.py,
experiments/gpu-backend/bench_ab.py): one folder of alternated runs in, a table or JSON out.

Why a module: both scripts read a folder, pick the base setting, summarise per setting and
print the same way; only what a run is and what the table shows differ. Standard library only;
a script imports it after putting this folder on sys.path.
"""
import argparse
import json
import pathlib
import sys


def fmt(v, spec):
    """`v` formatted, or "-" where it is missing."""
    return "-" if v is None else format(v, spec)


def run(doc, name, layout, load, labels, summarize, print_table):
    """Parse FOLDER [--base LABEL] [--json]; load the folder (`load(folder)` -> runs, empty when
    it holds none: exit 1 naming `layout`); the base is --base or the first of
    `labels(runs)` in sort order; print `summarize(runs, base)` as JSON or by `print_table`."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--base")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not a.folder.is_dir():
        sys.exit(f"{name}: {a.folder} is not a folder")
    runs = load(a.folder)
    if not runs:
        print(f"{name}: no {layout} in {a.folder}", file=sys.stderr)
        sys.exit(1)
    base = a.base or sorted(labels(runs))[0]
    rows = summarize(runs, base)
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print_table(rows)
