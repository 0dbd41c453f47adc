"""Floor 2, the patch engine: the options (``config``), the registry of targets and the journal of
every change they make, with its exact undo (``_patching``), and the torch versions tested
(``_versions``)."""
