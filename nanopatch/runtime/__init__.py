"""Floor 2, the CPU runtime of a training process: threads, affinity and allocator (``tuning``,
``_malloc``), the ``--nproc`` launch (``launch``) and the processes BigDL-Nano's APIs start
(``_processes``). Nothing here patches anything."""
