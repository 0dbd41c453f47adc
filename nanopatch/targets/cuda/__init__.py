"""``--cuda-to-cpu``: a script written for a CUDA GPU runs on the CPU, unedited (see patch.py)."""
