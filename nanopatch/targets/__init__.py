"""Floor 3, the patch targets: one package per concern (``vision``, ``training``, ``parallel``,
``cuda``, ``breakdown``), each with a ``patch.py`` the engine applies when its library is imported."""
