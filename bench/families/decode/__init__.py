"""bench/decode.py's code: the data set, the variants, the worker processes and the report
(transforms.py shares its processes)."""
