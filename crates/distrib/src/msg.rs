//! The distributer's messages. Each is one binding message (a `MSG` frame, see
//! `bs_binding::driver`) whose first byte says what it is; numbers are big-endian.
//!
//! ```text
//!  kind  name      direction                      body
//!  1     JOIN      sender/receiver → distributer  role u8 (1 sender, 2 receiver), JSON
//!                                                 {"stream","flow","name","token"}
//!  2     WELCOME   distributer → both             JSON {"policy", "chunk", "pace", "socket_buffer",
//!                                                 "transport", "datagram", "udp_port"}
//!  3     START     sender → distributer → recv.   JSON object: the flow's parameters
//!  4     DATA      sender → distributer → recv.   offset u64, then the bytes
//!  5     STOP      sender → distributer → recv.   total u64, xxh3-128 digest of the flow (16)
//!  6     CONFIRM   receiver → distributer         total u64 (bytes it got), ok u8, reason (UTF-8)
//!  7     DROPPED   distributer → sender           JSON {"receiver","delivered","reason"}
//!  8     STOPPED   distributer → sender           JSON {"total","receivers":[{"name",
//!                                                 "delivered","ok","reason"}]}
//!  9     ABORT     distributer → receiver         reason (UTF-8): the run ends unfinished
//! 10     PORT      receiver → distributer         port u16: where its datagrams go (udp flows)
//! 11     SENT      distributer → receiver         datagrams u64 sent to it so far (udp flows,
//!                                                 just before START and before STOP)
//! 12     LOST      receiver → distributer         datagrams u64 of the run that never came
//!                                                 (udp flows, just before CONFIRM)
//! ```
//!
//! On a `udp` flow a receiver's `DATA` travels as datagrams instead (format in [`crate::udp`]);
//! every other message stays on its TCP connection. After `WELCOME` (which names the
//! distributer's datagram port) the receiver answers `PORT` with its own.
//!
//! A `DATA` message is forwarded to every receiver exactly as the sender sent it (the same
//! buffer). A connection's first message is `JOIN`; the distributer answers `WELCOME` or ends
//! the connection with an `ERROR` frame naming what is wrong.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::DistribError;

/// A flow's start parameters (an observation id, a file name, …): short, typed values.
pub type Params = BTreeMap<String, serde_json::Value>;

pub const JOIN: u8 = 1;
pub const WELCOME: u8 = 2;
pub const START: u8 = 3;
pub const DATA: u8 = 4;
pub const STOP: u8 = 5;
pub const CONFIRM: u8 = 6;
pub const DROPPED: u8 = 7;
pub const STOPPED: u8 = 8;
pub const ABORT: u8 = 9;
pub const PORT: u8 = 10;
pub const SENT: u8 = 11;
pub const LOST: u8 = 12;

/// Bytes before a `DATA` message's payload: kind and offset.
pub const DATA_HEAD: usize = 9;

pub const ROLE_SENDER: u8 = 1;
pub const ROLE_RECEIVER: u8 = 2;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Join {
    pub stream: String,
    pub flow: String,
    /// A receiver's name (reported to the sender); empty for a sender.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Welcome {
    pub policy: String,
    /// Largest `DATA` payload the flow takes.
    pub chunk: u64,
    /// The flow's pace for senders (bytes/s); 0: none.
    #[serde(default)]
    pub pace: u64,
    /// The flow's socket buffer (bytes) for the client's end of the connection; 0: the
    /// kernel's.
    #[serde(default)]
    pub socket_buffer: u64,
    /// "tcp" or "udp" (how the distributer sends to receivers).
    #[serde(default = "tcp")]
    pub transport: String,
    /// udp: payload bytes per datagram, and the port the distributer sends them from.
    #[serde(default)]
    pub datagram: u64,
    #[serde(default)]
    pub udp_port: u16,
}

fn tcp() -> String {
    "tcp".into()
}

