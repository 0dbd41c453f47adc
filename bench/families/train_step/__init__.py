"""bench/train_step.py's code: models, variants, the worker and its loop, the roof, the parent and its report."""
