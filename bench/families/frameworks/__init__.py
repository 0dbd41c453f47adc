"""bench/frameworks.py's code: the variants, the training scripts its workers run, the launch and the report."""
