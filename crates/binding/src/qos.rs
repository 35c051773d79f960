//! QoS profiles: the typed form of `QosProfile` in `proto/blobstream.proto`, with a builder,
//! the layer names of a profile, and conversion to and from the protobuf message.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bs_proto as pb;

use crate::error::BindingError;

/// The flow a binding carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flow {
    /// One way.
    #[default]
    Stream,
    /// Each message answered by one message.
    RequestReply,
}

/// What the bytes travel over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Tcp,
    Udp,
    Unix,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Unix => "unix",
        }
    }
}

impl FromStr for TransportKind {
    type Err = BindingError;
    fn from_str(s: &str) -> Result<Self, BindingError> {
        Ok(match s {
            "tcp" => Self::Tcp,
            "udp" => Self::Udp,
            "unix" => Self::Unix,
            other => {
                return Err(BindingError::BadProfile(format!(
                    "unknown transport {other:?} (tcp, udp, unix)"
                )));
            }
        })
    }
}

/// Per-message checksum algorithm of the `checksum` layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumAlgo {
    /// xxh3-64: fast, catches corruption, not tampering.
    Xxh3,
    /// BLAKE3 (256 bits): cryptographic.
    Blake3,
}

/// Compression codec of the `compress` layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// zstd at a level (1..=19).
    Zstd(i32),
    Lz4,
}

/// One protocol layer as named in a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerSpec {
    /// Does nothing (to measure the cost of stacking).
    Null,
    Checksum(SumAlgo),
    Compress(Codec),
    /// TLS on the connection (always the bottom layer).
    Encrypt,
    /// Split messages into pieces of at most this many bytes.
    Fragment(u32),
    /// Send at most this many bytes per second (token bucket).
    Pace(u64),
}

/// Default zstd level when none is named.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

impl FromStr for LayerSpec {
    type Err = BindingError;
    fn from_str(s: &str) -> Result<Self, BindingError> {
        let unknown = || BindingError::UnknownLayer(s.to_string());
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let bad = |why: &str| BindingError::BadProfile(format!("layer {s:?}: {why}"));
        Ok(match (name, arg) {
            ("null", None) => Self::Null,
            ("checksum", None | Some("xxh3")) => Self::Checksum(SumAlgo::Xxh3),
            ("checksum", Some("blake3")) => Self::Checksum(SumAlgo::Blake3),
            ("compress", None | Some("zstd")) => Self::Compress(Codec::Zstd(ZSTD_DEFAULT_LEVEL)),
            ("compress", Some("lz4")) => Self::Compress(Codec::Lz4),
            ("compress", Some(a)) if a.starts_with("zstd:") => {
                let level: i32 = a[5..].parse().map_err(|_| bad("zstd level must be 1..=19"))?;
                if !(1..=19).contains(&level) {
                    return Err(bad("zstd level must be 1..=19"));
                }
                Self::Compress(Codec::Zstd(level))
            }
            ("encrypt", None) => Self::Encrypt,
            ("fragment", Some(a)) => {
                let n = parse_size(a).ok_or_else(|| bad("size must be a number of bytes"))?;
                if !(64..=u32::MAX as u64).contains(&n) {
                    return Err(bad("fragments must be at least 64 bytes"));
                }
                Self::Fragment(n as u32)
            }
            ("pace", Some(a)) => {
                let n = parse_size(a).ok_or_else(|| bad("rate must be bytes per second"))?;
                if n == 0 {
                    return Err(bad("rate must be above 0"));
                }
                Self::Pace(n)
            }
            _ => return Err(unknown()),
        })
    }
}

impl fmt::Display for LayerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Null => write!(f, "null"),
            Self::Checksum(SumAlgo::Xxh3) => write!(f, "checksum:xxh3"),
            Self::Checksum(SumAlgo::Blake3) => write!(f, "checksum:blake3"),
            Self::Compress(Codec::Zstd(l)) => write!(f, "compress:zstd:{l}"),
            Self::Compress(Codec::Lz4) => write!(f, "compress:lz4"),
            Self::Encrypt => write!(f, "encrypt"),
            Self::Fragment(n) => write!(f, "fragment:{n}"),
            Self::Pace(n) => write!(f, "pace:{n}"),
        }
    }
}

/// `123`, `64k`, `1m`, `2g`, `1t`, written also `64KiB`, `64 KB`, `1TiB`, `100B` (binary
/// multiples either way: k = 1024), as the docs write sizes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    let s = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k') => (&s[..i], 1u64 << 10),
        (i, 'm') => (&s[..i], 1 << 20),
        (i, 'g') => (&s[..i], 1 << 30),
        (i, 't') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// A binding's quality of service. `0` means "no requirement" (or "the peer's default")
/// throughout; see `QosProfile` in `proto/blobstream.proto` for each field.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Profile {
    pub throughput_bps: u64,
    pub latency_us: u32,
    pub jitter_us: u32,
    pub loss_ppm: u32,
    pub priority: u8,
    pub weight: u32,
    pub flow: Flow,
    /// Top (next to the application) to bottom.
    pub layers: Vec<LayerSpec>,
    /// Preferred first; empty means TCP.
    pub transports: Vec<TransportKind>,
    pub max_message: u32,
    pub chunk_size: u32,
    pub send_buffer: u32,
    pub recv_buffer: u32,
    /// End-to-end digest algorithms of a transfer, preferred first.
    pub digests: Vec<String>,
}

