//! The worker's TURN client (RFC 8656), sans-IO: the live view's only network path (BROW-9).
//!
//! The worker never advertises an address of its own. It allocates a relayed address on the one
//! configured TURN authority with the session's TURN REST credential, and every packet of every
//! viewer's WebRTC connection goes to the authority wrapped in a Send indication and comes back
//! in a Data indication. [`Client`] builds the requests (Allocate with the long-term credential's
//! 401 challenge, CreatePermission, Refresh), wraps and unwraps data, and reads the answers; the
//! caller owns the socket and the clock.
//!
//! The long-term credential's key is MD5(username ":" realm ":" password) and MESSAGE-INTEGRITY
//! is HMAC-SHA1 over the message up to that attribute, with the header's length counting it
//! (RFC 8489 14.5). A stale nonce (438) is answered by the caller retrying with the new one.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use corral_core::browser::turn::STUN_MAGIC_COOKIE;
use hmac::{Hmac, KeyInit as _, Mac as _};
use md5::{Digest as _, Md5};
use sha1::Sha1;

const ALLOCATE: u16 = 0x003;
const REFRESH: u16 = 0x004;
const SEND: u16 = 0x006;
const DATA: u16 = 0x007;
const CREATE_PERMISSION: u16 = 0x008;

const CLASS_REQUEST: u16 = 0x0000;
const CLASS_INDICATION: u16 = 0x0010;
const CLASS_SUCCESS: u16 = 0x0100;
const CLASS_ERROR: u16 = 0x0110;

const ATTR_USERNAME: u16 = 0x0006;
const ATTR_MESSAGE_INTEGRITY: u16 = 0x0008;
const ATTR_ERROR_CODE: u16 = 0x0009;
const ATTR_LIFETIME: u16 = 0x000D;
const ATTR_XOR_PEER_ADDRESS: u16 = 0x0012;
const ATTR_DATA: u16 = 0x0013;
const ATTR_REALM: u16 = 0x0014;
const ATTR_NONCE: u16 = 0x0015;
const ATTR_XOR_RELAYED_ADDRESS: u16 = 0x0016;
const ATTR_REQUESTED_TRANSPORT: u16 = 0x0019;
const ATTR_XOR_MAPPED_ADDRESS: u16 = 0x0020;

/// UDP, as REQUESTED-TRANSPORT names it.
const TRANSPORT_UDP: u8 = 17;
/// How long an allocation is asked to live; refreshed at half of it.
pub const ALLOCATION_LIFETIME_SECONDS: u32 = 600;
/// A permission lasts 300 s on the server (RFC 8656 9); renewed well before.
pub const PERMISSION_RENEW_SECONDS: u64 = 120;

/// What a packet from the authority was.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A peer's packet relayed to the allocation.
    Data { peer: SocketAddr, data: Vec<u8> },
    /// The answer to one of this client's requests.
    Answer {
        transaction: [u8; 12],
        answer: Answer,
    },
    /// Not a STUN message this client knows, or not for it.
    Other,
}

/// A request's outcome.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// An Allocate's success: the relayed address, and the address the server saw.
    Allocated {
        relayed: SocketAddr,
        mapped: Option<SocketAddr>,
    },
    /// Any other success.
    Done,
    /// An error with its code and, for a challenge or a stale nonce, the realm and nonce.
    Error {
        code: u16,
        realm: Option<String>,
        nonce: Option<String>,
    },
}

/// One client of one authority, with one credential.
pub struct Client {
    username: String,
    password: String,
    realm: Option<String>,
    nonce: Option<String>,
    key: Option<[u8; 16]>,
    /// The method of each request in flight.
    pending: HashMap<[u8; 12], u16>,
}

