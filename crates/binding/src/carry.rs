//! Blob payload through a binding's layer stack: a `put` or `get` whose negotiated profile
//! names message layers (checksum, compress, fragment, pace, null) sends its bytes through
//! them instead of raw.
//!
//! Wire format (on the transfer's data connection, after `HELLO`):
//!
//! ```text
//!  DATA(offset, len)                 header only: announces `len` blob bytes at `offset`
//!  MSG(seq, wire_len) + wire bytes   the layered encoding of those `len` bytes, one message;
//!  MSG(seq+1, …) + …                 more MSG frames only when a layer splits it (fragment)
//!  DATA(offset+len, …) …             next piece; the transfer's SUM/ACK close it as before
//! ```
//!
//! The message must decode to exactly `len` bytes; sequence numbers run on across pieces
//! (epoch 0: a transfer is never renegotiated). A profile with no message layers uses none of
//! this: its `DATA` payload is the raw bytes, moved by `sendfile`/vectored writes untouched.

use std::sync::Arc;
use std::time::Instant;

use bs_transport::{Conn, TransportError};
use bs_wire::{Frame, FrameKind, Hasher, Header};

use crate::counters::Counters;
use crate::error::BindingError;
use crate::msg::Msg;
use crate::negotiate::{Floor, Limits};
use crate::qos::{LayerSpec, Profile};
use crate::session::{Outgoing, Role, Session};

type Result<T> = std::result::Result<T, BindingError>;

/// Does `p` put any message layer between a transfer's bytes and its connection?
pub fn has_message_layers(p: &Profile) -> bool {
    p.layers.iter().any(|l| !matches!(l, LayerSpec::Encrypt))
}

/// One transfer's layer stack, in one direction of use (a side either sends or receives).
pub struct Carrier {
    session: Session,
    out: Vec<Outgoing>,
}

impl std::fmt::Debug for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Carrier").field("profile", &self.session.profile().to_string()).finish()
    }
}

impl Carrier {
    /// A carrier for a transfer running `p`, counting into `counters`, or `None` when `p`
    /// has no message layers (the bytes then travel raw).
    pub fn for_profile(p: &Profile, role: Role, counters: Arc<Counters>) -> Option<Self> {
        has_message_layers(p).then(|| {
            let mut session = Session::new(role, p.clone(), Limits::default(), Floor::default());
            session.count_into(counters);
            Self { session, out: Vec::new() }
        })
    }

    /// Largest piece one `DATA` frame may announce.
    pub fn max_piece(&self) -> usize {
        self.session.max_message().max(1)
    }

    /// Send `data` (at most [`Carrier::max_piece`] bytes) as the blob bytes at `offset`,
    /// hashing it for the end-to-end digest on the way.
    pub fn send(
        &mut self,
        conn: &mut Conn,
        offset: u64,
        data: &[u8],
        hasher: Option<&mut Hasher>,
    ) -> Result<()> {
        if let Some(h) = hasher {
            h.update(data);
        }
        let data_head = bs_wire::Header::data(offset, data.len() as u64).encode();
        if let Some(a) = self.session.encode_in_place(data.len())? {
            // Only null layers: both headers and the bytes in one write, from where they are.
            let head = msg_header(a, data.len());
            return conn.write_slices(&[&data_head, &head, data]).map_err(BindingError::from);
        }
        let msg = self.session.message(data);
        conn.write_slices(&[&data_head])?;
        let mut out = std::mem::take(&mut self.out);
        let res = self.session.encode(msg, &mut out).and_then(|()| {
            out.drain(..).try_for_each(|o| write_msg(conn, &o).map_err(BindingError::from))
        });
        out.clear();
        self.out = out;
        res
    }

    /// After a `DATA(_, len)` header: read `MSG` frames until they decode to one message of
    /// exactly `len` bytes, and return it.
    pub fn recv(&mut self, conn: &mut Conn, len: u64) -> Result<Msg> {
        loop {
            let (seq, wire_len) = match conn.read_frame_or_remote_error()? {
                Frame::Msg { seq, len } => (seq, len),
                other => return Err(BindingError::UnexpectedFrame(other.kind().name())),
            };
            if let Some(m) = read_msg(conn, &mut self.session, seq, wire_len)? {
                if m.len() as u64 != len {
                    return Err(crate::error::LayerError::Malformed {
                        layer: "transfer",
                        reason: format!(
                            "DATA announced {len} bytes, its message holds {}",
                            m.len()
                        ),
                    }
                    .into());
                }
                return Ok(m);
            }
        }
    }
}

/// Write one layered message as a `MSG` frame (waiting first for its pacing time).
pub(crate) fn write_msg(conn: &mut Conn, o: &Outgoing) -> std::result::Result<(), TransportError> {
    wait_pacing(o);
    let head = msg_header(o.seq, o.wire.len());
    let (h, b) = o.wire.parts();
    conn.write_slices(&[&head, h, b])
}

/// Sleep until the pace layer's time for `o` (if it set one).
pub(crate) fn wait_pacing(o: &Outgoing) {
    if let Some(t) = o.wire.not_before {
        let now = Instant::now();
        if t > now {
            std::thread::sleep(t - now);
        }
    }
}

