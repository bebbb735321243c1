#!/usr/bin/env python3
"""A program's own LibTorch model through smp (examples/mixer): what the
wrapping costs, and data parallelism against the machine's bound.

1. One rank, one thread each: mixer_smp's training loop against mixer_plain's
   (the same model, data and SGD), interleaved pairs in alternating order;
   the throughput ratio plain_seconds / smp_seconds per pair (goal >= 0.97).
2. dp = 2 weak scaling, as `smp-bench dp-scaling` measures it: per round,
   mixer_smp on one rank (t1), two one-rank runs at once (the bound: what
   this machine gives two independent jobs, t_pair = the slower) and dp = 2
   with twice the global batch under smp-launch (t_dp), one thread per rank;
   weak = 2 t1 / t_dp, bound = 2 t1 / t_pair, dp2 / bound = t_pair / t_dp.

Every time is the program's own "train seconds" line (the training loop, not
start-up). Writes every repeat, the medians, the machine's load and the
commit to --out.

  python3 bench/program_bench.py --build build --pairs 10 --steps 200 --out bench/results/program.json
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

from validity import Validity

HERE = os.path.dirname(os.path.abspath(__file__))


def source_commit():
    r = subprocess.run(["bash", os.path.join(HERE, "source_commit.sh")], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def train_seconds(out, what):
    m = re.search(r"train seconds ([0-9.eE+-]+)", out)
    if not m:
        sys.exit(f"{what}: no 'train seconds' line\n{out[-3000:]}")
    return float(m.group(1))


def env1():
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    return e


def start(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env1())


def finish(p, what):
    out, _ = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{what} failed ({p.returncode})\n{out[-3000:]}")
    return train_seconds(out, what)


def plain(build, steps):
    return finish(start([os.path.join(build, "bin", "mixer_plain"), str(steps)]), "mixer_plain")


def smp_cmd(build, steps, sets):
    d = tempfile.mkdtemp(prefix="smp-program-bench-")
    return [os.path.join(build, "bin", "mixer_smp"), str(steps), "run.threads=1", "run.log_to_file=false",
            f"run.dir={d}"] + sets


def smp_one(build, steps):
    return finish(start(smp_cmd(build, steps, [])), "mixer_smp")


def smp_dp2(build, steps):
    cmd = [os.path.join(build, "bin", "smp-launch"), "--nproc-per-node", "2", "--threads-per-rank", "1",
           "--master-port", "0", "--worker"] + smp_cmd(build, steps, ["parallel.dp=2", "train.batch_size=64"])
    cmd.insert(cmd.index("--worker") + 2, "--")
    return finish(start(cmd), "mixer_smp dp=2")


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    load_start = loadavg()
    smp_one(build, 5), plain(build, 5)  # warm the page cache and the allocator paths
    validity = Validity()
    pairs = []
    for k, p, s in validity.alternating_pairs(a.pairs, "plain", lambda: plain(build, a.steps),
                                              "smp 1 rank", lambda: smp_one(build, a.steps)):
        pairs.append({"plain_seconds": p, "smp_seconds": s, "smp_over_plain_throughput": p / s})
        print(f"pair {k + 1}: plain {p:.3f} s, smp {s:.3f} s, throughput ratio {p / s:.3f}", flush=True)
    rounds = []
    for k in range(a.pairs):
        t1 = validity.measure("smp 1 rank", k + 1, lambda: smp_one(build, a.steps))

        def two_at_once():
            both = [start(smp_cmd(build, a.steps, [])) for _ in range(2)]
            return max(finish(p, "mixer_smp (pair)") for p in both)

        t_pair = validity.measure("two at once", k + 1, two_at_once)
        t_dp = validity.measure("dp 2", k + 1, lambda: smp_dp2(build, a.steps))
        r = {"one_rank_seconds": t1, "two_at_once_seconds": t_pair, "dp2_seconds": t_dp,
             "bound_over_1rank": 2 * t1 / t_pair, "dp2_weak_over_1rank": 2 * t1 / t_dp,
             "dp2_weak_over_bound": t_pair / t_dp}
        rounds.append(r)
        print(f"round {k + 1}: 1 rank {t1:.3f} s, two at once {t_pair:.3f} s, dp2 {t_dp:.3f} s, "
              f"dp2/bound {r['dp2_weak_over_bound']:.3f}", flush=True)
    med = lambda xs: statistics.median(xs)
    result = {
        "benchmark": "program (examples/mixer): smp's wrapping at 1 rank, dp 2 against the machine's bound",
        "commit": source_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_start": load_start,
                    "load_at_end": loadavg()},
        "method": (f"{a.steps} training steps of the MLP-Mixer (4 blocks, batch 32, SGD), one thread per process, "
                   "times from the programs' own 'train seconds' line (the loop, not start-up). One rank: "
                   f"{a.pairs} interleaved pairs, order alternating; ratio = plain seconds / smp seconds. dp 2: "
                   f"{a.pairs} rounds of 1 rank, two 1-rank runs at once and dp = 2 with twice the global batch "
                   "(smp-launch --threads-per-rank 1), back to back; medians of the per-round ratios."),
        "one_rank": {"pairs": pairs, "ratios": [p["smp_over_plain_throughput"] for p in pairs],
                     "smp_over_plain_throughput_median": med([p["smp_over_plain_throughput"] for p in pairs]),
                     "goal": 0.97},
        "validity": validity.json(),
        "dp2": {"rounds": rounds,
                "bound_over_1rank_per_round": [r["bound_over_1rank"] for r in rounds],
                "dp2_weak_over_bound_per_round": [r["dp2_weak_over_bound"] for r in rounds],
                "bound_over_1rank_median": med([r["bound_over_1rank"] for r in rounds]),
                "dp2_weak_over_1rank_median": med([r["dp2_weak_over_1rank"] for r in rounds]),
                "dp2_weak_over_bound_median": med([r["dp2_weak_over_bound"] for r in rounds])},
    }
    print(json.dumps({k: result[k] for k in ("commit", "machine")}, indent=1))
    print(f"1 rank: smp / plain throughput, median {result['one_rank']['smp_over_plain_throughput_median']:.3f}")
    print(f"dp 2: weak / bound, median {result['dp2']['dp2_weak_over_bound_median']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
