//! A block server's disks: one directory each, a data file and an index per data set, and the
//! staging area a loader writes into until it commits.
//!
//! On every disk directory, for each committed data set:
//!
//! ```text
//! <dataset>.blk   the blocks, back to back, each level in Hilbert-curve order
//! <dataset>.idx   "DPSSIDX1", then per block: level u8, x u32, y u32, offset u64,
//!                 length u32, digest [16] (xxh3-128), all big-endian
//! ```
//!
//! A loader's blocks go to `.staging/<dataset>.<n>` on their disk, in arrival order. Commit
//! rewrites them into `<dataset>.blk.tmp` sorted by (level, Hilbert index), writes
//! `<dataset>.idx.tmp`, syncs both, renames the data file and then the index (the index makes
//! the data set exist) and syncs the directory. At start, staging files, `.tmp` files and a
//! data file without its index are removed: nothing half-loaded survives a crash.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::block::{BlockId, check_name, digest};
use crate::error::DpssError;
use crate::hilbert;
use crate::msg::Placed;

const MAGIC: &[u8; 8] = b"DPSSIDX1";
const RECORD: usize = 1 + 4 + 4 + 8 + 4 + 16;
/// The largest block a server stores or sends.
pub const MAX_BLOCK: usize = 16 << 20;

/// Where one block lives on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub disk: u16,
    pub offset: u64,
    pub len: u32,
    pub digest: [u8; 16],
}

/// One committed data set on this server: where each of its blocks is, and the open files.
#[derive(Debug)]
pub struct Dataset {
    pub blocks: HashMap<BlockId, Loc>,
    files: Vec<Option<File>>,
}

impl Dataset {
    /// Read a block from its disk (not verified; see [`Dataset::read_verified`]).
    pub fn read(&self, loc: &Loc) -> std::io::Result<Vec<u8>> {
        let f = self.files[loc.disk as usize].as_ref().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no data file on that disk")
        })?;
        let mut buf = vec![0u8; loc.len as usize];
        f.read_exact_at(&mut buf, loc.offset)?;
        Ok(buf)
    }

    /// Read a block and check it against the digest it was stored with.
    pub fn read_verified(&self, id: BlockId, loc: &Loc) -> Result<Vec<u8>, DpssError> {
        let buf = self.read(loc)?;
        if digest(&buf) != loc.digest {
            return Err(DpssError::Corrupt(id.to_string()));
        }
        Ok(buf)
    }
}

/// A server's disk directories.
#[derive(Debug)]
pub struct Disks {
    dirs: Vec<PathBuf>,
    next_stage: AtomicU64,
}

/// A loader's blocks staged on this server, not yet visible.
#[derive(Debug)]
pub struct Staging {
    pub dataset: String,
    files: Vec<Option<(PathBuf, File, u64)>>,
    blocks: Vec<(BlockId, Loc)>,
}

impl Disks {
    /// Open (creating) the directories and clear what a crash left half done.
    pub fn open(dirs: Vec<PathBuf>) -> Result<Self, DpssError> {
        if dirs.is_empty() || dirs.len() > u16::MAX as usize {
            return Err(DpssError::Layout("a block server needs 1 to 65535 disks".into()));
        }
        for d in &dirs {
            // Every failure names the disk directory: "Permission denied" alone does not
            // say which of a server's disks is at fault.
            let at = |e: std::io::Error| {
                DpssError::Io(std::io::Error::new(e.kind(), format!("disk {}: {e}", d.display())))
            };
            let staging = d.join(".staging");
            fs::create_dir_all(&staging).map_err(at)?;
            for e in fs::read_dir(&staging).map_err(at)? {
                fs::remove_file(e.map_err(at)?.path()).map_err(at)?;
            }
            for e in fs::read_dir(d).map_err(at)? {
                let p = e.map_err(at)?.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                let orphan = name.ends_with(".tmp")
                    || (name.ends_with(".blk") && !p.with_extension("idx").exists());
                if orphan {
                    fs::remove_file(&p).map_err(at)?;
                }
            }
        }
        Ok(Self { dirs, next_stage: AtomicU64::new(0) })
    }

    pub fn count(&self) -> usize {
        self.dirs.len()
    }

    /// Every committed data set on these disks.
    pub fn load_all(&self) -> Result<HashMap<String, Dataset>, DpssError> {
        let mut names = std::collections::BTreeSet::new();
        for d in &self.dirs {
            for e in fs::read_dir(d)? {
                let p = e?.path();
                if p.extension().is_some_and(|x| x == "idx")
                    && let Some(stem) = p.file_stem().and_then(|s| s.to_str())
                    && check_name(stem).is_ok()
                {
                    names.insert(stem.to_string());
                }
            }
        }
        names.into_iter().map(|n| Ok((n.clone(), self.load(&n)?))).collect()
    }

