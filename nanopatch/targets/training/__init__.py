"""Training acceleration: bf16 autocast, channels-last, IPEX and fused optimizer steps applied
to the model and optimizer an unmodified script builds (see :mod:`.patch`)."""
