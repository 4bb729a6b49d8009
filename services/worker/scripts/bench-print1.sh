#!/bin/sh
# Benchmark: `print(1)` through `corral jail run` against a bare `/usr/bin/python3` (an explicit
# interpreter path, never a pyenv shim), and reset time for a full 8 MiB workspace. Needs root
# and hyperfine (Debian: apt-get install hyperfine).
#
#   services/worker/scripts/bench-print1.sh [path/to/corral]
set -eu
corral=${1:-target/debug/corral}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo 'print(1)' > "$dir/print1.py"
hyperfine -N --warmup 10 --runs 100 \
    "/usr/bin/python3 $dir/print1.py" \
    "$corral jail run --language python $dir/print1.py"

cat > "$dir/fill.py" <<'PY'
try:
    with open("fill.bin", "wb") as f:
        while True:
            f.write(b"x" * 65536)
except OSError:
    pass
PY
echo "reset of a full workspace (ms), 20 runs:"
for _ in $(seq 20); do
    "$corral" jail run --language python "$dir/fill.py" |
        /usr/bin/python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["durations"]["reset_ms"], r["bound"], r["reset_evidence"]["verdict"])'
done | sort -n | awk '{ v[NR] = $1 } END { printf "min %d median %d max %d\n", v[1], v[int((NR + 1) / 2)], v[NR] }'
