//! End-to-end load benchmark of `corral egress-proxy` on this machine only (loopback and a
//! network namespace it creates; nothing leaves the host). Needs root (for the namespace).
//!
//! ```text
//! cargo build --release -p corral -p corral-benches --bin egress_load
//! sudo target/release/egress_load [--corral target/release/corral] [--iterations 2000]
//!      [--bytes 1073741824] [--tunnels 1000] [--streams 64] [--stream-bytes 16777216]
//!      [--link-gbit 10]
//! ```
//!
//! It starts an upstream sink inside a namespace (10.213.K.2, reached over a veth pair), a stub
//! DNS server on loopback, and the real proxy binary with a key file; mints a `private_network`
//! grant for the namespace's /24; and measures:
//! - setup latency: connect and one echoed byte, direct vs through CONNECT (IP literal and a
//!   name resolved by the stub), median, p90, p99, and the median added;
//! - single-connection throughput downloading `--bytes`, direct vs tunnelled, and the ratio,
//!   with the CPU per GiB each way (the machine's, the proxy's, the sink's and the client's);
//!   then the same on the namespace's link shaped to `--link-gbit` Gbit/s (0: not measured),
//!   where a network interface's rate, not the machine's copying, is the limit;
//! - the proxy's VmRSS: idle at start, with `--tunnels` open idle tunnels, with `--streams`
//!   concurrent downloads, and idle again afterwards.
//!
//! `EGRESS_LOAD_KEEP_LOG=PATH` keeps the proxy's log lines (one per decision) at PATH.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corral_benches::load::{cpu_jiffies, process_jiffies};
use corral_core::egress::{
    EgressSettings, ExecutionId, GrantRequest, GrantSigner, TokenTtl, resolve,
};
use corral_core::ids::ActorId;
use corral_core::time::UnixMillis;

const SINK_PORT: u16 = 9000;
const FIELD_KEY: &[u8] = b"egress-load-benchmark-field-key!";
const NAME: &str = "sink.bench";

struct Options {
    corral: String,
    iterations: usize,
    bytes: u64,
    tunnels: usize,
    streams: usize,
    stream_bytes: u64,
    link_gbit: u64,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sink") {
        return match args.get(1).and_then(|a| a.parse().ok()) {
            Some(addr) => sink(addr),
            None => ExitCode::from(2),
        };
    }
    let options = match parse_options(&args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("egress_load: {e}");
            return ExitCode::from(2);
        }
    };
    match bench(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("egress_load: {e}");
            ExitCode::from(1)
        }
    }
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        corral: "target/release/corral".into(),
        iterations: 2000,
        bytes: 1 << 30,
        tunnels: 1000,
        streams: 64,
        stream_bytes: 16 << 20,
        link_gbit: 10,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--corral" => options.corral = value.clone(),
            "--iterations" => options.iterations = number()? as usize,
            "--bytes" => options.bytes = number()?,
            "--tunnels" => options.tunnels = number()? as usize,
            "--streams" => options.streams = number()? as usize,
            "--stream-bytes" => options.stream_bytes = number()?,
            "--link-gbit" => options.link_gbit = number()?.min(400),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(options)
}

/// The upstream, run inside the namespace. First byte: `e` echo until EOF, `s` + u64 BE: send
/// that many bytes and close, `h`: hold until EOF.
fn sink(addr: SocketAddr) -> ExitCode {
    let Ok(listener) = std::net::TcpListener::bind(addr) else {
        return ExitCode::from(1);
    };
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || {
            let _ = stream.set_nodelay(true);
            let mut command = [0u8; 1];
            if stream.read_exact(&mut command).is_err() {
                return;
            }
            let mut buf = vec![0u8; 256 * 1024];
            match command[0] {
                b's' => {
                    let mut len = [0u8; 8];
                    if stream.read_exact(&mut len).is_err() {
                        return;
                    }
                    let mut left = u64::from_be_bytes(len);
                    while left > 0 {
                        let n = left.min(buf.len() as u64) as usize;
                        if stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                        left -= n as u64;
                    }
                }
                b'e' => {
                    let _ = stream.write_all(&command);
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
                _ => while matches!(stream.read(&mut buf), Ok(n) if n > 0) {},
            }
        });
    }
    ExitCode::SUCCESS
}

