"""bench/transforms.py's code: the pipelines, the checks of what they ran, the worker processes and the report."""
