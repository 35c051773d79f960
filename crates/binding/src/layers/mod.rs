//! Protocol layers and the stack they form.
//!
//! A [`Layer`] turns one message into one or more on the way down ([`Layer::encode`]) and back
//! on the way up ([`Layer::decode`]), pushing and popping its header in the message's headroom.
//! Each layer maps the QoS it is given onto what it asks of the layer below
//! ([`Layer::lower`]): a checksum adds its digest to every message, fragmentation caps the
//! message size below at its fragment size, pacing sets the rate. The stack is built from the
//! negotiated profile's layer list, never compiled in.
//!
//! Headers, in order of the layers (all integers big-endian):
//!
//! | layer        | header                                                        |
//! |--------------|---------------------------------------------------------------|
//! | `null`       | none                                                          |
//! | `checksum`   | algo u8 (1 = xxh3-64, 2 = blake3) + digest (8 or 32 bytes)    |
//! | `compress`   | method u8 (0 = none, 1 = zstd, 2 = lz4) + original length u32 |
//! | `fragment`   | flags u8 (1 = first, 2 = last) + index u32 + total length u32 |
//! | `pace`       | none (sets when the message may leave)                        |
//! | `encrypt`    | none here: TLS records on the connection                      |

mod checksum;
mod compress;
mod fragment;
mod pace;

use bs_wire::SizedPools;

pub use checksum::Checksum;
pub use compress::Compress;
pub use fragment::Fragment;
pub use pace::{Pace, TokenBucket};

use crate::error::LayerError;
use crate::msg::Msg;
use crate::qos::LayerSpec;

/// The QoS one layer offers the layer above it, and asks of the one below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerQos {
    /// Largest message, in bytes.
    pub max_message: usize,
    /// Bytes per second; 0: unpaced.
    pub rate_bps: u64,
}

/// One protocol layer.
pub trait Layer: Send {
    fn spec(&self) -> LayerSpec;
    /// Most header bytes this layer pushes on a message.
    fn header_len(&self) -> usize;
    /// What this layer asks of the layer below to give `above` to the layer above.
    fn lower(&self, above: LayerQos) -> LayerQos;
    /// One message down: push the result(s) onto `out`.
    fn encode(&mut self, msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError>;
    /// One message up: the message for the layer above, or `None` while more are needed.
    fn decode(&mut self, msg: Msg) -> Result<Option<Msg>, LayerError>;
    /// In the middle of a message (a renegotiation now would split it).
    fn pending(&self) -> bool {
        false
    }
}

/// Does nothing: measures what stacking costs.
struct Null(LayerSpec);

impl Layer for Null {
    fn spec(&self) -> LayerSpec {
        self.0
    }
    fn header_len(&self) -> usize {
        0
    }
    fn lower(&self, above: LayerQos) -> LayerQos {
        above
    }
    fn encode(&mut self, msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError> {
        out.push(msg);
        Ok(())
    }
    fn decode(&mut self, msg: Msg) -> Result<Option<Msg>, LayerError> {
        Ok(Some(msg))
    }
}

/// Layers top to bottom, built from a negotiated layer list.
pub struct Stack {
    layers: Vec<Box<dyn Layer>>,
    pools: SizedPools,
    headroom: usize,
    /// No layer changes a message (see [`Stack::is_transparent`]).
    transparent: bool,
    app: LayerQos,
    wire: LayerQos,
    /// Two work lists, reused message after message (no allocation per message per layer).
    scratch: (Vec<Msg>, Vec<Msg>),
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack").field("layers", &self.specs()).field("wire", &self.wire).finish()
    }
}

impl Stack {
    /// The stack for `specs` (top first), carrying application messages of at most
    /// `max_message` bytes.
    pub fn new(specs: &[LayerSpec], max_message: usize, pools: SizedPools) -> Self {
        let app = LayerQos { max_message, rate_bps: 0 };
        // Each layer's headroom is the headers of every layer below it.
        let below: Vec<usize> =
            (0..specs.len()).map(|i| specs[i + 1..].iter().map(|s| header_len(*s)).sum()).collect();
        let mut layers: Vec<Box<dyn Layer>> = Vec::with_capacity(specs.len());
        let mut qos = app;
        for (spec, room) in specs.iter().zip(below) {
            let layer: Box<dyn Layer> = match *spec {
                LayerSpec::Null | LayerSpec::Encrypt => Box::new(Null(*spec)),
                LayerSpec::Checksum(a) => Box::new(Checksum::new(a, &pools)),
                LayerSpec::Compress(c) => Box::new(Compress::new(c, qos.max_message, room, &pools)),
                LayerSpec::Fragment(n) => {
                    Box::new(Fragment::new(n as usize, qos.max_message, room, &pools))
                }
                LayerSpec::Pace(rate) => Box::new(Pace::new(rate)),
            };
            qos = layer.lower(qos);
            layers.push(layer);
        }
        let headroom = specs.iter().map(|s| header_len(*s)).sum();
        let transparent = specs.iter().all(|s| matches!(s, LayerSpec::Null | LayerSpec::Encrypt));
        Self {
            layers,
            pools,
            headroom,
            transparent,
            app,
            wire: qos,
            scratch: (Vec::new(), Vec::new()),
        }
    }

