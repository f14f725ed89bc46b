#!/usr/bin/env bash
# Whether a change left a kernel's code as it was, without a GPU: compiles one CUDA source to PTX (sm_90a, the build's
# own flags from build/compile_commands.json) in the working tree and in a git worktree of REV, and compares the
# entries whose names match KERNEL_REGEX - line counts, and the instructions with register names, labels and line info
# dropped, as sorted multisets (a refactor that only renames registers or reorders independent instructions shows 0).
#   scripts/ptx-diff.sh src/cuda/sampling/lmhead_screen.cu 'pick_kernel|pick_topk' [REV (default HEAD)]
# PTX_DIFF_FULL=1 also prints the normalized diff in program order. Generated files under build/ are the current
# build's in both compiles.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
SRC=$(realpath --relative-to="$ROOT" "$1")
RE=${2:?KERNEL_REGEX}
REV=${3:-HEAD}
DB=$BUILD/compile_commands.json
[[ -f $DB ]] || { echo "no $DB: configure the build first (scripts/build.sh)" >&2; exit 1; }
T=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$T/old" >/dev/null 2>&1 || true; rm -rf "$T"' EXIT
git -C "$ROOT" worktree add --detach "$T/old" "$REV" >/dev/null 2>&1
# ptx TREE OUT: the source's compile command with TREE for the repository root, to PTX.
ptx() {
  local cmd
  cmd=$(python3 - "$DB" "$ROOT" "$SRC" "$1" "$2" <<'PY'
import json, re, sys
db, root, src, tree, out = sys.argv[1:]
for e in json.load(open(db)):
    if e['file'] == f'{root}/{src}':
        c = re.sub(r' -o \S+', f' -o {out}', e['command']).replace(' -c ', ' -ptx ')
        c = re.sub(r'--generate-code=\S+|-gencode[= ]\S+', '-arch=sm_90a', c)
        # The include paths CMake keeps in an options file, inlined so that they can point into the tree.
        c = re.sub(r'--options-file (\S+)', lambda m: open(f"{e['directory']}/{m.group(1)}").read().strip(), c)
        c = c.replace(f'{root}/src', f'{tree}/src')
        print(f"cd {e['directory']} && {c}")
        break
PY
)
  [[ -n $cmd ]] || { echo "$SRC is not in $DB" >&2; exit 1; }
  bash -c "$cmd" >"$2.log" 2>&1 || { echo "compile failed in $1:"; tail -5 "$2.log"; exit 1; }
}
ptx "$T/old" "$T/old.ptx"
ptx "$ROOT" "$T/new.ptx"
python3 - "$T/old.ptx" "$T/new.ptx" "$RE" "${PTX_DIFF_FULL:-0}" <<'PY'
import difflib, re, sys
from collections import Counter
old, new, pat, full = sys.argv[1], sys.argv[2], re.compile(sys.argv[3]), sys.argv[4] == '1'
def entries(path):
    out, name, body = {}, None, []
    for line in open(path):
        line = re.sub(r'_GLOBAL__N__\w+?_cu_[0-9a-f]+', '_GLOBAL__N_', line)  # the anonymous namespace's per-file hash
        m = re.match(r'\s*(?:\.visible\s+)?\.entry\s+(\S+?)\(', line)
        if m: name, body = m.group(1), []
        if name is None: continue
        s = line.strip()
        if s and not s.startswith(('.loc', '//', '.file')):
            body.append(re.sub(r'\$L__\w+', 'L', s))
        if s == '}': out[name], name = body, None
    return out
a, b = entries(old), entries(new)
names = sorted(n for n in set(a) | set(b) if pat.search(n))
if not names: sys.exit(f'no kernel matches {pat.pattern}')
for n in names:
    x, y = a.get(n), b.get(n)
    if x is None or y is None:
        print(f'{n}: only in the {"new" if x is None else "old"} source'); continue
    norm = lambda L: [re.sub(r'%[a-z]+\d+', 'R', l) for l in L]
    d = sum(((Counter(norm(x)) - Counter(norm(y))) + (Counter(norm(y)) - Counter(norm(x)))).values())
    print(f'{n}: {len(x)} -> {len(y)} lines, {d} instructions differ with register names dropped')
    if full and d: sys.stdout.writelines(l + '\n' for l in difflib.unified_diff(norm(x), norm(y), lineterm='', n=1))
PY
