//! The loader: cut a data set into blocks, send every copy of every block to its server and
//! disk, commit on every server, then publish the data set on the name server — or, when any
//! step fails, remove what was committed so nothing half-loaded is ever visible.

use std::collections::HashMap;
use std::time::Instant;

use bs_binding::Binding;
use bs_proto as pb;
use serde::Serialize;

use crate::block::{BlockId, digest};
use crate::client::{ClientOptions, block_on};
use crate::conn::Peer;
use crate::error::DpssError;
use crate::layout::{Layout, ServerRef};
use crate::msg::{self, Message};
use crate::pyramid::TileSource;

/// What a load did.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub dataset: String,
    pub blocks: u64,
    /// Bytes of the data set (each block once) and bytes written (every copy).
    pub bytes: u64,
    pub written: u64,
    pub servers: usize,
    pub k: u32,
    pub h: u32,
    pub r: u32,
    pub levels: u32,
    pub seconds: f64,
}

/// The block servers the master reports up, in a stable order.
pub fn live_servers(master: &str, opts: &ClientOptions) -> Result<Vec<ServerRef>, DpssError> {
    Ok(servers(master, opts)?.0)
}

/// The block servers the master knows: the live ones (in address order; an error if none),
/// and the names of those that are down.
fn servers(master: &str, opts: &ClientOptions) -> Result<(Vec<ServerRef>, Vec<String>), DpssError> {
    block_on(async {
        let mut c = crate::master::connect(master, opts).await?;
        let st = c.status(pb::DpssStatusRequest {}).await?.into_inner();
        let (up, down): (Vec<_>, Vec<_>) = st.servers.into_iter().partition(|s| s.up);
        let mut out: Vec<ServerRef> = up
            .into_iter()
            .map(|s| ServerRef { name: s.name, addr: s.addr, disks: s.disks })
            .collect();
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        if out.is_empty() {
            return Err(DpssError::Master(format!(
                "the master at {master} knows no live block server"
            )));
        }
        Ok((out, down.into_iter().map(|s| s.name).collect()))
    })
}

/// Something that hands every block of a data set, once each and in any order, to `emit`.
pub type Produce<'a> = dyn FnMut(&mut dyn FnMut(BlockId, Vec<u8>) -> Result<(), DpssError>) -> Result<(), DpssError>
    + 'a;

