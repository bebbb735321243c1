"""smp-bench's validity rule for the Python benchmarks (bench/jobs.h's, in Python).

A measurement during which other processes kept more than `quiet_cores` busy
on average is not valid: it runs again (at most RETRIES more times), and each
set-aside attempt is listed; the last is kept, marked, when the retries run
out. "Other processes" is the machine's busy time (/proc/stat) less this
process's and its waited-for children's CPU time, over the wall time.
"""
import os
import time

RETRIES = 3
RULE = ("a measurement during which other processes kept more than quiet_cores busy on average is run again, "
        "up to 3 times; every such attempt is listed, kept = true where it stands in the measurements")


def machine_busy_seconds():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OtherCores:
    """Cores other processes kept busy since construction."""

    def __init__(self):
        self.busy0, self.own0, self.t0 = machine_busy_seconds(), own_cpu_seconds(), time.monotonic()

    def cores(self):
        wall = time.monotonic() - self.t0
        if wall <= 0:
            return 0.0
        return max(0.0, (machine_busy_seconds() - self.busy0 - (own_cpu_seconds() - self.own0)) / wall)


def wait_for_quiet(quiet_cores, max_wait_s=60.0):
    """Waits (up to max_wait_s) while other processes keep more than quiet_cores busy; returns the last sample."""
    deadline = time.monotonic() + max_wait_s
    while True:
        o = OtherCores()
        time.sleep(1.0)
        busy = o.cores()
        if busy <= quiet_cores or time.monotonic() >= deadline:
            return busy


class Validity:
    """Runs measurements under the rule and keeps the set-aside attempts."""

    def __init__(self, quiet_cores=0.5):
        self.quiet_cores = quiet_cores
        self.invalid_attempts = []

    def measure(self, label, rnd, fn):
        """fn() measured until valid; returns its value."""
        for attempt in range(RETRIES + 1):
            wait_for_quiet(self.quiet_cores)
            o = OtherCores()
            value = fn()
            busy = o.cores()
            kept = attempt == RETRIES
            if busy > self.quiet_cores:
                self.invalid_attempts.append({"label": label, "round": rnd, "competing_cores": busy, "kept": kept})
                print(f"{label} round {rnd}: other processes used {busy:.2f} cores meanwhile: "
                      f"{'kept, marked invalid' if kept else 'not valid, again'}", flush=True)
            if busy <= self.quiet_cores or kept:
                return value

    def alternating_pairs(self, n, a_label, a, b_label, b):
        """n pairs (a(), b()), each value measured under the rule, a first in even pairs and b first in odd
        ones (so neither side always runs on the warmer machine); yields (index, a value, b value)."""
        for k in range(n):
            run_a = lambda: self.measure(a_label, k + 1, a)
            run_b = lambda: self.measure(b_label, k + 1, b)
            if k % 2 == 0:
                va, vb = run_a(), run_b()
            else:
                vb, va = run_b(), run_a()
            yield k, va, vb

    def json(self):
        return {"rule": RULE, "quiet_cores": self.quiet_cores, "invalid_attempts": self.invalid_attempts}
