//! The live view's adapter inside the worker (BROW-2, BROW-5, BROW-9, BROW-10, BROW-11,
//! BROW-12): one thread per session that owns the display's capture, the encoder, the input
//! injector, one TURN allocation and a WebRTC peer (str0m) per viewer.
//!
//! - Relay only: the one local candidate is the allocation's relayed address; a viewer's offer
//!   keeps only its relayed candidates (anything else is dropped before str0m sees it), each of
//!   whose addresses gets a TURN permission. Every packet leaves in a Send indication to the
//!   authority and arrives in a Data indication: the worker opens no port of its own.
//! - Frames on change: the loop waits in poll(2) on the TURN socket, the X connection and its
//!   command pipe; a frame is captured only after Damage and at most at the frame rate, and a
//!   keyframe is forced when a viewer connects or asks for one.
//! - Input: a data channel's messages are judged by `corral_core::browser::input::map` and a
//!   per-viewer `InputBudget`, then performed through XTest; a refused one is dropped and
//!   counted, never reaches the display. A pane message (the viewer's size) is answered on the
//!   channel with the capture it asked for or its refusal's code, and the screen's mode after it
//!   (`input::pane_answer`).
//! - Private text: while a member's interval is private, every other viewer's peer is removed
//!   and their offers are refused (the API also closes their signaling relays).

use std::collections::HashMap;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corral_core::browser::input::{self, Injection, InputBudget};
use corral_core::browser::media::Capture;
pub use corral_core::browser::viewer::OfferRefusal;
use corral_core::browser::viewer::{SIGNAL_MAX_BYTES, VIEWERS_MAX};
use corral_core::time::UnixMillis;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use str0m::change::SdpOffer;
use str0m::format::Codec;
use str0m::media::{MediaKind, MediaTime, Mid};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc};

use crate::FrameTimes;
use crate::capture::Display;
use crate::encode::H264;
use crate::input::Injector;
use crate::turn::{self, Answer, Client, Incoming};

/// Frames per second at most (BROW-11's bitrate is derived at this rate).
pub const FRAME_RATE: u32 = 25;
/// How long the TURN allocation may take at start.
const ALLOCATE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an offer waits for the adapter's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the adapter needs to start.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The display: its name or its socket's path.
    pub display: String,
    /// The TURN authority's address, as the API resolved it.
    pub turn: SocketAddr,
    /// The session's TURN REST credential.
    pub username: String,
    /// Its password.
    pub password: String,
}

/// What the adapter has done, for the benchmark and the close's report.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Frames encoded and sent.
    pub frames: u64,
    /// Frames the rate control dropped.
    pub skipped: u64,
    /// The sum of each stage's time over the frames.
    pub times: FrameTimes,
    /// Bytes of H.264 sent (once per frame, whatever the number of viewers).
    pub bytes: u64,
    /// Input events performed, and refused (by code).
    pub injected: u64,
    /// Refused input by code.
    pub refused: HashMap<&'static str, u64>,
    /// Peers removed for a private interval.
    pub removed: u64,
    /// Screen mode changes made.
    pub resized: u64,
}

enum Command {
    Offer {
        viewer: String,
        member: String,
        sdp: String,
        reply: mpsc::Sender<Result<String, OfferRefusal>>,
    },
    Private {
        member: Option<String>,
        reply: mpsc::Sender<Vec<String>>,
    },
    Resize {
        capture: Capture,
        reply: mpsc::Sender<Result<(), String>>,
    },
    Stats {
        reply: mpsc::Sender<Stats>,
    },
    Renew {
        username: String,
        password: String,
        reply: mpsc::Sender<Result<SocketAddr, String>>,
    },
}

/// The caller's side of a running adapter. Dropping it stops the adapter.
pub struct Handle {
    commands: mpsc::Sender<Command>,
    wake: UnixStream,
    thread: Option<std::thread::JoinHandle<Stats>>,
    /// The allocation's relayed address.
    pub relayed: SocketAddr,
}

