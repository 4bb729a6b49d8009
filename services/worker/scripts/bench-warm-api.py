"""Benchmark: `print(1)` through `corral worker serve`'s API from the prepared (warm) jail, through
the API built for the request (cold: a second execute without a reset), and a bare
`/usr/bin/python3 -c` spawn (an explicit path, never a shim), interleaved in the same run. Each
warm execute follows a reset and waits until /health says the next jail is prepared.

    CORRAL_WORKER_TOKEN=... corral worker serve --listen 127.0.0.1:18397 &   # as root
    CORRAL_WORKER_TOKEN=... python3 services/worker/scripts/bench-warm-api.py [N] [CODE]
"""
import http.client, json, os, subprocess, time, statistics, sys
TOKEN = os.environ["CORRAL_WORKER_TOKEN"]
HOST, PORT = "127.0.0.1", int(os.environ.get("CORRAL_BENCH_PORT", "18397"))
def req(method, path, body):
    c = http.client.HTTPConnection(HOST, PORT, timeout=60)
    c.request(method, path, body=json.dumps(body), headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    r = c.getresponse(); data = json.loads(r.read()); c.close(); return data
def health():
    c = http.client.HTTPConnection(HOST, PORT, timeout=60)
    c.request("GET", "/health", headers={"Authorization": "Bearer " + TOKEN})
    r = c.getresponse(); d = json.loads(r.read()); c.close(); return d
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
code = sys.argv[2] if len(sys.argv) > 2 else "print(1)"
# Any CODE given must print exactly 1, so that every run is checked to have worked.
warm, cold, bare, server_total, resets = [], [], [], [], []
for i in range(N):
    r = req("POST", "/v1/reset", {"token": i})
    while not health()["prepared"]:
        time.sleep(0.005)
    t = time.perf_counter(); d = req("POST", "/v1/execute", {"language": "python", "code": code}); warm.append(time.perf_counter() - t)
    assert d["warm"] and d["stdout"]["text"] == "1\n", d
    server_total.append(d["durations"]["total_ms"])
    # No reset in between: this one is built for the request (the cold path through the API).
    t = time.perf_counter(); d = req("POST", "/v1/execute", {"language": "python", "code": code}); cold.append(time.perf_counter() - t)
    assert not d["warm"] and d["stdout"]["text"] == "1\n", d
    t = time.perf_counter(); out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True); bare.append(time.perf_counter() - t)
    assert out.stdout == b"1\n"
med = lambda xs: statistics.median(xs) * 1000
print(f"code={code!r} n={N}")
print(f"warm via API   median {med(warm):.1f} ms  (min {min(warm)*1000:.1f}, server total_ms median {statistics.median(server_total)})")
print(f"cold via API   median {med(cold):.1f} ms  (min {min(cold)*1000:.1f})")
print(f"bare python3   median {med(bare):.1f} ms  (min {min(bare)*1000:.1f})")
print(f"ratio warm/bare {med(warm)/med(bare):.2f}   cold/bare {med(cold)/med(bare):.2f}")
