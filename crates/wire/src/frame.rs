//! The data-plane frame format.
//!
//! Every data connection carries a sequence of frames. A frame is a fixed 24-byte header,
//! optionally followed by a small control body (at most [`MAX_BODY_LEN`] bytes). A `DATA`
//! frame has no body; instead its header *announces* exactly how many raw payload bytes follow
//! it on the connection, so a receiver always knows when the payload ends and never stops early.
//! All integers are big-endian.
//!
//! ```text
//!  0       2     3      4             8                    16                   24
//!  +-------+-----+------+-------------+--------------------+--------------------+
//!  | "BS"  | ver | kind | body_len u32| a  u64             | b  u64             |
//!  +-------+-----+------+-------------+--------------------+--------------------+
//!  | body (body_len bytes, control frames only)                                 |
//!  +-----------------------------------------------------------------------------+
//! ```
//!
//! | kind | name  | a                         | b                          | body                         |
//! |------|-------|---------------------------|----------------------------|------------------------------|
//! | 1    | HELLO | 0                         | 0                          | one-time token (32 bytes)    |
//! | 2    | DATA  | blob offset of payload    | payload length; then `b` raw bytes follow | none          |
//! | 3    | SUM   | payload bytes in transfer | flags: bit 0 = FINAL       | algo id (u8) + digest        |
//! | 4    | ACK   | bytes received / blob size| flags: bit 0 = COMMITTED   | algo id + whole-blob digest, or empty |
//! | 5    | ERROR | error code (see [`ErrorCode`]) | 0                     | UTF-8 message                |
//! | 6    | MSG   | epoch (16 bits) << 48 \| sequence number (48 bits) | wire length; then `b` layered bytes follow | none |
//! | 7    | RENEG | renegotiation id          | step (see [`RenegStep`])   | encoded QoS profile, or reason |
//! | 8    | REPORT| datagrams sent (sender) or received (receiver) | datagrams lost | reordered u64 + duplicates u64 |
//! | 9    | NEGOTIATE | 0                     | 0                          | protobuf `NegotiateRequest`  |
//! | 10   | GRANT | 0 (granted) or a gRPC status code (refused) | 0    | protobuf `NegotiateResponse`, or UTF-8 reason |
//!
//! A **push** is `HELLO, DATA+payload…, SUM` from the client; the server answers the `HELLO`
//! with an `ACK` without the COMMITTED flag (admitted: send) and the `SUM` with an `ACK` (the
//! end-to-end confirmation), or either with `ERROR`. A **pull** is the client's `HELLO`, answered by
//! `DATA+payload…, SUM` (or `ERROR`); it needs no confirmation. `SUM` carries the digest of every
//! payload byte of the transfer, in order, which the receiver verifies. A connection whose
//! transfer ended cleanly may start another with a new `HELLO` (keep-alive; each transfer has
//! its own one-time token).
//!
//! **In-band negotiation.** On such a kept-alive connection the client may send a
//! `NEGOTIATE` in place of the next `HELLO`: the same request the control plane's
//! `Negotiate` call takes, answered by a `GRANT` carrying the same answer (without a token:
//! none is needed, the transfer runs on this connection at once) — then the transfer goes on
//! exactly as after a `HELLO`. A refusal is a `GRANT` with the gRPC status code the call
//! would have returned and its reason; the connection then waits for the next request. The
//! connection was admitted by a one-time token that only an authenticated `Negotiate`
//! hands out, and a server that requires a token of its control plane requires it in every
//! in-band request too (`NegotiateRequest.auth`; `ERROR(BadToken)` and the connection closed
//! without it); a connection that has not yet carried a token's transfer cannot negotiate in
//! band. This saves the control plane's
//! round trip, and the server's admission `ACK` of a push follows the `GRANT` at once.
//!
//! **Pipelined pushes.** A request marked `pipelined` (a push of a known length of at most
//! the server's `pipeline_up_to`) is followed at once by the transfer's `DATA` and its FINAL
//! `SUM`, without waiting for the `GRANT`; the `GRANT`, the admission `ACK` and the commit
//! `ACK` then come back together: one round trip for a small blob. A refused one's frames are
//! read and dropped through the `SUM` before the refusing `GRANT` is sent, so the connection
//! stays in step (more than `pipeline_up_to` bytes, or another frame, closes it).
//!
//! A **binding** (crate `blobstream-binding`) carries messages instead of blob ranges: after
//! the `HELLO`, each message travels as a `MSG` header announcing its *wire* length (the
//! message after every negotiated protocol layer pushed its header), then those bytes.
//! `RENEG` frames renegotiate the binding's QoS in the same stream, between messages: a
//! `PROPOSE` is answered by a `COUNTER` (or `REFUSE`), the proposer then sends `ACCEPT` (its
//! messages after that frame use the new profile) or `REFUSE`, and the answerer confirms an
//! `ACCEPT` with `APPLIED` (its messages after that frame use the new profile). Each direction
//! therefore switches at a frame boundary that its sender marks; the `MSG` epoch counts those
//! switches, so a datagram (which may overtake the `RENEG` on another socket) still says
//! which profile encoded it. A datagram binding sends each `MSG` as one UDP datagram and
//! keeps its TCP connection for `RENEG` and the closing `REPORT`s: the sender's says how many
//! datagrams it sent, the receiver's answer how many arrived, were lost, came late or twice.