struct Peer {
    viewer: String,
    member: String,
    rtc: Rtc,
    video: Option<(Mid, str0m::format::PayloadParams)>,
    connected: bool,
    keyframe: bool,
    budget: InputBudget,
    /// The capture its pane asks for, once it said.
    pane: Option<Capture>,
    /// The relayed address of the allocation it connects through.
    relayed: SocketAddr,
}

/// One allocation on the TURN authority, with the socket it was made from.
struct Relay {
    socket: UdpSocket,
    local: SocketAddr,
    relayed: SocketAddr,
    turn: Client,
    /// The address of each permission, with when it was last asked for.
    permissions: HashMap<IpAddr, Instant>,
    /// What each TURN request in flight was for, to ask again after a stale nonce.
    asked: HashMap<[u8; 12], Asked>,
    refreshed: Instant,
}

struct Adapter {
    /// The TURN authority.
    server: SocketAddr,
    /// The allocations: the last is the one new viewers get; an earlier one (made with a
    /// credential since renewed) stays while a viewer still uses it.
    relays: Vec<Relay>,
    display: Display,
    injector: Injector,
    encoder: H264,
    capture: Capture,
    peers: Vec<Peer>,
    /// The viewer whose pane sets the screen's mode (BROW-5): the last to send a pointer or key
    /// event, or before anyone has, the first to report its pane.
    driver: Option<String>,
    private: Option<String>,
    /// The last frame was dropped by the rate control: the screen is captured again at the next
    /// frame time even if nothing changes meanwhile, so a viewer never keeps a stale picture.
    stale: bool,
    started: Instant,
    next_frame: Instant,
    stats: Stats,
}

#[derive(Clone, Copy)]
enum Asked {
    Refresh,
    Permission(SocketAddr),
}

fn transaction() -> [u8; 12] {
    let mut id = [0u8; 12];
    for chunk in id.chunks_mut(8) {
        let random = fastrand_u64();
        chunk.copy_from_slice(&random.to_le_bytes()[..chunk.len()]);
    }
    id
}

/// Transaction ids need to be unpredictable enough not to collide, not secret: the TURN
/// exchange is authenticated by MESSAGE-INTEGRITY.
fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish()
}

fn now_millis() -> UnixMillis {
    UnixMillis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    )
}

/// Allocates on the authority, waiting for each answer: the challenge, then the allocation.
fn allocate(socket: &UdpSocket, turn: &mut Client) -> Result<SocketAddr, String> {
    let deadline = Instant::now() + ALLOCATE_TIMEOUT;
    let mut buffer = vec![0u8; 2048];
    let mut challenged = false;
    loop {
        let id = transaction();
        socket
            .send(&turn.allocate(id))
            .map_err(|e| format!("ask the TURN server for a relay: {e}"))?;
        let resend = Instant::now() + Duration::from_millis(500);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err("the TURN server did not allocate a relay in time".to_owned());
            }
            socket
                .set_read_timeout(Some(
                    resend
                        .min(deadline)
                        .saturating_duration_since(now)
                        .max(Duration::from_millis(1)),
                ))
                .map_err(|e| e.to_string())?;
            let n = match socket.recv(&mut buffer) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= resend {
                        break;
                    }
                    continue;
                }
                Err(e) => return Err(format!("the TURN server: {e}")),
            };
            match turn.receive(&buffer[..n]) {
                Incoming::Answer {
                    answer: Answer::Allocated { relayed, .. },
                    ..
                } => return Ok(relayed),
                // The first 401 is the challenge; a 438 is a stale nonce. A 401 to the
                // authenticated request is the credential refused, below.
                Incoming::Answer {
                    answer: Answer::Error { code, realm, nonce },
                    ..
                } if (code == 401 && !challenged) || code == 438 => {
                    challenged = true;
                    turn.challenged(realm, nonce);
                    break;
                }
                Incoming::Answer {
                    answer: Answer::Error { code, .. },
                    ..
                } => {
                    return Err(format!("the TURN server refused the relay ({code})"));
                }
                _ => {}
            }
        }
    }
}

