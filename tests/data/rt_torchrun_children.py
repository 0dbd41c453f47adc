"""Runs torchrun itself (2 local workers: this file with --worker); each worker reports its threads and affinity."""

import json
import os
import subprocess
import sys

if __name__ == "__main__":
    out = sys.argv[-1]
    if sys.argv[1] == "--worker":
        import torch

        report = {
            "name": f"rank{os.environ['RANK']}",
            "threads": torch.get_num_threads(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")},
        }
        with open(os.path.join(out, f"{report['name']}.json"), "w") as f:
            json.dump(report, f)
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        subprocess.run([*torchrun, os.path.abspath(__file__), "--worker", out], check=True)
        print("RESULT " + json.dumps({"name": "script", "env": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}}))
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                print("RESULT " + f.read())
