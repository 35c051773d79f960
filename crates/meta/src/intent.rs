//! Commit intents: a blob's catalogue row made durable while its bytes are still on their
//! way to storage, so that the commit once they are stored need not wait for the disk.
//!
//! The object store commits a blob in two catalogue writes. The intent — the row it will
//! commit, and what it may replace — is written durably (one WAL fsync) while the PUT or the
//! multipart completion is in flight; once the bucket has the bytes, the commit itself goes
//! to the WAL without an fsync of its own, and the writer is acknowledged. If a crash loses
//! that commit, the intent is still there, and the store's start-up commits it again when
//! it finds the object whole in the bucket (an object is all there or absent), or forgets
//! it when the object is not there (never stored, so never acknowledged).
//!
//! Why a surviving intent is always the newest word on its name: the WAL is one file,
//! synced in order, so any durable write after a lazy commit makes that commit durable
//! too, and the commit deletes its intent in the same transaction. An intent survives a
//! crash only if no durable write followed its commit, or if its commit never ran. Every
//! commit and every delete of a name deletes the name's intents, so no intent outlives a
//! later change to its name. A commit is left lazy only when it did exactly what its intent
//! said and that intent was the name's only one; otherwise (its intent gone, another left
//! behind by a failure, the name's blob not to be replaced) it is made durable before it
//! returns. So an intent a crash leaves with a lost commit is its name's only one, and
//! replaying it cannot put an older write over a newer.
//!
//! Only the embedded SQLite catalogue keeps intents; PostgreSQL's commits stay durable on
//! their own (see [`crate::Catalogue::intend`]).

use rusqlite::params;

use crate::error::MetaError;
use crate::group::Durability;
use crate::record::{BlobRecord, Commit, from_json, now_ms, to_json};
use crate::sqlite_catalogue::{SqliteCatalogue, commit_row};

type Result<T> = std::result::Result<T, MetaError>;

/// A blob about to be committed: its record and location, its chunk digests (stored form),
/// and what it may replace (the upload's `overwrite` and refused digests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitIntent {
    pub record: BlobRecord,
    pub location: String,
    pub chunks: Vec<u8>,
    pub overwrite: bool,
    pub refuse_digests: Vec<String>,
}

