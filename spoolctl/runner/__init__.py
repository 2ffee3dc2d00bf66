"""The runner: everything about this machine's processes and what they use.

Two tiers, each in its own place in the layer order (ARCHITECTURE.md):

- supervising, above `services/` (it reads a claim and builds an outcome,
  services' data): `supervise.py` starts one attempt (its output files, its
  environment, the spawn), drives its timeout and signals and finds its end;
  `stopping.py` holds when it is stopped and how far its stopping has gone
  (its timers; the first signal, grace and SIGKILL); `contained.py` is that
  attempt's cgroup; `liveness.py` judges a stale owner and ends what is
  left of its attempt.
- capacity, `capacity.py`: a worker's slots, the place each attempt
  takes and gives back, and a lane cap's arithmetic.
- the machine's edge, below every other layer but the leaves (the drivers
  use it too): `spawn.py` (posix_spawn, else Popen), `procs.py` (psutil:
  processes, groups, start times, pid spaces), `containment/` (a cgroup per
  attempt), `lease_guard.py` (the forked watchdog that fences a frozen
  worker's jobs) and `wakeup.py` (waiting on descriptors and signals).

No SQL here: the spawn record (a job's pid, start time and cgroup) is read
from the process here and written by `services/spawn_record.py`.
"""