impl Profile {
    pub fn builder() -> ProfileBuilder {
        ProfileBuilder(Profile::default())
    }

    /// The latency bound, if any.
    pub fn latency(&self) -> Option<Duration> {
        (self.latency_us > 0).then(|| Duration::from_micros(self.latency_us.into()))
    }

    pub fn wants_encryption(&self) -> bool {
        self.layers.contains(&LayerSpec::Encrypt)
    }

    /// Check the profile makes sense on its own (before any peer looks at it).
    pub fn validate(&self) -> Result<(), BindingError> {
        if self.priority > 7 {
            return Err(BindingError::BadProfile(format!(
                "priority {} is outside 0..=7",
                self.priority
            )));
        }
        if let Some(i) = self.layers.iter().position(|l| *l == LayerSpec::Encrypt)
            && i + 1 != self.layers.len()
        {
            return Err(BindingError::BadProfile(
                "encrypt must be the bottom (last) layer: it is the connection's TLS".into(),
            ));
        }
        if self.layers.iter().filter(|l| matches!(l, LayerSpec::Pace(_))).count() > 1 {
            return Err(BindingError::BadProfile("at most one pace layer".into()));
        }
        Ok(())
    }

    /// The layer names, as the profile message carries them.
    pub fn layer_names(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.to_string()).collect()
    }

    pub fn to_pb(&self) -> pb::QosProfile {
        pb::QosProfile {
            throughput_bps: self.throughput_bps,
            latency_us: self.latency_us,
            jitter_us: self.jitter_us,
            loss_ppm: self.loss_ppm,
            priority: self.priority.into(),
            weight: self.weight,
            flow: match self.flow {
                Flow::Stream => pb::qos_profile::Flow::Stream,
                Flow::RequestReply => pb::qos_profile::Flow::RequestReply,
            } as i32,
            layers: self.layer_names(),
            transports: self.transports.iter().map(|t| t.name().to_string()).collect(),
            max_message: self.max_message,
            chunk_size: self.chunk_size,
            send_buffer: self.send_buffer,
            recv_buffer: self.recv_buffer,
            digests: self.digests.clone(),
        }
    }

    /// Parse and validate a profile message; an unknown layer or transport name is an error.
    pub fn from_pb(p: &pb::QosProfile) -> Result<Self, BindingError> {
        let prof = Self {
            throughput_bps: p.throughput_bps,
            latency_us: p.latency_us,
            jitter_us: p.jitter_us,
            loss_ppm: p.loss_ppm.min(1_000_000),
            priority: u8::try_from(p.priority).map_err(|_| {
                BindingError::BadProfile(format!("priority {} is outside 0..=7", p.priority))
            })?,
            weight: p.weight,
            flow: match pb::qos_profile::Flow::try_from(p.flow) {
                Ok(pb::qos_profile::Flow::RequestReply) => Flow::RequestReply,
                Ok(_) => Flow::Stream,
                Err(_) => return Err(BindingError::BadProfile(format!("unknown flow {}", p.flow))),
            },
            layers: p.layers.iter().map(|l| l.parse()).collect::<Result<_, _>>()?,
            transports: p.transports.iter().map(|t| t.parse()).collect::<Result<_, _>>()?,
            max_message: p.max_message,
            chunk_size: p.chunk_size,
            send_buffer: p.send_buffer,
            recv_buffer: p.recv_buffer,
            digests: p.digests.clone(),
        };
        prof.validate()?;
        Ok(prof)
    }

    /// Encoded as the body of a `RENEG` frame.
    pub fn encode(&self) -> bytes::Bytes {
        use prost::Message;
        self.to_pb().encode_to_vec().into()
    }

    pub fn decode(b: &[u8]) -> Result<Self, BindingError> {
        use prost::Message;
        let p = pb::QosProfile::decode(b)
            .map_err(|e| BindingError::BadProfile(format!("undecodable profile: {e}")))?;
        Self::from_pb(&p)
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flow = match self.flow {
            Flow::Stream => "stream",
            Flow::RequestReply => "request/reply",
        };
        write!(f, "{flow}")?;
        if self.throughput_bps > 0 {
            write!(f, ", {} B/s", self.throughput_bps)?;
        }
        if self.latency_us > 0 {
            write!(f, ", latency ≤ {} µs", self.latency_us)?;
        }
        if self.jitter_us > 0 {
            write!(f, ", jitter ≤ {} µs", self.jitter_us)?;
        }
        if self.loss_ppm > 0 {
            write!(f, ", loss ≤ {} ppm", self.loss_ppm)?;
        }
        write!(f, ", priority {}", self.priority)?;
        if self.max_message > 0 {
            write!(f, ", messages ≤ {} B", self.max_message)?;
        }
        let layers = self.layer_names();
        write!(f, ", layers [{}]", layers.join(", "))?;
        let t: Vec<_> = self.transports.iter().map(|t| t.name()).collect();
        if !t.is_empty() {
            write!(f, ", over {}", t.join("|"))?;
        }
        Ok(())
    }
}

