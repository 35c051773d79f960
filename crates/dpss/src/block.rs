//! Names of things in the block store: data sets, blocks (level, x, y) and request priorities.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::DpssError;

/// A block of a data set: a tile at (`x`, `y`) of pyramid `level` (0 is full resolution), or
/// for a flat file block number `x` of level 0 with `y` = 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlockId {
    pub level: u8,
    pub x: u32,
    pub y: u32,
}

impl BlockId {
    pub fn new(level: u8, x: u32, y: u32) -> Self {
        Self { level, x, y }
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}_{}", self.level, self.x, self.y)
    }
}

/// How urgently a client wants a block (the ISS request priorities).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Send, in list order.
    High = 0,
    /// Send if there is time: only when no high block is ready.
    Medium = 1,
    /// Read into the cache only; never sent for this request.
    Low = 2,
}

impl Priority {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::High),
            1 => Some(Self::Medium),
            2 => Some(Self::Low),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Medium => "medium",
            Self::Low => "low",
        }
    }
}

/// A data set's name: it becomes a file name on every disk, so only a safe alphabet.
pub fn check_name(name: &str) -> Result<(), DpssError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok { Ok(()) } else { Err(DpssError::BadName(name.to_string())) }
}

/// The digest every block is stored and checked with (xxh3-128).
pub fn digest(data: &[u8]) -> [u8; 16] {
    bs_wire::xxh3::Xxh3::oneshot_128(data).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_a_directory_are_refused() {
        for bad in ["", ".", "..", "../x", "a/b", ".hidden", "a b", "x\0", &"a".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["demo", "slide-01.v2", "A_b"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn priorities_round_trip_and_order_by_urgency() {
        for p in [Priority::High, Priority::Medium, Priority::Low] {
            assert_eq!(Priority::from_u8(p as u8), Some(p));
        }
        assert_eq!(Priority::from_u8(3), None);
        assert!(Priority::High < Priority::Medium && Priority::Medium < Priority::Low);
    }
}