/// Starts the adapter: connects to the display, allocates the relay, and runs on its own thread.
///
/// # Errors
/// The display or the TURN server cannot be reached, or the relay was refused.
pub fn start(settings: &Settings) -> Result<Handle, String> {
    let display = Display::connect(&settings.display)?;
    let injector = Injector::connect(&settings.display)?;
    let (width, height) = display.size();
    let capture = Capture::bounded(u32::from(width), u32::from(height));
    let encoder = H264::new(capture, FRAME_RATE)?;
    let relay = Relay::open(settings.turn, &settings.username, &settings.password)?;
    let relayed = relay.relayed;
    let (commands, received) = mpsc::channel();
    let (wake, woken) = UnixStream::pair().map_err(|e| e.to_string())?;
    woken.set_nonblocking(true).map_err(|e| e.to_string())?;
    let now = Instant::now();
    let mut adapter = Adapter {
        server: settings.turn,
        relays: vec![relay],
        display,
        injector,
        encoder,
        capture,
        peers: Vec::new(),
        driver: None,
        private: None,
        stale: false,
        started: now,
        next_frame: now,
        stats: Stats::default(),
    };
    let thread = std::thread::Builder::new()
        .name("corral-live-view".to_owned())
        .spawn(move || {
            adapter.run(&received, woken);
            adapter.release();
            adapter.stats
        })
        .map_err(|e| e.to_string())?;
    Ok(Handle {
        commands,
        wake,
        thread: Some(thread),
        relayed,
    })
}

impl Relay {
    /// A socket towards `server` and an allocation on it with `username` and `password`.
    fn open(server: SocketAddr, username: &str, password: &str) -> Result<Relay, String> {
        let unspecified: IpAddr = if server.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let socket = UdpSocket::bind((unspecified, 0)).map_err(|e| format!("a UDP socket: {e}"))?;
        socket
            .connect(server)
            .map_err(|e| format!("reach the TURN server {server}: {e}"))?;
        let local = socket.local_addr().map_err(|e| e.to_string())?;
        let mut turn = Client::new(username, password);
        let relayed = allocate(&socket, &mut turn)?;
        socket.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(Relay {
            socket,
            local,
            relayed,
            turn,
            permissions: HashMap::new(),
            asked: HashMap::new(),
            refreshed: Instant::now(),
        })
    }

    /// Asks for a permission for `peer`'s address unless one was asked for recently.
    fn permit(&mut self, peer: SocketAddr, now: Instant) {
        let fresh = self.permissions.get(&peer.ip()).is_some_and(|at| {
            now.duration_since(*at) < Duration::from_secs(turn::PERMISSION_RENEW_SECONDS)
        });
        if fresh {
            return;
        }
        let id = transaction();
        let packet = self.turn.create_permission(id, peer);
        self.asked.insert(id, Asked::Permission(peer));
        let _ = self.socket.send(&packet);
        self.permissions.insert(peer.ip(), now);
    }

    /// Keeps the allocation and its permissions alive.
    fn maintain(&mut self, now: Instant) {
        if now.duration_since(self.refreshed)
            >= Duration::from_secs(u64::from(turn::ALLOCATION_LIFETIME_SECONDS / 2))
        {
            self.refreshed = now;
            let id = transaction();
            let packet = self.turn.refresh(id, turn::ALLOCATION_LIFETIME_SECONDS);
            self.asked.insert(id, Asked::Refresh);
            let _ = self.socket.send(&packet);
        }
        let stale: Vec<IpAddr> = self
            .permissions
            .iter()
            .filter(|(_, at)| {
                now.duration_since(**at) >= Duration::from_secs(turn::PERMISSION_RENEW_SECONDS)
            })
            .map(|(ip, _)| *ip)
            .collect();
        for ip in stale {
            self.permissions.remove(&ip);
            self.permit(SocketAddr::new(ip, 0), now);
        }
    }

