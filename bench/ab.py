#!/usr/bin/env python3
"""A/B of smp step times between two sides: two builds (--build-a/-b), two
builds of smp's plugins and/or two sets of settings.

Side A runs --build-a's smp-launch (default --build), puts --a's plugin
folder first on SMP_PLUGIN_PATH and adds --a-set's overrides; side B
likewise (a side without a folder uses its build's own plugins).
Interleaved rounds (A then B, alternating which goes first), each shape per
round; per round the B/A step-time ratio, and their median. Runs
follow bench/validity.py's rule: a run during which other processes used more
than --quiet-cores is run again (at most 3 times) and listed.

--bench gpt: one rank, bench/configs/gpt-bench.toml at two shapes.
--bench moe-ep: two ranks, bench/configs/moe-bench.toml, dp 2 with ep 2.
--bench pp2: two ranks, gpt-bench.toml, pp 2 1F1B, batch 16, 4 and 8 microbatches.
--bench dp2: two ranks, gpt-bench.toml, dp 2.
--bench pp2dp2: four ranks, gpt-bench.toml, pp 2 x dp 2 1F1B, batch 16, 4 microbatches.

  bench/ab.py --a /tmp/old-plugins --b /tmp/new-plugins --label gelu \\
      --out bench/results/ab-gelu-kernel.json
  bench/ab.py --bench pp2 --a-set comm.shm_mb=0 --b-set comm.shm_mb=16 \\
      --label "pipeline sends through shared memory" --out bench/results/p2p-transport.json
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

from validity import Validity

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
BENCHES = {
    "gpt": {"nproc": 1, "plugin": "gpt", "config": "gpt-bench.toml",
            "common": ["train.batch_size=8", "train.val_batches=0", "train.val_every=0"],
            "shapes": {"bench (hidden 256, seq 128)": [], "small (hidden 64, seq 64)": ["model.hidden=64", "model.seq_len=64"]}},
    "moe-ep": {"nproc": 2, "plugin": "moe", "config": "moe-bench.toml", "common": ["parallel.dp=2"],
               "shapes": {"dp 2, ep 2": ["parallel.ep=2"]}},
    "pp2": {"nproc": 2, "plugin": "gpt", "config": "gpt-bench.toml",
            "common": ["parallel.pp=2", "parallel.schedule=1f1b", "train.batch_size=16", "train.val_batches=0",
                       "train.val_every=0"],
            "shapes": {"m4": ["parallel.microbatches=4"], "m8": ["parallel.microbatches=8"]}},
    "pp2dp2": {"nproc": 4, "plugin": "gpt", "config": "gpt-bench.toml",
               "common": ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=1f1b", "train.batch_size=16",
                          "parallel.microbatches=4", "train.val_batches=0", "train.val_every=0"],
               "shapes": {"pp 2 x dp 2": []}},
    "dp2": {"nproc": 2, "plugin": "gpt", "config": "gpt-bench.toml",
            "common": ["parallel.dp=2", "train.val_batches=0", "train.val_every=0"], "shapes": {"dp 2": []}},
}
MALLOC = {"MALLOC_TRIM_THRESHOLD_": "17179869184", "MALLOC_MMAP_THRESHOLD_": "33554432",
          "MALLOC_TOP_PAD_": "268435456"}


def run(build, plugins, bench, extra, steps):
    d = tempfile.mkdtemp(prefix="ab-")
    env = dict(os.environ, OMP_NUM_THREADS="1", **MALLOC)
    if plugins:
        env["SMP_PLUGIN_PATH"] = plugins
    cmd = [build + "/bin/smp-launch", "--nproc-per-node", str(bench["nproc"]), "--threads-per-rank", "1", "--plugin",
           bench["plugin"], "--config", HERE + "/configs/" + bench["config"], "--set", "run.threads=1", "--set",
           "run.dir=" + d, "--set", "train.steps=%d" % steps, "--set", "run.log_to_file=false"]
    for o in bench["common"] + extra:
        cmd += ["--set", o]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(d + "/summary.json") as f:
        s = json.load(f)
    subprocess.run(["rm", "-rf", d])
    return s["step_seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", default="", help="side A's plugin folder (default: the build's)")
    ap.add_argument("--b", default="", help="side B's plugin folder (default: the build's)")
    ap.add_argument("--a-set", action="append", default=[], help="side A's override key=value (repeatable)")
    ap.add_argument("--b-set", action="append", default=[], help="side B's override key=value (repeatable)")
    ap.add_argument("--label", required=True, help="what B changes")
    ap.add_argument("--bench", default="gpt", choices=sorted(BENCHES))
    ap.add_argument("--build", default=SRC + "/build")
    ap.add_argument("--build-a", default="", help="side A's build (core, smp-launch; default --build)")
    ap.add_argument("--build-b", default="", help="side B's build (default --build)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quiet-cores", type=float, default=0.5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    bench = BENCHES[a.bench]
    # HEAD, "-dirty" when tracked files other than the results changed (as every benchmark).
    commit = subprocess.run(["bash", HERE + "/source_commit.sh"], capture_output=True, text=True).stdout.strip()
    validity = Validity(a.quiet_cores)
    result = {"benchmark": "ab", "bench": a.bench, "change": a.label, "commit": commit,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_1_5_15_before": os.getloadavg(),
              "method": "%d rank(s), bench/configs/%s, overrides %s, %d steps (mean of steps 2..N, as summary.json), "
                        "1 thread per rank; per round each shape on A and B back to back, the order alternating by "
                        "round; ratio = B / A step seconds" % (bench["nproc"], bench["config"], bench["common"], a.steps),
              "build_a": a.build_a or a.build, "build_b": a.build_b or a.build,
              "plugins_a": a.a or "the build's", "plugins_b": a.b or "the build's", "set_a": a.a_set,
              "set_b": a.b_set, "shapes": {}}
    rows = {k: {"a": [], "b": [], "b_over_a": []} for k in bench["shapes"]}
    for r in range(a.rounds):
        for shape, extra in bench["shapes"].items():
            got = {}
            for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
                sets = a.a_set if side == "a" else a.b_set
                got[side] = validity.measure("%s %s" % (shape, side), r + 1,
                                             lambda: run(getattr(a, "build_" + side) or a.build, getattr(a, side), bench,
                                                         extra + sets, a.steps))
            rows[shape]["a"].append(got["a"])
            rows[shape]["b"].append(got["b"])
            rows[shape]["b_over_a"].append(got["b"] / got["a"])
            print("round %d %s: A %.2f ms, B %.2f ms, B/A %.4f" % (r + 1, shape, 1e3 * got["a"], 1e3 * got["b"],
                                                                   got["b"] / got["a"]), flush=True)
    for shape, v in rows.items():
        v["median_b_over_a"] = statistics.median(v["b_over_a"])
        result["shapes"][shape] = v
        print("%s: median B/A %.4f over %d rounds" % (shape, v["median_b_over_a"], len(v["b_over_a"])))
    result["validity"] = validity.json()
    result["load_1_5_15_after"] = os.getloadavg()
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