/// What became of one receiver in a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Outcome {
    pub name: String,
    /// Bytes the receiver was sent (all of them, when `ok`).
    pub delivered: u64,
    /// It confirmed the exact total and digest.
    pub ok: bool,
    /// Why not, when not.
    #[serde(default)]
    pub reason: String,
    /// udp flows: datagrams of the run that never reached it.
    #[serde(default)]
    pub lost: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stopped {
    pub total: u64,
    pub receivers: Vec<Outcome>,
}

/// A parsed message (a `DATA` payload stays where it arrived: see [`data_payload`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Join(u8, Join),
    Welcome(Welcome),
    Start(Params),
    Data { offset: u64, len: usize },
    Stop { total: u64, digest: [u8; 16] },
    Confirm { total: u64, ok: bool, reason: String },
    Dropped(Outcome),
    Stopped(Stopped),
    Abort(String),
    Port(u16),
    Sent(u64),
    Lost(u64),
}

fn bad(what: &str) -> DistribError {
    DistribError::Malformed(what.to_string())
}

fn json<T: serde::de::DeserializeOwned>(b: &[u8], what: &str) -> Result<T, DistribError> {
    serde_json::from_slice(b).map_err(|e| DistribError::Malformed(format!("{what}: {e}")))
}

fn u64_at(b: &[u8], what: &str) -> Result<u64, DistribError> {
    let bytes: [u8; 8] = b.get(..8).and_then(|s| s.try_into().ok()).ok_or_else(|| bad(what))?;
    Ok(u64::from_be_bytes(bytes))
}

impl Message {
    /// Parse one binding message.
    pub fn parse(m: &[u8]) -> Result<Self, DistribError> {
        let (&kind, body) = m.split_first().ok_or_else(|| bad("empty message"))?;
        Ok(match kind {
            JOIN => {
                let (&role, rest) = body.split_first().ok_or_else(|| bad("JOIN without a role"))?;
                if role != ROLE_SENDER && role != ROLE_RECEIVER {
                    return Err(bad(&format!("JOIN with unknown role {role}")));
                }
                Message::Join(role, json(rest, "JOIN")?)
            }
            WELCOME => Message::Welcome(json(body, "WELCOME")?),
            START => Message::Start(json(body, "START parameters")?),
            DATA => Message::Data {
                offset: u64_at(body, "DATA shorter than its offset")?,
                len: body.len() - 8,
            },
            STOP => {
                let total = u64_at(body, "STOP shorter than its total")?;
                let digest = body
                    .get(8..24)
                    .and_then(|d| d.try_into().ok())
                    .filter(|_| body.len() == 24)
                    .ok_or_else(|| bad("STOP without a 16-byte digest"))?;
                Message::Stop { total, digest }
            }
            CONFIRM => {
                let total = u64_at(body, "CONFIRM shorter than its total")?;
                let ok = *body.get(8).ok_or_else(|| bad("CONFIRM without its flag"))? == 1;
                let reason = String::from_utf8_lossy(&body[9..]).into_owned();
                Message::Confirm { total, ok, reason }
            }
            DROPPED => Message::Dropped(json(body, "DROPPED")?),
            STOPPED => Message::Stopped(json(body, "STOPPED")?),
            ABORT => Message::Abort(String::from_utf8_lossy(body).into_owned()),
            PORT => {
                let port: [u8; 2] = body.try_into().map_err(|_| bad("PORT is not a u16"))?;
                Message::Port(u16::from_be_bytes(port))
            }
            SENT => Message::Sent(u64_at(body, "SENT shorter than its count")?),
            LOST => Message::Lost(u64_at(body, "LOST shorter than its count")?),
            k => return Err(bad(&format!("unknown message kind {k}"))),
        })
    }
}

/// The payload of a `DATA` message (after kind and offset).
pub fn data_payload(m: &[u8]) -> &[u8] {
    &m[DATA_HEAD..]
}

/// `DATA`'s kind and offset, to send in front of the payload.
pub fn data_head(offset: u64) -> [u8; DATA_HEAD] {
    let mut h = [0u8; DATA_HEAD];
    h[0] = DATA;
    h[1..].copy_from_slice(&offset.to_be_bytes());
    h
}

fn with_json(kind: u8, v: &impl Serialize) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&serde_json::to_vec(v).expect("plain data serializes"));
    out
}

