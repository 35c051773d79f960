//! Connections that have proven nothing yet (no token, no first message): each holds a
//! thread on the servers that serve a connection per thread (the distributer, the block
//! servers), so at most so many are kept at once, and a first message announcing more than a
//! greeting can be is refused before its body is read.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bs_wire::Frame;

use crate::{Conn, TransportError};

/// Connections counted until they have proven themselves (or gone): dropped, uncounted.
#[derive(Debug)]
pub struct Unproven(Arc<AtomicUsize>);

impl Unproven {
    /// Count one more connection in `count`, unless `max` are counted already.
    pub fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        let taken =
            count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        taken.ok().map(|_| Self(count.clone()))
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Look at the first frame on `conn` (left in place for whoever reads next): `Ok(Err(why))`
/// when it is a message of more than `max` bytes — a greeting is far smaller, and its body
/// is not read (nor buffered) for a peer that has proven nothing.
pub fn first_message_at_most(
    conn: &mut Conn,
    max: u64,
) -> Result<Result<(), String>, TransportError> {
    Ok(match conn.peek_frame()? {
        Frame::Msg { len, .. } if len > max => {
            Err(format!("a first message of {len} bytes: a greeting is at most {max}"))
        }
        _ => Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_are_counted_and_a_dropped_one_makes_room() {
        let count = Arc::new(AtomicUsize::new(0));
        let held: Vec<_> = (0..3).map(|_| Unproven::take(&count, 3).unwrap()).collect();
        assert!(Unproven::take(&count, 3).is_none());
        drop(held);
        assert_eq!(count.load(Ordering::Acquire), 0);
        assert!(Unproven::take(&count, 3).is_some());
    }
}
