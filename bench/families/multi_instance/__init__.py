"""bench/multi_instance.py's code: the worker, the variants and their launch, and the report."""
