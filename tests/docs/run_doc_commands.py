#!/usr/bin/env python3
"""Runs every shell command the docs show (issue 37: "the docs run as written").

Every ```sh block (also ```bash, ```shell, ```console) of README.md and
docs/**/*.md is split into commands (continuation lines joined, comment lines
dropped; in a block with `$ ` prompts only the prompted lines are commands, the
rest is output). Each command is then classified by RULES below, first match
wins:

  run    run it, after the rule's rewrites (scale: fewer steps; fill in what the
         doc leaves to the reader, such as `...`); it must exit 0 (and print
         what the rule expects, where the doc claims something of it)
  fail   run it; the doc shows it being refused: it must exit non-zero and
         print what the doc says
  skip   do not run it, for the reason given (needs root, a GPU, the network, ...)

A command no rule matches fails the test as "unclassified", and so does a rule
that matches no command (the docs changed under it): a new or changed doc
command is never silently ignored. A fence without a language whose first line
looks like a command fails too (label it ```sh, or ```text for output).

Commands of one doc file run in order, each in its own bash, in one fresh
working folder per file (a reader's checkout: configs/, scripts/, tests/,
examples/ and sdk/ link to the repository's, build/ to the build folder, PATH
has build/bin, HOME is a folder inside it), so whatever they write stays in the
temporary folder. Every path a command names under configs/, scripts/,
tests/, examples/, sdk/ or build/bin/ must exist, skipped commands included.

  run_doc_commands.py --repo <source dir> --build <build dir> [--list] [--keep] [--only REGEX]
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SHELL_LANGS = {"sh", "bash", "shell", "console"}
# Folders of the repository a command may name, linked into each working folder.
LINKED = ["configs", "scripts", "tests", "examples", "sdk"]
COMMAND_TIMEOUT_S = 90


class Rule:
    def __init__(self, action, cmd, why, file=r".*", subs=(), expect=None, tag=None, check=None,
                 timeout_s=COMMAND_TIMEOUT_S):
        self.action = action  # "run", "fail" or "skip"
        self.timeout_s = timeout_s  # run: the command's own limit
        self.file = re.compile(file)
        self.cmd = re.compile(cmd)
        self.why = why
        self.subs = [(re.compile(p), r) for p, r in subs]
        self.expect = re.compile(expect) if expect else None
        self.tag = tag  # skip: the short reason in the summary
        self.check = check  # run: check(output, the doc's text after the block) -> [problem, ...]
        self.used = 0

    def matches(self, path, cmd):
        return self.file.search(path) and self.cmd.search(cmd)

    def rewrite(self, cmd):
        for p, r in self.subs:
            cmd = p.sub(r, cmd)
        return cmd


# ---- scale ------------------------------------------------------------------
# A training job of the docs runs 2 steps: the configs train 200-300, which
# takes minutes; 2 steps still builds the layout, runs the schedule forward and
# backward, the optimizer, validation at the end, the summary and checkpoints.
STEPS = 2


def steps(n):
    """Rewrites giving an smp-launch job (--plugin/--config, no `--`) n steps:
    its own `--set train.steps=` is replaced, else one is added at the end."""
    return [(r"--set train\.steps=\d+", "--set train.steps=%d" % n),
            (r"^(?!.*--set train\.steps=)(.*)$", r"\1 --set train.steps=%d" % n)]


def check_estimate_table(out, after):
    """The table after docs/memory.md's estimate is the command's output,
    each figure rounded (half away from zero) from the exact bytes of the
    JSON line it prints, to the decimals the table shows. A row is
    `pp rank N` or `pp ranks A-B`; a cell `x → y` gives ranks A and B."""
    doc = next((json.loads(l) for l in out.splitlines() if l.startswith("{") and "per_pp_rank" in l), None)
    if doc is None:
        return ["no JSON line with per_pp_rank in the output"]
    ranks = {r["pp_rank"]: r for r in doc["per_pp_rank"]}
    keys = ["parameters", "gradients", "optimizer_state", "step_peak", "total"]
    problems, rows = [], 0
    for line in after.split("\n"):
        if rows and not line.startswith("|"):
            break
        m = re.match(r"^\| *pp ranks? (\d+)(?:-(\d+))?[^|]*\|(.*)\|\s*$", line)
        if not m:
            continue
        rows += 1
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        for key, cell in zip(keys, m.group(3).split("|")):
            values = [v.strip() for v in cell.split("→")]
            for rank, shown in zip([first, last] if len(values) == 2 else [first], values):
                exact = ranks[rank][key] / 2 ** 30
                decimals = len(shown.split(".")[1]) if "." in shown else 0
                want = "%.*f" % (decimals, float(int(exact * 10 ** decimals + 0.5)) / 10 ** decimals)
                if shown != want:
                    problems.append("the table after the block: pp rank %d %s is %s, the estimate says %s (%.4f GiB)"
                                    % (rank, key, shown, want, exact))
    return problems if rows else ["no `| pp rank ...` table after the block"]


SKIP_SUITE = ("the whole test suite, this test included (CI runs it: .ci/run calls scripts/test.sh)")
SKIP_OUT_OF_TREE = ("installs build/ and compiles separate CMake projects against the install (minutes on 2 cores); "
                    "sdk_out_of_tree_test (SdkOutOfTree.InstallBuildAPluginAgainstItLoadItAndTrain, label slow) "
                    "runs these same steps: cmake --install, sdk/example and examples/embed configured with "
                    "CMAKE_PREFIX_PATH=<prefix>, built, smp_embed run on example_scale.so")

RULES = [
    # README.md: the two commands.
    Rule("run", r"^bash scripts/setup\.sh$", file=r"^README\.md$",
         subs=[(r"^bash scripts/setup\.sh$", "bash scripts/run_default_job.sh --set train.steps=%d" % STEPS)],
         why="installing packages as root and building build/ is what CI does (.ci/run -> scripts/test.sh -> "
             "setup.sh --no-job); the rest of setup.sh is the default job, run here as setup.sh runs it "
             "(scripts/run_default_job.sh), 2 steps"),
    Rule("skip", r"^bash scripts/test\.sh$", file=r"^README\.md$", tag="whole suite", why=SKIP_SUITE),
    Rule("skip", r"^ctest --test-dir build --output-on-failure -j2$", file=r"^README\.md$", tag="whole suite",
         why=SKIP_SUITE),
    # docs/checkpoints.md: save, resume in another layout, then the tools on what was saved.
    Rule("run", r"^build/bin/smp-launch .*--set parallel\.pp=2 --set parallel\.tp=2 --set run\.checkpoint_every=100$",
         file=r"^docs/checkpoints\.md$", subs=steps(4) + [(r"$", " --set run.exit_after_steps=2")],
         expect=r"checkpoint \S+/runs/gpt-small/checkpoints/step-00000002: ",
         why="a job of 4 steps that stops after 2 (run.exit_after_steps: a checkpoint is saved first), so that "
             "the next command has steps left to resume"),
    Rule("run", r"^build/bin/smp-launch .*--set parallel\.dp=2 --set parallel\.zero=3 --set run\.checkpoint_every=100$",
         file=r"^docs/checkpoints\.md$", subs=steps(4),
         expect=r"loaded checkpoint runs/gpt-small/checkpoints/step-00000002 \(step 2, saved at pp=2 tp=2 ",
         why="the same job of 4 steps: it must continue from the previous command's checkpoint (step 2, pp 2 x "
             "tp 2) in its own layout"),
    Rule("run", r"^build/bin/smp-checkpoint inspect .*\[--tensors\]", file=r"^docs/checkpoints\.md$",
         subs=[(r"\[--tensors\]", "--tensors")], why="`[--tensors]` is the doc's notation for an optional flag"),
    Rule("run", r"^build/bin/smp-launch \.\.\. ", file=r"^docs/checkpoints\.md$",
         subs=[(r"^build/bin/smp-launch \.\.\. ",
                "build/bin/smp-launch --nproc-per-node 2 --plugin gpt --config configs/gpt-small.toml "
                "--set run.dir=runs/from-imported ")] + steps(STEPS),
         expect=r"parameters from imported/ \(run\.init_from\)",
         why="`...` is the reader's job: this file's gpt-small job, in a run folder of its own (a run that "
             "resumes ignores run.init_from, and runs/gpt-small has checkpoints)"),
    # docs/data.md: a corpus/ folder, dump.jsonl and tokenizer.json are the reader's (FIXTURES).
    # docs/embedding.md
    Rule("run", r"^build/bin/smp-launch --nproc-per-node 2 --worker build/bin/mixer_smp -- 30 ",
         subs=[(r" -- 30 ", " -- %d " % STEPS)], why="the mixer's first argument is its step count: 2, not 30"),
    Rule("fail", r"^build/bin/smp_train gpt configs/gpt-tiny\.toml train\.stpes=5$",
         expect=r"unknown key 'train\.stpes' \(did you mean 'train\.steps'\?\)",
         why="the doc shows a mistyped key refused with the nearest one"),
    Rule("run", r"^build/bin/smp_train gpt configs/gpt-tiny\.toml train\.steps=5$",
         why="gpt-tiny, 5 steps: a few seconds as written"),
    Rule("run", r"^build/bin/smp-launch --nproc-per-node 2 --worker build/bin/smp_train -- gpt configs/gpt-tiny\.toml "
                r"train\.steps=5$", why="gpt-tiny, 5 steps: a few seconds as written"),
    # Install and out-of-tree builds (docs/writing-plugins.md steps 1 and 3, docs/embedding.md).
    Rule("skip", r"^cmake --install build --prefix \$HOME/smp$", tag="out-of-tree build", why=SKIP_OUT_OF_TREE),
    Rule("skip", r"^cmake -S (sdk/example|examples/embed) -B /tmp/\w+ -G Ninja -DCMAKE_PREFIX_PATH=\$HOME/smp$",
         tag="out-of-tree build", why=SKIP_OUT_OF_TREE),
    Rule("skip", r"^cmake --build /tmp/(example|embed)( && /tmp/embed/smp_embed /tmp/example/example_scale\.so)?$",
         tag="out-of-tree build", why=SKIP_OUT_OF_TREE),
    Rule("skip", r"^export SMP_PLUGIN_PATH=/tmp/example$", tag="out-of-tree build",
         why="names the plugin built by the skipped command before it; " + SKIP_OUT_OF_TREE),
    # docs/gpus-and-precision.md
    Rule("skip", r"^SMP_TORCH=pip (SMP_TORCH_VERSION=[\d.]+ )?bash scripts/setup\.sh --no-job$", tag="network",
         why="installs pip's torch (a CUDA wheel, several GB, from the network) and builds build-pip/; CI's "
             "second leg (scripts/ci_pip_torch.sh) runs it"),
    Rule("skip", r"^Torch_DIR=/opt/libtorch/\S+ bash scripts/setup\.sh --no-job$", tag="other LibTorch",
         why="needs a LibTorch unpacked in /opt/libtorch, and builds all of build-torch/ (many minutes)"),
    Rule("skip", r"^bash scripts/gpu/fetch-deps\.sh$", tag="network",
         why="downloads the GPU check's packages (pip, apt) from the network"),
    Rule("skip", r"^(SMP_GIT_COMMIT=\S.*|OUT=\S+) bash scripts/gpu/check\.sh$", tag="GPU",
         why="the GPU check: needs an NVIDIA GPU (its --dry-run is CI's on a machine without one)"),
    # docs/running.md: elastic runs across machines.
    Rule("skip", r"^smp-launch (--nproc-per-node 8 --nnodes 1:4|--rdzv-server --nnodes 1:4) --rdzv-endpoint 10\.0\.0\.\d+:29400",
         file=r"^docs/running\.md$", tag="several machines",
         why="an elastic job over machines at 10.0.0.x, which this machine is not; elastic_test runs the same "
             "(smp-launch --nnodes 1:2, a rendezvous served by a launcher and by --rdzv-server) on two "
             "network-namespace hosts"),
    # docs/fuzzing.md
    Rule("skip", r"^bash scripts/fuzz\.sh( --seconds \d+| --jobs \d+| --ci|( [a-z_]+)+)?$", file=r"^docs/fuzzing\.md$",
         tag="fuzzing", why="builds build-fuzz/ with clang under ASan + UBSan (many minutes on 2 cores), then fuzzes "
                            "every harness for 20 s or more, and writes bench/results/fuzz.json into the repository; "
                            "fuzz_replay_test (label core) replays the seeds and regressions through the same harnesses"),
    Rule("skip", r"^bash scripts/tsan\.sh( --at \S+| --ci| --break \S+)?$", file=r"^docs/fuzzing\.md$", tag="sanitizer",
         why="builds build-tsan/ with clang under ThreadSanitizer (minutes on 2 cores); CI runs it after the fuzzers "
             "(--break: a copy of the sources with one synchronisation removed, which must make TSan report)"),
    # Generic rules: the tools, as written or with fewer steps.
    Rule("run", r"^build/bin/smp-launch (?!.*(--worker|--estimate-memory| -- )).*--config ", subs=steps(STEPS),
         why="a training job: 2 steps"),
    Rule("run", r"^build/bin/smp-launch --estimate-memory --device-memory 80GB --plugin gpt "
                r"--config configs/gpt3-175b-1024\.toml$", file=r"^docs/memory\.md$", check=check_estimate_table,
         why="an estimate, no training: as written; the table below it must be its output, rounded"),
    # It times every GEMM size five times on two ranks at once: a minute on a
    # quiet 2-core machine, twice that beside another test (ctest -j2).
    Rule("run", r"^build/bin/smp-plan --calibrate ", why="as written; measuring takes minutes beside other tests",
         timeout_s=240),
    Rule("run", r"^build/bin/smp-(data|checkpoint|generate|plan) ", why="as written"),
    Rule("run", r"^echo \"[^\"]*\" \| build/bin/smp-data ", why="as written"),
]

# What a doc file assumes the reader has, made in its working folder first.
FIXTURES = {
    "docs/data.md": "a corpus: corpus/ (the licence texts of /usr/share/common-licenses, a file each), "
                    "dump.jsonl (their paragraphs as JSON lines, key \"text\"), tokenizer.json (a byte-level "
                    "BPE tokenizer in Hugging Face's format: the 256 byte pieces, a few merges, <|endoftext|>)",
}


def bytes_to_unicode():
    """GPT-2's byte-to-character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_fixtures(rel, work):
    if rel != "docs/data.md":
        return
    lic = "/usr/share/common-licenses"
    os.makedirs(os.path.join(work, "corpus"))
    paragraphs = []
    for name in sorted(os.listdir(lic)):
        src = os.path.join(lic, name)
        if os.path.isfile(src) and not os.path.islink(src):
            shutil.copy(src, os.path.join(work, "corpus", name))
            with open(src, encoding="utf-8", errors="replace") as f:
                paragraphs += [p.strip() for p in f.read().split("\n\n") if p.strip()]
    with open(os.path.join(work, "dump.jsonl"), "w", encoding="utf-8") as f:
        for p in paragraphs:
            f.write(json.dumps({"text": p}) + "\n")
    chars = bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    merges = []
    for a, b in [("H", "e"), ("l", "l"), ("He", "ll"), ("Hell", "o")]:
        vocab[a + b] = len(vocab)
        merges.append(a + " " + b)
    vocab["<|endoftext|>"] = len(vocab)
    tok = {"model": {"type": "BPE", "vocab": vocab, "merges": merges},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "normalizer": None}
    with open(os.path.join(work, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


# ---- markdown -----------------------------------------------------------------
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)")
LOOKS_LIKE_A_COMMAND = re.compile(r"^\s*(\$ |build/bin/|bash |sh |cmake |ctest |python3? |\./|[A-Z_]+=\S* )")


def fences(path):
    """Yields (lang, line of the opening fence, [(line number, text)], the text after the block)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        marker, lang, start = m.group(1), m.group(2).lower(), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith(marker):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        yield lang, start, body, "\n".join(lines[i:])


def strip_comment(s):
    """Splits a shell line at its comment (a # outside quotes, at a word's start)."""
    quote = None
    for i, c in enumerate(s):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or s[i - 1].isspace()):
            return s[:i].rstrip(), s[i + 1:].strip()
    return s.rstrip(), ""


def commands(body):
    """[(line, command, comment)] of a shell block."""
    prompted = any(t.startswith("$ ") for _, t in body)
    out = []
    pending = None  # (line, text) of a command continued with a backslash
    for n, t in body:
        if pending is None:
            if prompted:
                if not t.startswith("$ "):
                    continue  # output shown after a prompt
                t = t[2:]
            if not t.strip() or t.lstrip().startswith("#"):
                continue
            pending = (n, "")
        code, comment = strip_comment(t)
        if code.endswith("\\"):
            pending = (pending[0], pending[1] + code[:-1].strip() + " ")
            continue
        out.append((pending[0], (pending[1] + code.strip()).strip(), comment))
        pending = None
    if pending:
        out.append((pending[0], pending[1].strip(), ""))
    return out


PATH_TOKEN = re.compile(r"(?<![\w/.$-])((?:configs|scripts|tests|examples|sdk|build/bin|build/tests)/[\w./-]*\w)")


def missing_paths(cmd, repo, build):
    missing = []
    for p in PATH_TOKEN.findall(cmd):
        full = os.path.join(build, p[len("build/"):]) if p.startswith("build/") else os.path.join(repo, p)
        if not os.path.exists(full):
            missing.append(p)
    return missing


# ---- test labels --------------------------------------------------------------
def label_problems(repo, docs):
    """Every label the docs name (`-L <label>`, and docs/architecture.md's
    "Labels:" list) is a label of some test in tests/**/CMakeLists.txt, and
    that list names every label the tests use."""
    used = set()
    for d, _, files in os.walk(os.path.join(repo, "tests")):
        if "CMakeLists.txt" in files:
            with open(os.path.join(d, "CMakeLists.txt"), encoding="utf-8") as f:
                for m in re.finditer(r"\bLABELS\s+(\"[^\"]*\"|[\w;]+)", f.read()):
                    used |= {l for l in m.group(1).strip('"').split(";") if re.fullmatch(r"[a-z]\w*", l)}
    problems = []
    for rel in docs:
        with open(os.path.join(repo, rel), encoding="utf-8") as f:
            text = f.read()
        for n, line in enumerate(text.split("\n"), 1):
            for label in re.findall(r"(?:ctest|scripts/test\.sh)\b[^`]*?\s-L\s+([\w-]+)", line):
                if label not in used:
                    problems.append("%s:%d: `-L %s`: no test has the label %s" % (rel, n, label, label))
        if rel == "docs/architecture.md":
            m = re.search(r"\nLabels: (.*?)(?:\n\n|$)", text, re.S)
            listed = set(re.findall(r"`([a-z]\w*)`", m.group(1))) if m else set()
            if not m:
                problems.append("%s: no \"Labels:\" paragraph" % rel)
            for label in sorted(listed - used):
                problems.append("%s: \"Labels:\" names %s, which no test has" % (rel, label))
            for label in sorted(used - listed):
                problems.append("%s: \"Labels:\" does not name %s, a label of tests" % (rel, label))
    return problems


# ---- running --------------------------------------------------------------------
def make_workdir(root, rel, repo, build):
    work = os.path.join(root, re.sub(r"[^\w.-]", "_", rel))
    os.makedirs(os.path.join(work, "home"))
    os.makedirs(os.path.join(work, "logs"))  # each command's output, <line>.log
    for d in LINKED:
        os.symlink(os.path.join(repo, d), os.path.join(work, d))
    os.symlink(build, os.path.join(work, "build"))
    make_fixtures(rel, work)
    return work


def environment(work, build):
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("SLURM_", "OMPI_", "PMI_", "SMP_")) or k in
                   ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "Torch_DIR"))}
    env["HOME"] = os.path.join(work, "home")
    env["PATH"] = os.path.join(build, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["SMP_BUILD_DIR"] = os.path.join(work, "build")
    return env


def execute(cmd, work, build, timeout_s=COMMAND_TIMEOUT_S):
    """Runs a command with bash in its own process group; on a timeout the
    whole group (a launcher and its ranks) is killed. Returns (status, output)."""
    p = subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], cwd=work, env=environment(work, build),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, out.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return "timeout after %d s" % timeout_s, out.decode("utf-8", "replace")


