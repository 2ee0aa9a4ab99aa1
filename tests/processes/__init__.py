"""Real processes: races, SIGKILL, signals and time limits, the chaos runner."""
