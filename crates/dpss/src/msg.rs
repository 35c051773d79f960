//! The block store's messages. Each is one binding message (a `MSG` frame, see
//! `bs_binding::driver`) whose first byte says what it is; numbers are big-endian, a data set
//! name is one length byte and its UTF-8.
//!
//! ```text
//!  kind  name       direction          body
//!  1     HELLO      peer → server      JSON {"role": "requests"|"blocks"|"loader",
//!                                      "session": hex, "token": string}
//!  2     WELCOME    server → peer      JSON {"name", "disks", "max_list", "max_block"}
//!  3     LIST       client → server    seq u32, got u64, dataset, count u32,
//!                                      count × (level u8, x u32, y u32, priority u8);
//!                                      got: BLOCKs the client has read on this session
//!                                      so far (the server sends none of the blocks it has
//!                                      sent since again: they are on their way)
//!  4     BLOCK      server → client    seq u32, level u8, x u32, y u32, length u32,
//!                                      digest [16] (xxh3-128), dataset, then length bytes
//!  5     FAILED     server → client    seq u32, level u8, x u32, y u32, reason (UTF-8)
//!  6     DONE       server → client    seq u32, JSON ListStats: the list was served or
//!                                      replaced by the next one (then "flushed" counts)
//!  7     PUT        loader → server    disk u16, level u8, x u32, y u32, digest [16],
//!                                      dataset, then the block's bytes
//!  8     COMMIT     loader → server    dataset: publish what was PUT (reply COMMITTED)
//!  9     COMMITTED  server → loader    JSON {"blocks": [[level, x, y, disk, offset], …]}
//! 10     DROP       loader → server    dataset: remove it (a load that failed half way);
//!                                      answered by HELD, "exists" saying whether this
//!                                      server held blocks of it (now removed)
//! 11     BEGIN      loader → server    dataset: hold the name for this connection until it
//!                                      ends (no other loader may load or drop it meanwhile)
//! 12     HELD       server → loader    JSON {"exists": bool}: to BEGIN, the name is held and
//!                                      whether this server already has a committed data set
//!                                      of that name; to DROP, whether it held blocks of it
//! ```
//!
//! A client opens two connections to each server: `requests` carries its `LIST`s, `blocks`
//! brings back `BLOCK`, `FAILED` and `DONE` (so a new list never waits behind a block, and
//! neither side polls); both say the same random `session` in their `HELLO`. Priorities:
//! 0 high, 1 medium, 2 low. Anything malformed ends the connection with an `ERROR` frame.

use serde::{Deserialize, Serialize};

use crate::block::{BlockId, Priority};
use crate::error::DpssError;

pub const HELLO: u8 = 1;
pub const WELCOME: u8 = 2;
pub const LIST: u8 = 3;
pub const BLOCK: u8 = 4;
pub const FAILED: u8 = 5;
pub const DONE: u8 = 6;
pub const PUT: u8 = 7;
pub const COMMIT: u8 = 8;
pub const COMMITTED: u8 = 9;
pub const DROP: u8 = 10;
pub const BEGIN: u8 = 11;
pub const HELD: u8 = 12;

/// Bytes per entry of a `LIST`.
const ENTRY: usize = 10;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    pub role: String,
    #[serde(default)]
    pub session: String,
    #[serde(default)]
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Welcome {
    pub name: String,
    pub disks: u32,
    pub max_list: u32,
    pub max_block: u32,
}

/// What became of one request list (sent in its `DONE`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListStats {
    pub requested: u32,
    /// Blocks found in the cache.
    pub cache_hits: u32,
    /// Blocks read from disk for this list.
    pub read: u32,
    pub sent: u32,
    pub failed: u32,
    /// Requests dropped unserved because the next list replaced this one.
    pub flushed: u32,
    /// Requests not served again because the block was on its way to the client already
    /// (sent for an earlier list after the client made this one).
    #[serde(default)]
    pub in_flight: u32,
}

/// Where a committed block landed on a server: (id, local disk, offset).
pub type Placed = (BlockId, u16, u64);

