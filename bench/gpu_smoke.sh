#!/usr/bin/env bash
# Smoke test on CUDA: every registered method's `tiny` preset through train → sample → evaluate.
#
#   bench/gpu_smoke.sh OUT_DIR
#
# Environment: DEVICE (default cuda; DEVICE=cpu runs the same steps on the CPU, slowly),
# PYTHON (default python3), DATA (default digits), INCEPTION_WEIGHTS (a TorchScript TF-Inception
# file: adds FID to the evaluation), N (samples per method, default 200).
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
methods=$("$py" -c 'from dpsynth.methods.registry import method_names; print(" ".join(method_names()))') || {
  echo "gpu_smoke: cannot list the methods from dpsynth.methods.registry" >&2
  exit 1
}
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
  if step "$method" train dpsynth train --method "$method" --data "$data" --epsilon 10 \
        --preset tiny --out "$dir/run" --device "$device" --ledger "$ledger" --quiet --json \
    && "$py" - "$dir/run/config.json" "$device" <<'PY' \
    && step "$method" sample dpsynth sample "$dir/run" --n "$n" --out "$dir/samples" \
        --device "$device" --ledger "$ledger" --quiet --json \
    && step "$method" evaluate dpsynth evaluate --synthetic "$dir/samples" --real "$data:test" \
        --metrics "$metrics" --classifier cnn --seeds 1 --device "$device" "${weights[@]}" \
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
parts = [f"{k} {v['value']:.2f}" for k, v in result["metrics"].items() if "value" in v]
acc = result["metrics"].get("accuracy")
if acc:
    parts.append(f"accuracy {acc['mean']:.3f}")
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
          --no-python "$py" -m dpsynth.cli train --method "$method" --data "$data" \
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
