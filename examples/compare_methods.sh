#!/usr/bin/env bash
# Compare backends at the same ε on the same data. Each experiment gets its own ledger: on one
# shared ledger the second run would see the first run's spend (ε composes per dataset).
set -euo pipefail
EPSILON=${EPSILON:-10}
for method in pge dpkernel; do
  dir="compare/$method"
  mkdir -p "$dir"
  dpsynth train --method "$method" --data digits --epsilon "$EPSILON" --preset small \
    --out "$dir/run" --ledger "$dir/ledger.jsonl" --json > "$dir/train.json"
  dpsynth sample "$dir/run" --n 2000 --out "$dir/synthetic" --ledger "$dir/ledger.jsonl" --quiet
  dpsynth evaluate --synthetic "$dir/synthetic" --real digits:test --metrics accuracy \
    --classifier logreg --seeds 3 --ledger "$dir/ledger.jsonl" --json > "$dir/eval.json"
  python -c "import json,sys; r=json.load(open('$dir/eval.json')); \
print('$method', r['metrics']['accuracy']['mean'])"
done
