"""bench/working_weights.py's code: the prototype of bf16 working weights against autocast, and its table."""