use bytes::{BufMut, Bytes, BytesMut};

use crate::digest::Digest;
use crate::error::WireError;

/// Two bytes every frame starts with.
pub const MAGIC: u16 = 0x4253; // "BS"
/// Version of this format.
pub const VERSION: u8 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 24;
/// Largest control body accepted; anything larger is rejected before allocating.
pub const MAX_BODY_LEN: u32 = 64 * 1024;
/// Length of a one-time data-connection token.
pub const TOKEN_LEN: usize = 32;

/// `SUM` flag: this transfer completes the upload; commit it.
pub const FLAG_FINAL: u64 = 1;
/// `ACK` flag: the blob is committed and visible.
pub const FLAG_COMMITTED: u64 = 1;

/// The kind byte of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Hello = 1,
    Data = 2,
    Sum = 3,
    Ack = 4,
    Error = 5,
    Msg = 6,
    Reneg = 7,
    Report = 8,
    Negotiate = 9,
    Grant = 10,
}

/// The step a `RENEG` frame takes (its `b` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RenegStep {
    /// A new profile is proposed (body: the profile).
    Propose = 1,
    /// The answerer's offer, perhaps lowered (body: the profile).
    Counter = 2,
    /// The proposer takes the offer; its messages after this frame use it (body: empty).
    Accept = 3,
    /// Either side declines (body: the reason, UTF-8); nothing changes.
    Refuse = 4,
    /// The answerer's messages after this frame use the accepted profile (body: empty).
    Applied = 5,
}

impl RenegStep {
    fn from_u64(v: u64) -> Option<Self> {
        Some(match v {
            1 => Self::Propose,
            2 => Self::Counter,
            3 => Self::Accept,
            4 => Self::Refuse,
            5 => Self::Applied,
            _ => return None,
        })
    }
}

impl FrameKind {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            1 => Self::Hello,
            2 => Self::Data,
            3 => Self::Sum,
            4 => Self::Ack,
            5 => Self::Error,
            6 => Self::Msg,
            7 => Self::Reneg,
            8 => Self::Report,
            9 => Self::Negotiate,
            10 => Self::Grant,
            other => return Err(WireError::UnknownKind(other)),
        })
    }

    /// Lower-case name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hello => "HELLO",
            Self::Data => "DATA",
            Self::Sum => "SUM",
            Self::Ack => "ACK",
            Self::Error => "ERROR",
            Self::Msg => "MSG",
            Self::Reneg => "RENEG",
            Self::Report => "REPORT",
            Self::Negotiate => "NEGOTIATE",
            Self::Grant => "GRANT",
        }
    }
}

/// Error codes carried by `ERROR` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The token is unknown to this server.
    BadToken = 1,
    /// The token was valid but its time ran out.
    TokenExpired = 2,
    /// The token was already used once.
    TokenReused = 3,
    /// A frame broke the format (bad magic, absurd length, unexpected kind).
    BadFrame = 4,
    /// A DATA frame fell outside the negotiated range.
    OutOfRange = 5,
    /// The receiver's digest differs from the sender's.
    ChecksumMismatch = 6,
    /// The store ran out of space.
    StorageFull = 7,
    /// The blob does not exist (any more).
    NotFound = 8,
    /// The upload was finalised before all its bytes arrived.
    Incomplete = 9,
    /// Anything else on the server side.
    Internal = 10,
    /// Another transfer is writing the same upload, or the server is at its connection limit.
    Busy = 11,
    /// The stored blob failed its digest check: corrupt on disk (or in memory).
    Corrupt = 12,
    /// A binding's message broke a negotiated layer (checksum, size cap, decompression).
    BadMessage = 13,
    /// A renegotiation broke the protocol (e.g. during a fragmented message).
    BadRenegotiation = 14,
    /// The peer sent too slowly: a push averaged under the server's floor on its rate.
    TooSlow = 15,
}

