"""Floor 1, the foundation: what every other floor may use and which uses nothing of nanopatch's:
the logger (``log``), the CPU's facts (``cpu``) and what "learns as stock" means (``learning``)."""
