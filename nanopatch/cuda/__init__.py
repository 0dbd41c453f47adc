"""The public path of ``nanopatch.cuda.standins`` (the ``--cuda-to-cpu`` target itself is
nanopatch/targets/cuda/)."""
