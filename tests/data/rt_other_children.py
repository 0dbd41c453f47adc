"""Under ``python -m nanopatch``: a script that imports torch (so that OpenMP pins its main
thread to one CPU) and starts processes through ``subprocess``: a program that is no Python
(``sh``), a Python started with ``-I`` (which skips the bootstrap), a Python under ``taskset -c
LAST`` (a mask of its own), and a plain Python (bootstrapped). Each prints one ``RESULT`` line:
its CPUs (from ``/proc/self/status``, as any program would read them) and the runner's
variables it saw."""

import json
import os
import subprocess
import sys

import torch

torch.ones(64, 64) @ torch.ones(64, 64)  # an OpenMP region: the runner's pinning applies

NAMES = ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "LD_PRELOAD", "NANOPATCH_TUNED")
PY_REPORT = (
    "import json, os, sys\n"
    "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
    "print('RESULT ' + json.dumps({'name': sys.argv[1], 'cpus': status['Cpus_allowed_list'].strip(),\n"
    f"    'env': {{n: os.environ.get(n) for n in {NAMES!r}}},\n"
    "    'patched': 'nanopatch' in sys.modules and sys.modules['nanopatch'].is_patched()}), flush=True)\n"
)
SH_REPORT = (  # the same line from a program that is no Python; an unset variable reads "<unset>"
    "cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2); "
    'printf \'RESULT {"name": "sh", "cpus": "%s", "env": {'
    + ", ".join(f'"{n}": "%s"' for n in NAMES)
    + '}}\\n\' "$cpus" '
    + " ".join(f'"${{{n}-<unset>}}"' for n in NAMES)
)
last = max(
    os.sched_getaffinity(0) | {int(c) for c in os.environ.get("NANOPATCH_CPUS", "0").replace("-", ",").split(",")}
)

status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print("RESULT " + json.dumps({"name": "script", "cpus": status["Cpus_allowed_list"].strip()}), flush=True)
subprocess.run(["sh", "-c", SH_REPORT], check=True)
subprocess.run([sys.executable, "-I", "-c", PY_REPORT, "isolated"], check=True)
subprocess.run(["taskset", "-c", str(last), sys.executable, "-c", PY_REPORT, "taskset"], check=True)
subprocess.run([sys.executable, "-c", PY_REPORT, "python"], check=True)