impl SqliteCatalogue {
    /// Record `intent`, durably.
    pub fn intend(&self, intent: &CommitIntent) -> Result<()> {
        let i = intent.clone();
        self.db.write(move |tx| {
            tx.prepare_cached(
                "INSERT INTO intents
                 (location, name, size, content_type, digest, created_ms, metadata, chunks,
                  overwrite, refuse_digests)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                i.location,
                i.record.name,
                i.record.size as i64,
                i.record.content_type,
                i.record.digest,
                i.record.created_ms,
                to_json(&i.record.metadata),
                i.chunks,
                i.overwrite,
                serde_json::to_string(&i.refuse_digests).expect("string lists serialise"),
            ])?;
            Ok(())
        })
    }

    /// Commit what `intent` says (as `commit_blob` would) and drop it. With
    /// [`Durability::Lazy`] the commit rests on the intent for its durability, unless it did
    /// not do exactly what the intent said: then it is made durable before this returns.
    pub fn commit_intended(
        &self,
        intent: &CommitIntent,
        may_replace: impl Fn(Option<&str>) -> bool + Send + 'static,
        durability: Durability,
    ) -> Result<Commit> {
        let i = intent.clone();
        let op = move |tx: &rusqlite::Connection| {
            let done = commit_row(tx, &i.record, &i.location, &i.chunks, None, may_replace)?;
            // Committed: the name's intents go, this one with them. Refused: only this one.
            let sql = match done {
                Commit::Done(_) => {
                    "DELETE FROM intents WHERE name = ?1 OR location = ?2 RETURNING location"
                }
                Commit::Refused => {
                    "DELETE FROM intents WHERE name = ?1 AND location = ?2 RETURNING location"
                }
            };
            let mut st = tx.prepare_cached(sql)?;
            let gone =
                st.query_map(params![i.record.name, i.location], |r| r.get::<_, String>(0))?;
            // Exactly one, ours: another (even at our location, left by an earlier attempt
            // whose intent could not be dropped) could be replayed ahead of ours.
            let gone = gone.collect::<rusqlite::Result<Vec<String>>>()?;
            Ok((done, gone.len() == 1 && gone[0] == i.location))
        };
        let (done, ours) = match durability {
            Durability::Now => self.db.write(op)?,
            Durability::Lazy => self.db.write_lazy(op)?,
        };
        if durability == Durability::Lazy && !(ours && matches!(done, Commit::Done(_))) {
            self.sync()?;
        }
        Ok(done)
    }

    /// Drop the intent for `location` (its bytes were not stored), durably, with every
    /// write before it.
    pub fn forget_intent(&self, location: &str) -> Result<()> {
        let location = location.to_string();
        self.db.write(move |tx| {
            tx.prepare_cached("DELETE FROM intents WHERE location = ?1")?.execute([&location])?;
            mark_synced(tx)
        })
    }

    /// Make every write so far durable.
    pub fn sync(&self) -> Result<()> {
        self.db.write(mark_synced)
    }

    /// Every intent left, oldest first.
    pub fn intents(&self) -> Result<Vec<CommitIntent>> {
        let c = self.db.lock();
        let mut st = c.prepare(
            "SELECT location, name, size, content_type, digest, created_ms, metadata, chunks,
                    overwrite, refuse_digests
             FROM intents ORDER BY seq",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, Vec<u8>>(7)?,
                r.get::<_, bool>(8)?,
                r.get::<_, String>(9)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (location, name, size, content_type, digest, created_ms, meta, chunks, ow, rd) =
                row?;
            let refuse_digests = serde_json::from_str(&rd).map_err(|e| MetaError::Corrupt {
                name: name.clone(),
                reason: format!("intent refuse_digests: {e}"),
            })?;
            out.push(CommitIntent {
                record: BlobRecord {
                    metadata: from_json(&name, &meta)?,
                    name,
                    size: size as u64,
                    content_type,
                    digest,
                    created_ms,
                },
                location,
                chunks,
                overwrite: ow,
                refuse_digests,
            });
        }
        Ok(out)
    }
}

