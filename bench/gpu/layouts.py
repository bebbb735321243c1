#!/usr/bin/env python3
"""The layouts step of scripts/gpu/check.sh: two ranks sharing one GPU, their
CUDA tensors crossing through host memory over Gloo (comm.cuda_backend =
"gloo", run.devices = [0, 0]), each layout against the serial run of the same
small GPT (tests/integration/data/gpt-equiv.toml), as tests/integration/
cuda_jobs_test.cpp compares them:

  - every pipeline schedule at pp 2: gpipe, 1f1b, interleaved-1f1b with
    virtual_stages 2, zb-h1: losses within 2e-5 (relative) and parameters
    within 2e-4 of the serial run's (run.dump_parameters);
  - ZeRO-3 at dp 2: the same bounds;
  - a checkpoint saved from the GPU and resumed (ZeRO-3, dp 2: sharded state):
    a run stopped after step 2 (run.exit_after_steps) and continued from its
    checkpoint must end with the parameters and losses of the run never
    stopped, bit for bit.

  python3 bench/gpu/layouts.py --bin build/bin --device cuda --out layouts.json
  python3 bench/gpu/layouts.py --bin build/bin --device cpu ...   # the dry run

With --device cpu (the check's dry run) the same jobs run on CPU ranks, without
the CUDA-only settings. Prints one line per case and writes one JSON object:
{case: {status, seconds, worst_loss_rel, worst_param_abs, ...}}; exits 1 when a
case failed. --budget-s stops starting cases once that many seconds have gone
(the rest are recorded "not run: budget").
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

LOSS_TOL, PARAM_TOL = 2e-5, 2e-4


def params_of(run_dir, folder="parameters"):
    """Every parameter by name from the ranks' dumps: the dp 0 replica on the
    lowest pp stage holding it, tp shards joined (tp is 1 here)."""
    best = {}
    d = os.path.join(run_dir, folder)
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name)) as f:
            j = json.load(f)
        if j.get("dp", 0) != 0 or j.get("tp", 0) != 0:
            continue
        for p in j["parameters"]:
            key = p["name"]
            if key not in best or j["pp"] < best[key][0]:
                best[key] = (j["pp"], p["data"])
    return {k: v[1] for k, v in best.items()}


def worst_param_diff(a, b):
    if set(a) != set(b):
        return float("inf"), f"parameter names differ: {sorted(set(a) ^ set(b))[:4]}"
    worst = 0.0
    for k in a:
        if len(a[k]) != len(b[k]):
            return float("inf"), f"{k}: sizes differ"
        worst = max(worst, max((abs(x - y) for x, y in zip(a[k], b[k])), default=0.0))
    return worst, ""


def worst_loss_diff(a, b):
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


class Runner:
    def __init__(self, args):
        self.a = args
        self.root = tempfile.mkdtemp(prefix="smp-gpu-layouts.")
        self.t0 = time.time()

    def run(self, name, nproc, sets, run_dir=None):
        """One smp-launch job; returns (exit code, seconds, summary or None, run_dir, tail of output)."""
        a = self.a
        run_dir = run_dir or os.path.join(self.root, name)
        base = [f"run.device=\"{a.device}\""]
        if a.device == "cuda" and nproc > 1:
            base += ["run.devices=[0, 0]", "comm.cuda_backend=\"gloo\""]
        sets = base + ["run.dump_parameters=true", f"run.dir=\"{run_dir}\"", f"train.steps={a.steps}"] + sets
        cmd = [os.path.join(a.bin, "smp-launch"), "--nproc-per-node", str(nproc), "--plugin", "gpt",
               "--config", a.config]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.time()
        for _attempt in range(3):  # another job can take the rendezvous port first (as job_runner.cpp retries)
            try:
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   timeout=a.job_timeout_s)
                rc, out = p.returncode, p.stdout
            except subprocess.TimeoutExpired as e:
                rc, out = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                out += f"\n(killed after {a.job_timeout_s} s)"
            if rc == 0 or ("EADDRINUSE" not in out and "Address already in use" not in out):
                break
        secs = time.time() - t0
        if a.verbose:
            print(out)
        summary = None
        sp = os.path.join(run_dir, "summary.json")
        if os.path.exists(sp):
            with open(sp) as f:
                summary = json.load(f)
        tail = " | ".join(out.strip().splitlines()[-4:])[-600:]
        return rc, secs, summary, run_dir, tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bin", required=True, help="the folder of smp-launch")
    ap.add_argument("--config", default=os.path.join(here, "..", "..", "tests", "integration", "data", "gpt-equiv.toml"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--job-timeout-s", type=int, default=90)
    ap.add_argument("--budget-s", type=float, default=0, help="start no case after this many seconds (0: no limit)")
    ap.add_argument("--only", default="", help="comma-separated cases to run (default: all)")
    ap.add_argument("--out")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    r = Runner(a)

    cases = [
        ("pp2-gpipe", ["parallel.pp=2", "parallel.schedule=\"gpipe\""]),
        ("pp2-1f1b", ["parallel.pp=2", "parallel.schedule=\"1f1b\""]),
        ("pp2-interleaved-1f1b-v2", ["parallel.pp=2", "parallel.schedule=\"interleaved-1f1b\"",
                                     "parallel.virtual_stages=2"]),
        ("pp2-zb-h1", ["parallel.pp=2", "parallel.schedule=\"zb-h1\""]),
        ("dp2-zero3", ["parallel.dp=2", "parallel.zero=3"]),
    ]
    only = set(filter(None, a.only.split(",")))
    results = {}

    def budget_left():
        return a.budget_s <= 0 or time.time() - r.t0 < a.budget_s

    def record(name, res):
        results[name] = res
        print(f"layouts: {name}: {res['status']} ({res.get('seconds', 0):.1f} s)", flush=True)

    serial = None
    if budget_left():
        rc, secs, summary, sdir, tail = r.run("serial", 1, [])
        if rc == 0 and summary:
            serial = (summary["losses"], params_of(sdir))
            record("serial", {"status": "ok", "seconds": secs, "losses": summary["losses"]})
        else:
            record("serial", {"status": f"failed: smp-launch exited {rc}: {tail}", "seconds": secs})
    for name, sets in cases:
        if only and name not in only:
            continue
        if not budget_left():
            results[name] = {"status": "not run: budget"}
            continue
        if serial is None:
            results[name] = {"status": "not run: the serial reference failed"}
            continue
        rc, secs, summary, rdir, tail = r.run(name, 2, sets)
        if rc != 0 or not summary:
            record(name, {"status": f"failed: smp-launch exited {rc}: {tail}", "seconds": secs})
            continue
        dl = worst_loss_diff(summary["losses"], serial[0])
        dp, problem = worst_param_diff(params_of(rdir), serial[1])
        ok = dl <= LOSS_TOL and dp <= PARAM_TOL
        status = "ok" if ok else (f"failed: {problem}" if problem else
                                  f"failed: worst loss difference {dl:.2e} (<= {LOSS_TOL:g}), "
                                  f"worst parameter difference {dp:.2e} (<= {PARAM_TOL:g})")
        record(name, {"status": status, "seconds": secs, "worst_loss_rel": dl, "worst_param_abs": dp,
                      "loss_tol": LOSS_TOL, "param_tol": PARAM_TOL})

    # A checkpoint saved from the device (ZeRO-3's shards) and resumed: bit for bit.
    name = "checkpoint-resume-dp2-zero3"
    if not only or name in only:
        if not budget_left():
            results[name] = {"status": "not run: budget"}
        else:
            ck = ["parallel.dp=2", "parallel.zero=3", "run.checkpoint_every=2", "run.checkpoint_async=false"]
            t0 = time.time()
            rc1, _, whole, wdir, tail1 = r.run("ckpt-whole", 2, ck)
            stop_dir = os.path.join(r.root, "ckpt-stopped")
            rc2, _, _, _, tail2 = r.run("ckpt-stopped", 2, ck + ["run.exit_after_steps=2"], run_dir=stop_dir)
            rc3, _, resumed, _, tail3 = (r.run("ckpt-stopped", 2, ck, run_dir=stop_dir) if rc2 == 0
                                         else (rc2, 0, None, stop_dir, tail2))
            secs = time.time() - t0
            if rc1 != 0 or not whole:
                record(name, {"status": f"failed: the whole run exited {rc1}: {tail1}", "seconds": secs})
            elif rc3 != 0 or not resumed:
                record(name, {"status": f"failed: the stopped/resumed run exited {rc3}: {tail3}", "seconds": secs})
            else:
                resumed_from = (resumed.get("checkpoints") or {}).get("resumed_from", "")
                lw, lr = whole["losses"], resumed["losses"]
                tail_equal = len(lr) >= 1 and lw[-len(lr):] == lr
                dp, problem = worst_param_diff(params_of(stop_dir), params_of(wdir))
                ok = bool(resumed_from) and tail_equal and dp == 0 and not problem
                why = []
                if not resumed_from:
                    why.append("the second run did not resume (summary.checkpoints.resumed_from is empty)")
                if not tail_equal:
                    why.append(f"losses after resuming {lr} != the whole run's {lw[-len(lr):] if lr else lw}")
                if dp != 0 or problem:
                    why.append(problem or f"parameters differ by up to {dp:.3e}")
                record(name, {"status": "ok" if ok else "failed: " + "; ".join(why), "seconds": secs,
                              "resumed_from": resumed_from, "losses_whole": lw, "losses_resumed": lr,
                              "worst_param_abs": dp, "bit_for_bit": ok})

    if not a.keep:
        shutil.rmtree(r.root, ignore_errors=True)
    doc = {"device": a.device, "config": os.path.relpath(a.config), "steps": a.steps,
           "shared_gpu_over_gloo": a.device == "cuda", "cases": results,
           "seconds": time.time() - r.t0}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    bad = [k for k, v in results.items() if not v["status"].startswith("ok")]
    print(f"layouts: {len(results) - len(bad)} of {len(results)} ok" + (f"; not ok: {', '.join(bad)}" if bad else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
