#!/usr/bin/env bash
# Counts the lines a program's smp version changes relative to the plain one:
# every line added or removed by `diff` (a modified line counts twice, once as
# removed and once as added), comments and blank lines included.
#
#   bash scripts/count_changed_lines.sh examples/mixer/plain.cpp examples/mixer/smp.cpp [limit]
#
# Prints "added A, removed R, changed A+R" and the diff; exits 1 when A+R is over `limit`.
set -euo pipefail
plain=${1:?plain program}
changed=${2:?smp version}
limit=${3:-}
diff_text=$(diff -U0 "$plain" "$changed" || true)
added=$(printf '%s\n' "$diff_text" | grep -c '^+[^+]\|^+$' || true)
removed=$(printf '%s\n' "$diff_text" | grep -c '^-[^-]\|^-$' || true)
total=$((added + removed))
echo "added $added, removed $removed, changed $total"
printf '%s\n' "$diff_text" | tail -n +3
if [[ -n $limit && $total -gt $limit ]]; then
  echo "count_changed_lines: $total changed lines, over the limit of $limit" >&2
  exit 1
fi
