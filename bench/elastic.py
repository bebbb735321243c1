#!/usr/bin/env python3
"""Elastic re-formation times on two network-namespace hosts (root, `ip`).

The job of tests/integration/elastic_test.cpp: GPT (the equivalence model)
with SGD, 2 ranks per host, pp 2 x dp 2 on 4 ranks, pp 1 x dp 2 on 2 (the
job's [elastic.layouts]), a checkpoint every --every steps. Per repeat: after
a checkpoint host B's link is cut and every process in it killed (a machine
lost without a word: the rendezvous hears of it by its keepalive,
--keepalive seconds); the job goes on on host A; B's launcher is started
again and the job grows back at A's next committed checkpoint.

Measured per repeat, on this script's clock as the launchers' lines arrive:
  shrink_seconds: from the loss to host A's first step on 2 ranks
    (detection = the keepalive, stopping A's ranks, re-forming, loading);
  detect_seconds: from the loss to A's launcher being told to stop;
  grow_seconds: from B's launcher starting to the first step on 4 ranks
    (waiting for the next checkpoint, stopping, re-forming, loading);
  lost_steps_*: the steps computed again (the last step logged before the
    change minus the step the new world resumed at).
With --snapshot-every K the job keeps in-memory snapshots every K steps
(run.snapshot_every) and no checkpoint on disk at all: every re-formation
loads from memory.

  sudo bench/elastic.py --repeats 5 --out bench/results/elastic.json
"""
import argparse, json, os, re, shutil, subprocess, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def sh(cmd):
    return subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


class Hosts:
    def __init__(self):
        pid = os.getpid()
        self.a, self.b = "smp-ea-%d" % pid, "smp-eb-%d" % pid
        self.va, self.vb = "smpea%d" % (pid % 100000), "smpeb%d" % (pid % 100000)
        net = "10.232.%d." % (pid % 250 + 1)
        self.addr_a, self.addr_b = net + "1", net + "2"
        ok = all(sh(c) == 0 for c in [
            "ip netns add " + self.a, "ip netns add " + self.b,
            "ip link add %s type veth peer name %s" % (self.va, self.vb),
            "ip link set %s netns %s" % (self.va, self.a), "ip link set %s netns %s" % (self.vb, self.b),
            "ip -n %s addr add %s/24 dev %s" % (self.a, self.addr_a, self.va),
            "ip -n %s addr add %s/24 dev %s" % (self.b, self.addr_b, self.vb),
            "ip -n %s link set lo up" % self.a, "ip -n %s link set lo up" % self.b])
        if not ok or not self.link(True):
            self.close()
            raise SystemExit("bench/elastic.py: cannot make network namespaces here (root and iproute2 needed)")

    def link(self, up):
        ok = sh("ip -n %s link set %s %s" % (self.a, self.va, "up" if up else "down")) == 0
        return ok and (not up or sh("ip -n %s link set %s up" % (self.b, self.vb)) == 0)

    def kill_all(self, ns):
        sh("ip netns pids %s | xargs -r kill -9" % ns)

    def close(self):
        for ns in (self.b, self.a):
            self.kill_all(ns)
            sh("ip netns del " + ns)


