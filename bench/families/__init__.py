"""One package per benchmark family: the code behind bench/<name>.py, which stays a thin entry script."""