/// A namespace with a veth pair, its processes, and everything removed on drop.
struct Fixture {
    netns: String,
    ns_if: String,
    children: Vec<Child>,
    dir: std::path::PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let status = Command::new("ip")
        .args(args)
        .status()
        .map_err(|e| e.to_string())?;
    status
        .success()
        .then_some(())
        .ok_or(format!("ip {} failed", args.join(" ")))
}

fn namespace(fixture: &mut Fixture) -> Result<Ipv4Addr, String> {
    let pid = std::process::id() % 100_000;
    let used = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map_err(|e| e.to_string())?;
    let used = String::from_utf8_lossy(&used.stdout).into_owned();
    let k = (0..250u32)
        .map(|i| (pid + 101 + i) % 250 + 1)
        .find(|k| !used.contains(&format!("10.213.{k}.")))
        .ok_or("no free 10.213.K.0/24")? as u8;
    let (host_if, ns_if) = (format!("cbh{pid}"), format!("cbn{pid}"));
    fixture.ns_if.clone_from(&ns_if);
    ip(&["netns", "add", &fixture.netns])?;
    let (host_cidr, ns_cidr) = (format!("10.213.{k}.1/24"), format!("10.213.{k}.2/24"));
    for step in [
        &[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ][..],
        &["link", "set", &ns_if, "netns", &fixture.netns],
        &["addr", "add", &host_cidr, "dev", &host_if],
        &["link", "set", &host_if, "up"],
        &["-n", &fixture.netns, "addr", "add", &ns_cidr, "dev", &ns_if],
        &["-n", &fixture.netns, "link", "set", &ns_if, "up"],
        &["-n", &fixture.netns, "link", "set", "lo", "up"],
    ] {
        ip(step)?;
    }
    Ok(Ipv4Addr::new(10, 213, k, 2))
}

fn wait_for(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("nothing listens on {addr}"))
}

/// A stub DNS server answering `sink.bench` with `answer` (A) and nothing else.
fn stub_dns(answer: Ipv4Addr, stop: Arc<AtomicBool>) -> Result<SocketAddr, String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    let addr = socket.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            let query = &buf[..n];
            let mut at = 12;
            while at < n && query[at] != 0 {
                at += 1 + usize::from(query[at]);
            }
            if at + 5 > n {
                continue;
            }
            let qtype = u16::from_be_bytes([query[at + 1], query[at + 2]]);
            let answers = u16::from(qtype == 1);
            let mut reply = query[..2].to_vec();
            reply.extend_from_slice(&[0x81, 0x80, 0, 1]);
            reply.extend_from_slice(&answers.to_be_bytes());
            reply.extend_from_slice(&[0, 0, 0, 0]);
            reply.extend_from_slice(&query[12..at + 5]);
            if answers == 1 {
                reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                reply.extend_from_slice(&answer.octets());
            }
            let _ = socket.send_to(&reply, from);
        }
    });
    Ok(addr)
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Opens a tunnel through the proxy to `target` and returns the stream after the 200.
fn tunnel(proxy: SocketAddr, target: &str, grant: &str) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect(proxy).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Bearer {grant}\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .map_err(|e| e.to_string())?;
    // The proxy sends nothing after its answer until the client speaks, so reads end there.
    let mut response = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !response.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "proxy closed: {}",
                String::from_utf8_lossy(&response)
            ));
        }
        response.extend_from_slice(&buf[..n]);
    }
    if !response.starts_with(b"HTTP/1.1 200") {
        return Err(format!(
            "proxy answered {}",
            String::from_utf8_lossy(&response)
        ));
    }
    Ok(stream)
}

/// One setup measured: connect (and tunnel) and echo a byte.
type Probe<'a> = dyn Fn() -> Result<(), String> + 'a;

fn ping(mut stream: TcpStream) -> Result<(), String> {
    stream.write_all(b"e").map_err(|e| e.to_string())?;
    let mut echo = [0u8; 1];
    stream.read_exact(&mut echo).map_err(|e| e.to_string())
}