    /// Reads every packet waiting: answers are handled here, peers' data is returned.
    fn receive_all(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut received = Vec::new();
        let mut buffer = vec![0u8; 2048];
        loop {
            let n = match self.socket.recv(&mut buffer) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return received,
            };
            match self.turn.receive(&buffer[..n]) {
                Incoming::Data { peer, data } => received.push((peer, data)),
                Incoming::Answer {
                    transaction,
                    answer,
                } => {
                    let asked = self.asked.remove(&transaction);
                    // Only a stale nonce is asked again: a 401 to a request that was already
                    // authenticated is a refusal (an expired credential), and asking again would
                    // only be refused again.
                    if let (
                        Answer::Error {
                            code: 438,
                            realm,
                            nonce,
                        },
                        Some(asked),
                    ) = (answer, asked)
                    {
                        self.turn.challenged(realm, nonce);
                        let id = self::transaction();
                        let packet = match asked {
                            Asked::Refresh => {
                                self.turn.refresh(id, turn::ALLOCATION_LIFETIME_SECONDS)
                            }
                            Asked::Permission(peer) => self.turn.create_permission(id, peer),
                        };
                        self.asked.insert(id, asked);
                        let _ = self.socket.send(&packet);
                    }
                }
                Incoming::Other => {}
            }
        }
    }

    /// Ends the allocation (a zero-lifetime Refresh), so the relay does not outlive its use.
    fn release(&mut self) {
        let packet = self.turn.refresh(transaction(), 0);
        let _ = self.socket.send(&packet);
    }
}

impl Handle {
    fn ask<T>(
        &self,
        command: impl FnOnce(mpsc::Sender<T>) -> Command,
        timeout: Duration,
    ) -> Option<T> {
        let (reply, answer) = mpsc::channel();
        self.commands.send(command(reply)).ok()?;
        let _ = (&self.wake).write(&[1]);
        answer.recv_timeout(timeout).ok()
    }

    /// Answers `viewer`'s (of `member`) SDP offer, or refuses it.
    ///
    /// # Errors
    /// [`OfferRefusal`].
    pub fn offer(&self, viewer: &str, member: &str, sdp: &str) -> Result<String, OfferRefusal> {
        if sdp.len() > SIGNAL_MAX_BYTES {
            return Err(OfferRefusal::Invalid(format!(
                "over {SIGNAL_MAX_BYTES} bytes"
            )));
        }
        let command = |reply| Command::Offer {
            viewer: viewer.to_owned(),
            member: member.to_owned(),
            sdp: sdp.to_owned(),
            reply,
        };
        self.ask(command, ANSWER_TIMEOUT)
            .unwrap_or(Err(OfferRefusal::Stopped))
    }

    /// Starts (`Some(member)`) or ends (`None`) a private interval; the viewers removed.
    #[must_use]
    pub fn private(&self, member: Option<&str>) -> Vec<String> {
        let command = |reply| Command::Private {
            member: member.map(str::to_owned),
            reply,
        };
        self.ask(command, ANSWER_TIMEOUT).unwrap_or_default()
    }

    /// Changes the screen's mode to `capture` (BROW-5).
    ///
    /// # Errors
    /// The display refused the size.
    pub fn resize(&self, capture: Capture) -> Result<(), String> {
        self.ask(|reply| Command::Resize { capture, reply }, ANSWER_TIMEOUT)
            .unwrap_or_else(|| Err("the live view has stopped".to_owned()))
    }

