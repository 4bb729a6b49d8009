//! Brings the loopback interface of a new network namespace up, with one rtnetlink request.
//!
//! A new network namespace has only `lo`, and it is down. The usual `SIOCSIFFLAGS` ioctl needs
//! unsafe code; a netlink `RTM_NEWLINK` message does the same through a safe socket.

use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

const RTM_NEWLINK: u16 = 16;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const IFF_UP: u32 = 0x1;
/// `lo` is always interface 1 in a new network namespace.
const LOOPBACK_INDEX: i32 = 1;

/// The request: a `nlmsghdr` followed by an `ifinfomsg` setting `IFF_UP` on `lo`.
fn request() -> Vec<u8> {
    let mut message = Vec::with_capacity(32);
    message.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    message.extend_from_slice(&RTM_NEWLINK.to_ne_bytes()); // nlmsg_type
    message.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes()); // nlmsg_flags
    message.extend_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    message.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    message.push(libc::AF_UNSPEC as u8); // ifi_family
    message.push(0); // padding
    message.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    message.extend_from_slice(&LOOPBACK_INDEX.to_ne_bytes()); // ifi_index
    message.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    message.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    message
}

/// Sets `lo` up in the calling process's network namespace.
pub fn loopback_up() -> Result<(), String> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(|e| format!("netlink socket: {e}"))?;
    let kernel = NetlinkAddr::new(0, 0);
    sendto(fd.as_raw_fd(), &request(), &kernel, MsgFlags::empty())
        .map_err(|e| format!("netlink send: {e}"))?;
    let mut answer = [0u8; 1024];
    let length = recv(fd.as_raw_fd(), &mut answer, MsgFlags::empty())
        .map_err(|e| format!("netlink receive: {e}"))?;
    let answer = &answer[..length];
    let field = |at: usize, width: usize| answer.get(at..at + width);
    let kind = field(4, 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let error = field(16, 4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (kind, error) {
        (Some(NLMSG_ERROR), Some(0)) => Ok(()),
        (Some(NLMSG_ERROR), Some(code)) => Err(format!(
            "netlink RTM_NEWLINK: {}",
            nix::errno::Errno::from_raw(-code)
        )),
        _ => Err("netlink RTM_NEWLINK: unexpected answer".to_owned()),
    }
}