fn percentiles(mut samples: Vec<Duration>) -> [Duration; 3] {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    [at(0.5), at(0.9), at(0.99)]
}

fn download(mut stream: TcpStream, bytes: u64) -> Result<(), String> {
    let mut command = vec![b's'];
    command.extend_from_slice(&bytes.to_be_bytes());
    stream.write_all(&command).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while got < bytes {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) => return Err(e.to_string()),
        }
    }
    (got == bytes)
        .then_some(())
        .ok_or(format!("short download: {got} of {bytes}"))
}

fn bench(options: &Options) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("corral-egress-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut fixture = Fixture {
        netns: format!("corral-bench-{}", std::process::id()),
        ns_if: String::new(),
        children: Vec::new(),
        dir: dir.clone(),
    };
    let sink_ip = namespace(&mut fixture)?;
    let sink_addr = SocketAddr::from((sink_ip, SINK_PORT));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let exe = exe.to_string_lossy().into_owned();
    let sink_child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &fixture.netns,
            &exe,
            "sink",
            &sink_addr.to_string(),
        ])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    fixture.children.push(sink_child);
    wait_for(sink_addr)?;
    let stop_dns = Arc::new(AtomicBool::new(false));
    let dns = stub_dns(sink_ip, Arc::clone(&stop_dns))?;

    let signer = GrantSigner::from_field_key(FIELD_KEY).map_err(|e| e.code().to_owned())?;
    let key_file = dir.join("verifying-key");
    std::fs::write(&key_file, signer.verifier().public_key_text()).map_err(|e| e.to_string())?;
    let proxy = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let log = std::fs::File::create(dir.join("proxy.log")).map_err(|e| e.to_string())?;
    let proxy_child = Command::new(&options.corral)
        .arg("egress-proxy")
        .env("CORRAL_EGRESS_LISTEN", proxy.to_string())
        .env("CORRAL_EGRESS_VERIFYING_KEY_FILE", &key_file)
        .env("SANDBOX_EGRESS_DNS_SERVERS", dns.to_string())
        .env("CORRAL_EGRESS_CONNECTIONS_MAX", "8192")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("{}: {e}", options.corral))?;
    let proxy_pid = proxy_child.id();
    fixture.children.push(proxy_child);
    wait_for(proxy)?;
    std::thread::sleep(Duration::from_millis(300));
    let rss_start = rss_kib(proxy_pid);

    let cidr = format!("{}/24", Ipv4Addr::from(u32::from(sink_ip) & 0xffff_ff00));
    let policy = resolve(&EgressSettings {
        enabled: None,
        mode: Some("private_network"),
        allowed_ports: Some("9000"),
        private_cidrs: Some(&cidr),
        allowed_hosts: None,
        token_ttl_seconds: Some("14400"),
        proxy_address_present: true,
        field_key_present: true,
    })
    .policy;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis() as u64;
    let actor = ActorId("bench".into());
    let grant = signer
        .mint(&GrantRequest {
            policy: &policy,
            provider_hint: None,
            run: "bench-run",
            actor: &actor,
            execution_id: ExecutionId([9; 16]),
            policy_revision: 1,
            now: UnixMillis(now),
            ttl: TokenTtl::from_seconds(14_400).ok_or("ttl")?,
        })
        .map_err(|e| e.code().to_owned())?
        .token;
    let literal = sink_addr.to_string();
    let named = format!("{NAME}:{SINK_PORT}");
    println!(
        "egress_load: proxy {} (pid {proxy_pid}), sink {sink_addr} in namespace {}, grant {} bytes",
        proxy,
        fixture.netns,
        grant.len()
    );

    // Setup latency: the three kinds interleaved, each iteration in a rotating order, so that
    // every kind meets the same machine (the TIME_WAIT sockets that thousands of connections to
    // one address leave make every later connect's port search longer: measured one kind after
    // another, the last kind paid for the first's).
    let kinds: [(&str, &Probe); 3] = [
        ("direct connect+echo", &|| {
            ping(TcpStream::connect(sink_addr).map_err(|e| e.to_string())?)
        }),
        ("CONNECT literal+echo", &|| {
            ping(tunnel(proxy, &literal, &grant)?)
        }),
        ("CONNECT name (DNS)+echo", &|| {
            ping(tunnel(proxy, &named, &grant)?)
        }),
    ];
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for iteration in 0..options.iterations + options.iterations / 10 {
        for turn in 0..kinds.len() {
            let kind = (iteration + turn) % kinds.len();
            let started = Instant::now();
            (kinds[kind].1)()?;
            if iteration >= options.iterations / 10 {
                samples[kind].push(started.elapsed());
            }
        }
    }
    let mut medians = [Duration::ZERO; 3];
    for (kind, taken) in samples.into_iter().enumerate() {
        let [p50, p90, p99] = percentiles(taken);
        println!(
            "latency {:<28} p50 {:>7.1} us  p90 {:>7.1} us  p99 {:>7.1} us",
            kinds[kind].0,
            us(p50),
            us(p90),
            us(p99)
        );
        medians[kind] = p50;
    }
    let [direct, via_literal, via_name] = medians;
    println!(
        "latency added (p50): literal {:.1} us, name {:.1} us",
        us(via_literal.saturating_sub(direct)),
        us(via_name.saturating_sub(direct))
    );

    // Throughput on one connection, and the CPU per GiB moved, on the namespace's link as it is
    // (as fast as the machine can copy: the proxy's CPU is the limit), then on the link shaped
    // to `--link-gbit` (a network interface's rate: the link is the limit).
    let sink_pid = fixture.children[0].id();
    let moving = Moving {
        proxy,
        sink_addr,
        literal: &literal,
        grant: &grant,
        pids: [proxy_pid, sink_pid, std::process::id()],
    };
    let bytes = options.bytes;
    let (rates, busy) = moving.throughput(bytes)?;
    println!(
        "throughput one connection ({} MiB, median of 3): direct {:.0} MiB/s, tunnelled {:.0} MiB/s, ratio {:.2}",
        bytes >> 20,
        rates[0] / 1048576.0,
        rates[1] / 1048576.0,
        rates[1] / rates[0]
    );
    // Jiffies are hundredths of a second on Linux.
    let per_gib = |jiffies: u64| jiffies as f64 * 10.0 / (3.0 * bytes as f64 / 1073741824.0);
    for (way, name) in ["direct", "tunnelled"].into_iter().enumerate() {
        let [machine, proxy, upstream, client] = busy[way].map(per_gib);
        println!(
            "CPU per GiB moved, {name:<9} (ms): machine {machine:.0}, proxy {proxy:.0}, upstream {upstream:.0}, client {client:.0}"
        );
    }
    println!(
        "CPU per GiB moved, ratio tunnelled / direct: {:.2}",
        busy[1][0] as f64 / busy[0][0].max(1) as f64
    );
    if options.link_gbit > 0 {
        shape(&fixture, Some(options.link_gbit))?;
        // About a second a download at the shaped rate.
        let bytes = (options.link_gbit << 27).min(options.bytes);
        let (rates, _) = moving.throughput(bytes)?;
        println!(
            "throughput one connection on a link shaped to {} Gbit/s ({} MiB, median of 3): direct {:.0} MiB/s, tunnelled {:.0} MiB/s, ratio {:.2}",
            options.link_gbit,
            bytes >> 20,
            rates[0] / 1048576.0,
            rates[1] / 1048576.0,
            rates[1] / rates[0]
        );
        shape(&fixture, None)?;
    }

    // Memory with many idle tunnels.
    let mut held = Vec::with_capacity(options.tunnels);
    for _ in 0..options.tunnels {
        let mut stream = tunnel(proxy, &literal, &grant)?;
        stream.write_all(b"h").map_err(|e| e.to_string())?;
        held.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss_tunnels = rss_kib(proxy_pid);
    drop(held);

    // Memory under concurrent downloads.
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(proxy_pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let started = Instant::now();
    let workers: Vec<_> = (0..options.streams)
        .map(|_| {
            let (literal, grant) = (literal.clone(), grant.clone());
            let bytes = options.stream_bytes;
            std::thread::spawn(move || download(tunnel(proxy, &literal, &grant)?, bytes))
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| "a download thread panicked")??;
    }
    let elapsed = started.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = rss_kib(proxy_pid);
    println!(
        "concurrent: {} tunnels x {} MiB in {:.2} s ({:.0} MiB/s aggregate)",
        options.streams,
        options.stream_bytes >> 20,
        elapsed.as_secs_f64(),
        (options.streams as u64 * options.stream_bytes) as f64 / 1048576.0 / elapsed.as_secs_f64()
    );
    println!(
        "proxy VmRSS: idle at start {:.1} MiB, {} open idle tunnels {:.1} MiB, {} concurrent downloads peak {:.1} MiB, idle after {:.1} MiB",
        rss_start as f64 / 1024.0,
        options.tunnels,
        rss_tunnels as f64 / 1024.0,
        options.streams,
        peak.load(Ordering::Relaxed) as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    stop_dns.store(true, Ordering::Relaxed);
    if let Some(keep) = std::env::var_os("EGRESS_LOAD_KEEP_LOG") {
        let _ = std::fs::copy(dir.join("proxy.log"), keep);
    }
    Ok(())
}

/// What the throughput measure needs: where to connect, and whose CPU to count (the proxy, the
/// upstream sink, this process as the client).
struct Moving<'a> {
    proxy: SocketAddr,
    sink_addr: SocketAddr,
    literal: &'a str,
    grant: &'a str,
    pids: [u32; 3],
}

impl Moving<'_> {
    /// The machine's busy jiffies, then each counted process's own.
    fn parts(&self) -> [u64; 4] {
        let mut parts = [cpu_jiffies().0, 0, 0, 0];
        for (part, pid) in parts[1..].iter_mut().zip(self.pids) {
            *part = process_jiffies(pid);
        }
        parts
    }

    /// Three downloads of `bytes` each way, alternated: the median rate (bytes per second) of
    /// direct and of tunnelled downloads, and the jiffies they used in all.
    fn throughput(&self, bytes: u64) -> Result<([f64; 2], [[u64; 4]; 2]), String> {
        let mut rates = [Vec::new(), Vec::new()];
        let mut busy = [[0u64; 4]; 2];
        for _ in 0..3 {
            for (way, tunnelled) in [false, true].into_iter().enumerate() {
                let (started, before) = (Instant::now(), self.parts());
                let stream = if tunnelled {
                    tunnel(self.proxy, self.literal, self.grant)?
                } else {
                    TcpStream::connect(self.sink_addr).map_err(|e| e.to_string())?
                };
                download(stream, bytes)?;
                rates[way].push(bytes as f64 / started.elapsed().as_secs_f64());
                for ((sum, after), before) in busy[way].iter_mut().zip(self.parts()).zip(before) {
                    *sum += after.saturating_sub(before);
                }
            }
        }
        let medians = rates.map(|mut rates| {
            rates.sort_by(f64::total_cmp);
            rates[1]
        });
        Ok((medians, busy))
    }
}

/// Shapes what the sink sends to `gbit` Gbit/s (a token bucket on its end of the veth pair), or
/// removes the shaping (`None`).
fn shape(fixture: &Fixture, gbit: Option<u64>) -> Result<(), String> {
    let rate = gbit.map(|gbit| format!("{gbit}gbit"));
    let mut tc = Command::new("ip");
    tc.args(["netns", "exec", &fixture.netns, "tc", "qdisc"]);
    match &rate {
        Some(rate) => tc
            .args(["add", "dev", &fixture.ns_if, "root", "tbf", "rate", rate])
            .args(["burst", "4mb", "latency", "10ms"]),
        None => tc.args(["del", "dev", &fixture.ns_if, "root"]),
    };
    let status = tc.status().map_err(|e| format!("tc: {e}"))?;
    status.success().then_some(()).ok_or(format!(
        "tc could not shape {} ({})",
        fixture.ns_if,
        rate.as_deref().unwrap_or("removing the shaping")
    ))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
