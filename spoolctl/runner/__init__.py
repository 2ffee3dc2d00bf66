"""The runner: a worker's local side of running jobs (its capacity, and the
processes of the attempts it runs)."""