    /// One committed data set.
    pub fn load(&self, name: &str) -> Result<Dataset, DpssError> {
        let mut blocks = HashMap::new();
        let mut files = Vec::with_capacity(self.dirs.len());
        for (disk, d) in self.dirs.iter().enumerate() {
            let idx = d.join(format!("{name}.idx"));
            if !idx.exists() {
                files.push(None);
                continue;
            }
            let raw = fs::read(&idx)?;
            let bad = || DpssError::Layout(format!("{} is not a block index", idx.display()));
            let body = raw.strip_prefix(MAGIC.as_slice()).ok_or_else(bad)?;
            if body.len() % RECORD != 0 {
                return Err(bad());
            }
            for r in body.chunks_exact(RECORD) {
                let id = BlockId::new(r[0], be32(&r[1..5]), be32(&r[5..9]));
                let loc = Loc {
                    disk: disk as u16,
                    offset: u64::from_be_bytes(r[9..17].try_into().unwrap()),
                    len: be32(&r[17..21]),
                    digest: r[21..37].try_into().unwrap(),
                };
                blocks.insert(id, loc);
            }
            files.push(Some(File::open(d.join(format!("{name}.blk")))?));
        }
        Ok(Dataset { blocks, files })
    }

    /// Start staging `dataset`'s blocks.
    pub fn stage(&self, dataset: &str) -> Result<Staging, DpssError> {
        check_name(dataset)?;
        Ok(Staging {
            dataset: dataset.to_string(),
            files: (0..self.dirs.len()).map(|_| None).collect(),
            blocks: Vec::new(),
        })
    }

    /// Append one block to the staging file of its disk (its digest checked first).
    pub fn put(
        &self,
        s: &mut Staging,
        disk: u16,
        id: BlockId,
        want: [u8; 16],
        data: &[u8],
    ) -> Result<(), DpssError> {
        if disk as usize >= self.dirs.len() {
            return Err(DpssError::Malformed(format!(
                "disk {disk} on a server with {} disks",
                self.dirs.len()
            )));
        }
        if data.len() > MAX_BLOCK {
            return Err(DpssError::Malformed(format!("a block of {} bytes", data.len())));
        }
        if digest(data) != want {
            return Err(DpssError::Corrupt(id.to_string()));
        }
        let slot = &mut s.files[disk as usize];
        if slot.is_none() {
            let n = self.next_stage.fetch_add(1, Ordering::Relaxed);
            let p = self.dirs[disk as usize].join(".staging").join(format!("{}.{n}", s.dataset));
            let f = OpenOptions::new().read(true).write(true).create_new(true).open(&p)?;
            *slot = Some((p, f, 0));
        }
        let (_, f, end) = slot.as_mut().unwrap();
        f.write_all_at(data, *end)?;
        s.blocks.push((id, Loc { disk, offset: *end, len: data.len() as u32, digest: want }));
        *end += data.len() as u64;
        Ok(())
    }

