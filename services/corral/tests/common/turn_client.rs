//! Just enough of a TURN client (RFC 8656) to ask a real TURN server for an allocation with a
//! credential: the Allocate request, its 401 with realm and nonce, and the authenticated retry
//! with MESSAGE-INTEGRITY (HMAC-SHA1 keyed with MD5(username:realm:password), RFC 5389 15.4).
//! The tests use it to see the server accept the credential Corral minted and refuse a forged
//! or expired one.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use hmac::{Hmac, KeyInit as _, Mac as _};
use md5::{Digest as _, Md5};
use sha1::Sha1;

const MAGIC: u32 = 0x2112_A442;
const ALLOCATE_REQUEST: u16 = 0x0003;
const ALLOCATE_SUCCESS: u16 = 0x0103;
const ALLOCATE_ERROR: u16 = 0x0113;
const USERNAME: u16 = 0x0006;
const MESSAGE_INTEGRITY: u16 = 0x0008;
const ERROR_CODE: u16 = 0x0009;
const REALM: u16 = 0x0014;
const NONCE: u16 = 0x0015;
const REQUESTED_TRANSPORT: u16 = 0x0019;
const XOR_RELAYED_ADDRESS: u16 = 0x0016;

/// What the server answered the authenticated Allocate.
#[derive(Debug, PartialEq, Eq)]
pub enum Allocation {
    /// An allocation, at this relayed address.
    Relayed(SocketAddr),
    /// An error response with this code (401: the credential was refused).
    Refused(u16),
}

fn message(kind: u16, transaction: &[u8; 12], attributes: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, value) in attributes {
        body.extend(kind.to_be_bytes());
        body.extend(u16::try_from(value.len()).unwrap().to_be_bytes());
        body.extend(value);
        body.resize(body.len().next_multiple_of(4), 0);
    }
    let mut out = Vec::new();
    out.extend(kind.to_be_bytes());
    out.extend(u16::try_from(body.len()).unwrap().to_be_bytes());
    out.extend(MAGIC.to_be_bytes());
    out.extend(transaction);
    out.extend(body);
    out
}

fn attributes(reply: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut found = Vec::new();
    let mut at = 20;
    while at + 4 <= reply.len() {
        let kind = u16::from_be_bytes([reply[at], reply[at + 1]]);
        let len = usize::from(u16::from_be_bytes([reply[at + 2], reply[at + 3]]));
        let Some(value) = reply.get(at + 4..at + 4 + len) else {
            break;
        };
        found.push((kind, value.to_vec()));
        at += 4 + len.next_multiple_of(4);
    }
    found
}

fn exchange(socket: &UdpSocket, request: &[u8]) -> Vec<u8> {
    let mut reply = vec![0u8; 1500];
    for _ in 0..5 {
        socket.send(request).expect("send to the TURN server");
        if let Ok(n) = socket.recv(&mut reply) {
            reply.truncate(n);
            return reply;
        }
    }
    panic!("the TURN server did not answer");
}

/// Asks `server` over UDP for an allocation as `username` with `password`.
pub fn allocate(server: SocketAddr, username: &str, password: &str) -> Allocation {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let transport = vec![17, 0, 0, 0];
    let first = exchange(
        &socket,
        &message(
            ALLOCATE_REQUEST,
            b"corral-alloc",
            &[(REQUESTED_TRANSPORT, transport.clone())],
        ),
    );
    assert_eq!(
        u16::from_be_bytes([first[0], first[1]]),
        ALLOCATE_ERROR,
        "an unauthenticated Allocate is challenged"
    );
    let challenge = attributes(&first);
    let value = |kind: u16| {
        challenge
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.clone())
            .expect("the challenge carries a realm and a nonce")
    };
    let (realm, nonce) = (value(REALM), value(NONCE));
    let mut key_input = format!("{username}:").into_bytes();
    key_input.extend(&realm);
    key_input.extend(format!(":{password}").bytes());
    let key = Md5::digest(&key_input);
    let transaction = b"corral-auth1";
    let mut request = message(
        ALLOCATE_REQUEST,
        transaction,
        &[
            (REQUESTED_TRANSPORT, transport),
            (USERNAME, username.as_bytes().to_vec()),
            (REALM, realm),
            (NONCE, nonce),
        ],
    );
    // The length counts the integrity attribute that follows (24 bytes) before it is computed.
    let length = u16::try_from(request.len() - 20 + 24).unwrap();
    request[2..4].copy_from_slice(&length.to_be_bytes());
    let mut mac = <Hmac<Sha1>>::new_from_slice(&key).unwrap();
    mac.update(&request);
    request.extend(MESSAGE_INTEGRITY.to_be_bytes());
    request.extend(20u16.to_be_bytes());
    request.extend(mac.finalize().into_bytes());
    let reply = exchange(&socket, &request);
    match u16::from_be_bytes([reply[0], reply[1]]) {
        ALLOCATE_SUCCESS => {
            let (_, relayed) = attributes(&reply)
                .into_iter()
                .find(|(k, _)| *k == XOR_RELAYED_ADDRESS)
                .expect("a relayed address");
            let port = u16::from_be_bytes([relayed[2], relayed[3]]) ^ 0x2112;
            let ip = u32::from_be_bytes(relayed[4..8].try_into().unwrap()) ^ MAGIC;
            Allocation::Relayed(SocketAddr::from((ip.to_be_bytes(), port)))
        }
        ALLOCATE_ERROR => {
            let (_, error) = attributes(&reply)
                .into_iter()
                .find(|(k, _)| *k == ERROR_CODE)
                .expect("an error code");
            Allocation::Refused(u16::from(error[2] & 7) * 100 + u16::from(error[3]))
        }
        other => panic!("an answer of type {other:#06x}"),
    }
}
