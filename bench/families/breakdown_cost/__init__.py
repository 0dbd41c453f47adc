"""bench/breakdown_cost.py's code: the cost per training step of nanopatch's breakdown option, and its table."""