pub fn join(role: u8, j: &Join) -> Vec<u8> {
    let mut out = vec![JOIN, role];
    out.extend_from_slice(&serde_json::to_vec(j).expect("plain data serializes"));
    out
}

pub fn welcome(w: &Welcome) -> Vec<u8> {
    with_json(WELCOME, w)
}

pub fn start(p: &Params) -> Vec<u8> {
    with_json(START, p)
}

pub fn stop(total: u64, digest: &[u8; 16]) -> Vec<u8> {
    let mut out = vec![STOP];
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(digest);
    out
}

pub fn confirm(total: u64, ok: bool, reason: &str) -> Vec<u8> {
    let mut out = vec![CONFIRM];
    out.extend_from_slice(&total.to_be_bytes());
    out.push(ok as u8);
    out.extend_from_slice(reason.as_bytes());
    out
}

pub fn port(p: u16) -> Vec<u8> {
    let mut out = vec![PORT];
    out.extend_from_slice(&p.to_be_bytes());
    out
}

pub fn sent(datagrams: u64) -> Vec<u8> {
    let mut out = vec![SENT];
    out.extend_from_slice(&datagrams.to_be_bytes());
    out
}

pub fn lost(datagrams: u64) -> Vec<u8> {
    let mut out = vec![LOST];
    out.extend_from_slice(&datagrams.to_be_bytes());
    out
}

pub fn dropped(o: &Outcome) -> Vec<u8> {
    with_json(DROPPED, o)
}

pub fn stopped(s: &Stopped) -> Vec<u8> {
    with_json(STOPPED, s)
}

pub fn abort(reason: &str) -> Vec<u8> {
    let mut out = vec![ABORT];
    out.extend_from_slice(reason.as_bytes());
    out
}

/// The xxh3-128 digest a `STOP` carries, as bytes.
pub fn digest_bytes(d: &bs_wire::Digest) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&d.bytes[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let j = Join {
            stream: "s".into(),
            flow: "f".into(),
            name: "archive".into(),
            token: "t".into(),
        };
        assert_eq!(Message::parse(&join(ROLE_RECEIVER, &j)).unwrap(), Message::Join(2, j));
        let mut p = Params::new();
        p.insert("obs".into(), serde_json::json!("uid://A002/X1"));
        p.insert("scan".into(), serde_json::json!(7));
        assert_eq!(Message::parse(&start(&p)).unwrap(), Message::Start(p));
        let mut d = data_head(42).to_vec();
        d.extend_from_slice(b"abc");
        assert_eq!(Message::parse(&d).unwrap(), Message::Data { offset: 42, len: 3 });
        assert_eq!(data_payload(&d), b"abc");
        assert_eq!(
            Message::parse(&stop(9, &[7; 16])).unwrap(),
            Message::Stop { total: 9, digest: [7; 16] }
        );
        assert_eq!(
            Message::parse(&confirm(9, false, "digest differs")).unwrap(),
            Message::Confirm { total: 9, ok: false, reason: "digest differs".into() }
        );
        assert_eq!(Message::parse(&lost(3)).unwrap(), Message::Lost(3));
        assert_eq!(Message::parse(&port(40_000)).unwrap(), Message::Port(40_000));
        assert_eq!(Message::parse(&sent(1 << 40)).unwrap(), Message::Sent(1 << 40));
        assert_eq!(Message::parse(&abort("gone")).unwrap(), Message::Abort("gone".into()));
    }

    #[test]
    fn malformed_messages_are_named() {
        for (m, needle) in [
            (&[][..], "empty"),
            (&[99u8][..], "unknown message kind 99"),
            (&[JOIN, 7, b'{', b'}'][..], "unknown role 7"),
            (&[DATA, 0, 0][..], "DATA shorter"),
            (&[STOP, 0, 0, 0, 0, 0, 0, 0, 1, 2][..], "16-byte digest"),
            (&[START, b'['][..], "START parameters"),
            (&[LOST, 0, 0][..], "LOST shorter"),
            (&[PORT, 1][..], "PORT is not a u16"),
        ] {
            let e = Message::parse(m).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
