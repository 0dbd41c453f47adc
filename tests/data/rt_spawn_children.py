"""Starts 2 processes with torch.multiprocessing.spawn; each reports its threads and affinity."""

import json
import os
import sys

import torch
import torch.multiprocessing as mp


def report(name: str) -> dict:
    return {
        "name": name,
        "threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")},
    }


def work(rank: int, out: str) -> None:
    x = torch.ones(256, 256)
    (x @ x).sum()  # a parallel region
    with open(os.path.join(out, f"child{rank}.json"), "w") as f:
        json.dump(report(f"child{rank}"), f)


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(work, args=(out,), nprocs=2)
    print("RESULT " + json.dumps(report("parent")))
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            print("RESULT " + f.read())