/// A parsed message (payloads borrowed from the message).
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    Hello(Hello),
    Welcome(Welcome),
    List { seq: u32, got: u64, dataset: &'a str, entries: Vec<(BlockId, Priority)> },
    Block { seq: u32, id: BlockId, digest: [u8; 16], dataset: &'a str, data: &'a [u8] },
    Failed { seq: u32, id: BlockId, reason: &'a str },
    Done { seq: u32, stats: ListStats },
    Put { disk: u16, id: BlockId, digest: [u8; 16], dataset: &'a str, data: &'a [u8] },
    Commit(&'a str),
    Drop(&'a str),
    Committed(Vec<Placed>),
    Begin(&'a str),
    Held { exists: bool },
}

fn bad(what: &str) -> DpssError {
    DpssError::Malformed(what.to_string())
}

/// A cursor over a message body.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DpssError> {
        if self.0.len() < n {
            return Err(bad(&format!("message ends inside its {what}")));
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
    fn u8(&mut self, what: &str) -> Result<u8, DpssError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, DpssError> {
        Ok(u16::from_be_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32, DpssError> {
        Ok(u32::from_be_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, DpssError> {
        Ok(u64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn id(&mut self) -> Result<BlockId, DpssError> {
        Ok(BlockId { level: self.u8("level")?, x: self.u32("x")?, y: self.u32("y")? })
    }
    fn digest(&mut self) -> Result<[u8; 16], DpssError> {
        Ok(self.take(16, "digest")?.try_into().unwrap())
    }
    fn name(&mut self) -> Result<&'a str, DpssError> {
        let n = self.u8("data set name")? as usize;
        std::str::from_utf8(self.take(n, "data set name")?)
            .map_err(|_| bad("data set name is not UTF-8"))
    }
    fn text(self) -> Result<&'a str, DpssError> {
        std::str::from_utf8(self.0).map_err(|_| bad("text is not UTF-8"))
    }
}

fn json<T: for<'d> Deserialize<'d>>(b: &[u8], what: &str) -> Result<T, DpssError> {
    serde_json::from_slice(b).map_err(|e| bad(&format!("{what}: {e}")))
}

impl<'a> Message<'a> {
    /// Parse one message; `max_list` bounds a `LIST`'s entries.
    pub fn parse(m: &'a [u8], max_list: usize) -> Result<Self, DpssError> {
        let (&kind, body) = m.split_first().ok_or_else(|| bad("empty message"))?;
        let mut r = Rd(body);
        Ok(match kind {
            HELLO => Message::Hello(json(body, "HELLO")?),
            WELCOME => Message::Welcome(json(body, "WELCOME")?),
            LIST => {
                let seq = r.u32("seq")?;
                let got = r.u64("got")?;
                let dataset = r.name()?;
                let count = r.u32("count")? as usize;
                if count > max_list {
                    return Err(DpssError::ListTooLong { got: count, max: max_list });
                }
                if r.0.len() != count * ENTRY {
                    return Err(bad(&format!(
                        "LIST says {count} entries but carries {} bytes of them",
                        r.0.len()
                    )));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let id = r.id()?;
                    let p = r.u8("priority")?;
                    let p = Priority::from_u8(p)
                        .ok_or_else(|| bad(&format!("priority {p} (0 high, 1 medium, 2 low)")))?;
                    entries.push((id, p));
                }
                Message::List { seq, got, dataset, entries }
            }
            BLOCK => {
                let seq = r.u32("seq")?;
                let id = r.id()?;
                let len = r.u32("length")? as usize;
                let digest = r.digest()?;
                let dataset = r.name()?;
                if r.0.len() != len {
                    return Err(bad(&format!("BLOCK says {len} bytes, carries {}", r.0.len())));
                }
                Message::Block { seq, id, digest, dataset, data: r.0 }
            }
            FAILED => {
                let seq = r.u32("seq")?;
                let id = r.id()?;
                Message::Failed { seq, id, reason: r.text()? }
            }
            DONE => {
                let seq = r.u32("seq")?;
                Message::Done { seq, stats: json(r.0, "DONE")? }
            }
            PUT => {
                let disk = r.u16("disk")?;
                let id = r.id()?;
                let digest = r.digest()?;
                let dataset = r.name()?;
                Message::Put { disk, id, digest, dataset, data: r.0 }
            }
            COMMIT => {
                let name = r.text()?;
                Message::Commit(name)
            }
            DROP => Message::Drop(r.text()?),
            BEGIN => Message::Begin(r.text()?),
            HELD => {
                #[derive(Deserialize)]
                struct H {
                    exists: bool,
                }
                let h: H = json(body, "HELD")?;
                Message::Held { exists: h.exists }
            }
            COMMITTED => {
                #[derive(Deserialize)]
                struct C {
                    blocks: Vec<(u8, u32, u32, u16, u64)>,
                }
                let c: C = json(body, "COMMITTED")?;
                let placed =
                    c.blocks.into_iter().map(|(l, x, y, d, o)| (BlockId::new(l, x, y), d, o));
                Message::Committed(placed.collect())
            }
            k => return Err(bad(&format!("unknown message kind {k}"))),
        })
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    debug_assert!(name.len() <= 255);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
}

fn put_id(out: &mut Vec<u8>, id: BlockId) {
    out.push(id.level);
    out.extend_from_slice(&id.x.to_be_bytes());
    out.extend_from_slice(&id.y.to_be_bytes());
}

fn with_json(kind: u8, v: &impl Serialize) -> Vec<u8> {
    let mut out = vec![kind];
    serde_json::to_writer(&mut out, v).expect("JSON of a plain struct");
    out
}

pub fn hello(h: &Hello) -> Vec<u8> {
    with_json(HELLO, h)
}

pub fn welcome(w: &Welcome) -> Vec<u8> {
    with_json(WELCOME, w)
}

pub fn list(seq: u32, got: u64, dataset: &str, entries: &[(BlockId, Priority)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + dataset.len() + entries.len() * ENTRY);
    out.push(LIST);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&got.to_be_bytes());
    put_name(&mut out, dataset);
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for &(id, p) in entries {
        put_id(&mut out, id);
        out.push(p as u8);
    }
    out
}

/// A `BLOCK`'s header; the block's bytes follow it in the same message.
pub fn block_head(seq: u32, id: BlockId, len: usize, digest: &[u8; 16], dataset: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + dataset.len());
    block_head_into(&mut out, seq, id, len, digest, dataset);
    out
}

/// [`block_head`] into `out` (cleared first), so a sender reuses one buffer for every block.
pub fn block_head_into(
    out: &mut Vec<u8>,
    seq: u32,
    id: BlockId,
    len: usize,
    digest: &[u8; 16],
    dataset: &str,
) {
    out.clear();
    out.push(BLOCK);
    out.extend_from_slice(&seq.to_be_bytes());
    put_id(out, id);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(digest);
    put_name(out, dataset);
}

pub fn failed(seq: u32, id: BlockId, reason: &str) -> Vec<u8> {
    let mut out = vec![FAILED];
    out.extend_from_slice(&seq.to_be_bytes());
    put_id(&mut out, id);
    out.extend_from_slice(reason.as_bytes());
    out
}

pub fn done(seq: u32, stats: &ListStats) -> Vec<u8> {
    let mut out = vec![DONE];
    out.extend_from_slice(&seq.to_be_bytes());
    serde_json::to_writer(&mut out, stats).expect("JSON of a plain struct");
    out
}

/// A `PUT`'s header; the block's bytes follow it in the same message.
pub fn put_head(disk: u16, id: BlockId, digest: &[u8; 16], dataset: &str) -> Vec<u8> {
    let mut out = vec![PUT];
    out.extend_from_slice(&disk.to_be_bytes());
    put_id(&mut out, id);
    out.extend_from_slice(digest);
    put_name(&mut out, dataset);
    out
}

pub fn commit(dataset: &str) -> Vec<u8> {
    let mut out = vec![COMMIT];
    out.extend_from_slice(dataset.as_bytes());
    out
}

pub fn drop(dataset: &str) -> Vec<u8> {
    let mut out = vec![DROP];
    out.extend_from_slice(dataset.as_bytes());
    out
}

pub fn begin(dataset: &str) -> Vec<u8> {
    let mut out = vec![BEGIN];
    out.extend_from_slice(dataset.as_bytes());
    out
}

pub fn held(exists: bool) -> Vec<u8> {
    with_json(HELD, &serde_json::json!({ "exists": exists }))
}

pub fn committed(placed: &[Placed]) -> Vec<u8> {
    let rows: Vec<_> = placed.iter().map(|(id, d, o)| (id.level, id.x, id.y, *d, *o)).collect();
    with_json(COMMITTED, &serde_json::json!({ "blocks": rows }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let id = BlockId::new(3, 70_000, 5);
        let d = [7u8; 16];
        let entries = vec![(id, Priority::High), (BlockId::new(0, 1, 2), Priority::Low)];
        let l = list(9, 1 << 40, "demo", &entries);
        assert_eq!(
            Message::parse(&l, 10).unwrap(),
            Message::List { seq: 9, got: 1 << 40, dataset: "demo", entries }
        );
        let mut b = block_head(9, id, 3, &d, "demo");
        b.extend_from_slice(b"abc");
        assert_eq!(
            Message::parse(&b, 10).unwrap(),
            Message::Block { seq: 9, id, digest: d, dataset: "demo", data: b"abc" }
        );
        let f = failed(2, id, "gone");
        assert_eq!(Message::parse(&f, 10).unwrap(), Message::Failed { seq: 2, id, reason: "gone" });
        let s = ListStats { requested: 5, sent: 3, flushed: 2, ..Default::default() };
        assert_eq!(Message::parse(&done(4, &s), 10).unwrap(), Message::Done { seq: 4, stats: s });
        let mut p = put_head(1, id, &d, "demo");
        p.extend_from_slice(b"xy");
        assert_eq!(
            Message::parse(&p, 10).unwrap(),
            Message::Put { disk: 1, id, digest: d, dataset: "demo", data: b"xy" }
        );
        assert_eq!(Message::parse(&commit("demo"), 10).unwrap(), Message::Commit("demo"));
        assert_eq!(Message::parse(&drop("demo"), 10).unwrap(), Message::Drop("demo"));
        assert_eq!(Message::parse(&begin("demo"), 10).unwrap(), Message::Begin("demo"));
        assert_eq!(Message::parse(&held(true), 10).unwrap(), Message::Held { exists: true });
        let c = committed(&[(id, 1, 4096)]);
        assert_eq!(Message::parse(&c, 10).unwrap(), Message::Committed(vec![(id, 1, 4096)]));
    }

    #[test]
    fn malformed_messages_are_named_not_panicked_on() {
        let l = list(1, 0, "demo", &[(BlockId::new(0, 0, 0), Priority::High)]);
        // Every truncation of a LIST is an error, never a panic.
        for n in 0..l.len() {
            assert!(Message::parse(&l[..n], 10).is_err(), "prefix {n}");
        }
        let mut extra = l.clone();
        extra.push(0);
        assert!(Message::parse(&extra, 10).is_err());
        let mut prio = l.clone();
        *prio.last_mut().unwrap() = 7;
        let e = Message::parse(&prio, 10).unwrap_err().to_string();
        assert!(e.contains("priority 7"), "{e}");
        assert!(matches!(Message::parse(&[200], 10), Err(DpssError::Malformed(_))));
        let mut b = block_head(1, BlockId::new(0, 0, 0), 5, &[0; 16], "d");
        b.extend_from_slice(b"abc");
        assert!(Message::parse(&b, 10).unwrap_err().to_string().contains("says 5 bytes"));
    }

    #[test]
    fn a_list_over_the_bound_is_refused_before_it_is_read() {
        let entries = vec![(BlockId::new(0, 0, 0), Priority::Medium); 11];
        let e = Message::parse(&list(1, 0, "d", &entries), 10).unwrap_err();
        assert!(matches!(e, DpssError::ListTooLong { got: 11, max: 10 }), "{e}");
    }
}
