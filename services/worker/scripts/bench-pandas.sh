#!/bin/sh
# Benchmark: `import pandas; print(1)` through a warm `corral worker serve` whose prepared Python
# jail has already imported pandas and numpy (CORRAL_WORKER_PYTHON_PREIMPORT=pandas,numpy), against
# a bare `/usr/bin/python3 -c` (an explicit interpreter path, never a pyenv shim), interleaved.
# Each warm execute follows a reset and waits until /health says the Python jail is prepared, so
# the import happens before the lease, as it does in production. Prints the medians over N runs
# and their ratio. Needs root and Debian's pandas (apt-get install python3-pandas).
#
#   services/worker/scripts/bench-pandas.sh [N] [path/to/corral]
set -eu
n=${1:-20}
corral=${2:-target/debug/corral}
port=${CORRAL_BENCH_PORT:-18398}
/usr/bin/python3 -c 'import pandas' || { echo "no pandas for /usr/bin/python3: apt-get install python3-pandas" >&2; exit 1; }
dir=$(mktemp -d)
token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
CORRAL_WORKER_TOKEN=$token CORRAL_WORKER_PYTHON_PREIMPORT=pandas,numpy \
    "$corral" worker serve --listen "127.0.0.1:$port" > "$dir/stdout" 2> "$dir/stderr" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
# The server prints one line once it listens.
until grep -q '^listening on' "$dir/stdout"; do
    kill -0 "$server" 2>/dev/null || { cat "$dir/stderr" >&2; exit 1; }
    sleep 0.05
done
CORRAL_WORKER_TOKEN=$token CORRAL_BENCH_PORT=$port CORRAL_BENCH_N=$n /usr/bin/python3 - <<'PY'
import http.client, json, os, statistics, subprocess, time
TOKEN = os.environ["CORRAL_WORKER_TOKEN"]
PORT = int(os.environ["CORRAL_BENCH_PORT"])
N = int(os.environ["CORRAL_BENCH_N"])
CODE = "import pandas; print(1)"
def call(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    r = c.getresponse(); data = json.loads(r.read()); c.close(); return data
def bare():
    t = time.perf_counter(); out = subprocess.run(["/usr/bin/python3", "-c", CODE], capture_output=True)
    elapsed = time.perf_counter() - t
    assert out.stdout == b"1\n", out
    return elapsed
bare()  # the page cache, for both sides
warm, bares, run_ms = [], [], []
for i in range(N):
    r = call("POST", "/v1/reset", {"token": i})
    assert r["reset_evidence"]["verdict"] == "clean", r
    while "python" not in call("GET", "/health")["prepared_languages"]:
        time.sleep(0.005)
    t = time.perf_counter(); d = call("POST", "/v1/execute", {"language": "python", "code": CODE}); warm.append(time.perf_counter() - t)
    assert d["warm"] and d["stdout"]["text"] == "1\n", d
    run_ms.append(d["durations"]["run_ms"])
    bares.append(bare())
med = lambda xs: statistics.median(xs) * 1000
print(f"code={CODE!r} n={N} CORRAL_WORKER_PYTHON_PREIMPORT=pandas,numpy")
print(f"warm via API  median {med(warm):.1f} ms  (min {min(warm)*1000:.1f}, max {max(warm)*1000:.1f}; server run_ms median {statistics.median(run_ms)})")
print(f"bare python3  median {med(bares):.1f} ms  (min {min(bares)*1000:.1f}, max {max(bares)*1000:.1f})")
print(f"ratio warm/bare {med(warm)/med(bares):.3f}  (bare/warm {med(bares)/med(warm):.1f}x)")
PY
