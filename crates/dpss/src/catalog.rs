//! The name server's catalogue: data set → layout, block → length, digest and the (server,
//! disk, offset) of each copy, in SQLite with the conventions of `crates/meta` (WAL, full
//! sync, one transaction per change).
//!
//! A data set becomes visible only by [`Catalog::publish`], which checks that every block of
//! its layout is there with all its copies and writes everything in one transaction.

use std::path::Path;

use bs_proto as pb;
use prost::Message;
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::DpssError;
use crate::layout::Layout;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY,
    layout BLOB NOT NULL,          -- protobuf DpssLayout
    published_unix INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS blocks (
    dataset TEXT NOT NULL, level INTEGER NOT NULL, x INTEGER NOT NULL, y INTEGER NOT NULL,
    len INTEGER NOT NULL, digest BLOB NOT NULL,
    PRIMARY KEY (dataset, level, x, y)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS placements (
    dataset TEXT NOT NULL, level INTEGER NOT NULL, x INTEGER NOT NULL, y INTEGER NOT NULL,
    copy INTEGER NOT NULL,         -- 0: the primary
    server INTEGER NOT NULL, disk INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (dataset, level, x, y, copy)
) WITHOUT ROWID;
-- The mark of each name's latest load, kept after a drop: the next load's is larger.
CREATE TABLE IF NOT EXISTS loads (
    name TEXT PRIMARY KEY,
    published_ns INTEGER NOT NULL
);
";

/// What the name server knows of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRow {
    pub len: u32,
    pub digest: [u8; 16],
    /// (server, disk, offset) of each copy, the primary first.
    pub copies: Vec<(u32, u32, u64)>,
}

#[derive(Debug)]
pub struct Catalog {
    db: Connection,
}