impl ErrorCode {
    /// Decode a code; unknown codes map to `Internal`.
    pub fn from_u64(v: u64) -> Self {
        match v {
            1 => Self::BadToken,
            2 => Self::TokenExpired,
            3 => Self::TokenReused,
            4 => Self::BadFrame,
            5 => Self::OutOfRange,
            6 => Self::ChecksumMismatch,
            7 => Self::StorageFull,
            8 => Self::NotFound,
            9 => Self::Incomplete,
            11 => Self::Busy,
            12 => Self::Corrupt,
            13 => Self::BadMessage,
            14 => Self::BadRenegotiation,
            15 => Self::TooSlow,
            _ => Self::Internal,
        }
    }
}

/// A decoded fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub body_len: u32,
    pub a: u64,
    pub b: u64,
}

impl Header {
    /// Parse and validate a header. Rejects bad magic, versions, kinds, and bodies larger than
    /// [`MAX_BODY_LEN`] — before anyone allocates for them.
    pub fn parse(buf: &[u8; HEADER_LEN]) -> Result<Self, WireError> {
        let magic = u16::from_be_bytes([buf[0], buf[1]]);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if buf[2] != VERSION {
            return Err(WireError::BadVersion(buf[2]));
        }
        let kind = FrameKind::from_u8(buf[3])?;
        let body_len = u32::from_be_bytes(buf[4..8].try_into().unwrap());
        if body_len > MAX_BODY_LEN {
            return Err(WireError::BodyTooLarge { len: body_len, max: MAX_BODY_LEN });
        }
        if matches!(kind, FrameKind::Data | FrameKind::Msg) && body_len != 0 {
            return Err(malformed(kind, "DATA and MSG frames carry no body"));
        }
        let a = u64::from_be_bytes(buf[8..16].try_into().unwrap());
        let b = u64::from_be_bytes(buf[16..24].try_into().unwrap());
        Ok(Self { kind, body_len, a, b })
    }

    /// Encode into the fixed 24 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[4..8].copy_from_slice(&self.body_len.to_be_bytes());
        out[8..16].copy_from_slice(&self.a.to_be_bytes());
        out[16..24].copy_from_slice(&self.b.to_be_bytes());
        out
    }

    /// Header announcing `len` payload bytes for blob offset `offset`.
    pub fn data(offset: u64, len: u64) -> Self {
        Self { kind: FrameKind::Data, body_len: 0, a: offset, b: len }
    }
}

/// A complete control frame (everything but the raw payload that follows a `DATA` header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello {
        token: [u8; TOKEN_LEN],
    },
    Data {
        offset: u64,
        len: u64,
    },
    Sum {
        total: u64,
        final_: bool,
        digest: Digest,
    },
    Ack {
        received: u64,
        committed: Option<Digest>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    /// A binding message: `len` layered bytes follow.
    Msg {
        seq: u64,
        len: u64,
    },
    Reneg {
        id: u64,
        step: RenegStep,
        body: Bytes,
    },
    /// Datagram accounting: `count` sent (from the sender) or received (from the receiver).
    Report {
        count: u64,
        lost: u64,
        reordered: u64,
        duplicates: u64,
    },
    /// An in-band transfer request (an encoded `NegotiateRequest`).
    Negotiate {
        body: Bytes,
    },
    /// The answer to a `NEGOTIATE`: `code` 0 and an encoded `NegotiateResponse`, or the gRPC
    /// status code of the refusal and its reason.
    Grant {
        code: u32,
        body: Bytes,
    },
}

fn malformed(kind: FrameKind, reason: &str) -> WireError {
    WireError::Malformed { kind: kind.name(), reason: reason.to_string() }
}

