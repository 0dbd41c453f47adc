"""bench/run.py's suite: the benches it knows (``benches``) and running them all in one command (``runner``)."""
