#!/bin/sh
# Fit the default routing preset to llama.cpp#27861's published statistics and print the
# statistics of the presets (about 6 minutes on 2 cores). Run from the repository root after
# `cargo build --release`.
set -eu
FT=${FT:-target/release/ft}
D=experiments/routing-fit
R=$D/results
mkdir -p "$R"
{ date -u +%Y-%m-%dT%H:%MZ; uname -sr; nproc; grep -m1 "model name" /proc/cpuinfo || true;
  "$FT" --version; } > "$R/env.txt"
"$FT" routing fit --points "$D/llama-cpp-27861.toml" --start "$D/start.toml" \
    --out "$R/fitted-typical.toml" > "$R/fit-llama-cpp-27861.txt"
"$FT" routing fit --points "$D/imp-2061.toml" > "$R/fit-imp-2061.txt"
"$FT" routing stats > "$R/stats-typical.txt"
"$FT" routing stats --json > "$R/stats-typical.json"
for p in skewed legacy-typical; do
    "$FT" routing stats --routing "$p" --policy lru > "$R/stats-$p.txt"
done
