"""Floor 2, the CPU runtime of a training process: threads, affinity and allocator (``tuning``,
``malloc``), the ``--nproc`` launch (``launch``) and the processes BigDL-Nano's APIs start
(``processes``). Nothing here patches anything."""