def tail(text, n=40):
    lines = text.rstrip("\n").split("\n")
    return "\n".join(("    " + l) for l in lines[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--list", action="store_true", help="classify, run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the working folders")
    ap.add_argument("--only", help="run only the commands whose file:line or text matches this regex")
    args = ap.parse_args()
    repo, build = os.path.realpath(args.repo), os.path.realpath(args.build)

    docs = ["README.md"]
    for d, _, files in sorted(os.walk(os.path.join(repo, "docs"))):
        docs += sorted(os.path.relpath(os.path.join(d, f), repo) for f in files if f.endswith(".md"))

    t_start = time.time()
    failures = label_problems(repo, docs)
    root = None if args.list else tempfile.mkdtemp(prefix="smp-doc-commands-")
    ran, skipped, skip_tags = 0, 0, {}
    if root:
        print("doc commands: working folders under %s" % root, flush=True)
    for rel in docs:
        work = None
        for lang, start, body, after in fences(os.path.join(repo, rel)):
            if lang not in SHELL_LANGS:
                if lang == "" and body and LOOKS_LIKE_A_COMMAND.match(body[0][1]):
                    failures.append("%s:%d: a command in a fence without a language (```sh for a command, ```text "
                                    "for output): %s" % (rel, start, body[0][1].strip()))
                continue
            for line, cmd, comment in commands(body):
                where = "%s:%d" % (rel, line)
                rule = next((r for r in RULES if r.matches(rel, cmd)), None)
                if rule is None:
                    failures.append("%s: unclassified command (add a rule to %s): %s" % (where, __file__, cmd))
                    print("UNCLASSIFIED %s: %s" % (where, cmd), flush=True)
                    continue
                rule.used += 1
                gone = missing_paths(cmd, repo, build)
                if gone:
                    failures.append("%s: names what does not exist: %s (in: %s)" % (where, ", ".join(gone), cmd))
                if args.only and not (re.search(args.only, where) or re.search(args.only, cmd)):
                    continue
                if rule.action == "skip":
                    skipped += 1
                    skip_tags[rule.tag] = skip_tags.get(rule.tag, 0) + 1
                    print("SKIP %s: %s\n     why: %s" % (where, cmd, rule.why), flush=True)
                    continue
                run = rule.rewrite(cmd)
                if args.list:
                    print("%s %s: %s%s" % ({"run": "RUN   ", "fail": "REFUSE"}[rule.action], where, run, "" if run == cmd else "   [was: %s]" % cmd))
                    continue
                if work is None:
                    work = make_workdir(root, rel, repo, build)
                t0 = time.time()
                rc, out = execute(run, work, build, rule.timeout_s)
                dt = time.time() - t0
                ran += 1
                with open(os.path.join(work, "logs", "%d.log" % line), "w", encoding="utf-8") as f:
                    f.write("$ %s\n%s" % (run, out))
                if rule.action == "fail":
                    ok = isinstance(rc, int) and rc != 0 and rule.expect.search(out)
                    verdict = "refused as the doc shows" if ok else (
                        "expected a refusal matching /%s/, got exit %s" % (rule.expect.pattern, rc))
                else:
                    ok = rc == 0
                    verdict = "exit 0" if ok else "exit %s" % rc
                    problems = rule.check(out, after) if ok and rule.check else []
                    if ok and rule.expect and not rule.expect.search(out):
                        problems.append("the output does not match /%s/" % rule.expect.pattern)
                    if problems:
                        ok, verdict = False, "exit 0, but " + "; ".join(problems)
                print("%s %s (%.1f s, %s): %s" % ("RUN " if ok else "FAIL", where, dt, verdict, run), flush=True)
                if run != cmd:
                    print("     as written: %s\n     why: %s" % (cmd, rule.why), flush=True)
                if not ok:
                    print(tail(out), flush=True)
                    failures.append("%s: %s: %s" % (where, verdict, run))
    for r in RULES:
        if r.used == 0:
            failures.append("a rule matches no doc command (the docs changed? update %s): /%s/ in /%s/" %
                            (__file__, r.cmd.pattern, r.file.pattern))
    if failures:
        print("\nFAILED:\n" + "\n".join("  " + f for f in failures))
        if root:
            print("working folders kept: %s" % root)
    elif root and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    reasons = ", ".join("%d %s" % (n, t) for t, n in sorted(skip_tags.items()))
    print("doc commands: %d run, %d skipped (%s), %d failed in %.0f s" %
          (ran, skipped, reasons or "none", len(failures), time.time() - t_start))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
