"""Floor 5, the runner behind ``python -m nanopatch``: its options (``cli``), running the script as
``__main__`` (``_scripts``), patching the processes it starts (``_bootstrap``), ``--compare``
(``compare``, ``stock``), ``--verify`` (``verify``, ``_verify_child``) and ``--info`` (``_info``)."""