    /// Make the staged blocks a committed data set; returns where each block landed.
    pub fn commit(&self, mut s: Staging) -> Result<Vec<Placed>, DpssError> {
        let name = s.dataset.clone();
        if self.dirs.iter().any(|d| d.join(format!("{name}.idx")).exists()) {
            self.discard(s);
            return Err(DpssError::DatasetExists(name));
        }
        // Hilbert order within each level: the grid of a level is what its blocks span.
        let mut span: HashMap<u8, (u32, u32)> = HashMap::new();
        for (id, _) in &s.blocks {
            let e = span.entry(id.level).or_default();
            *e = (e.0.max(id.x + 1), e.1.max(id.y + 1));
        }
        let key = |id: &BlockId| {
            let (w, h) = span[&id.level];
            (id.level, hilbert::sort_key(id.x, id.y, w, h))
        };
        s.blocks.sort_by_key(|(id, _)| key(id));
        s.blocks.dedup_by_key(|(id, _)| *id);
        let mut placed = Vec::with_capacity(s.blocks.len());
        let mut renames = Vec::new();
        for (disk, dir) in self.dirs.iter().enumerate() {
            let Some((_, src, _)) = &s.files[disk] else { continue };
            let blk = dir.join(format!("{name}.blk.tmp"));
            let idx = dir.join(format!("{name}.idx.tmp"));
            let mut out = BufWriter::with_capacity(1 << 20, File::create(&blk)?);
            let mut index = Vec::from(MAGIC.as_slice());
            let mut offset = 0u64;
            for (id, loc) in s.blocks.iter().filter(|(_, l)| l.disk as usize == disk) {
                let mut buf = vec![0u8; loc.len as usize];
                src.read_exact_at(&mut buf, loc.offset)?;
                out.write_all(&buf)?;
                index.push(id.level);
                index.extend_from_slice(&id.x.to_be_bytes());
                index.extend_from_slice(&id.y.to_be_bytes());
                index.extend_from_slice(&offset.to_be_bytes());
                index.extend_from_slice(&loc.len.to_be_bytes());
                index.extend_from_slice(&loc.digest);
                placed.push((*id, disk as u16, offset));
                offset += loc.len as u64;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            let mut f = File::create(&idx)?;
            f.write_all(&index)?;
            f.sync_all()?;
            renames.push((dir.clone(), blk, idx));
        }
        for (dir, blk, idx) in &renames {
            fs::rename(blk, dir.join(format!("{name}.blk")))?;
            fs::rename(idx, dir.join(format!("{name}.idx")))?;
            File::open(dir)?.sync_all()?;
        }
        self.discard(s);
        Ok(placed)
    }

    /// Forget staged blocks (a loader that went away, or a failed commit).
    pub fn discard(&self, s: Staging) {
        for (p, _, _) in s.files.into_iter().flatten() {
            let _ = fs::remove_file(p);
        }
    }

    /// Remove a committed data set from every disk (the index first, so a crash half way
    /// leaves data files that the next start removes).
    pub fn remove(&self, name: &str) -> Result<bool, DpssError> {
        check_name(name)?;
        let mut any = false;
        for d in &self.dirs {
            for ext in ["idx", "blk"] {
                match fs::remove_file(d.join(format!("{name}.{ext}"))) {
                    Ok(()) => any = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(any)
    }

    pub fn dir(&self, disk: usize) -> &Path {
        &self.dirs[disk]
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disks(t: &tempfile::TempDir, n: usize) -> Disks {
        Disks::open((0..n).map(|i| t.path().join(format!("d{i}"))).collect()).unwrap()
    }

    #[test]
    fn a_disk_that_cannot_be_used_is_named() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let e = Disks::open(vec![t.path().join("d0"), file.clone()]).err().unwrap().to_string();
        assert!(e.contains(&format!("disk {}: ", file.display())), "{e}");
    }

    #[test]
    fn committed_blocks_read_back_in_hilbert_order_and_survive_reopen() {
        let t = tempfile::tempdir().unwrap();
        let d = disks(&t, 2);
        let mut s = d.stage("img").unwrap();
        let data = |x: u32, y: u32| format!("block {x},{y}").into_bytes();
        // Staged in row order; committed along the Hilbert curve.
        for y in 0..4 {
            for x in 0..4 {
                let b = data(x, y);
                d.put(&mut s, ((x + y) % 2) as u16, BlockId::new(0, x, y), digest(&b), &b).unwrap();
            }
        }
        let placed = d.commit(s).unwrap();
        assert_eq!(placed.len(), 16);
        let d = disks(&t, 2); // a restart
        let all = d.load_all().unwrap();
        let ds = &all["img"];
        for (id, loc) in &ds.blocks {
            assert_eq!(ds.read_verified(*id, loc).unwrap(), data(id.x, id.y));
        }
        // Along each disk's file, offsets grow with the Hilbert index.
        for disk in 0..2u16 {
            let mut on: Vec<_> = ds.blocks.iter().filter(|(_, l)| l.disk == disk).collect();
            on.sort_by_key(|(_, l)| l.offset);
            let keys: Vec<_> =
                on.iter().map(|(id, _)| hilbert::sort_key(id.x, id.y, 4, 4)).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        }
    }

    #[test]
    fn a_rotted_block_fails_its_digest_and_staging_never_becomes_visible() {
        let t = tempfile::tempdir().unwrap();
        let d = disks(&t, 1);
        let mut s = d.stage("img").unwrap();
        let b = vec![9u8; 1000];
        d.put(&mut s, 0, BlockId::new(0, 0, 0), digest(&b), &b).unwrap();
        // A wrong digest is refused at PUT.
        assert!(matches!(
            d.put(&mut s, 0, BlockId::new(0, 1, 0), [0; 16], &b),
            Err(DpssError::Corrupt(_))
        ));
        assert!(d.put(&mut s, 5, BlockId::new(0, 1, 0), digest(&b), &b).is_err());
        // Staged, not committed: another server start sees nothing and clears the staging.
        let again = disks(&t, 1);
        assert!(again.load_all().unwrap().is_empty());
        let mut s = again.stage("img").unwrap();
        again.put(&mut s, 0, BlockId::new(0, 0, 0), digest(&b), &b).unwrap();
        again.commit(s).unwrap();
        // Flip one byte on disk: the read says corrupt.
        let f = OpenOptions::new().write(true).open(t.path().join("d0/img.blk")).unwrap();
        f.write_all_at(&[8], 10).unwrap();
        let ds = again.load("img").unwrap();
        let (id, loc) = ds.blocks.iter().next().unwrap();
        assert!(matches!(ds.read_verified(*id, loc), Err(DpssError::Corrupt(_))));
        // The same name cannot be committed twice.
        let mut s = again.stage("img").unwrap();
        again.put(&mut s, 0, BlockId::new(0, 0, 0), digest(&b), &b).unwrap();
        assert!(matches!(again.commit(s), Err(DpssError::DatasetExists(_))));
        assert!(again.stage("../x").is_err());
    }
}