    /// Allocates a new relay with the session's renewed credential (BROW-9): viewers that
    /// connect from now on use it; the old one stays while a viewer still does.
    ///
    /// # Errors
    /// The TURN server refused or did not answer; the old relay is kept.
    pub fn renew(&self, username: &str, password: &str) -> Result<SocketAddr, String> {
        let command = |reply| Command::Renew {
            username: username.to_owned(),
            password: password.to_owned(),
            reply,
        };
        self.ask(command, ANSWER_TIMEOUT)
            .unwrap_or_else(|| Err("the live view has stopped".to_owned()))
    }

    /// What the adapter has done so far.
    #[must_use]
    pub fn stats(&self) -> Option<Stats> {
        self.ask(|reply| Command::Stats { reply }, ANSWER_TIMEOUT)
    }

    /// Stops the adapter (its peers, its allocation), and returns what it did.
    #[must_use]
    pub fn stop(mut self) -> Stats {
        self.finish()
    }

    fn finish(&mut self) -> Stats {
        // The pipe closing tells the thread to stop.
        let _ = self.wake.shutdown(std::net::Shutdown::Both);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Keeps only the relayed candidates of an offer (BROW-9): a viewer's host or reflexive address
/// is never tried, whatever its browser was told.
fn relay_only(sdp: &str) -> (String, Vec<SocketAddr>) {
    let mut peers = Vec::new();
    let mut kept = String::with_capacity(sdp.len());
    for line in sdp.lines() {
        if let Some(candidate) = line.strip_prefix("a=candidate:") {
            let fields: Vec<&str> = candidate.split_whitespace().collect();
            let relayed = fields.windows(2).any(|w| w == ["typ", "relay"]);
            let udp = fields.get(2).is_some_and(|p| p.eq_ignore_ascii_case("udp"));
            let address = fields
                .get(4)
                .zip(fields.get(5))
                .and_then(|(ip, port)| Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?)));
            match (relayed && udp, address) {
                (true, Some(address)) => peers.push(address),
                _ => continue,
            }
        }
        kept.push_str(line);
        kept.push_str("\r\n");
    }
    (kept, peers)
}