    pub fn specs(&self) -> Vec<LayerSpec> {
        self.layers.iter().map(|l| l.spec()).collect()
    }

    /// No layer changes a message (none, or only null and encrypt — the connection's TLS):
    /// the wire message is the application message.
    pub fn is_transparent(&self) -> bool {
        self.transparent
    }

    /// Refuse an application message larger than the stack carries.
    pub fn check_len(&self, len: usize) -> Result<(), LayerError> {
        if len > self.app.max_message {
            return Err(LayerError::TooLarge {
                layer: "binding",
                len: len as u64,
                max: self.app.max_message as u64,
            });
        }
        Ok(())
    }

    /// Header bytes every layer together may push.
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// What the application may send.
    pub fn app_qos(&self) -> LayerQos {
        self.app
    }

    /// What the stack asks of the transport: the largest wire message and the rate.
    pub fn wire_qos(&self) -> LayerQos {
        self.wire
    }

    pub fn pools(&self) -> &SizedPools {
        &self.pools
    }

    /// An empty application message of `len` bytes with room for every header.
    pub fn alloc(&self, len: usize) -> Msg {
        Msg::alloc(&self.pools, self.headroom, len)
    }

    /// An application message whose payload is `body`, shared (not copied).
    pub fn shared(&self, body: bytes::Bytes) -> Msg {
        Msg::shared(&self.pools, self.headroom, body)
    }

    /// An application message holding a copy of `data`.
    pub fn message(&self, data: &[u8]) -> Msg {
        Msg::copy_of(&self.pools, self.headroom, data)
    }

    /// A buffer for `len` wire bytes about to be read off a connection.
    pub fn wire_buffer(&self, len: usize) -> Msg {
        Msg::alloc(&self.pools, 0, len)
    }