fn message(kind: u16, transaction: &[u8; 12], attributes: &[(u16, &[u8])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend(kind.to_be_bytes());
    out.extend([0, 0]);
    out.extend(STUN_MAGIC_COOKIE.to_be_bytes());
    out.extend(transaction);
    for (kind, value) in attributes {
        push_attribute(&mut out, *kind, value);
    }
    set_length(&mut out);
    out
}

fn push_attribute(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    out.extend(kind.to_be_bytes());
    // Attributes this client writes are far below 64 KiB (a datagram's payload bounds DATA).
    out.extend(u16::try_from(value.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

fn set_length(out: &mut [u8]) {
    let length = u16::try_from(out.len() - 20).unwrap_or(u16::MAX);
    out[2..4].copy_from_slice(&length.to_be_bytes());
}

/// The attributes of a STUN message, in order; `None` when it is not one.
fn attributes(packet: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    if packet.len() < 20
        || packet[0] & 0xC0 != 0
        || packet[4..8] != STUN_MAGIC_COOKIE.to_be_bytes()
        || usize::from(u16::from_be_bytes([packet[2], packet[3]])) + 20 != packet.len()
    {
        return None;
    }
    let mut found = Vec::new();
    let mut at = 20;
    while at + 4 <= packet.len() {
        let kind = u16::from_be_bytes([packet[at], packet[at + 1]]);
        let len = usize::from(u16::from_be_bytes([packet[at + 2], packet[at + 3]]));
        let value = packet.get(at + 4..at + 4 + len)?;
        found.push((kind, value));
        at = (at + 4 + len).next_multiple_of(4);
    }
    Some(found)
}

/// An XOR-…-ADDRESS value (RFC 8489 14.2).
fn xor_address(value: &[u8], transaction: &[u8]) -> Option<SocketAddr> {
    let cookie = STUN_MAGIC_COOKIE.to_be_bytes();
    let port =
        u16::from_be_bytes([*value.get(2)?, *value.get(3)?]) ^ (STUN_MAGIC_COOKIE >> 16) as u16;
    let ip = match *value.get(1)? {
        0x01 => {
            let raw: [u8; 4] = value.get(4..8)?.try_into().ok()?;
            let mut ip = [0u8; 4];
            for i in 0..4 {
                ip[i] = raw[i] ^ cookie[i];
            }
            IpAddr::V4(Ipv4Addr::from(ip))
        }
        0x02 => {
            let raw: [u8; 16] = value.get(4..20)?.try_into().ok()?;
            let mask: Vec<u8> = cookie.iter().chain(transaction).copied().collect();
            let mut ip = [0u8; 16];
            for i in 0..16 {
                ip[i] = raw[i] ^ mask[i];
            }
            IpAddr::V6(Ipv6Addr::from(ip))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn encode_xor_address(address: SocketAddr, transaction: &[u8; 12]) -> Vec<u8> {
    let cookie = STUN_MAGIC_COOKIE.to_be_bytes();
    let port = address.port() ^ (STUN_MAGIC_COOKIE >> 16) as u16;
    let mut out = vec![0];
    match address.ip() {
        IpAddr::V4(ip) => {
            out.push(0x01);
            out.extend(port.to_be_bytes());
            out.extend(ip.octets().iter().zip(cookie).map(|(a, b)| a ^ b));
        }
        IpAddr::V6(ip) => {
            out.push(0x02);
            out.extend(port.to_be_bytes());
            let mask = cookie.iter().chain(transaction);
            out.extend(ip.octets().iter().zip(mask).map(|(a, b)| a ^ b));
        }
    }
    out
}

impl Client {
    /// A client that authenticates as `username` with `password` (the TURN REST credential).
    #[must_use]
    pub fn new(username: &str, password: &str) -> Client {
        Client {
            username: username.to_owned(),
            password: password.to_owned(),
            realm: None,
            nonce: None,
            key: None,
            pending: HashMap::new(),
        }
    }

    /// Takes the realm and nonce of a challenge (401) or a stale nonce (438).
    pub fn challenged(&mut self, realm: Option<String>, nonce: Option<String>) {
        if let Some(realm) = realm {
            let mut md5 = Md5::new();
            md5.update(format!("{}:{realm}:{}", self.username, self.password));
            self.key = Some(md5.finalize().into());
            self.realm = Some(realm);
        }
        if nonce.is_some() {
            self.nonce = nonce;
        }
    }

    /// A request of `method` with `attributes`, authenticated once a challenge was taken.
    fn request(
        &mut self,
        method: u16,
        transaction: [u8; 12],
        attributes: &[(u16, &[u8])],
    ) -> Vec<u8> {
        self.pending.insert(transaction, method);
        let mut all: Vec<(u16, &[u8])> = attributes.to_vec();
        let (Some(key), Some(realm), Some(nonce)) = (self.key, &self.realm, &self.nonce) else {
            return message(method | CLASS_REQUEST, &transaction, &all);
        };
        all.push((ATTR_USERNAME, self.username.as_bytes()));
        all.push((ATTR_REALM, realm.as_bytes()));
        all.push((ATTR_NONCE, nonce.as_bytes()));
        let mut out = message(method | CLASS_REQUEST, &transaction, &all);
        // The length counts MESSAGE-INTEGRITY (4 + 20 bytes) before it is computed.
        let length = u16::try_from(out.len() - 20 + 24).unwrap_or(u16::MAX);
        out[2..4].copy_from_slice(&length.to_be_bytes());
        let Ok(mut mac) = Hmac::<Sha1>::new_from_slice(&key) else {
            return out;
        };
        mac.update(&out);
        let integrity = mac.finalize().into_bytes();
        push_attribute(&mut out, ATTR_MESSAGE_INTEGRITY, &integrity);
        set_length(&mut out);
        out
    }

    /// An Allocate request for a UDP relay.
    pub fn allocate(&mut self, transaction: [u8; 12]) -> Vec<u8> {
        let lifetime = ALLOCATION_LIFETIME_SECONDS.to_be_bytes();
        self.request(
            ALLOCATE,
            transaction,
            &[
                (ATTR_REQUESTED_TRANSPORT, &[TRANSPORT_UDP, 0, 0, 0]),
                (ATTR_LIFETIME, &lifetime),
            ],
        )
    }

    /// A Refresh keeping the allocation for `lifetime` seconds more (0 ends it).
    pub fn refresh(&mut self, transaction: [u8; 12], lifetime: u32) -> Vec<u8> {
        self.request(
            REFRESH,
            transaction,
            &[(ATTR_LIFETIME, &lifetime.to_be_bytes())],
        )
    }

    /// A CreatePermission for `peer`'s address (its port does not matter to the server).
    pub fn create_permission(&mut self, transaction: [u8; 12], peer: SocketAddr) -> Vec<u8> {
        let address = encode_xor_address(peer, &transaction);
        self.request(
            CREATE_PERMISSION,
            transaction,
            &[(ATTR_XOR_PEER_ADDRESS, &address)],
        )
    }

    /// `data` for `peer`, as a Send indication (indications are not authenticated).
    #[must_use]
    pub fn send(transaction: [u8; 12], peer: SocketAddr, data: &[u8]) -> Vec<u8> {
        let address = encode_xor_address(peer, &transaction);
        message(
            SEND | CLASS_INDICATION,
            &transaction,
            &[(ATTR_XOR_PEER_ADDRESS, &address), (ATTR_DATA, data)],
        )
    }

    /// Reads a packet from the authority.
    pub fn receive(&mut self, packet: &[u8]) -> Incoming {
        let Some(attributes) = attributes(packet) else {
            return Incoming::Other;
        };
        let kind = u16::from_be_bytes([packet[0], packet[1]]);
        let mut transaction = [0u8; 12];
        transaction.copy_from_slice(&packet[8..20]);
        let find = |wanted: u16| {
            attributes
                .iter()
                .find(|(kind, _)| *kind == wanted)
                .map(|(_, v)| *v)
        };
        if kind == DATA | CLASS_INDICATION {
            return match (
                find(ATTR_XOR_PEER_ADDRESS).and_then(|v| xor_address(v, &transaction)),
                find(ATTR_DATA),
            ) {
                (Some(peer), Some(data)) => Incoming::Data {
                    peer,
                    data: data.to_vec(),
                },
                _ => Incoming::Other,
            };
        }
        let method = kind & !0x0110;
        if self.pending.get(&transaction) != Some(&method) {
            return Incoming::Other;
        }
        self.pending.remove(&transaction);
        let text = |v: Option<&[u8]>| v.map(|v| String::from_utf8_lossy(v).into_owned());
        let answer = match kind & 0x0110 {
            CLASS_SUCCESS if method == ALLOCATE => {
                match find(ATTR_XOR_RELAYED_ADDRESS).and_then(|v| xor_address(v, &transaction)) {
                    Some(relayed) => Answer::Allocated {
                        relayed,
                        mapped: find(ATTR_XOR_MAPPED_ADDRESS)
                            .and_then(|v| xor_address(v, &transaction)),
                    },
                    None => Answer::Error {
                        code: 0,
                        realm: None,
                        nonce: None,
                    },
                }
            }
            CLASS_SUCCESS => Answer::Done,
            CLASS_ERROR => Answer::Error {
                code: find(ATTR_ERROR_CODE)
                    .filter(|v| v.len() >= 4)
                    .map_or(0, |v| u16::from(v[2] & 0x7) * 100 + u16::from(v[3])),
                realm: text(find(ATTR_REALM)),
                nonce: text(find(ATTR_NONCE)),
            },
            _ => return Incoming::Other,
        };
        Incoming::Answer {
            transaction,
            answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brow_09_an_address_round_trips_through_its_xor_encoding() {
        let transaction = [7u8; 12];
        for address in ["127.0.0.1:49152", "[2001:db8::1]:3478", "10.1.2.3:1"] {
            let address: SocketAddr = address.parse().unwrap();
            let encoded = encode_xor_address(address, &transaction);
            assert_eq!(xor_address(&encoded, &transaction), Some(address));
        }
    }

    #[test]
    fn brow_09_a_send_indication_reads_back_as_data_when_relayed() {
        let peer: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        let mut packet = Client::send([1; 12], peer, b"hello, world");
        // The authority turns a Send into a Data indication with the same attributes.
        packet[..2].copy_from_slice(&(DATA | CLASS_INDICATION).to_be_bytes());
        let mut client = Client::new("u", "p");
        assert_eq!(
            client.receive(&packet),
            Incoming::Data {
                peer,
                data: b"hello, world".to_vec()
            }
        );
    }

    #[test]
    fn brow_09_an_answer_to_nothing_asked_is_ignored() {
        let mut client = Client::new("u", "p");
        let stray = message(ALLOCATE | CLASS_SUCCESS, &[2; 12], &[]);
        assert_eq!(client.receive(&stray), Incoming::Other);
        let asked = client.allocate([3; 12]);
        assert_eq!(asked.len() % 4, 0);
        let error = message(
            ALLOCATE | CLASS_ERROR,
            &[3; 12],
            &[
                (ATTR_ERROR_CODE, &[0, 0, 4, 1]),
                (ATTR_REALM, b"corral"),
                (ATTR_NONCE, b"n1"),
            ],
        );
        assert_eq!(
            client.receive(&error),
            Incoming::Answer {
                transaction: [3; 12],
                answer: Answer::Error {
                    code: 401,
                    realm: Some("corral".into()),
                    nonce: Some("n1".into())
                }
            }
        );
        // The same answer twice is not a second answer.
        assert_eq!(client.receive(&error), Incoming::Other);
        assert_eq!(
            client.receive(b"not stun at all, twenty+ bytes"),
            Incoming::Other
        );
    }

    #[test]
    fn brow_09_an_authenticated_request_carries_a_valid_integrity() {
        let mut client = Client::new("1700000000:session", "secret");
        client.challenged(Some("corral".into()), Some("nonce".into()));
        let packet = client.create_permission([4; 12], "127.0.0.1:1".parse().unwrap());
        let attrs = attributes(&packet).unwrap();
        let (at, _) = attrs
            .iter()
            .enumerate()
            .find(|(_, (k, _))| *k == ATTR_MESSAGE_INTEGRITY)
            .unwrap();
        assert_eq!(at, attrs.len() - 1, "MESSAGE-INTEGRITY is last");
        let mac_at = packet.len() - 24;
        let mut covered = packet[..mac_at].to_vec();
        covered[2..4].copy_from_slice(&u16::try_from(packet.len() - 20).unwrap().to_be_bytes());
        let key: [u8; 16] = Md5::digest(b"1700000000:session:corral:secret").into();
        let mut mac = Hmac::<Sha1>::new_from_slice(&key).unwrap();
        mac.update(&covered);
        assert_eq!(&packet[mac_at + 4..], &mac.finalize().into_bytes()[..]);
    }
}