/// Load `src` as `layout` (from [`Layout::plan`]) and publish it on the master at `master`,
/// making the blocks on every core, level by level. `progress` is told (blocks done, blocks in
/// all) as the load goes.
pub fn load(
    master: &str,
    layout: Layout,
    src: &dyn TileSource,
    opts: &ClientOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LoadReport, DpssError> {
    let ids: Vec<BlockId> = layout.all_blocks().collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let mut produce = |emit: &mut dyn FnMut(BlockId, Vec<u8>) -> Result<(), DpssError>| {
        for batch in ids.chunks(workers * 4) {
            // Make the batch's blocks in parallel, send them in order.
            let made: Vec<Result<Vec<u8>, DpssError>> = std::thread::scope(|sc| {
                let per = batch.len().div_ceil(workers);
                let handles: Vec<_> = batch
                    .chunks(per)
                    .map(|part| {
                        sc.spawn(move || part.iter().map(|id| src.block(*id)).collect::<Vec<_>>())
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().expect("a tile maker panicked")).collect()
            });
            for (id, data) in batch.iter().zip(made) {
                emit(*id, data?)?;
            }
        }
        Ok(())
    };
    load_from(master, layout, opts, progress, &mut produce)
}

/// Load the blocks `produce` makes (every block of `layout`, once each, in any order) and
/// publish the data set; see [`load`].
pub fn load_from(
    master: &str,
    mut layout: Layout,
    opts: &ClientOptions,
    progress: &mut dyn FnMut(u64, u64),
    produce: &mut Produce<'_>,
) -> Result<LoadReport, DpssError> {
    let started = Instant::now();
    let mut links: Vec<Binding> = Vec::with_capacity(layout.servers.len());
    for s in &layout.servers {
        let hello = msg::Hello {
            role: "loader".into(),
            session: String::new(),
            token: opts.token.clone().unwrap_or_default(),
        };
        links.push(Peer::new(s.addr.clone(), opts.tls.clone()).open(&hello)?.0);
    }
    check_name_free(master, &layout, &mut links, opts)?;
    let total = layout.all_blocks().count() as u64;
    let mut blocks: Vec<pb::DpssBlock> = Vec::with_capacity(total as usize);
    let mut seen = std::collections::HashSet::with_capacity(total as usize);
    let (mut bytes, mut written) = (0u64, 0u64);
    let mut committed: Vec<usize> = Vec::new();
    let res = (|| {
        let mut emit = |id: BlockId, data: Vec<u8>| -> Result<(), DpssError> {
            if !layout.contains(id) || !seen.insert(id) {
                return Err(DpssError::Layout(format!(
                    "block {id} is outside the layout or made twice"
                )));
            }
            let d = digest(&data);
            for (s, disk) in layout.locations(id) {
                let head = msg::put_head(disk, id, &d, &layout.dataset);
                links[s].send_parts(&head, &data)?;
                written += data.len() as u64;
            }
            bytes += data.len() as u64;
            blocks.push(pb::DpssBlock {
                level: id.level as u32,
                x: id.x,
                y: id.y,
                len: data.len() as u32,
                digest: d.to_vec(),
                placements: Vec::new(),
            });
            if blocks.len().is_multiple_of(64) {
                progress(blocks.len() as u64, total);
            }
            Ok(())
        };
        produce(&mut emit)?;
        progress(blocks.len() as u64, total);
        if blocks.len() as u64 != total {
            return Err(DpssError::Layout(format!(
                "the source made {} of the {total} blocks",
                blocks.len()
            )));
        }
        let mut placed: HashMap<(BlockId, usize), (u16, u64)> = HashMap::new();
        for (s, b) in links.iter_mut().enumerate() {
            b.send(&msg::commit(&layout.dataset))?;
            let m = b.recv()?.ok_or_else(|| {
                DpssError::Remote(format!(
                    "{} closed the connection at COMMIT",
                    layout.servers[s].addr
                ))
            })?;
            let Message::Committed(list) = Message::parse(m.payload(), 0)? else {
                return Err(DpssError::Malformed("expected COMMITTED".into()));
            };
            committed.push(s);
            for (id, disk, offset) in list {
                placed.insert((id, s), (disk, offset));
            }
        }
        for b in &mut blocks {
            let id = BlockId::new(b.level as u8, b.x, b.y);
            for (s, _) in layout.locations(id) {
                let (disk, offset) = placed.get(&(id, s)).copied().ok_or_else(|| {
                    DpssError::Remote(format!("server {s} did not commit block {id}"))
                })?;
                b.placements.push(pb::DpssPlacement {
                    server: s as u32,
                    disk: disk as u32,
                    offset,
                });
            }
        }
        layout.blocks = total;
        layout.bytes = bytes;
        let req = pb::DpssPublishRequest {
            layout: Some((&layout).into()),
            blocks: std::mem::take(&mut blocks),
        };
        block_on(async {
            let mut c = crate::master::connect(master, opts).await?;
            c.publish(req).await?;
            Ok::<(), DpssError>(())
        })
    })();
    if let Err(e) = res {
        // Take back what some servers committed; the rest discard their staging when the
        // connection ends.
        for s in committed {
            let _ = links[s].send(&msg::drop(&layout.dataset));
            let _ = links[s].recv();
        }
        return Err(e);
    }
    for b in links {
        b.close();
    }
    Ok(LoadReport {
        dataset: layout.dataset.clone(),
        blocks: total,
        bytes,
        written,
        servers: layout.servers.len(),
        k: layout.k,
        h: layout.h,
        r: layout.r,
        levels: layout.levels,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Hold the data set's name on every server (BEGIN) before sending a block, and refuse at
/// once a name that is taken: published ("already exists"), or left by a loader that died
/// after some servers committed but before the name server published. Such leftovers are not
/// dropped here: a hold ends with its connection, so an earlier loader whose publish is still
/// in flight (or which lost its links to restarted servers) cannot be told from a dead one,
/// and dropping its blocks could empty a data set about to be published. `dpss drop` (an
/// explicit decision) removes them.
fn check_name_free(
    master: &str,
    layout: &Layout,
    links: &mut [Binding],
    opts: &ClientOptions,
) -> Result<(), DpssError> {
    let name = &layout.dataset;
    let mut holding = Vec::new();
    for (s, b) in links.iter_mut().enumerate() {
        b.send(&msg::begin(name))?;
        let m = b.recv()?.ok_or_else(|| {
            DpssError::Remote(format!("{} closed the connection at BEGIN", layout.servers[s].addr))
        })?;
        match Message::parse(m.payload(), 0)? {
            Message::Held { exists: true } => holding.push(layout.servers[s].addr.clone()),
            Message::Held { exists: false } => {}
            other => return Err(DpssError::Malformed(format!("expected HELD, got {other:?}"))),
        }
    }
    if holding.is_empty() {
        return Ok(());
    }
    if published(master, name, opts)? {
        return Err(DpssError::DatasetExists(name.clone()));
    }
    Err(DpssError::Leftover { dataset: name.clone(), servers: holding.join(", ") })
}

/// Whether the name server has `dataset` published.
fn published(master: &str, dataset: &str, opts: &ClientOptions) -> Result<bool, DpssError> {
    block_on(async {
        let mut c = crate::master::connect(master, opts).await?;
        match c.lookup(pb::DpssLookupRequest { dataset: dataset.into() }).await {
            Ok(_) => Ok(true),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(false),
            Err(s) => Err(s.into()),
        }
    })
}

/// What [`remove`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Removed {
    /// It was published (now it is not).
    pub was_published: bool,
    /// Live servers that removed their blocks (or had none).
    pub servers: Vec<String>,
    /// Those of them that held blocks of it.
    pub held: Vec<String>,
    /// Servers that could not be told, with why: their blocks stay until `remove` runs again.
    pub failed: Vec<(String, String)>,
    /// Servers the master knows that are down and may hold blocks of it (those of its layout,
    /// when it was published; else every one down): their blocks stay until `remove` runs
    /// again once they are up.
    pub down: Vec<String>,
}

/// Remove `dataset`: first from the name server (so no client finds it), then its blocks from
/// every live server. Safe to run again (for servers that were down).
pub fn remove(master: &str, dataset: &str, opts: &ClientOptions) -> Result<Removed, DpssError> {
    crate::block::check_name(dataset)?;
    // Which servers hold its blocks, while the name server still knows (a published set).
    let holders: Option<Vec<String>> = crate::client::lookup(master, dataset, opts)
        .ok()
        .map(|l| l.servers.into_iter().map(|s| s.name).collect());
    let was_published = block_on(async {
        let mut c = crate::master::connect(master, opts).await?;
        let r = c.unpublish(pb::DpssLookupRequest { dataset: dataset.into() }).await?;
        Ok::<_, DpssError>(r.into_inner().existed)
    })?;
    let (live, mut down) = servers(master, opts)?;
    if let Some(holders) = &holders {
        down.retain(|d| holders.contains(d));
    }
    let mut out =
        Removed { was_published, servers: Vec::new(), held: Vec::new(), failed: Vec::new(), down };
    for s in live {
        let hello = msg::Hello {
            role: "loader".into(),
            session: String::new(),
            token: opts.token.clone().unwrap_or_default(),
        };
        let res =
            Peer::new(s.addr.clone(), opts.tls.clone()).open(&hello).and_then(|(mut b, _)| {
                b.send(&msg::drop(dataset))?;
                let held = b.recv()?.and_then(|m| match Message::parse(m.payload(), 0) {
                    Ok(Message::Held { exists }) => Some(exists),
                    // A server from before HELD answered DROP: it removed them, if it held any.
                    Ok(Message::Committed(_)) => Some(true),
                    _ => None,
                });
                let held = held.ok_or_else(|| DpssError::Malformed("no answer to DROP".into()))?;
                b.close();
                Ok(held)
            });
        match res {
            Ok(held) => {
                if held {
                    out.held.push(s.name.clone());
                }
                out.servers.push(s.name)
            }
            Err(e) => out.failed.push((s.name, e.to_string())),
        }
    }
    Ok(out)
}