impl Frame {
    /// Build a frame from a validated header and its body (exactly `header.body_len` bytes).
    pub fn from_parts(h: Header, body: &[u8]) -> Result<Self, WireError> {
        debug_assert_eq!(body.len(), h.body_len as usize);
        Ok(match h.kind {
            FrameKind::Hello => {
                let token: [u8; TOKEN_LEN] =
                    body.try_into().map_err(|_| malformed(h.kind, "token must be 32 bytes"))?;
                Frame::Hello { token }
            }
            FrameKind::Data => Frame::Data { offset: h.a, len: h.b },
            FrameKind::Sum => Frame::Sum {
                total: h.a,
                final_: h.b & FLAG_FINAL != 0,
                digest: Digest::decode(body).map_err(|e| malformed(h.kind, &e.to_string()))?,
            },
            FrameKind::Ack => Frame::Ack {
                received: h.a,
                committed: if h.b & FLAG_COMMITTED != 0 {
                    Some(Digest::decode(body).map_err(|e| malformed(h.kind, &e.to_string()))?)
                } else {
                    None
                },
            },
            FrameKind::Error => Frame::Error {
                code: ErrorCode::from_u64(h.a),
                message: String::from_utf8_lossy(body).into_owned(),
            },
            FrameKind::Msg => Frame::Msg { seq: h.a, len: h.b },
            FrameKind::Report => {
                let v: [u8; 16] =
                    body.try_into().map_err(|_| malformed(h.kind, "body must be 16 bytes"))?;
                Frame::Report {
                    count: h.a,
                    lost: h.b,
                    reordered: u64::from_be_bytes(v[..8].try_into().expect("8")),
                    duplicates: u64::from_be_bytes(v[8..].try_into().expect("8")),
                }
            }
            FrameKind::Negotiate => Frame::Negotiate { body: Bytes::copy_from_slice(body) },
            FrameKind::Grant => Frame::Grant {
                code: u32::try_from(h.a).map_err(|_| malformed(h.kind, "status code too large"))?,
                body: Bytes::copy_from_slice(body),
            },
            FrameKind::Reneg => Frame::Reneg {
                id: h.a,
                step: RenegStep::from_u64(h.b)
                    .ok_or_else(|| malformed(h.kind, &format!("unknown step {}", h.b)))?,
                body: Bytes::copy_from_slice(body),
            },
        })
    }

