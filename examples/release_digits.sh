#!/usr/bin/env bash
# Release 10,000 synthetic digits at (ε=10, δ=1e-5) with a budget cap, then prove the spend.
# Copy and adapt: point --data at your own images (folder:DIR, mnist:DIR, npz:FILE).
set -euo pipefail
export DPSYNTH_LEDGER=${DPSYNTH_LEDGER:-./dpsynth-ledger.jsonl}
DATA=${DATA:-digits}
OUT=${OUT:-release}

dpsynth data inspect "$DATA"
# A cap first: later runs on the same data are refused (exit 3) once it would be exceeded.
dpsynth ledger budget --dataset "$DATA" --epsilon 10 --delta 1e-5
dpsynth train --method pge --data "$DATA" --epsilon 10 --delta 1e-5 --preset small --out "$OUT/run"
dpsynth sample "$OUT/run" --n 10000 --out "$OUT/synthetic"
dpsynth evaluate --synthetic "$OUT/synthetic" --real "$DATA:test" --metrics accuracy \
  --classifier logreg --report "$OUT/report"
dpsynth ledger verify --against "$OUT/run"
# Keep or publish the head: `dpsynth ledger verify --head HASH` later proves no rewrite.
dpsynth ledger head --json > "$OUT/ledger-head.json"
dpsynth ledger show --dataset "$DATA"