class Launcher:
    """One host's smp-launch; its lines with their arrival times."""

    def __init__(self, cmd):
        self.lines, self.lock = [], threading.Lock()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern, after=0.0):
        rx = re.compile(pattern)
        with self.lock:
            for t, line in self.lines:
                if t >= after and rx.search(line):
                    return t, line
        return None

    def wait(self, pattern, timeout, after=0.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.first(pattern, after)
            if got:
                return got
            time.sleep(0.01)
        raise RuntimeError("no line matching %r within %d s" % (pattern, timeout))

    def last_step_before(self, t):
        step = -1
        with self.lock:
            for when, line in self.lines:
                m = re.search(r"\] step (\d+)/", line)
                if when <= t and m:
                    step = int(m.group(1))
        return step


def repeat(hosts, build, args, port):
    run_dir = tempfile.mkdtemp(prefix="smp-elastic-bench-")
    job = os.path.join(run_dir, "job.toml")
    with open(os.path.join(SRC, "tests/integration/data/gpt-equiv.toml")) as f:
        text = f.read()
    with open(job, "w") as f:
        f.write(text + "\n[elastic.layouts]\n4 = { pp = 2, dp = 2, microbatches = 4 }\n"
                "2 = { pp = 1, dp = 2, microbatches = 2 }\n")
    sets = ["train.steps=%d" % args.steps, "train.log_every=1", 'train.optimizer="sgd"', "train.lr=0.05",
            "train.val_batches=0", "run.checkpoint_every=%d" % args.every, "comm.shm_mb=0",
            'run.dir="%s"' % os.path.join(run_dir, "run")]
    memory = None
    if args.snapshot_every:
        memory = tempfile.mkdtemp(prefix="smp-elastic-bench-", dir="/dev/shm")
        sets += ["run.checkpoint_every=0", "run.snapshot_every=%d" % args.snapshot_every,
                 'run.snapshot_dir="%s"' % memory]

    def cmd(ns, name):
        c = ["ip", "netns", "exec", ns, build + "/bin/smp-launch", "--nproc-per-node", "2", "--nnodes", "1:2",
             "--rdzv-endpoint", "%s:%d" % (hosts.addr_a, port), "--rdzv-keepalive", str(args.keepalive),
             "--kill-timeout", "2", "--node-name", name, "--plugin", build + "/lib/smp/plugins/gpt.so",
             "--config", job]
        for s in sets:
            c += ["--set", s]
        return c

    a = Launcher(cmd(hosts.a, "a"))
    a.wait("serving the rendezvous", 30)
    b = Launcher(cmd(hosts.b, "b"))
    try:
        latest = os.path.join(run_dir, "run", "checkpoints", "latest")
        deadline = time.monotonic() + 300
        while True:
            step = -1
            if args.snapshot_every:
                step = 2 * args.snapshot_every if a.first(r"\] step %d/" % (2 * args.snapshot_every)) else -1
                if step >= 0 and a.first(r"\] step %d/" % (step + 2)):
                    break
            elif os.path.exists(latest):
                with open(latest) as f:
                    m = re.search(r"(\d+)", f.read())
                step = int(m.group(1)) if m else -1
            if not args.snapshot_every and step >= args.every and a.first(r"\] step %d/" % (step + 2)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no step past the first checkpoint")
            time.sleep(0.01)
        hosts.link(False)
        hosts.kill_all(hosts.b)
        lost = time.monotonic()
        if memory:  # its memory is gone with it (the hosts share this machine's /dev/shm)
            for run in os.listdir(memory):
                shutil.rmtree(os.path.join(memory, run, "b"), ignore_errors=True)
        b.proc.wait()
        detect = a.wait(r"the job re-forms", 120, lost)[0]
        first_small = a.wait(r"elastic: round 1 .*first step", 120, lost)
        resumed_small = int(re.search(r"resumed at step (\d+)", first_small[1]).group(1))
        hosts.link(True)
        back = time.monotonic()
        b2 = Launcher(cmd(hosts.b, "b"))
        stop_grow = a.wait(r"the job re-forms: b joined", 120, back)[0]
        first_big = a.wait(r"elastic: round 2 .*first step", 120, back)
        resumed_big = int(re.search(r"resumed at step (\d+)", first_big[1]).group(1))
        a.proc.wait(timeout=300)
        b2.proc.wait(timeout=60)
        if a.proc.returncode != 0 or b2.proc.returncode != 0:
            raise RuntimeError("the job failed: exit %s / %s" % (a.proc.returncode, b2.proc.returncode))
        return {"shrink_seconds": round(first_small[0] - lost, 3), "detect_seconds": round(detect - lost, 3),
                "grow_seconds": round(first_big[0] - back, 3),
                "grow_wait_for_checkpoint_seconds": round(stop_grow - back, 3),
                "lost_steps_shrink": a.last_step_before(lost) - resumed_small,
                "lost_steps_grow": a.last_step_before(stop_grow) - resumed_big,
                "resumed_at": [resumed_small, resumed_big]}
    finally:
        for l in (a, b):
            if l.proc.poll() is None:
                l.proc.kill()
        hosts.kill_all(hosts.a)
        hosts.kill_all(hosts.b)
        hosts.link(True)
        shutil.rmtree(run_dir, ignore_errors=True)
        if memory:
            shutil.rmtree(memory, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=SRC + "/build")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10, help="run.checkpoint_every")
    ap.add_argument("--keepalive", type=float, default=4, help="--rdzv-keepalive seconds")
    ap.add_argument("--snapshot-every", type=int, default=0, help="run.snapshot_every (and no disk checkpoints)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("ip"):
        raise SystemExit("bench/elastic.py: needs root and iproute2 (network namespaces)")
    commit = subprocess.run(["bash", HERE + "/source_commit.sh"], capture_output=True, text=True).stdout.strip()
    result = {"benchmark": "elastic", "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_1_5_15_before": os.getloadavg(), "cores": os.cpu_count(),
              "method": "two network-namespace hosts of 2 ranks on this machine (veth), GPT equivalence model "
                        "(tests/integration/data/gpt-equiv.toml) with SGD, pp 2 x dp 2 on 4 ranks, pp 1 x dp 2 on 2, "
                        "%s, --rdzv-keepalive %g s; host B lost after a checkpoint (link cut, "
                        "its processes killed), started again once host A trains on 2 ranks; times on the bench's "
                        "clock as the launchers' lines arrive" % (
                            "in-memory snapshots every %d steps, no disk checkpoint" % args.snapshot_every
                            if args.snapshot_every else "a disk checkpoint every %d steps" % args.every,
                            args.keepalive),
              "snapshot_every": args.snapshot_every, "checkpoint_every": 0 if args.snapshot_every else args.every,
              "repeats": []}
    hosts = Hosts()
    try:
        for i in range(args.repeats):
            port = 29400 + (os.getpid() + i) % 500
            r = repeat(hosts, args.build, args, port)
            print("repeat %d: %s" % (i, json.dumps(r)), flush=True)
            result["repeats"].append(r)
    finally:
        hosts.close()
    result["load_1_5_15_after"] = os.getloadavg()
    for key in ("shrink_seconds", "detect_seconds", "grow_seconds", "grow_wait_for_checkpoint_seconds",
                "lost_steps_shrink", "lost_steps_grow"):
        values = sorted(r[key] for r in result["repeats"])
        result["median_" + key] = values[len(values) // 2]
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k.startswith("median")}))


if __name__ == "__main__":
    main()
