#!/usr/bin/env bash
# A long run is interrupted (Ctrl-C, a reboot): its reserved spend stays counted in full, and
# --resume finishes it from the last checkpoint with the same noise and no second charge.
set -euo pipefail
dpsynth train --method pge --data mnist-5k --epsilon 10 --preset small --out runs/long \
  --checkpoint-every 60 || true
dpsynth train --resume --out runs/long
dpsynth ledger show --dataset mnist-5k
