"""bench/run.py's report of a results file: Markdown (``markdown``), the README table (``readme``)
and charts (``charts``), all written by ``render``."""
