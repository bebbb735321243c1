#!/usr/bin/env python3
"""Step time of sharded data parallelism and activation checkpointing, side by side.

dp = 2 on the benchmark GPT (bench/configs/gpt-bench.toml, one thread per rank):
zero 0, 1, 2, 3 and zero 0 with every transformer layer checkpointed, run
interleaved for --rounds rounds (each round runs every variant once, in a
rotated order), and each variant's mean step time (first step excluded) divided
by zero 0's of the same round; the median of those paired ratios is reported.

  python3 bench/zero_step_times.py [--build build] [--rounds 6] [--out bench/results/zero-step-times.json]
"""
import argparse, time, json, os, statistics, subprocess, sys, tempfile

from validity import Validity

VARIANTS = [
    ("zero0", ["parallel.zero=0"]),
    ("zero1", ["parallel.zero=1"]),
    ("zero2", ["parallel.zero=2"]),
    ("zero3", ["parallel.zero=3"]),
    ("zero0 checkpoint", ["parallel.zero=0", 'memory.checkpoint=["transformer_layer"]']),
]

def run(build, config, sets):
    with tempfile.TemporaryDirectory() as d:
        cmd = [os.path.join(build, "bin", "smp-launch"), "--nproc-per-node", "2", "--threads-per-rank", "1",
               "--master-port", "0", "--plugin", os.path.join(build, "lib", "smp", "plugins", "gpt.so"),
               "--config", config] + sum((["--set", s] for s in sets + [f"run.dir={d}"]), [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"job failed: {' '.join(sets)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        s = json.load(open(os.path.join(d, "summary.json")))
        return s["step_seconds"], max(s["memory_bytes"]["total"])


def source_commit():
    """The source tree's commit (bench/source_commit.sh): which code was measured."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(["bash", os.path.join(here, "source_commit.sh")], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "configs", "gpt-bench.toml"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out")
    a = ap.parse_args()
    base = ["parallel.dp=2", "train.steps=10", "train.batch_size=16", "run.log_to_file=false", "run.threads=1"]
    times = {name: [] for name, _ in VARIANTS}
    memory = {}
    validity = Validity()
    load_start = os.getloadavg()
    for rnd in range(a.rounds):
        order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
        for name, sets in order:
            t, m = validity.measure(name, rnd + 1, lambda: run(a.build, a.config, base + sets))
            times[name].append(t)
            memory[name] = m
        print(f"round {rnd + 1}: " + "  ".join(f"{n} {1000 * times[n][-1]:.0f} ms" for n, _ in VARIANTS), flush=True)
    rows = []
    for name, _ in VARIANTS:
        ratios = [t / z for t, z in zip(times[name], times["zero0"])]
        rows.append({"variant": name, "step_seconds": times[name], "median_step_seconds": statistics.median(times[name]),
                     "median_ratio_to_zero0": statistics.median(ratios), "ratios": ratios,
                     "memory_bytes_per_rank": memory[name]})
        print(f"{name:18s} median {1000 * statistics.median(times[name]):.0f} ms  ratio to zero0 "
              f"{statistics.median(ratios):.3f} (spread {min(ratios):.3f}-{max(ratios):.3f})  memory {memory[name] / 1e6:.1f} MB")
    out = {"commit": source_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "what": "dp=2 step time, ZeRO stages and checkpointing vs zero 0, paired per round (median of ratios)",
           "config": a.config, "overrides": base, "rounds": a.rounds, "rows": rows,
           "load_1_5_15_at_start": load_start, "load_1_5_15_at_end": os.getloadavg(), "validity": validity.json()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)

if __name__ == "__main__":
    main()