/// A write that always changes the database (so its commit has a WAL frame to sync).
fn mark_synced(tx: &rusqlite::Connection) -> Result<()> {
    tx.prepare_cached("INSERT OR REPLACE INTO settings (key, value) VALUES ('synced_ms', ?1)")?
        .execute([now_ms().to_string()])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn intent(name: &str, location: &str, overwrite: bool) -> CommitIntent {
        CommitIntent {
            record: BlobRecord {
                name: name.into(),
                size: 3,
                content_type: "application/octet-stream".into(),
                digest: format!("blake3:{location}"),
                created_ms: 1,
                metadata: BTreeMap::from([("k".into(), "v".into())]),
            },
            location: location.into(),
            chunks: vec![1, 2, 3],
            overwrite,
            refuse_digests: vec!["blake3:x".into()],
        }
    }

    fn open(dir: &tempfile::TempDir) -> SqliteCatalogue {
        SqliteCatalogue::open(&dir.path().join("c.db")).unwrap()
    }

    #[test]
    fn an_intent_outlives_a_reopen_and_goes_with_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let cat = open(&dir);
        let a = intent("n", "loc-a", true);
        cat.intend(&a).unwrap();
        drop(cat);
        let cat = open(&dir);
        assert_eq!(cat.intents().unwrap(), vec![a.clone()]);
        // Referenced while it stands: garbage collection keeps its object.
        assert!(cat.referenced().unwrap().contains(&"loc-a".to_string()));
        let done = cat.commit_intended(&a, |_| true, Durability::Lazy).unwrap();
        assert_eq!(done, Commit::Done(None));
        assert!(cat.intents().unwrap().is_empty());
        let (rec, loc) = cat.blob("n").unwrap().unwrap();
        assert_eq!((rec, loc.as_str()), (a.record.clone(), "loc-a"));
    }

    #[test]
    fn a_commit_or_delete_of_a_name_voids_its_older_intents() {
        let dir = tempfile::tempdir().unwrap();
        let cat = open(&dir);
        cat.intend(&intent("n", "stale", true)).unwrap();
        cat.intend(&intent("other", "keep", true)).unwrap();
        let b = intent("n", "loc-b", true);
        cat.commit_blob(&b.record, &b.location, &b.chunks, None, |_| true).unwrap();
        let left: Vec<_> = cat.intents().unwrap().into_iter().map(|i| i.location).collect();
        assert_eq!(left, ["keep"]);
        cat.intend(&intent("other", "later", true)).unwrap();
        cat.delete_blob("other").unwrap();
        assert!(cat.intents().unwrap().is_empty());
    }

    #[test]
    fn a_commit_beside_an_intent_left_behind_is_made_durable_and_voids_it() {
        let dir = tempfile::tempdir().unwrap();
        let cat = open(&dir);
        // Left behind by a commit that failed, its intent with it undroppable at the time.
        cat.intend(&intent("n", "left", true)).unwrap();
        let a = intent("n", "loc-a", true);
        cat.intend(&a).unwrap();
        let synced = |c: &SqliteCatalogue| -> Option<String> {
            c.db.lock()
                .query_row("SELECT value FROM settings WHERE key = 'synced_ms'", [], |r| r.get(0))
                .ok()
        };
        assert_eq!(synced(&cat), None);
        assert_eq!(
            cat.commit_intended(&a, |_| true, Durability::Lazy).unwrap(),
            Commit::Done(None)
        );
        assert!(synced(&cat).is_some(), "not left resting on intents of which one is older");
        assert!(cat.intents().unwrap().is_empty());
        assert_eq!(cat.blob("n").unwrap().unwrap().1, "loc-a");
        // Left behind at the very location of the next attempt (a resend reuses its key).
        let dir = tempfile::tempdir().unwrap();
        let cat = open(&dir);
        cat.intend(&intent("n", "same", true)).unwrap();
        let again = CommitIntent { chunks: vec![9], ..intent("n", "same", true) };
        cat.intend(&again).unwrap();
        cat.commit_intended(&again, |_| true, Durability::Lazy).unwrap();
        assert!(synced(&cat).is_some(), "not left resting on two intents at one location");
    }

    #[test]
    fn a_refused_intent_is_dropped_and_the_name_keeps_its_blob() {
        let dir = tempfile::tempdir().unwrap();
        let cat = open(&dir);
        let first = intent("n", "first", false);
        cat.intend(&first).unwrap();
        assert_eq!(
            cat.commit_intended(&first, |d| d.is_none(), Durability::Lazy).unwrap(),
            Commit::Done(None)
        );
        let second = intent("n", "second", false);
        cat.intend(&second).unwrap();
        assert_eq!(
            cat.commit_intended(&second, |d| d.is_none(), Durability::Lazy).unwrap(),
            Commit::Refused
        );
        assert!(cat.intents().unwrap().is_empty());
        assert_eq!(cat.blob("n").unwrap().unwrap().1, "first");
    }

    #[test]
    fn an_intent_dropped_before_its_commit_still_lets_it_commit() {
        // Its name deleted while the bytes were stored: the commit still lands, durably.
        let dir = tempfile::tempdir().unwrap();
        let cat = open(&dir);
        let a = intent("n", "loc-a", true);
        cat.intend(&a).unwrap();
        assert_eq!(cat.delete_blob("n").unwrap(), None);
        assert!(cat.intents().unwrap().is_empty());
        assert_eq!(
            cat.commit_intended(&a, |_| true, Durability::Lazy).unwrap(),
            Commit::Done(None)
        );
        assert_eq!(cat.blob("n").unwrap().unwrap().1, "loc-a");
        cat.forget_intent("loc-a").unwrap();
        assert_eq!(cat.blob("n").unwrap().unwrap().1, "loc-a");
    }
}