    /// The kind of this frame.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Hello { .. } => FrameKind::Hello,
            Frame::Data { .. } => FrameKind::Data,
            Frame::Sum { .. } => FrameKind::Sum,
            Frame::Ack { .. } => FrameKind::Ack,
            Frame::Error { .. } => FrameKind::Error,
            Frame::Msg { .. } => FrameKind::Msg,
            Frame::Reneg { .. } => FrameKind::Reneg,
            Frame::Report { .. } => FrameKind::Report,
            Frame::Negotiate { .. } => FrameKind::Negotiate,
            Frame::Grant { .. } => FrameKind::Grant,
        }
    }

    /// Try to parse one frame from the start of `buf`. `Ok(None)` means more bytes are needed
    /// (a normal state, not an error); on success returns the frame and the bytes it used. For
    /// `DATA` only the header is consumed: the announced payload follows.
    pub fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let h = Header::parse(head)?;
        let total = HEADER_LEN + h.body_len as usize;
        if buf.len() < total {
            return Ok(None);
        }
        Ok(Some((Frame::from_parts(h, &buf[HEADER_LEN..total])?, total)))
    }

    /// Encode header and body into one buffer.
    pub fn encode(&self) -> Bytes {
        let (kind, a, b, body): (FrameKind, u64, u64, Vec<u8>) = match self {
            Frame::Hello { token } => (FrameKind::Hello, 0, 0, token.to_vec()),
            Frame::Data { offset, len } => (FrameKind::Data, *offset, *len, Vec::new()),
            Frame::Sum { total, final_, digest } => {
                (FrameKind::Sum, *total, if *final_ { FLAG_FINAL } else { 0 }, digest.encode())
            }
            Frame::Ack { received, committed } => match committed {
                Some(d) => (FrameKind::Ack, *received, FLAG_COMMITTED, d.encode()),
                None => (FrameKind::Ack, *received, 0, Vec::new()),
            },
            Frame::Error { code, message } => {
                let mut m = message.as_bytes().to_vec();
                m.truncate(MAX_BODY_LEN as usize);
                (FrameKind::Error, *code as u64, 0, m)
            }
            Frame::Msg { seq, len } => (FrameKind::Msg, *seq, *len, Vec::new()),
            Frame::Report { count, lost, reordered, duplicates } => {
                let mut m = reordered.to_be_bytes().to_vec();
                m.extend_from_slice(&duplicates.to_be_bytes());
                (FrameKind::Report, *count, *lost, m)
            }
            Frame::Reneg { id, step, body } => {
                let mut m = body.to_vec();
                m.truncate(MAX_BODY_LEN as usize);
                (FrameKind::Reneg, *id, *step as u64, m)
            }
            // Callers check the size first ([`MAX_BODY_LEN`]): a cut request would not decode.
            Frame::Negotiate { body } => (FrameKind::Negotiate, 0, 0, body.to_vec()),
            Frame::Grant { code, body } => {
                let mut m = body.to_vec();
                m.truncate(MAX_BODY_LEN as usize);
                (FrameKind::Grant, u64::from(*code), 0, m)
            }
        };
        let h = Header { kind, body_len: body.len() as u32, a, b };
        let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
        out.put_slice(&h.encode());
        out.put_slice(&body);
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::DigestAlgo;
    use proptest::prelude::*;

    fn roundtrip(f: Frame) {
        let enc = f.encode();
        let (g, used) = Frame::parse(&enc).unwrap().unwrap();
        assert_eq!(g, f);
        assert_eq!(used, enc.len());
        // Every strict prefix is "incomplete", never an error.
        for cut in 0..enc.len() {
            assert_eq!(Frame::parse(&enc[..cut]).unwrap(), None, "prefix {cut}");
        }
    }

    #[test]
    fn every_kind_roundtrips() {
        roundtrip(Frame::Hello { token: [7; TOKEN_LEN] });
        roundtrip(Frame::Data { offset: 1 << 40, len: 12345 });
        roundtrip(Frame::Sum {
            total: 99,
            final_: true,
            digest: DigestAlgo::Xxh3_128.digest(b"abc"),
        });
        roundtrip(Frame::Ack { received: 5, committed: None });
        roundtrip(Frame::Ack { received: 5, committed: Some(DigestAlgo::Blake3.digest(b"x")) });
        roundtrip(Frame::Error { code: ErrorCode::TokenReused, message: "used".into() });
        roundtrip(Frame::Msg { seq: 9, len: 1 << 20 });
        roundtrip(Frame::Report { count: 10, lost: 2, reordered: 1, duplicates: 3 });
        roundtrip(Frame::Negotiate { body: Bytes::from_static(b"request") });
        roundtrip(Frame::Grant { code: 0, body: Bytes::from_static(b"response") });
        roundtrip(Frame::Grant { code: 5, body: Bytes::from_static(b"not found") });
        for step in [
            RenegStep::Propose,
            RenegStep::Counter,
            RenegStep::Accept,
            RenegStep::Refuse,
            RenegStep::Applied,
        ] {
            roundtrip(Frame::Reneg { id: 3, step, body: Bytes::from_static(b"profile") });
        }
    }

    #[test]
    fn reneg_with_unknown_step_is_malformed() {
        let h = Header { kind: FrameKind::Reneg, body_len: 0, a: 1, b: 77 };
        assert!(matches!(Frame::parse(&h.encode()), Err(WireError::Malformed { .. })));
    }

    #[test]
    fn data_header_is_24_bytes_and_big_endian() {
        let enc = Frame::Data { offset: 0x0102, len: 0x0304 }.encode();
        assert_eq!(enc.len(), HEADER_LEN);
        assert_eq!(&enc[..4], &[b'B', b'S', 1, 2]);
        assert_eq!(&enc[14..16], &[1, 2]);
        assert_eq!(&enc[22..24], &[3, 4]);
    }

    #[test]
    fn absurd_body_length_is_rejected_from_the_header_alone() {
        let mut h = Header { kind: FrameKind::Hello, body_len: u32::MAX, a: 0, b: 0 }.encode();
        assert_eq!(
            Frame::parse(&h),
            Err(WireError::BodyTooLarge { len: u32::MAX, max: MAX_BODY_LEN })
        );
        h[0] = b'X';
        assert!(matches!(Frame::parse(&h), Err(WireError::BadMagic(_))));
    }

    #[test]
    fn unknown_kind_and_version_are_rejected() {
        let mut h = Frame::Data { offset: 0, len: 0 }.encode().to_vec();
        h[3] = 99;
        assert_eq!(Frame::parse(&h), Err(WireError::UnknownKind(99)));
        h[3] = 2;
        h[2] = 9;
        assert_eq!(Frame::parse(&h), Err(WireError::BadVersion(9)));
    }

    #[test]
    fn hello_with_short_token_is_malformed() {
        let h = Header { kind: FrameKind::Hello, body_len: 3, a: 0, b: 0 };
        let mut buf = h.encode().to_vec();
        buf.extend_from_slice(b"abc");
        assert!(matches!(Frame::parse(&buf), Err(WireError::Malformed { .. })));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Frame::parse(&bytes);
        }

        #[test]
        fn data_frames_roundtrip(offset in any::<u64>(), len in any::<u64>()) {
            let enc = Frame::Data { offset, len }.encode();
            prop_assert_eq!(Frame::parse(&enc).unwrap().unwrap().0, Frame::Data { offset, len });
        }
    }
}
