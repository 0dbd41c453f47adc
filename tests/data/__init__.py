"""Scripts, models and generated data the tests run, most of them in fresh interpreters."""