    /// Down the stack: the wire messages for one application message, in order.
    pub fn encode(&mut self, msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError> {
        self.check_len(msg.len())?;
        let (mut cur, mut next) = std::mem::take(&mut self.scratch);
        cur.clear();
        next.clear();
        cur.push(msg);
        let mut res = Ok(());
        for layer in &mut self.layers {
            for m in cur.drain(..) {
                if res.is_ok() {
                    res = layer.encode(m, &mut next);
                }
            }
            std::mem::swap(&mut cur, &mut next);
        }
        if res.is_ok() {
            out.append(&mut cur);
        }
        cur.clear();
        self.scratch = (cur, next);
        res
    }

    /// Up the stack: the application message, once every piece of it has arrived.
    pub fn decode(&mut self, mut msg: Msg) -> Result<Option<Msg>, LayerError> {
        for layer in self.layers.iter_mut().rev() {
            match layer.decode(msg)? {
                Some(m) => msg = m,
                None => return Ok(None),
            }
        }
        Ok(Some(msg))
    }

    /// Some layer holds part of a message.
    pub fn pending(&self) -> bool {
        self.layers.iter().any(|l| l.pending())
    }
}

fn header_len(spec: LayerSpec) -> usize {
    match spec {
        LayerSpec::Null | LayerSpec::Encrypt | LayerSpec::Pace(_) => 0,
        LayerSpec::Checksum(a) => Checksum::header_for(a),
        LayerSpec::Compress(_) => compress::HEADER,
        LayerSpec::Fragment(_) => fragment::HEADER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::{Codec, SumAlgo};
    use proptest::prelude::*;

    fn roundtrip(specs: &[LayerSpec], data: &[u8]) -> Vec<u8> {
        let pools = SizedPools::new(4);
        let mut tx = Stack::new(specs, 1 << 20, pools.clone());
        let mut rx = Stack::new(specs, 1 << 20, pools);
        let mut wire = Vec::new();
        // Half the time the payload is shared rather than copied in.
        let msg = if data.len().is_multiple_of(2) {
            tx.shared(bytes::Bytes::copy_from_slice(data))
        } else {
            tx.message(data)
        };
        tx.encode(msg, &mut wire).unwrap();
        let mut got = None;
        let n = wire.len();
        for (i, w) in wire.into_iter().enumerate() {
            assert!(w.len() <= tx.wire_qos().max_message, "wire message over the cap");
            // Through a byte copy, as a socket would carry it.
            let mut m = rx.wire_buffer(w.len());
            let (h, b) = w.parts();
            m.payload_mut()[..h.len()].copy_from_slice(h);
            m.payload_mut()[h.len()..].copy_from_slice(b);
            let out = rx.decode(m).unwrap();
            assert_eq!(out.is_some(), i + 1 == n, "a message completes on its last piece");
            got = out.map(|m| m.to_vec());
        }
        assert!(!rx.pending());
        got.unwrap()
    }

    fn spec() -> impl Strategy<Value = LayerSpec> {
        prop_oneof![
            Just(LayerSpec::Null),
            Just(LayerSpec::Checksum(SumAlgo::Xxh3)),
            Just(LayerSpec::Checksum(SumAlgo::Blake3)),
            (1i32..4).prop_map(|l| LayerSpec::Compress(Codec::Zstd(l))),
            Just(LayerSpec::Compress(Codec::Lz4)),
            (64u32..5000).prop_map(LayerSpec::Fragment),
            Just(LayerSpec::Pace(u64::MAX / 4)),
        ]
    }

    fn data() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..20_000),
            // Compressible: runs of a few values.
            (proptest::collection::vec(0u8..3, 0..200), 1usize..200)
                .prop_map(|(v, n)| v.iter().flat_map(|&b| std::iter::repeat_n(b, n)).collect()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn any_stack_roundtrips_any_bytes(
            specs in proptest::collection::vec(spec(), 0..6),
            bytes in data(),
        ) {
            prop_assert_eq!(roundtrip(&specs, &bytes), bytes);
        }
    }

    #[test]
    fn every_layer_alone_roundtrips() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for s in [
            "null",
            "checksum:xxh3",
            "checksum:blake3",
            "compress:zstd:3",
            "compress:lz4",
            "fragment:1000",
            "pace:1g",
            "encrypt",
        ] {
            let spec: LayerSpec = s.parse().unwrap();
            assert_eq!(roundtrip(&[spec], &data), data, "{s}");
            assert_eq!(roundtrip(&[spec], b""), b"", "{s} empty");
        }
    }

    #[test]
    fn a_message_over_the_binding_cap_is_refused_before_encoding() {
        let pools = SizedPools::new(4);
        let mut tx = Stack::new(&[], 10, pools);
        let e = tx.encode(tx.message(&[0; 11]), &mut Vec::new()).unwrap_err();
        assert!(matches!(e, LayerError::TooLarge { len: 11, max: 10, .. }), "{e}");
    }

    #[test]
    fn the_wire_cap_accounts_for_every_header() {
        let specs = [LayerSpec::Checksum(SumAlgo::Blake3), LayerSpec::Compress(Codec::Lz4)];
        let s = Stack::new(&specs, 1000, SizedPools::new(1));
        assert_eq!(s.wire_qos().max_message, 1000 + 33 + 5);
        assert_eq!(s.headroom(), 38);
        let f = Stack::new(&[LayerSpec::Fragment(100)], 1 << 20, SizedPools::new(1));
        assert_eq!(f.wire_qos().max_message, 100 + 9);
    }
}
