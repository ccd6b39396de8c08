#!/usr/bin/env python3
"""Was the machine idle while a benchmark ran? Measured, not assumed.

Around a run it reads the CPU time the whole machine spent busy (/proc/stat: user, system,
interrupts, and time stolen by the hypervisor) and subtracts what the benchmark's own
processes used (this process, its waited-for children and their children through getrusage,
and any live processes named by PID through /proc/PID/stat). What is left is the CPU time
other processes took, given in cores: CPU seconds over wall seconds (0.5: half a core busy
beside the benchmark for the whole run).

As a module (bench/vs_pytorch.py):

    with OthersMeter(own_pids=[twin.pid]) as m:
        run_something()
    m.cores                                  # other processes' CPU over the run, in cores

As a command, in front of a benchmark: it runs the command, prints its output, and runs it
again (up to --redo times) while others took more than --max cores; then one line on stderr,
"[idle] others took 0.02 cores during the run (clean, 1 try)" or "... NOT CLEAN ...", and the
command's own exit code:

    python3 bench/idle.py -- build/bench_gpt_train S,M 2 cpu none,full,selective
    python3 bench/idle.py --max 0.05 --redo 3 -- mpirun -np 2 build/train_gpt ...
"""
import argparse
import os
import resource
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu_s():
    """CPU seconds the whole machine spent busy (all cores, stolen time included), /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


def process_cpu_s(pid):
    """CPU seconds of one live process (user + system), /proc/PID/stat; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICK
    except (OSError, IndexError):
        return 0.0


def own_cpu_s(pids):
    """This process, its waited-for children (and theirs), and the live processes in pids."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + sum(process_cpu_s(p) for p in pids)


class OthersMeter:
    """The CPU time other processes took during a span, in cores (CPU seconds / wall seconds).
    Children started in the span count as the benchmark's own once they are waited for."""

    def __init__(self, own_pids=()):
        self.own_pids = list(own_pids)
        self.cores = 0.0

    def __enter__(self):
        self.t, self.machine, self.own = time.perf_counter(), machine_cpu_s(), own_cpu_s(self.own_pids)
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        others = (machine_cpu_s() - self.machine) - (own_cpu_s(self.own_pids) - self.own)
        self.cores = max(others, 0.0) / max(wall, 1e-3)
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 usage="bench/idle.py [--max CORES] [--redo N] -- COMMAND [ARGS...]")
    ap.add_argument("--max", type=float, default=0.10, help="a run is clean when others took at most this many cores")
    ap.add_argument("--redo", type=int, default=2, help="times a run that was not clean is run again")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command: bench/idle.py -- COMMAND [ARGS...]")
    if args.max < 0 or args.redo < 0:
        ap.error("--max and --redo must be >= 0")
    for attempt in range(args.redo + 1):
        with OthersMeter() as meter:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                print(f"idle.py: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
                return 127
        clean = meter.cores <= args.max
        if clean or attempt == args.redo:
            break
        print(f"[idle] others took {meter.cores:.2f} cores during the run (over {args.max:.2f}): running it again",
              file=sys.stderr, flush=True)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    tries = f"{attempt + 1} {'try' if attempt == 0 else 'tries'}"
    print(f"[idle] others took {meter.cores:.2f} cores during the run ({'clean' if clean else 'NOT CLEAN'}, {tries})",
          file=sys.stderr, flush=True)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
