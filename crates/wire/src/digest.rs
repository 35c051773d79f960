//! End-to-end digests: every transfer carries one, every stored blob keeps one.
//!
//! `xxh3-128` is the default (tens of GB/s per core, so it costs almost nothing next to the
//! network); `blake3` is available when a cryptographic digest is wanted. On the wire a digest
//! is one algorithm byte followed by the digest bytes; in text it is `algo:hex`.

use std::fmt;
use std::str::FromStr;

use crate::error::WireError;

/// A digest algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DigestAlgo {
    #[default]
    Xxh3_128,
    Blake3,
}

impl DigestAlgo {
    /// All algorithms, in order of preference.
    pub const ALL: [DigestAlgo; 2] = [DigestAlgo::Xxh3_128, DigestAlgo::Blake3];

    /// Stable wire id.
    pub fn id(self) -> u8 {
        match self {
            Self::Xxh3_128 => 1,
            Self::Blake3 => 2,
        }
    }

    fn from_id(id: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.id() == id)
    }

    /// Name used in text and in negotiation.
    pub fn name(self) -> &'static str {
        match self {
            Self::Xxh3_128 => "xxh3-128",
            Self::Blake3 => "blake3",
        }
    }

    fn len(self) -> usize {
        match self {
            Self::Xxh3_128 => 16,
            Self::Blake3 => 32,
        }
    }

    /// A fresh streaming hasher.
    pub fn hasher(self) -> Hasher {
        match self {
            Self::Xxh3_128 => Hasher::Xxh3(Box::default()),
            Self::Blake3 => Hasher::Blake3(Box::default()),
        }
    }

    /// Digest of one buffer.
    pub fn digest(self, data: &[u8]) -> Digest {
        let mut h = self.hasher();
        h.update(data);
        h.finish()
    }
}

impl FromStr for DigestAlgo {
    type Err = WireError;
    fn from_str(s: &str) -> Result<Self, WireError> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| WireError::UnknownDigest(s.to_string()))
    }
}

impl fmt::Display for DigestAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A streaming hasher for one transfer. Cloning it forks the state (the digest so far, and
/// then two ways on).
#[derive(Clone)]
pub enum Hasher {
    Xxh3(Box<crate::xxh3::Xxh3>),
    Blake3(Box<blake3::Hasher>),
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Xxh3(_) => "Hasher(xxh3-128)",
            Self::Blake3(_) => "Hasher(blake3)",
        })
    }
}

impl Hasher {
    /// Feed bytes, in order.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Self::Xxh3(h) => h.write(data),
            Self::Blake3(h) => {
                h.update(data);
            }
        }
    }

    /// The digest of everything fed so far.
    pub fn finish(&self) -> Digest {
        match self {
            Self::Xxh3(h) => {
                Digest { algo: DigestAlgo::Xxh3_128, bytes: h.finish_128().to_be_bytes().to_vec() }
            }
            Self::Blake3(h) => {
                Digest { algo: DigestAlgo::Blake3, bytes: h.finalize().as_bytes().to_vec() }
            }
        }
    }
}

/// A finished digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest {
    pub algo: DigestAlgo,
    pub bytes: Vec<u8>,
}

impl Digest {
    /// Wire form: algorithm id then digest bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + self.bytes.len());
        v.push(self.algo.id());
        v.extend_from_slice(&self.bytes);
        v
    }

    /// Parse the wire form.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let (&id, rest) =
            buf.split_first().ok_or_else(|| WireError::UnknownDigest("(empty)".into()))?;
        let algo =
            DigestAlgo::from_id(id).ok_or_else(|| WireError::UnknownDigest(id.to_string()))?;
        if rest.len() != algo.len() {
            return Err(WireError::UnknownDigest(format!("{algo} with {} bytes", rest.len())));
        }
        Ok(Self { algo, bytes: rest.to_vec() })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algo, hex::encode(&self.bytes))
    }
}

impl FromStr for Digest {
    type Err = WireError;
    fn from_str(s: &str) -> Result<Self, WireError> {
        let (algo, hexpart) =
            s.split_once(':').ok_or_else(|| WireError::UnknownDigest(s.to_string()))?;
        let algo: DigestAlgo = algo.parse()?;
        let bytes = hex::decode(hexpart).map_err(|_| WireError::UnknownDigest(s.to_string()))?;
        if bytes.len() != algo.len() {
            return Err(WireError::UnknownDigest(s.to_string()));
        }
        Ok(Self { algo, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_equals_one_shot_and_text_roundtrips() {
        for algo in DigestAlgo::ALL {
            let mut h = algo.hasher();
            h.update(b"hello ");
            h.update(b"world");
            let d = h.finish();
            assert_eq!(d, algo.digest(b"hello world"));
            assert_ne!(d, algo.digest(b"hello worle"));
            assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
            assert_eq!(Digest::decode(&d.encode()).unwrap(), d);
        }
    }

    /// Digests are stored: the algorithm must never change under them (this value is
    /// XXH3-128 of the reference implementation, as xxhash-rust computed it before the switch
    /// to twox-hash).
    #[test]
    fn xxh3_128_is_the_reference_value() {
        let d = DigestAlgo::Xxh3_128.digest(b"blobstream");
        assert_eq!(d.to_string(), "xxh3-128:2fd78db4cd98508d62c41b2aed6d218b");
        let mut h = DigestAlgo::Xxh3_128.hasher();
        for piece in b"blobstream".chunks(3) {
            h.update(piece);
        }
        assert_eq!(h.finish(), d);
    }

    #[test]
    fn bad_digests_are_rejected() {
        assert!(Digest::decode(&[]).is_err());
        assert!(Digest::decode(&[9, 1, 2]).is_err());
        assert!(Digest::decode(&[1, 1, 2]).is_err());
        assert!("md5:00".parse::<Digest>().is_err());
        assert!("xxh3-128:zz".parse::<Digest>().is_err());
    }
}
