"""The library on its own, or on the suite's one Redis through the fixtures: no processes to kill."""
