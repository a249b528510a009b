#!/usr/bin/env python3
"""Convert a per-token, per-layer expert-id trace into ft's JSON-lines routing trace.

Input (one of; the format is picked from the extension: .csv, .json, .jsonl/.ndjson):

* CSV with a header row and columns
    token     token index within its sequence (integer; "token_idx" and "pos" accepted too)
    layer     layer index (any integers: they are renumbered 0..L-1 in increasing order, so
              the layer numbers of a model with leading dense layers work as they are)
    experts   the token's top-k expert ids at that layer, separated by spaces, ';' or '|'
              (a JSON list such as "[3, 17]" is accepted too)
    weights   optional, the router weights in the same order and with the same separators
    sequence  optional, which prompt/sequence the token belongs to ("seq", "request" too)
* JSON: a list of objects with the same keys (experts and weights as lists), or an object
  {"records": [...]}; JSON lines: one such object per line.

Output: docs/routing.md's JSON-lines trace: a header line with the geometry, then one record
per (step, stream, layer), steps in order.

Sequences: with --mode concat (default) all sequences are concatenated, in order of their
first appearance, into stream 0 (one token per step). With --mode parallel sequence i becomes
stream i and step t holds token t of every sequence; the trace ends with the shortest
sequence (ft needs every stream at every step).

Weights are renormalised to sum to 1 over the top-k (routers that report softmax
probabilities over all experts do not). Without weights the records carry none, and ft uses
1/top_k each.

Example:
    scripts/convert_trace.py mixtral_routing.csv -o mixtral.jsonl --skip-tokens 32
"""

import argparse
import csv
import json
import re
import sys
from collections import Counter, OrderedDict

FORMAT_NAME = "ft-routing-trace"
VERSION = 1

TOKEN_KEYS = ("token", "token_idx", "pos")
SEQUENCE_KEYS = ("sequence", "seq", "request")


def fail(msg):
    sys.stderr.write(f"convert_trace: {msg}\n")
    sys.exit(2)


def pick(row, keys, where, required=True):
    for k in keys:
        if k in row and row[k] not in (None, ""):
            return row[k]
    if required:
        fail(f"{where}: no {' / '.join(keys)} field")
    return None


def parse_list(value, where, cast):
    if isinstance(value, list):
        items = value
    else:
        text = str(value).strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as e:
                fail(f"{where}: bad list {text!r}: {e}")
        else:
            items = [t for t in re.split(r"[\s;|,]+", text) if t]
    try:
        return [cast(x) for x in items]
    except (TypeError, ValueError):
        fail(f"{where}: {value!r} is not a list of numbers")


def read_rows(path):
    """Yield (where, dict) for every input record."""
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            for i, row in enumerate(csv.DictReader(f), start=2):
                yield f"{path}:{i}", row
    elif path.endswith((".jsonl", ".ndjson")):
        with open(path) as f:
            for i, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        yield f"{path}:{i}", json.loads(line)
                    except json.JSONDecodeError as e:
                        fail(f"{path}:{i}: {e}")
    elif path.endswith(".json"):
        with open(path) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                fail(f"{path}: {e}")
        if isinstance(doc, dict):
            doc = doc.get("records")
        if not isinstance(doc, list):
            fail(f"{path}: expected a list of records or {{\"records\": [...]}}")
        for i, row in enumerate(doc):
            yield f"{path}[{i}]", row
    else:
        fail(f"{path}: unknown input format (use .csv, .json or .jsonl)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("-o", "--output", required=True, help="the .jsonl trace to write")
    ap.add_argument("--experts", type=int, help="experts per layer (default: max id + 1)")
    ap.add_argument("--mode", choices=("concat", "parallel"), default="concat")
    ap.add_argument("--skip-tokens", type=int, default=0,
                    help="drop the first N tokens of every sequence (e.g. the prompt)")
    ap.add_argument("--source", default=None, help="free text stored in the header")
    args = ap.parse_args()

    # tokens[seq][token][layer] = (experts, weights)
    tokens = OrderedDict()
    layers = set()
    lengths = Counter()
    max_id = -1
    for where, row in read_rows(args.input):
        if not isinstance(row, dict):
            fail(f"{where}: not an object")
        tok = int(pick(row, TOKEN_KEYS, where))
        layer = int(pick(row, ("layer",), where))
        seq = str(pick(row, SEQUENCE_KEYS, where, required=False) or "0")
        experts = parse_list(pick(row, ("experts",), where), where, int)
        raw_w = pick(row, ("weights",), where, required=False)
        weights = parse_list(raw_w, where, float) if raw_w is not None else None
        if len(set(experts)) != len(experts):
            fail(f"{where}: repeated expert id in {experts}")
        if min(experts, default=0) < 0:
            fail(f"{where}: negative expert id")
        if weights is not None:
            if len(weights) != len(experts):
                fail(f"{where}: {len(experts)} experts but {len(weights)} weights")
            total = sum(weights)
            if total <= 0 or any(w < 0 for w in weights):
                fail(f"{where}: weights must be non-negative with a positive sum")
            weights = [w / total for w in weights]
        per_tok = tokens.setdefault(seq, {}).setdefault(tok, {})
        if layer in per_tok:
            fail(f"{where}: sequence {seq} token {tok} layer {layer} appears twice")
        per_tok[layer] = (experts, weights)
        layers.add(layer)
        lengths[len(experts)] += 1
        max_id = max(max_id, max(experts, default=-1))

    if not tokens:
        fail(f"{args.input}: no records")
    if len(lengths) != 1:
        fail(f"{args.input}: tokens route to different numbers of experts: {dict(lengths)}")
    top_k = next(iter(lengths))
    experts = args.experts if args.experts is not None else max_id + 1
    if max_id >= experts:
        fail(f"--experts {experts} but the trace uses expert id {max_id}")
    layer_ids = sorted(layers)
    renumber = {l: i for i, l in enumerate(layer_ids)}

    # Per sequence: the ordered token list, every token complete.
    sequences = []
    for seq, toks in tokens.items():
        ordered = []
        for t in sorted(toks):
            missing = [l for l in layer_ids if l not in toks[t]]
            if missing:
                fail(f"{args.input}: sequence {seq} token {t} has no record for layers {missing}")
            ordered.append(toks[t])
        sequences.append(ordered[args.skip_tokens:])

    if args.mode == "concat":
        streams = [[tok for seq in sequences for tok in seq]]
    else:
        n = min(len(s) for s in sequences)
        streams = [s[:n] for s in sequences]
    steps = min(len(s) for s in streams)
    if steps == 0:
        fail(f"{args.input}: no tokens left after --skip-tokens {args.skip_tokens}")

    header = {"format": FORMAT_NAME, "version": VERSION, "experts": experts,
              "top_k": top_k, "moe_layers": len(layer_ids)}
    if args.source:
        header["source"] = args.source
    with open(args.output, "w") as out:
        out.write(json.dumps(header, separators=(",", ":")) + "\n")
        for step in range(steps):
            for s, stream in enumerate(streams):
                tok = stream[step]
                for l in layer_ids:
                    ids, w = tok[l]
                    rec = {"step": step, "stream": s, "layer": renumber[l], "experts": ids}
                    if w is not None:
                        rec["weights"] = w
                    out.write(json.dumps(rec, separators=(",", ":")) + "\n")
    sys.stderr.write(
        f"convert_trace: {steps} steps x {len(streams)} streams x {len(layer_ids)} layers, "
        f"{experts} experts, top-{top_k} -> {args.output}\n")


if __name__ == "__main__":
    main()
