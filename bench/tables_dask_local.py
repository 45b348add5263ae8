"""mst through the Dask engine on a local cluster (issue 47): the cluster path, measured.

Starts a `LocalCluster` of `--workers` processes with one thread each, runs `dpsynth train
--engine dask://…` on a Parquet table made by `python -m bench.big_table --parquet` (its folder
holds `big.parquet/` and `big.schema.json`), and writes JSON with the date, machine, commit,
command, the per-pass times the CLI prints, the wall time and the peak memory of the client (from
`/usr/bin/time -v`) and of the workers.

    python -m bench.tables_dask_local --table /tmp/dpsynth-scale/10000000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import describe


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    """Run the measurement and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, required=True, help="folder of big_table.py")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--delta", default="1e-6")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = Client(cluster)
    work = Path(tempfile.mkdtemp(prefix="dpsynth-dask-"))
    command = [
        "dpsynth", "train", "--method", "mst",
        "--data", f"parquet:{args.table / 'big.parquet'}",
        "--schema", str(args.table / "big.schema.json"),
        "--epsilon", args.epsilon, "--delta", args.delta,
        "--engine", cluster.scheduler_address.replace("tcp://", "dask://"),
        "--out", str(work / "run"), "--ledger", str(work / "ledger.jsonl"), "--device", "cpu",
    ]  # fmt: skip
    binary = str(Path(sys.executable).parent / "dpsynth")
    started = time.time()
    done = subprocess.run(
        ["/usr/bin/time", "-v", binary, *command[1:]], capture_output=True, text=True
    )
    wall = time.time() - started
    workers = client.run(_peak_rss_mb)
    client.close()
    cluster.close()
    text = done.stdout + done.stderr
    passes = [
        {"pass": int(m[1]), "what": m[2], "rows": int(m[3].replace(",", "")), "s": float(m[4])}
        for m in re.finditer(r"pass (\d+) \(dask, ([^)]*)\): ([\d,]+) rows in ([\d.]+) s", text)
    ]
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    record = {
        "machine": describe("cpu"),
        "command": " ".join(command),
        "workers": args.workers,
        "exit_code": done.returncode,
        "passes": passes,
        "train_wall_s": round(wall, 1),
        "client_peak_rss_mb": round(int(peak[1]) / 1024) if peak else None,
        "worker_peak_rss_mb": {k: round(v) for k, v in workers.items()},
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
