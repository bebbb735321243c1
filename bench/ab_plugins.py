#!/usr/bin/env python3
"""A/B of one-rank GPT step times between two builds of smp's plugins.

Both sides run the same smp-launch and core; side A puts PLUGINS_A first on
SMP_PLUGIN_PATH, side B PLUGINS_B (e.g. smp_nn.so before and after a kernel
change). Interleaved rounds (A then B, alternating which goes first), each
shape per round; per round the B/A step-time ratio, and their median. The
machine's load and other processes' CPU use during each run are recorded; a
run during which others used more than --quiet-cores is run again (at most 3
times) and listed as invalid.

  bench/ab_plugins.py --a /tmp/old-plugins --b /tmp/new-plugins --label gelu \\
      --out bench/results/ab-gelu-kernel.json
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
SHAPES = {"bench (hidden 256, seq 128)": [], "small (hidden 64, seq 64)": ["model.hidden=64", "model.seq_len=64"]}
MALLOC = {"MALLOC_TRIM_THRESHOLD_": "17179869184", "MALLOC_MMAP_THRESHOLD_": "33554432",
          "MALLOC_TOP_PAD_": "268435456"}


def busy_seconds():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def run(build, plugins, extra, steps):
    d = tempfile.mkdtemp(prefix="ab-")
    env = dict(os.environ, SMP_PLUGIN_PATH=plugins, OMP_NUM_THREADS="1", **MALLOC)
    cmd = [build + "/bin/smp-launch", "--nproc-per-node", "1", "--threads-per-rank", "1", "--plugin", "gpt",
           "--config", HERE + "/configs/gpt-bench.toml", "--set", "run.threads=1", "--set", "run.dir=" + d,
           "--set", "train.steps=%d" % steps, "--set", "train.batch_size=8", "--set", "train.val_batches=0",
           "--set", "train.val_every=0", "--set", "run.log_to_file=false"]
    for o in extra:
        cmd += ["--set", o]
    b0, t0 = busy_seconds(), time.time()
    r0 = os.times()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r1, wall = os.times(), time.time() - t0
    own = (r1.children_user + r1.children_system) - (r0.children_user + r0.children_system)
    others = max(0.0, (busy_seconds() - b0 - own) / wall)
    with open(d + "/summary.json") as f:
        s = json.load(f)
    subprocess.run(["rm", "-rf", d])
    return s["step_seconds"], others


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--label", required=True, help="what B changes")
    ap.add_argument("--build", default=SRC + "/build")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quiet-cores", type=float, default=0.5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", SRC, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", SRC, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    result = {"benchmark": "ab-plugins", "change": a.label, "commit": commit + ("-dirty" if dirty else ""),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_1_5_15_before": os.getloadavg(),
              "method": "one rank, bench/configs/gpt-bench.toml, batch 8, %d steps (mean of steps 2..N, as "
                        "summary.json), 1 thread; per round each shape on A and B back to back, the order "
                        "alternating by round; ratio = B / A step seconds" % a.steps,
              "plugins_a": a.a, "plugins_b": a.b, "quiet_cores": a.quiet_cores, "invalid_attempts": [],
              "shapes": {}}
    rows = {k: {"a": [], "b": [], "b_over_a": []} for k in SHAPES}
    for r in range(a.rounds):
        for shape, extra in SHAPES.items():
            got = {}
            for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
                for attempt in range(4):
                    s, others = run(a.build, getattr(a, side), extra, a.steps)
                    if others <= a.quiet_cores or attempt == 3:
                        break
                    result["invalid_attempts"].append({"shape": shape, "round": r + 1, "side": side,
                                                       "others_cores": others, "step_seconds": s})
                got[side] = s
            rows[shape]["a"].append(got["a"])
            rows[shape]["b"].append(got["b"])
            rows[shape]["b_over_a"].append(got["b"] / got["a"])
            print("round %d %s: A %.2f ms, B %.2f ms, B/A %.4f" % (r + 1, shape, 1e3 * got["a"], 1e3 * got["b"],
                                                                   got["b"] / got["a"]), flush=True)
    for shape, v in rows.items():
        v["median_b_over_a"] = statistics.median(v["b_over_a"])
        result["shapes"][shape] = v
        print("%s: median B/A %.4f over %d rounds" % (shape, v["median_b_over_a"], len(v["b_over_a"])))
    result["load_1_5_15_after"] = os.getloadavg()
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
