#!/usr/bin/env bash
# Registers, stack and spills of every kernel in one CUDA source, as ptxas reports them, without a GPU: reruns
# the source's compile command from build/compile_commands.json with -Xptxas -v (output to a scratch object).
#   scripts/ptxas-report.sh src/cuda/kernels/attention.cu [GREP_PATTERN]
# Names are demangled; one line per kernel: registers, stack frame, spill stores / loads, kernel.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
SRC=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
PATTERN=${2:-.}
DB=$BUILD/compile_commands.json
[[ -f $DB ]] || { echo "no $DB: configure the build first (scripts/build.sh)" >&2; exit 1; }
CMD=$(python3 - "$DB" "$SRC" <<'PY'
import json, re, sys
for e in json.load(open(sys.argv[1])):
    if e['file'] == sys.argv[2]:
        cmd = re.sub(r' -o \S+', ' -o /tmp/ptxas-report.o', e['command'])
        print('cd ' + e['directory'] + ' && ' + cmd + ' -Xptxas -v')
        break
PY
)
[[ -n $CMD ]] || { echo "$SRC is not in $DB" >&2; exit 1; }
bash -c "$CMD" 2>&1 | python3 -c '
import re, subprocess, sys
name, rows = None, []
for line in sys.stdin:
    m = re.search(r"Compiling entry function .(\S+). for", line)
    if m: name = m.group(1); stack = spills = None; continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name: stack, spills = m.group(1), (m.group(2), m.group(3)); continue
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        rows.append((m.group(1), stack or "0", spills or ("0", "0"), name)); name = None
names = subprocess.run(["c++filt"], input="\n".join(r[3] for r in rows), capture_output=True, text=True).stdout.split("\n")
pat = re.compile(sys.argv[1])
print("%5s %6s %13s  %s" % ("regs", "stack", "spill st/ld", "kernel"))
for r, n in zip(rows, names):
    if pat.search(n): print("%5s %6s %6s/%-6s  %s" % (r[0], r[1], r[2][0], r[2][1], n[:150]))
' "$PATTERN"
