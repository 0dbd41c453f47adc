"""What the tests share that is not a test: demo patch targets, transform recipes and cases, the
learning oracle, training tasks, readers of the runner's and the bench's output, and the scripts
tox runs (run_on_torch_versions.py, run_with_libjpeg_turbo3.py)."""
