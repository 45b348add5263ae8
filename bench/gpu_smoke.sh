#!/usr/bin/env bash
# Smoke test on CUDA: every registered method's `tiny` preset through train → sample → evaluate.
#
#   bench/gpu_smoke.sh OUT_DIR
#
# Environment: DEVICE (default cuda; DEVICE=cpu runs the same steps on the CPU, slowly),
# PYTHON (default python3), DATA (default digits), TABLE (default german-credit: the data of
# the table-only methods, aim and mst, evaluated with ml), INCEPTION_WEIGHTS (a TorchScript
# TF-Inception file: adds FID to the evaluation), N (samples per method, default 200),
# METHODS (a space-separated subset; default every registered method).
# Methods come from dpsynth.methods.registry, so a new backend joins without editing this file.
# Each method gets its own ledger under OUT_DIR (independent experiments on the same data).
# Any failing step fails the whole script (exit 1) after naming the method and the step; on
# CUDA it also fails when a run did not actually train on CUDA.
# Then every method trains once more under torchrun (NPROC processes, default 1: NCCL on CUDA,
# gloo on the CPU; NPROC=0 skips it), which must complete its ledger entry on the device.
set -uo pipefail

out=${1:?usage: bench/gpu_smoke.sh OUT_DIR}
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
data=${DATA:-digits}
n=${N:-200}
mkdir -p "$out" || exit 1

if [ "$device" = cuda ]; then
  "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu_smoke: CUDA is not available (DEVICE=cpu runs on the CPU)")' || exit 1
fi
methods=${METHODS:-$("$py" -c 'from dpsynth.methods.registry import method_names; print(" ".join(method_names()))')} || {
  echo "gpu_smoke: cannot list the methods from dpsynth.methods.registry" >&2
  exit 1
}
table=${TABLE:-german-credit}
# the methods that take no images train on the table
table_only=$("$py" -c 'from dpsynth.methods.registry import get_method, method_names
print(" ".join(m for m in method_names() if "image" not in get_method(m).modalities))') || exit 1
data_for() { case " $table_only " in *" $1 "*) echo "$table" ;; *) echo "$data" ;; esac; }
metrics=accuracy
weights=()
if [ -n "${INCEPTION_WEIGHTS:-}" ]; then
  metrics=fid,accuracy
  weights=(--inception-weights "$INCEPTION_WEIGHTS")
fi

dpsynth() { "$py" -m dpsynth.cli "$@"; }

step() {  # step METHOD NAME COMMAND...: run one step, log it, report a failure loudly
  local method=$1 name=$2
  shift 2
  local log="$out/$method/$name.log"
  local started=$SECONDS
  "$@" >"$out/$method/$name.json" 2>"$log"
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "  $name ok ($((SECONDS - started)) s)"
    return 0
  fi
  echo "FAILED: $method $name (exit $rc); $log:" >&2
  sed 's/^/    /' "$log" >&2
  return 1
}

failed=()
for method in $methods; do
  echo "== $method ($device)"
  dir="$out/$method"
  rm -rf "$dir" && mkdir -p "$dir" || exit 1
  ledger="$dir/ledger.jsonl"
  mdata=$(data_for "$method")
  if [ "$mdata" = "$data" ]; then mmetrics=$metrics; mweights=("${weights[@]}"); mout="$dir/samples"
  else mmetrics=ml; mweights=(); mout="$dir/samples.csv"; fi
  if step "$method" train dpsynth train --method "$method" --data "$mdata" --epsilon 10 \
        --preset tiny --out "$dir/run" --device "$device" --ledger "$ledger" --quiet --json \
    && "$py" - "$dir/run/config.json" "$device" <<'PY' \
    && step "$method" sample dpsynth sample "$dir/run" --n "$n" --out "$mout" \
        --device "$device" --ledger "$ledger" --quiet --json \
    && step "$method" evaluate dpsynth evaluate --synthetic "$mout" --real "$mdata:test" \
        --metrics "$mmetrics" --classifier cnn --seeds 1 --device "$device" "${mweights[@]}" \
        --report "$dir/report" --ledger "$ledger" --quiet --json \
    && step "$method" ledger-verify dpsynth ledger verify --ledger "$ledger" --json
import json, sys
used = json.load(open(sys.argv[1]))["device"]
if not used.startswith(sys.argv[2]):
    sys.exit(f"FAILED: the run trained on {used}, not {sys.argv[2]}")
PY
  then
    "$py" - "$dir/evaluate.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
metrics = result.get("metrics", {})
parts = [f"{k} {v['value']:.2f}" for k, v in metrics.items() if isinstance(v, dict) and "value" in v]
acc = metrics.get("accuracy")
if acc:
    parts.append(f"accuracy {acc['mean']:.3f}")
for name, scores in (metrics.get("classifiers") or {}).items():  # a table's classifiers
    if isinstance(scores, dict) and isinstance(scores.get("roc_auc"), dict):
        parts.append(f"{name} ROC-AUC {scores['roc_auc']['mean']:.3f}")
print("  result: " + ", ".join(parts))
PY
  else
    failed+=("$method")
  fi
done

nproc=${NPROC:-1}
if [ "$nproc" -gt 0 ]; then
  for method in $methods; do
    echo "== $method under torchrun ($nproc process(es), $device)"
    dir="$out/torchrun-$method"
    rm -rf "$dir" && mkdir -p "$dir" || exit 1
    if step "torchrun-$method" train "$py" -m torch.distributed.run --nproc-per-node "$nproc" \
          --no-python "$py" -m dpsynth.cli train --method "$method" --data "$(data_for "$method")" \
          --epsilon 10 --preset tiny --out "$dir/run" --device "$device" \
          --ledger "$dir/ledger.jsonl" --quiet --json \
      && "$py" - "$dir/run/config.json" "$device" "$nproc" "$dir/train.json" <<'PY' \
      && step "torchrun-$method" ledger-verify dpsynth ledger verify --ledger "$dir/ledger.jsonl" --json
import json, sys
config, device, nproc = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
result = json.load(open(sys.argv[4]))
if not config["device"].startswith(device):
    sys.exit(f"FAILED: the run trained on {config['device']}, not {device}")
if config.get("launch") != {"world_size": nproc}:
    sys.exit(f"FAILED: config.json records launch {config.get('launch')}, not {nproc} processes")
if result["ledger_status"] != "completed" or result["steps"] != result["total_steps"]:
    sys.exit(f"FAILED: {result['steps']}/{result['total_steps']} steps, {result['ledger_status']}")
print(f"  torchrun ok: {result['steps']} steps on {config['device']}, epsilon {result['epsilon']:.3g}")
PY
    then
      :
    else
      failed+=("torchrun-$method")
    fi
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_smoke: FAILED on $device: ${failed[*]}" >&2
  exit 1
fi
echo "gpu_smoke: all methods ok on $device ($methods); outputs in $out"
