#!/usr/bin/env bash
# The official OpenAI Python client against `ft serve --device host` (a tiny model), twice
# (two server processes), checking every case of check.py and that no response id repeats
# across the restart. 127.0.0.1 only; bounded (each call times out after 60 s).
#
# Usage: run.sh OUTDIR (the committed results: run.sh experiments/serve-openai/results)
# Env: FT (default target/release/ft). Needs `pip install openai`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
FT="${FT:-$root/target/release/ft}"
# shellcheck source=../lib/env-txt.sh
source "$here/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT"
cat > "$OUT/tiny.toml" <<'TOML'
name = "tiny-serve"
format = "bf16"

[geometry]
hidden = 64
intermediate = 64
experts = 16
top_k = 4
moe_layers = 2
TOML
write_env_txt "$OUT/machine.txt" serve-openai "$0 $*" \
  "openai client: $(python3 -c 'import openai; print(openai.__version__)')"

status=0
for run in 1 2; do
  "$FT" serve --model "$OUT/tiny.toml" --device host --moe-strategy offload --port 0 \
    --context-limit 512 > "$OUT/serve-$run.stdout" 2> "$OUT/serve-$run.log" &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    grep -q listening "$OUT/serve-$run.stdout" 2>/dev/null && break
    kill -0 "$pid" || { cat "$OUT/serve-$run.log" >&2; exit 1; }
    sleep 0.1
  done
  url="$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve-$run.stdout" | head -1)"
  python3 "$here/check.py" "$url/v1" "$OUT/ids-$run.txt" > "$OUT/cases-$run.jsonl" || status=$?
  kill -TERM "$pid"
  wait "$pid" || status=$?
  trap - EXIT
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "cases-1.jsonl"))]
cases, summary = rows[:-1], rows[-1]
print("| case | expected | status | ignored (header) / param | ok |")
print("|---|---|---|---|---|")
for r in cases:
    e = r["expected"]
    exp = e if isinstance(e, str) else ("ignored " + ", ".join(e[1]) if e[0] == "ignored" else f"{e[0]} {e[1]}")
    what = r.get("ignored") or r.get("param") or ""
    print(f"| {r['case']} | {exp} | {r['status']} | {what} | {'yes' if r['ok'] else 'NO'} |")
ids = [set(open(os.path.join(out, f"ids-{i}.txt")).read().split()) for i in (1, 2)]
print()
print(f"{summary['cases']} cases, {summary['failed']} failed (openai {summary['openai_client']}); "
      f"response ids: {len(ids[0])} and {len(ids[1])} in the two runs, {len(ids[0] & ids[1])} shared")
sys.exit(1 if ids[0] & ids[1] else 0)
PY
exit "$status"
