"""Floor 4, BigDL-Nano compatibility: its Lightning ``Trainer`` (``lightning``) and its custom-loop
APIs ``TorchNano`` and ``@nano`` (``torch_nano``, on Fabric through ``_fabric``)."""