/// Builds a [`Profile`].
#[derive(Debug, Clone)]
pub struct ProfileBuilder(Profile);

impl ProfileBuilder {
    pub fn throughput(mut self, bytes_per_sec: u64) -> Self {
        self.0.throughput_bps = bytes_per_sec;
        self
    }
    pub fn latency(mut self, bound: Duration) -> Self {
        self.0.latency_us = bound.as_micros().min(u32::MAX as u128) as u32;
        self
    }
    pub fn jitter(mut self, bound: Duration) -> Self {
        self.0.jitter_us = bound.as_micros().min(u32::MAX as u128) as u32;
        self
    }
    pub fn loss_ppm(mut self, ppm: u32) -> Self {
        self.0.loss_ppm = ppm;
        self
    }
    pub fn priority(mut self, p: u8) -> Self {
        self.0.priority = p;
        self
    }
    pub fn weight(mut self, w: u32) -> Self {
        self.0.weight = w;
        self
    }
    pub fn flow(mut self, f: Flow) -> Self {
        self.0.flow = f;
        self
    }
    pub fn layer(mut self, l: LayerSpec) -> Self {
        self.0.layers.push(l);
        self
    }
    pub fn transport(mut self, t: TransportKind) -> Self {
        self.0.transports.push(t);
        self
    }
    pub fn max_message(mut self, n: u32) -> Self {
        self.0.max_message = n;
        self
    }
    pub fn chunk_size(mut self, n: u32) -> Self {
        self.0.chunk_size = n;
        self
    }
    pub fn buffers(mut self, send: u32, recv: u32) -> Self {
        self.0.send_buffer = send;
        self.0.recv_buffer = recv;
        self
    }
    pub fn digest(mut self, algo: &str) -> Self {
        self.0.digests.push(algo.to_string());
        self
    }
    /// The profile, checked.
    pub fn build(self) -> Result<Profile, BindingError> {
        self.0.validate()?;
        Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_are_read_as_the_docs_write_them() {
        for (s, n) in [
            ("123", 123),
            ("64k", 64 << 10),
            ("64K", 64 << 10),
            ("64KiB", 64 << 10),
            ("64 KB", 64 << 10),
            ("1m", 1 << 20),
            ("2g", 2 << 30),
            ("64 GiB", 64 << 30),
            ("1TiB", 1 << 40),
            ("100B", 100),
        ] {
            assert_eq!(super::parse_size(s), Some(n), "{s}");
        }
        for s in ["", "k", "1x", "1.5g", "-1", "99999999999999t", "ib"] {
            assert_eq!(super::parse_size(s), None, "{s}");
        }
    }

    use super::*;

    #[test]
    fn layer_names_roundtrip() {
        for s in [
            "null",
            "checksum:xxh3",
            "checksum:blake3",
            "compress:zstd:7",
            "compress:lz4",
            "encrypt",
            "fragment:65536",
            "pace:1000000",
        ] {
            assert_eq!(s.parse::<LayerSpec>().unwrap().to_string(), s);
        }
        assert_eq!("compress".parse::<LayerSpec>().unwrap(), LayerSpec::Compress(Codec::Zstd(3)));
        assert_eq!("fragment:64k".parse::<LayerSpec>().unwrap(), LayerSpec::Fragment(65536));
    }

    #[test]
    fn unknown_and_bad_layers_are_named() {
        let e = "rot13".parse::<LayerSpec>().unwrap_err();
        assert!(matches!(e, BindingError::UnknownLayer(ref n) if n == "rot13"), "{e}");
        assert!(e.to_string().contains("rot13"));
        assert!(matches!(
            "compress:zstd:40".parse::<LayerSpec>(),
            Err(BindingError::BadProfile(_))
        ));
        assert!(matches!("fragment:3".parse::<LayerSpec>(), Err(BindingError::BadProfile(_))));
        assert!(matches!("pace:0".parse::<LayerSpec>(), Err(BindingError::BadProfile(_))));
    }

    #[test]
    fn profile_roundtrips_through_protobuf() {
        let p = Profile::builder()
            .throughput(100 << 20)
            .latency(Duration::from_millis(5))
            .priority(6)
            .flow(Flow::RequestReply)
            .layer(LayerSpec::Checksum(SumAlgo::Blake3))
            .layer(LayerSpec::Compress(Codec::Lz4))
            .layer(LayerSpec::Encrypt)
            .transport(TransportKind::Unix)
            .transport(TransportKind::Tcp)
            .max_message(1 << 16)
            .build()
            .unwrap();
        assert_eq!(Profile::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn encrypt_must_be_the_bottom_layer() {
        let e = Profile::builder()
            .layer(LayerSpec::Encrypt)
            .layer(LayerSpec::Null)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("bottom"), "{e}");
    }
}
