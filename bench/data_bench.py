#!/usr/bin/env python3
"""Prepared data: smp-data prepare's throughput against SentencePiece's own
spm_encode, the data time's share of a GPT-small step, and GPT-small on a
SentencePiece-tokenized corpus against byte level (validation loss per byte).

The corpus is /usr/share/common-licenses (base-files), repeated --copies
times as separate documents. Rounds are interleaved: each round runs every
prepare variant once; medians over rounds. Writes every repeat to --out.

  python3 bench/data_bench.py --build build --rounds 5 --out bench/results/data.json
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from validity import Validity

LICENCES = "/usr/share/common-licenses"


def source_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(["bash", os.path.join(here, "source_commit.sh")], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def timed(cmd, stdout=subprocess.DEVNULL):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0, r


def job(build, config, sets, nproc=2, cwd=None):
    d = tempfile.mkdtemp(prefix="smp-data-bench-")
    build = os.path.abspath(build)
    cmd = [os.path.join(build, "bin", "smp-launch"), "--nproc-per-node", str(nproc), "--threads-per-rank", "1",
           "--master-port", "0", "--plugin", os.path.join(build, "lib", "smp", "plugins", "gpt.so"),
           "--config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", config)]
    for s in sets + [f"run.dir={d}", "run.log_to_file=false"]:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        sys.exit(f"job failed: {sets}\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    return d, json.load(open(os.path.join(d, "summary.json")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--copies", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out")
    a = ap.parse_args()
    tool = os.path.join(a.build, "bin", "smp-data")
    os.environ["SMP_BUILD_DIR"] = os.path.abspath(a.build)  # for scripts/prepare_licenses_spm.sh
    work = tempfile.mkdtemp(prefix="smp-data-bench-")
    cores = os.cpu_count() or 1
    out = {"benchmark": "data", "commit": source_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "cores": cores, "corpus": f"{LICENCES}, {a.copies} copies of each file as separate documents",
           "rounds": a.rounds}
    try:
        corpus = os.path.join(work, "corpus")
        os.makedirs(corpus)
        names = sorted(os.listdir(LICENCES))
        for c in range(a.copies):
            for n in names:
                shutil.copy(os.path.join(LICENCES, n), os.path.join(corpus, f"{c:03d}-{n}"))
        files = [os.path.join(corpus, n) for n in sorted(os.listdir(corpus))]
        total_bytes = sum(os.path.getsize(f) for f in files)
        out["corpus_bytes"] = total_bytes
        model = os.path.join(work, "spm")
        timed([tool, "tokenizer", "--type", "unigram", "--vocab", str(a.vocab), "--input", LICENCES,
               "--output-prefix", model])
        # 1. Throughput: smp-data on 1 thread and on every core, spm_encode (one thread), interleaved.
        variants = {"smp-data 1 thread": ["--workers", "1"], "smp-data all threads": ["--workers", str(cores)]}
        seconds = {k: [] for k in list(variants) + ["spm_encode"]}
        tokens = 0
        validity = Validity()
        out["load_1_5_15_at_start"] = os.getloadavg()
        for rnd in range(a.rounds):
            for name, extra in variants.items():
                t, r = validity.measure(name, rnd + 1, lambda: timed(
                    [tool, "prepare", "--input", corpus, "--tokenizer", "sentencepiece", "--tokenizer-model",
                     model + ".model", "--output-prefix", os.path.join(work, "tp")] + extra, stdout=subprocess.PIPE))
                seconds[name].append(t)
                tokens = json.loads(r.stdout.strip().splitlines()[-1])["tokens"]

            def spm_encode():
                with open(os.devnull, "w") as null:
                    return timed(["spm_encode", "--model", model + ".model", "--output_format", "id"] + files,
                                 stdout=null)
            t, _ = validity.measure("spm_encode", rnd + 1, spm_encode)
            seconds["spm_encode"].append(t)
        out["prepare"] = {
            "method": "wall time of the whole command (reading, tokenizing, writing), SentencePiece unigram model "
                      f"of {a.vocab} pieces trained on the licences; spm_encode --output_format id to /dev/null; "
                      "each round runs all three; medians over rounds",
            "tokens": tokens, "seconds": seconds,
            "median_mb_per_s": {k: total_bytes / statistics.median(v) / 1e6 for k, v in seconds.items()},
            "smp_threads_over_spm_encode": statistics.median(
                [s / t for s, t in zip(seconds["spm_encode"], seconds["smp-data all threads"])]),
            "smp_1thread_over_spm_encode": statistics.median(
                [s / t for s, t in zip(seconds["spm_encode"], seconds["smp-data 1 thread"])]),
        }
        print(json.dumps(out["prepare"]["median_mb_per_s"]), flush=True)
        # 2. Byte level against SentencePiece, GPT small, same steps and batch; the data share from the trace.
        bytes_prefix = os.path.join(work, "bytes")
        timed([tool, "prepare", "--input", LICENCES, "--output-prefix", bytes_prefix])
        # The preset's corpus, written by its own script into <work>/data, where the preset looks (cwd).
        here = os.path.dirname(os.path.abspath(__file__))
        _, r = timed(["bash", os.path.join(here, "..", "scripts", "prepare_licenses_spm.sh"), os.path.join(work, "data")],
                     stdout=subprocess.PIPE)
        spm_tokens = json.loads(r.stdout.strip().splitlines()[-1])["tokens"]
        lic_bytes = sum(os.path.getsize(os.path.join(LICENCES, n)) for n in names)
        common = ["parallel.dp=2", f"train.steps={a.steps}", f"train.val_every={a.steps}", "train.val_batches=8"]
        runs = {}
        for name, config, sets in (("bytes", "gpt-small.toml", [f"model.data={bytes_prefix}", "model.vocab=257"]),
                                   ("sentencepiece", "gpt-small-spm.toml", [])):
            d, s = validity.measure(name, 1, lambda: job(a.build, config, common + sets + ["run.trace=true"], cwd=work))
            trace = json.load(open(os.path.join(d, "trace", "rank-0.json")))
            steps = sum(e.get("dur", 0) for e in trace["traceEvents"] if e.get("cat") == "step" and e.get("ph") == "X")
            data_us = sum(e.get("dur", 0) for e in trace["traceEvents"] if e.get("cat") == "data" and e.get("ph") == "X")
            runs[name] = {"val_loss_per_token": s["val_loss"], "step_seconds": s["step_seconds"],
                          "data_share_of_step": data_us / steps if steps else None}
            shutil.rmtree(d, ignore_errors=True)
        # nats per byte: per token x tokens per byte (end-of-document ids counted as tokens, as the model sees them)
        runs["bytes"]["tokens_per_byte"] = (lic_bytes + len(names)) / lic_bytes
        runs["sentencepiece"]["tokens_per_byte"] = spm_tokens / lic_bytes
        for r in runs.values():
            r["val_loss_per_byte"] = r["val_loss_per_token"] * r["tokens_per_byte"]
        out["quality"] = {
            "method": f"configs/gpt-small-spm.toml (the licences prepared by scripts/prepare_licenses_spm.sh: "
                      "SentencePiece unigram, 2000 pieces) against configs/gpt-small.toml on the licences prepared "
                      f"byte level (vocab 257), both at dp 2, {a.steps} steps, same batch and sequence length in "
                      "tokens; validation loss per byte = per token x the corpus' tokens per byte; run.trace on: "
                      "data share = rank 0's 'batch' events over its traced steps",
            "runs": runs,
            "spm_below_bytes_per_byte": runs["sentencepiece"]["val_loss_per_byte"] < runs["bytes"]["val_loss_per_byte"],
            "data_share_goal": 0.01,
            "data_share_met": all(r["data_share_of_step"] is not None and r["data_share_of_step"] < 0.01
                                  for r in runs.values()),
        }
        print(json.dumps(out["quality"]["runs"]), flush=True)
        out["validity"] = validity.json()
        out["load_1_5_15_at_end"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