impl Catalog {
    /// Open (creating) the catalogue at `path`; `:memory:` for a throwaway one.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DpssError> {
        let db = Connection::open(path)?;
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "FULL")?;
        db.execute_batch(SCHEMA)?;
        Ok(Self { db })
    }

    /// Make a loaded data set visible with its blocks, all or nothing.
    pub fn publish(&mut self, layout: &Layout, blocks: &[pb::DpssBlock]) -> Result<(), DpssError> {
        let want = layout.all_blocks().count();
        if blocks.len() != want {
            return Err(DpssError::Layout(format!(
                "{:?} has {want} blocks, {} were published",
                layout.dataset,
                blocks.len()
            )));
        }
        let tx = self.db.transaction()?;
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM datasets WHERE name = ?1", [&layout.dataset], |r| r.get(0))
            .optional()?;
        if exists.is_some() {
            return Err(DpssError::DatasetExists(layout.dataset.clone()));
        }
        {
            let mut b = tx.prepare(
                "INSERT INTO blocks (dataset, level, x, y, len, digest) VALUES (?1,?2,?3,?4,?5,?6)",
            )?;
            let mut p = tx.prepare(
                "INSERT INTO placements (dataset, level, x, y, copy, server, disk, offset)
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8)",
            )?;
            for blk in blocks {
                let id = crate::BlockId::new(blk.level as u8, blk.x, blk.y);
                if blk.level > u8::MAX as u32 || !layout.contains(id) {
                    return Err(DpssError::Layout(format!("block {id} is outside the layout")));
                }
                if blk.placements.len() != layout.r as usize || blk.digest.len() != 16 {
                    return Err(DpssError::Layout(format!(
                        "block {id} has {} copies of {} or a bad digest",
                        blk.placements.len(),
                        layout.r
                    )));
                }
                b.execute(params![layout.dataset, blk.level, blk.x, blk.y, blk.len, blk.digest])
                    .map_err(|e| dup(e, id))?;
                for (copy, pl) in blk.placements.iter().enumerate() {
                    p.execute(params![
                        layout.dataset,
                        blk.level,
                        blk.x,
                        blk.y,
                        copy as u32,
                        pl.server,
                        pl.disk,
                        pl.offset as i64
                    ])
                    .map_err(|e| dup(e, id))?;
                }
            }
        }
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        // This load's mark: after any earlier load of the name (a clock set back still gives
        // a new value).
        let last: Option<i64> = tx
            .query_row("SELECT published_ns FROM loads WHERE name = ?1", [&layout.dataset], |r| {
                r.get(0)
            })
            .optional()?;
        let ns = (now.as_nanos().min(i64::MAX as u128) as i64).max(last.map_or(1, |l| l + 1));
        let mut p = pb::DpssLayout::from(layout);
        p.published_ns = ns as u64;
        tx.execute(
            "INSERT INTO datasets (name, layout, published_unix) VALUES (?1, ?2, ?3)",
            params![layout.dataset, p.encode_to_vec(), now.as_secs() as i64],
        )?;
        tx.execute(
            "INSERT INTO loads (name, published_ns) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET published_ns = excluded.published_ns",
            params![layout.dataset, ns],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Forget a data set and its blocks; whether it was there.
    pub fn unpublish(&mut self, name: &str) -> Result<bool, DpssError> {
        let tx = self.db.transaction()?;
        let n = tx.execute("DELETE FROM datasets WHERE name = ?1", [name])?;
        tx.execute("DELETE FROM blocks WHERE dataset = ?1", [name])?;
        tx.execute("DELETE FROM placements WHERE dataset = ?1", [name])?;
        tx.commit()?;
        Ok(n > 0)
    }

    /// A published data set's layout.
    pub fn lookup(&self, name: &str) -> Result<Layout, DpssError> {
        let raw: Option<Vec<u8>> = self
            .db
            .query_row("SELECT layout FROM datasets WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        let raw = raw.ok_or_else(|| DpssError::UnknownDataset(name.to_string()))?;
        decode(&raw)
    }

    /// Every published data set.
    pub fn list(&self) -> Result<Vec<Layout>, DpssError> {
        let mut st = self.db.prepare("SELECT layout FROM datasets ORDER BY name")?;
        let rows = st.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
        rows.map(|r| decode(&r?)).collect()
    }

    /// A block's length, digest and copies.
    pub fn block(&self, dataset: &str, id: crate::BlockId) -> Result<BlockRow, DpssError> {
        let key = params![dataset, id.level, id.x, id.y];
        let row: Option<(u32, Vec<u8>)> = self
            .db
            .query_row(
                "SELECT len, digest FROM blocks WHERE dataset=?1 AND level=?2 AND x=?3 AND y=?4",
                key,
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (len, digest) = row.ok_or_else(|| DpssError::UnknownBlock {
            dataset: dataset.into(),
            block: id.to_string(),
        })?;
        let mut st = self.db.prepare(
            "SELECT server, disk, offset FROM placements
             WHERE dataset=?1 AND level=?2 AND x=?3 AND y=?4 ORDER BY copy",
        )?;
        let copies = st
            .query_map(key, |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BlockRow { len, digest: digest.try_into().unwrap_or([0; 16]), copies })
    }
}

fn decode(raw: &[u8]) -> Result<Layout, DpssError> {
    let p = pb::DpssLayout::decode(raw).map_err(|e| DpssError::Layout(e.to_string()))?;
    Layout::try_from(p)
}

fn dup(e: rusqlite::Error, id: crate::BlockId) -> DpssError {
    match e {
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            DpssError::Layout(format!("block {id} published twice"))
        }
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockId;
    use crate::layout::ServerRef;

    fn layout(name: &str) -> Layout {
        let servers = (0..2)
            .map(|i| ServerRef { name: format!("s{i}"), addr: format!("a{i}"), disks: 1 })
            .collect();
        Layout::plan(name, "file", (3000, 1), 1000, servers, 2).unwrap()
    }

    fn rows(l: &Layout) -> Vec<pb::DpssBlock> {
        l.all_blocks()
            .map(|id| pb::DpssBlock {
                level: 0,
                x: id.x,
                y: 0,
                len: 1000,
                digest: vec![id.x as u8; 16],
                placements: l
                    .locations(id)
                    .iter()
                    .map(|&(s, d)| pb::DpssPlacement {
                        server: s as u32,
                        disk: d as u32,
                        offset: id.x as u64 * 1000,
                    })
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn publish_is_all_or_nothing_and_survives_reopen() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("names.db");
        let mut c = Catalog::open(&path).unwrap();
        let l = layout("f");
        let mut r = rows(&l);
        // A block missing, or one with too few copies: refused, nothing visible.
        assert!(c.publish(&l, &r[..2]).is_err());
        let mut short = r.clone();
        short[1].placements.pop();
        assert!(c.publish(&l, &short).is_err());
        // A duplicate block: refused inside the transaction, nothing visible.
        r[2] = r[0].clone();
        assert!(c.publish(&l, &r).unwrap_err().to_string().contains("published twice"));
        assert!(matches!(c.lookup("f"), Err(DpssError::UnknownDataset(_))));
        c.publish(&l, &rows(&l)).unwrap();
        assert!(matches!(c.publish(&l, &rows(&l)), Err(DpssError::DatasetExists(_))));
        drop(c);
        let c = Catalog::open(&path).unwrap();
        let first = c.lookup("f").unwrap();
        assert!(first.published_ns > 0, "a published layout carries its load's mark");
        assert_eq!(Layout { published_ns: 0, ..first.clone() }, l);
        assert_eq!(c.list().unwrap().len(), 1);
        let b = c.block("f", BlockId::new(0, 2, 0)).unwrap();
        assert_eq!((b.len, b.digest, b.copies.len()), (1000, [2; 16], 2));
        let primary = l.locations(BlockId::new(0, 2, 0))[0];
        assert_eq!(b.copies[0], (primary.0 as u32, primary.1 as u32, 2000));
        assert!(c.block("f", BlockId::new(0, 3, 0)).is_err());
        let mut c = c;
        assert!(c.unpublish("f").unwrap());
        assert!(!c.unpublish("f").unwrap());
        assert!(matches!(c.lookup("f"), Err(DpssError::UnknownDataset(_))));
        assert!(c.block("f", BlockId::new(0, 2, 0)).is_err());
        c.publish(&l, &rows(&l)).unwrap(); // the name is free again
        let again = c.lookup("f").unwrap().published_ns;
        assert!(again > first.published_ns, "a new load of the name is told apart: {again}");
    }
}