/// The `MSG` frame header that goes before `len` wire bytes numbered `a` (epoch and sequence).
pub(crate) fn msg_header(a: u64, len: usize) -> [u8; bs_wire::HEADER_LEN] {
    Header { kind: FrameKind::Msg, body_len: 0, a, b: len as u64 }.encode()
}

/// After a `MSG(seq, len)` header: read its wire bytes and decode them (a message, or `None`
/// for one piece of a fragmented message).
pub(crate) fn read_msg(
    conn: &mut Conn,
    session: &mut Session,
    seq: u64,
    len: u64,
) -> Result<Option<Msg>> {
    let mut buf = session.wire_buffer(len)?;
    conn.recv_data_into(buf.payload_mut(), None)?;
    session.decode(seq, buf)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::error::LayerError;

    fn profile(layers: &[&str]) -> Profile {
        let mut b = Profile::builder().max_message(1 << 20);
        for l in layers {
            b = b.layer(l.parse().unwrap());
        }
        b.build().unwrap()
    }

    fn pair() -> (Conn, Conn) {
        let (a, b) = UnixStream::pair().unwrap();
        (Conn::unix(a), Conn::unix(b))
    }

    fn carriers(layers: &[&str]) -> (Carrier, Carrier) {
        let p = profile(layers);
        let c = || Arc::new(Counters::default());
        (
            Carrier::for_profile(&p, Role::Initiator, c()).unwrap(),
            Carrier::for_profile(&p, Role::Responder, c()).unwrap(),
        )
    }

    #[test]
    fn no_message_layers_means_raw_bytes() {
        let c = Arc::new(Counters::default());
        assert!(Carrier::for_profile(&profile(&[]), Role::Initiator, c.clone()).is_none());
        let tls_only = Profile { layers: vec![LayerSpec::Encrypt], ..profile(&[]) };
        assert!(Carrier::for_profile(&tls_only, Role::Initiator, c).is_none());
    }

    #[test]
    fn pieces_cross_every_stack_with_their_offsets_and_digest() {
        for layers in [
            &["null"][..],
            &["checksum:xxh3"],
            &["compress:zstd", "checksum:blake3", "fragment:1000"],
            &["compress:lz4", "pace:1g"],
        ] {
            let (mut tx, mut rx) = carriers(layers);
            let (mut a, mut b) = pair();
            let data: Vec<u8> = (0..300_000u32).map(|i| (i / 700) as u8).collect();
            let writer = std::thread::spawn(move || {
                let mut h = bs_wire::DigestAlgo::Xxh3_128.hasher();
                for (i, piece) in data.chunks(100_000).enumerate() {
                    tx.send(&mut a, i as u64 * 100_000, piece, Some(&mut h)).unwrap();
                }
                (h.finish(), tx.session.counters().snapshot())
            });
            let mut got = Vec::new();
            for i in 0..3u64 {
                let Frame::Data { offset, len } = b.read_frame().unwrap() else { panic!() };
                assert_eq!((offset, len), (i * 100_000, 100_000));
                got.extend_from_slice(rx.recv(&mut b, len).unwrap().payload());
            }
            let (digest, sent) = writer.join().unwrap();
            assert_eq!(bs_wire::DigestAlgo::Xxh3_128.digest(&got), digest, "{layers:?}");
            let recvd = rx.session.counters().snapshot();
            assert_eq!((sent.bytes_out, recvd.bytes_in), (300_000, 300_000));
            assert_eq!(sent.wire_out, recvd.wire_in, "{layers:?}");
            if layers[0].starts_with("compress") {
                assert!(recvd.wire_in < 30_000, "{layers:?}: {} wire bytes", recvd.wire_in);
            }
        }
    }

    #[test]
    fn a_damaged_message_or_a_wrong_length_is_refused_before_delivery() {
        let (mut tx, mut rx) = carriers(&["checksum:xxh3"]);
        let (mut a, mut b) = pair();
        let mut session = Session::new(
            Role::Initiator,
            profile(&["checksum:xxh3"]),
            Limits::default(),
            Floor::default(),
        );
        let mut out = Vec::new();
        session.encode(session.message(b"hello"), &mut out).unwrap();
        let mut wire = out.pop().unwrap().wire;
        wire.make_contiguous(&bs_wire::SizedPools::default());
        let last = wire.len() - 1;
        wire.payload_mut()[last] ^= 1;
        a.write_frame(&Frame::Data { offset: 0, len: 5 }).unwrap();
        write_msg(&mut a, &Outgoing { seq: 0, wire }).unwrap();
        let Frame::Data { len, .. } = b.read_frame().unwrap() else { panic!() };
        let e = rx.recv(&mut b, len).unwrap_err();
        assert!(matches!(e, BindingError::Layer(LayerError::Checksum { .. })), "{e}");

        // A message that is whole but not what its DATA header announced.
        let (mut a, mut b) = pair();
        tx.send(&mut a, 0, b"hello", None).unwrap();
        let (_, mut rx) = carriers(&["checksum:xxh3"]);
        let Frame::Data { .. } = b.read_frame().unwrap() else { panic!() };
        let e = rx.recv(&mut b, 6).unwrap_err();
        assert!(e.to_string().contains("announced 6 bytes"), "{e}");
    }
}