impl Adapter {
    fn run(&mut self, commands: &mpsc::Receiver<Command>, mut woken: UnixStream) {
        loop {
            // The pipe: a byte per command; closed when the handle stops the adapter.
            let mut byte = [0u8; 64];
            loop {
                match woken.read(&mut byte) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => return,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.command(command);
            }
            self.receive_all();
            let now = Instant::now();
            self.maintain(now);
            let mut deadline = now + Duration::from_secs(1);
            for peer in &mut self.peers {
                let _ = peer.rtc.handle_input(Input::Timeout(now));
            }
            deadline = deadline.min(self.drain_peers());
            // A display that is gone (the session ended under the adapter) ends the adapter.
            let Ok(changed) = self.display.changed() else {
                return;
            };
            let wanted = self.peers.iter().any(|p| p.connected && p.video.is_some());
            let keyframe = self.peers.iter().any(|p| p.connected && p.keyframe);
            if wanted && (changed || keyframe || self.stale) {
                if now >= self.next_frame {
                    self.frame(keyframe);
                    self.next_frame = now + Duration::from_secs(1) / FRAME_RATE;
                    deadline = deadline.min(self.drain_peers());
                    continue;
                }
                deadline = deadline.min(self.next_frame);
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            let millis = u16::try_from(wait.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds: Vec<PollFd> = self
                .relays
                .iter()
                .map(|relay| PollFd::new(relay.socket.as_fd(), PollFlags::POLLIN))
                .collect();
            fds.push(PollFd::new(self.display.as_fd(), PollFlags::POLLIN));
            fds.push(PollFd::new(woken.as_fd(), PollFlags::POLLIN));
            if poll(&mut fds, PollTimeout::from(millis)).is_err() {
                std::thread::yield_now();
            }
        }
    }

    /// Ends every allocation, so no relay outlives the session.
    fn release(&mut self) {
        for relay in &mut self.relays {
            relay.release();
        }
    }

    /// Ends the allocations no viewer uses any more, but the newest.
    fn retire(&mut self) {
        let newest = self.relays.len().saturating_sub(1);
        let peers = &self.peers;
        let mut index = 0;
        self.relays.retain_mut(|relay| {
            let keep = index == newest || peers.iter().any(|p| p.relayed == relay.relayed);
            index += 1;
            if !keep {
                relay.release();
            }
            keep
        });
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Offer {
                viewer,
                member,
                sdp,
                reply,
            } => {
                let _ = reply.send(self.offer(viewer, member, &sdp));
            }
            Command::Private { member, reply } => {
                let mut removed = Vec::new();
                if let Some(member) = &member {
                    self.peers.retain_mut(|peer| {
                        if &peer.member == member {
                            return true;
                        }
                        peer.rtc.disconnect();
                        removed.push(peer.viewer.clone());
                        false
                    });
                }
                self.stats.removed += removed.len() as u64;
                self.retire();
                self.private = member;
                let _ = reply.send(removed);
            }
            Command::Resize { capture, reply } => {
                let _ = reply.send(self.resize(capture));
            }
            Command::Stats { reply } => {
                let _ = reply.send(self.stats.clone());
            }
            Command::Renew {
                username,
                password,
                reply,
            } => {
                let opened = Relay::open(self.server, &username, &password);
                let _ = reply.send(opened.map(|relay| {
                    let relayed = relay.relayed;
                    self.relays.push(relay);
                    self.retire();
                    relayed
                }));
            }
        }
    }

    fn offer(&mut self, viewer: String, member: String, sdp: &str) -> Result<String, OfferRefusal> {
        if self
            .private
            .as_ref()
            .is_some_and(|private| *private != member)
        {
            return Err(OfferRefusal::Private);
        }
        self.peers.retain(|peer| peer.viewer != viewer);
        if self.peers.len() >= VIEWERS_MAX {
            return Err(OfferRefusal::Full);
        }
        let (kept, remote) = relay_only(sdp);
        if remote.is_empty() {
            return Err(OfferRefusal::Invalid(
                "it has no relayed UDP candidate (the viewer's ICE must be relay-only)".to_owned(),
            ));
        }
        let offer =
            SdpOffer::from_sdp_string(&kept).map_err(|e| OfferRefusal::Invalid(e.to_string()))?;
        let now = Instant::now();
        let mut rtc = Rtc::builder().clear_codecs().enable_h264(true).build(now);
        let Some(relay) = self.relays.last_mut() else {
            return Err(OfferRefusal::Stopped);
        };
        let candidate = Candidate::relayed(relay.relayed, relay.local, "udp")
            .map_err(|e| OfferRefusal::Invalid(e.to_string()))?;
        rtc.add_local_candidate(candidate);
        let answer = rtc
            .sdp_api()
            .accept_offer(offer)
            .map_err(|e| OfferRefusal::Invalid(e.to_string()))?;
        for peer in remote {
            relay.permit(peer, now);
        }
        let relayed = relay.relayed;
        self.peers.push(Peer {
            viewer,
            member,
            rtc,
            video: None,
            connected: false,
            keyframe: true,
            budget: InputBudget::new(now_millis()),
            pane: None,
            relayed,
        });
        self.retire();
        Ok(answer.to_sdp_string())
    }

    /// Keeps every allocation and its permissions alive.
    fn maintain(&mut self, now: Instant) {
        for relay in &mut self.relays {
            relay.maintain(now);
        }
    }

    /// Reads what every allocation received, and gives peers their packets.
    fn receive_all(&mut self) {
        for index in 0..self.relays.len() {
            let relayed = self.relays[index].relayed;
            for (peer, data) in self.relays[index].receive_all() {
                self.deliver(relayed, peer, &data);
            }
        }
    }

    fn deliver(&mut self, relayed: SocketAddr, peer: SocketAddr, data: &[u8]) {
        let Ok(contents) = data.try_into() else {
            return;
        };
        let input = Input::Receive(
            Instant::now(),
            Receive {
                proto: Protocol::Udp,
                source: peer,
                destination: relayed,
                contents,
            },
        );
        if let Some(owner) = self.peers.iter_mut().find(|p| p.rtc.accepts(&input)) {
            let _ = owner.rtc.handle_input(input);
        }
    }

    /// Performs every peer's output; the earliest time one wants to be woken.
    fn drain_peers(&mut self) -> Instant {
        let mut earliest = Instant::now() + Duration::from_secs(1);
        let mut gone = Vec::new();
        for index in 0..self.peers.len() {
            loop {
                let output = match self.peers[index].rtc.poll_output() {
                    Ok(output) => output,
                    Err(_) => {
                        gone.push(index);
                        break;
                    }
                };
                match output {
                    Output::Timeout(at) => {
                        earliest = earliest.min(at);
                        break;
                    }
                    Output::Transmit(transmit) => {
                        let packet =
                            Client::send(transaction(), transmit.destination, &transmit.contents);
                        // Through the allocation the packet is from (its ICE base).
                        if let Some(relay) =
                            self.relays.iter().find(|r| r.relayed == transmit.source)
                        {
                            let _ = relay.socket.send(&packet);
                        }
                    }
                    Output::Event(event) => {
                        if self.event(index, event) {
                            gone.push(index);
                            break;
                        }
                    }
                }
            }
        }
        let any_gone = !gone.is_empty();
        for index in gone.into_iter().rev() {
            self.peers.remove(index);
        }
        if any_gone {
            self.retire();
        }
        earliest
    }

    /// Handles one peer's event; true when the peer is finished.
    fn event(&mut self, index: usize, event: Event) -> bool {
        let peer = &mut self.peers[index];
        match event {
            Event::Connected => {
                peer.connected = true;
                peer.keyframe = true;
            }
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => return true,
            Event::MediaAdded(added) if added.kind == MediaKind::Video => {
                let params = peer.rtc.writer(added.mid).and_then(|writer| {
                    let mut found: Vec<_> = writer
                        .payload_params()
                        .filter(|p| p.spec().codec == Codec::H264)
                        .cloned()
                        .collect();
                    // Packetization mode 1 and constrained baseline first: what OpenH264 makes.
                    found.sort_by_key(|p| {
                        let format = p.spec().format;
                        (
                            format.packetization_mode != Some(1),
                            format.profile_level_id.map(|id| id >> 16 != 0x42),
                        )
                    });
                    found.into_iter().next()
                });
                peer.video = params.map(|p| (added.mid, p));
            }
            Event::KeyframeRequest(_) => peer.keyframe = true,
            Event::ChannelData(data) => {
                let judged = peer
                    .budget
                    .spend(now_millis())
                    .and_then(|()| input::map(&data.data, self.capture));
                let asked = match judged {
                    Ok(injections) => {
                        let pane = injections.iter().find_map(|injection| match injection {
                            Injection::Pane(capture) => Some(*capture),
                            _ => None,
                        });
                        self.perform(index, injections);
                        pane.ok_or("input_invalid")
                    }
                    Err(refusal) => {
                        *self.stats.refused.entry(refusal.code()).or_default() += 1;
                        Err(refusal.code())
                    }
                };
                // Every pane message is answered with what became of it and the screen's mode
                // after it (BROW-11), so a viewer need not guess when the picture follows.
                if input::is_pane(&data.data) {
                    let answer = input::pane_answer(asked, self.capture);
                    if let Some(mut channel) = self.peers[index].rtc.channel(data.id) {
                        let _ = channel.write(false, answer.as_bytes());
                    }
                }
            }
            _ => {}
        }
        false
    }

    /// Performs what one of peer `index`'s messages was judged to be.
    fn perform(&mut self, index: usize, injections: Vec<Injection>) {
        let viewer = self.peers[index].viewer.clone();
        for injection in injections {
            if let Injection::Pane(capture) = injection {
                self.peers[index].pane = Some(capture);
                if self.driver.is_none() {
                    self.driver = Some(viewer.clone());
                }
            } else {
                // Taking over the keyboard or the pointer makes this viewer the driver.
                self.driver = Some(viewer.clone());
                if self.injector.inject(injection).is_ok() {
                    self.stats.injected += 1;
                }
            }
        }
        self.follow_driver();
    }

    /// Sets the screen's mode to the driver's pane, when it says one other than the current.
    fn follow_driver(&mut self) {
        let pane = self
            .peers
            .iter()
            .find(|peer| Some(&peer.viewer) == self.driver.as_ref())
            .and_then(|peer| peer.pane);
        let Some(capture) = pane.filter(|pane| *pane != self.capture) else {
            return;
        };
        if self.resize(capture).is_err() {
            *self.stats.refused.entry("resize_failed").or_default() += 1;
        }
    }

    /// The screen's mode, the encoder and a keyframe for every viewer, at `capture`.
    fn resize(&mut self, capture: Capture) -> Result<(), String> {
        self.display.set_mode(capture)?;
        self.encoder = H264::new(capture, FRAME_RATE)?;
        self.capture = capture;
        self.stats.resized += 1;
        for peer in &mut self.peers {
            peer.keyframe = true;
        }
        Ok(())
    }

    fn frame(&mut self, keyframe: bool) {
        let mut times = FrameTimes::default();
        let began = Instant::now();
        let Ok(pixels) = self.display.grab() else {
            return;
        };
        times.capture = began.elapsed();
        let Ok(encoded) = self.encoder.encode(&pixels, keyframe, &mut times) else {
            return;
        };
        self.stats.times.capture += times.capture;
        self.stats.times.convert += times.convert;
        self.stats.times.encode += times.encode;
        self.stale = encoded.data.is_empty();
        if self.stale {
            self.stats.skipped += 1;
            return;
        }
        self.stats.frames += 1;
        self.stats.bytes += encoded.data.len() as u64;
        let now = Instant::now();
        let ticks = u64::try_from(now.duration_since(self.started).as_micros() * 9 / 100)
            .unwrap_or(u64::MAX);
        let data: std::sync::Arc<[u8]> = encoded.data.into();
        for peer in &mut self.peers {
            let Some((mid, params)) = peer.video.as_ref().filter(|_| peer.connected) else {
                continue;
            };
            let pt = params.pt();
            let written = peer.rtc.writer(*mid).is_some_and(|writer| {
                writer
                    .write(pt, now, MediaTime::from_90khz(ticks), data.clone())
                    .is_ok()
            });
            if written && encoded.keyframe {
                peer.keyframe = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brow_09_an_offer_keeps_only_relayed_udp_candidates() {
        let sdp = "v=0\r\na=candidate:1 1 udp 2122260223 192.168.1.5 50000 typ host\r\n\
                   a=candidate:2 1 udp 1686052607 203.0.113.7 50001 typ srflx raddr 0.0.0.0 rport 0\r\n\
                   a=candidate:3 1 udp 41885439 127.0.0.1 49160 typ relay raddr 0.0.0.0 rport 0\r\n\
                   a=candidate:4 1 tcp 41885438 127.0.0.1 49161 typ relay raddr 0.0.0.0 rport 0\r\n\
                   a=candidate:5 1 udp 41885439 not-an-ip 49162 typ relay\r\n";
        let (kept, peers) = relay_only(sdp);
        assert_eq!(peers, ["127.0.0.1:49160".parse::<SocketAddr>().unwrap()]);
        assert_eq!(kept.matches("a=candidate:").count(), 1);
        assert!(kept.contains("49160 typ relay"));
        assert!(!kept.contains("192.168.1.5") && !kept.contains("203.0.113.7"));
    }
}
