//! The block store end to end in one process: load, read back verified, request-list
//! semantics over the wire, failover, and bad input.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use bs_dpss::client::lookup;
use bs_dpss::conn::Peer;
use bs_dpss::msg;
use bs_dpss::pyramid::TileSource;
use bs_dpss::{BlockId, Client, ClientOptions, DpssError, Event, Priority};
use common::Cluster;

const WAIT: Duration = Duration::from_secs(30);

fn all(c: &Client) -> Vec<BlockId> {
    c.layout().all_blocks().collect()
}

#[test]
fn a_loaded_image_reads_back_block_for_block_from_every_server() {
    let cl = Cluster::start(4, 1, None);
    let (src, rep) = cl.load("card", 2048, 2, &ClientOptions::default());
    let rep = rep.unwrap();
    assert_eq!((rep.blocks, rep.levels, rep.k, rep.r), (64 + 16 + 4 + 1, 4, 4, 2));
    assert_eq!(rep.written, 2 * rep.bytes);
    let mut c = Client::open(&cl.master, "card", ClientOptions::default()).unwrap();
    let ids = all(&c);
    let got = c.fetch(&ids, WAIT).unwrap();
    for id in &ids {
        assert_eq!(got[id], src.block(*id).unwrap(), "{id}");
    }
    // Every server sent some of them: the data set is spread over all four.
    let st = cl.servers.iter().flatten().map(|s| s.stats()).collect::<Vec<_>>();
    assert!(st.iter().all(|s| s.sent_blocks > 0), "{st:?}");
    // The name server knows it; a second load under the same name is refused.
    assert_eq!(lookup(&cl.master, "card", &ClientOptions::default()).unwrap().blocks, rep.blocks);
    let (_, again) = cl.load("card", 512, 2, &ClientOptions::default());
    assert!(matches!(&again, Err(DpssError::DatasetExists(n)) if n == "card"), "{again:?}");
    // Removed: gone from the name server and from every server's disks; the name is free.
    drop(c);
    let r = bs_dpss::loader::remove(&cl.master, "card", &ClientOptions::default()).unwrap();
    assert!(r.was_published && r.failed.is_empty() && r.servers.len() == 4, "{r:?}");
    assert_eq!(r.held.len(), 4, "every server held blocks of it: {r:?}");
    assert!(lookup(&cl.master, "card", &ClientOptions::default()).is_err());
    assert!(cl.servers.iter().flatten().all(|s| s.stats().datasets == 0));
    for s in cl.servers.iter().flatten() {
        assert!(!s.disk_dir(0).join("card.blk").exists());
    }
    let (src, rep) = cl.load("card", 512, 2, &ClientOptions::default());
    rep.unwrap();
    let mut c = Client::open(&cl.master, "card", ClientOptions::default()).unwrap();
    let id = BlockId::new(0, 1, 1);
    assert_eq!(c.fetch(&[id], WAIT).unwrap()[&id], src.block(id).unwrap());
}

#[test]
fn a_new_list_flushes_the_old_and_cached_blocks_are_hits() {
    let cl = Cluster::start(1, 1, None);
    cl.load("img", 4096, 1, &ClientOptions::default()).1.unwrap();
    let mut c = Client::open(&cl.master, "img", ClientOptions::default()).unwrap();
    // Low priority: read into the cache, never sent.
    let low: Vec<_> = (0..4).map(|x| (BlockId::new(0, x, 0), Priority::Low)).collect();
    c.request(&low).unwrap();
    let stats = match c.next(WAIT).expect("an event") {
        Event::ListDone { stats, .. } => stats,
        Event::Block { id, .. } => panic!("low block {id} was sent"),
        e => panic!("{e:?}"),
    };
    assert_eq!((stats.requested, stats.read, stats.sent), (4, 4, 0));
    // Asked again at high priority: all four come from the cache.
    let high: Vec<_> = (0..4).map(|x| (BlockId::new(0, x, 0), Priority::High)).collect();
    c.request(&high).unwrap();
    let mut order = Vec::new();
    let stats = loop {
        match c.next(WAIT).expect("an event") {
            Event::Block { id, .. } => order.push(id.x),
            Event::ListDone { stats, .. } => break stats,
            e => panic!("{e:?}"),
        }
    };
    assert_eq!(order, [0, 1, 2, 3], "high blocks in list order");
    assert_eq!((stats.cache_hits, stats.read, stats.sent), (4, 0, 4));
    assert_eq!(cl.servers[0].as_ref().unwrap().stats().cache_hits, 4);
    // A long list replaced at once by another: the first is reported with what it flushed,
    // and everything of the second arrives.
    let long: Vec<_> = (0..16)
        .flat_map(|y| (0..16).map(move |x| (BlockId::new(0, x, y), Priority::High)))
        .collect();
    let first = c.request(&long).unwrap();
    let second = c.request(&[(BlockId::new(1, 0, 0), Priority::High)]).unwrap();
    let mut done = HashMap::new();
    let mut got_second = false;
    while done.len() < 2 {
        match c.next(WAIT).expect("an event") {
            Event::ListDone { seq, stats, .. } => {
                done.insert(seq, stats);
            }
            Event::Block { id, .. } => got_second |= id == BlockId::new(1, 0, 0),
            e => panic!("{e:?}"),
        }
    }
    let f = done[&first];
    assert_eq!(f.requested, 256);
    assert_eq!(f.sent + f.flushed, 256, "{f:?}");
    assert!(got_second && done[&second].sent == 1);
}

#[test]
fn losing_a_server_or_a_rotted_block_loses_nothing_with_two_copies() {
    let mut cl = Cluster::start(3, 2, None);
    let (src, rep) = cl.load("img", 2048, 2, &ClientOptions::default());
    rep.unwrap();
    let (rot_src, rep) = cl.load("rot", 1024, 2, &ClientOptions::default());
    rep.unwrap();
    // Rot a whole disk's copy of "rot": its server refuses to send those blocks, the client
    // takes the other copies.
    let layout = lookup(&cl.master, "rot", &ClientOptions::default()).unwrap();
    let victim = BlockId::new(0, 1, 1);
    let (s, disk) = layout.locations(victim)[0];
    let dir = cl.servers[s].as_ref().unwrap().disk_dir(disk as usize);
    let path = dir.join("rot.blk");
    let rotted: Vec<u8> = std::fs::read(&path).unwrap().iter().map(|b| b ^ 0x5A).collect();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&rotted, 0).unwrap();
    let mut c = Client::open(&cl.master, "rot", ClientOptions::default()).unwrap();
    let ids = all(&c);
    let got = c.fetch(&ids, WAIT).unwrap();
    for id in &ids {
        assert_eq!(got[id], rot_src.block(*id).unwrap(), "{id}");
    }
    assert!(cl.servers[s].as_ref().unwrap().stats().corrupt >= 1);
    let mut c = Client::open(&cl.master, "img", ClientOptions::default()).unwrap();
    // Now stop a server mid-list: every block still arrives, from the copies.
    let ids = all(&c);
    c.request(&ids.iter().map(|&i| (i, Priority::High)).collect::<Vec<_>>()).unwrap();
    let mut got = HashMap::new();
    let mut killed = false;
    while got.len() < ids.len() {
        match c.next(WAIT).expect("an event") {
            Event::Block { id, data, .. } => {
                got.insert(id, data);
                if !killed {
                    cl.servers[(s + 1) % 3] = None; // dropped: its sockets close
                    killed = true;
                }
            }
            Event::Lost { id, reason } => panic!("{id} lost: {reason}"),
            _ => {}
        }
    }
    for id in &ids {
        assert_eq!(got[id], src.block(*id).unwrap(), "{id}");
    }
    // Every block may have arrived before the client noticed the loss; it does notice.
    while c.lost_servers().is_empty() {
        assert!(c.next(WAIT).is_some(), "the stopped server was never noticed");
    }
    assert_eq!(c.lost_servers().len(), 1);
}

#[test]
fn bad_input_gets_a_clear_error_and_the_server_keeps_serving() {
    let cl = Cluster::start(1, 1, Some("sesame"));
    let opts = ClientOptions { token: Some("sesame".into()), tls: None };
    cl.load("img", 512, 1, &opts).1.unwrap();
    let addr = cl.servers[0].as_ref().unwrap().addr().to_string();
    let peer = Peer::new(addr.clone(), None);
    let hello = |role: &str, token: &str| msg::Hello {
        role: role.into(),
        session: "0123456789abcdef0123456789abcdef".into(),
        token: token.into(),
    };
    // A wrong token.
    let e = peer.open(&hello("requests", "guess")).unwrap_err();
    assert!(e.to_string().contains("wrong token"), "{e}");
    // An unknown role.
    let e = peer.open(&hello("janitor", "sesame")).unwrap_err();
    assert!(e.to_string().contains("role"), "{e}");
    // A list for an unknown data set; a list too long; a malformed list.
    let expect_end = |payload: Vec<u8>, want: &str| {
        let (mut b, _) = peer.open(&hello("requests", "sesame")).unwrap();
        b.send(&payload).unwrap();
        let e = b.recv().map(|m| m.map(|m| m.payload().to_vec())).unwrap_err();
        assert!(DpssError::from(e).to_string().contains(want), "want {want:?}");
    };
    expect_end(msg::list(1, 0, "nope", &[]), "unknown data set");
    let long = vec![(BlockId::new(0, 0, 0), Priority::High); 5000];
    expect_end(msg::list(1, 0, "img", &long), "exceeds the bound");
    expect_end(vec![msg::LIST, 0, 0], "malformed");
    // Blocks of another data set (ids it does not have) are reported, not fatal.
    let mut c = Client::open(&cl.master, "img", opts.clone()).unwrap();
    let e = c.request(&[(BlockId::new(0, 9, 9), Priority::High)]).unwrap_err();
    assert!(matches!(e, DpssError::UnknownBlock { .. }), "{e}");
    // A loader sending a block whose digest does not match: refused, nothing visible.
    let (mut b, _) = peer.open(&hello("loader", "sesame")).unwrap();
    let mut put = msg::put_head(0, BlockId::new(0, 0, 0), &[0; 16], "broken");
    put.extend_from_slice(b"not what the digest says");
    b.send(&put).unwrap();
    let e = b.recv().unwrap_err();
    assert!(DpssError::from(e).to_string().contains("fails its digest"));
    // A blocks connection for a session no requests connection opened is refused.
    let e = peer.open(&hello("blocks", "sesame")).unwrap_err();
    assert!(e.to_string().contains("after its session's requests"), "{e}");
    // One loader per name at a time.
    let data = b"one block".to_vec();
    let mut put = msg::put_head(0, BlockId::new(0, 0, 0), &bs_dpss::block::digest(&data), "twice");
    put.extend_from_slice(&data);
    let mut loaders: Vec<_> =
        (0..2).map(|_| peer.open(&hello("loader", "sesame")).unwrap().0).collect();
    for l in &mut loaders {
        l.send(&put).unwrap();
    }
    // Whichever came second was refused; the other commits.
    let mut outcomes: Vec<Result<bool, String>> = loaders
        .iter_mut()
        .map(|l| {
            let _ = l.send(&msg::commit("twice"));
            match l.recv() {
                Ok(Some(m)) => Ok(matches!(
                    msg::Message::parse(m.payload(), 0),
                    Ok(msg::Message::Committed(_))
                )),
                Ok(None) => Err("closed".to_string()),
                Err(e) => Err(DpssError::from(e).to_string()),
            }
        })
        .collect();
    outcomes.sort_by_key(|o| o.is_err());
    assert_eq!(outcomes[0], Ok(true), "{outcomes:?}");
    // (Or, had the other committed before this one's PUT was read, "already exists".)
    let refused =
        |m: &str| m.contains("being loaded by another loader") || m.contains("already exists");
    assert!(matches!(&outcomes[1], Err(m) if refused(m)), "{outcomes:?}");
    drop(loaders);
    // A loader that goes away before COMMIT leaves nothing: the name is free again.
    let (mut b, _) = peer.open(&hello("loader", "sesame")).unwrap();
    let data = b"half a data set".to_vec();
    let mut put = msg::put_head(0, BlockId::new(0, 0, 0), &bs_dpss::block::digest(&data), "half");
    put.extend_from_slice(&data);
    b.send(&put).unwrap();
    drop(b);
    assert!(
        matches!(lookup(&cl.master, "half", &ClientOptions::default()), Err(DpssError::Master(m)) if m.contains("unknown"))
    );
    // And through all this the server still serves.
    let all: Vec<_> = c.layout().all_blocks().collect();
    assert_eq!(c.fetch(&all, WAIT).unwrap().len(), all.len());
    let (_, rep) = cl.load("half", 256, 1, &opts);
    rep.unwrap();
}

#[test]
fn the_path_simulator_accounts_for_every_list_and_drops_nothing_when_a_server_dies() {
    let mut cl = Cluster::start(3, 1, None);
    cl.load("path", 4096, 2, &ClientOptions::default()).1.unwrap();
    let mut c = Client::open(&cl.master, "path", ClientOptions::default()).unwrap();
    let w = bs_dpss::simulate::Workload {
        lists_per_second: 20.0,
        lists: 30,
        tiles: 40,
        viewport: (768, 768),
        ..Default::default()
    };
    let rep = bs_dpss::simulate::run(&mut c, &w, |seq| {
        if seq == 10 {
            cl.servers[1] = None;
        }
    })
    .unwrap();
    assert_eq!(rep.lists.len(), 30);
    assert_eq!(rep.lost, 0, "{}", rep.table());
    while c.lost_servers().is_empty() {
        assert!(c.next(WAIT).is_some(), "the stopped server was never noticed");
    }
    assert_eq!(c.lost_servers().len(), 1);
    // Every list was accounted for by the servers that got it: what was asked was sent,
    // flushed, or (low) only read.
    for r in &rep.lists {
        assert!(r.requested >= r.high, "{}", rep.table());
        assert!(r.sent + r.flushed <= r.requested, "{}", rep.table());
    }
    // The path revisits tiles, so the cache served some.
    assert!(rep.cache_hits > 0 && rep.read > 0, "{}", rep.table());
    // The last list's high tiles all arrived.
    let last = rep.lists.last().unwrap();
    assert!(last.high_max_ms > 0.0, "{}", rep.table());
}

#[test]
fn the_name_server_plans_around_a_dead_server_and_metrics_show_every_server() {
    let mut cl = Cluster::start(3, 1, None);
    cl.load("img", 1024, 2, &ClientOptions::default()).1.unwrap();
    let layout = lookup(&cl.master, "img", &ClientOptions::default()).unwrap();
    let ids: Vec<BlockId> = layout.all_blocks().collect();
    let plan = |m: &str| {
        bs_dpss::client::block_on(async {
            let mut c = bs_dpss::master::connect(m, &ClientOptions::default()).await.unwrap();
            let blocks = ids
                .iter()
                .map(|b| bs_proto::DpssBlockRef {
                    level: b.level as u32,
                    x: b.x,
                    y: b.y,
                    priority: 0,
                })
                .collect();
            let req = bs_proto::DpssPlanRequest { dataset: "img".into(), blocks };
            c.plan(req).await.unwrap().into_inner()
        })
    };
    // All up: each block goes to its primary, and every block is planned once.
    let p = plan(&cl.master);
    assert_eq!(p.lists.iter().map(|l| l.blocks.len()).sum::<usize>(), ids.len());
    for l in &p.lists {
        for b in &l.blocks {
            let id = BlockId::new(b.level as u8, b.x, b.y);
            assert_eq!(layout.servers[layout.locations(id)[0].0].addr, l.addr);
        }
    }
    // A server stops reporting: once the master marks it down, nothing is planned on it.
    let gone = cl.servers[0].as_ref().unwrap().addr().to_string();
    cl.servers[0] = None;
    cl.wait_up(2);
    let p = plan(&cl.master);
    assert!(p.lists.iter().all(|l| l.addr != gone));
    assert_eq!(p.lists.iter().map(|l| l.blocks.len()).sum::<usize>(), ids.len());
    // /metrics on the same port: one line per server and family.
    let mut s = std::net::TcpStream::connect(&cl.master).unwrap();
    use std::io::{Read, Write};
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.contains("# TYPE blobstream_dpss_sent_bytes counter"), "{text}");
    assert_eq!(text.matches("blobstream_dpss_up{").count(), 3, "{text}");
    assert!(
        text.contains(&format!("blobstream_dpss_up{{server=\"server-0\",addr=\"{gone}\"}} 0")),
        "{text}"
    );
    // Dropped while a server is down: the live ones remove their blocks, the one down is
    // named (the CLI exits 1), each time the drop runs until it is up again.
    let opts = ClientOptions::default();
    let r = bs_dpss::loader::remove(&cl.master, "img", &opts).unwrap();
    assert!(r.was_published && r.failed.is_empty() && r.servers.len() == 2, "{r:?}");
    assert_eq!(r.down, ["server-0"], "{r:?}");
    let r = bs_dpss::loader::remove(&cl.master, "img", &opts).unwrap();
    assert!(!r.was_published && r.held.is_empty() && r.down == ["server-0"], "{r:?}");
}

#[test]
fn a_load_that_fails_half_way_publishes_nothing_and_frees_the_name() {
    let cl = Cluster::start(2, 1, None);
    let servers = bs_dpss::loader::live_servers(&cl.master, &ClientOptions::default()).unwrap();
    let layout = bs_dpss::Layout::plan("half", "image", (2048, 2048), 256, servers, 2).unwrap();
    let src = bs_dpss::pyramid::Synthetic { width: 2048, height: 2048, tile: 256 };
    let ids: Vec<BlockId> = layout.all_blocks().collect();
    // The source breaks after 20 blocks (as a truncated image would).
    let mut produce = |emit: &mut dyn FnMut(BlockId, Vec<u8>) -> Result<(), DpssError>| {
        for (n, id) in ids.iter().enumerate() {
            if n == 20 {
                return Err(DpssError::Image("truncated".into()));
            }
            emit(*id, src.block(*id)?)?;
        }
        Ok(())
    };
    let opts = ClientOptions::default();
    let e =
        bs_dpss::loader::load_from(&cl.master, layout.clone(), &opts, &mut |_, _| {}, &mut produce);
    assert!(matches!(e, Err(DpssError::Image(_))), "{e:?}");
    assert!(lookup(&cl.master, "half", &ClientOptions::default()).is_err());
    // A source that makes too few blocks is refused too.
    let mut short = |emit: &mut dyn FnMut(BlockId, Vec<u8>) -> Result<(), DpssError>| {
        emit(ids[0], src.block(ids[0])?)
    };
    let e =
        bs_dpss::loader::load_from(&cl.master, layout.clone(), &opts, &mut |_, _| {}, &mut short);
    assert!(e.unwrap_err().to_string().contains("made 1 of"));
    assert!(lookup(&cl.master, "half", &ClientOptions::default()).is_err());
    // Nothing was left staged or committed: the same name loads in full.
    let (src, rep) = cl.load("half", 2048, 2, &opts);
    rep.unwrap();
    let mut c = Client::open(&cl.master, "half", opts).unwrap();
    let got = c.fetch(&ids, WAIT).unwrap();
    assert!(ids.iter().all(|id| got[id] == src.block(*id).unwrap()));
}

#[test]
fn a_loader_that_died_between_commit_and_publish_leaves_a_name_that_rm_frees() {
    let cl = Cluster::start(2, 1, None);
    let opts = ClientOptions::default();
    let servers = bs_dpss::loader::live_servers(&cl.master, &opts).unwrap();
    let layout = bs_dpss::Layout::plan("orphan", "image", (512, 512), 256, servers, 2).unwrap();
    let src = bs_dpss::pyramid::Synthetic { width: 512, height: 512, tile: 256 };
    // What a loader killed after its COMMITs leaves: every server committed, nothing published.
    for (s, server) in layout.servers.iter().enumerate() {
        let hello =
            msg::Hello { role: "loader".into(), session: String::new(), token: String::new() };
        let (mut b, _) = Peer::new(server.addr.clone(), None).open(&hello).unwrap();
        for id in layout.all_blocks() {
            for (at, disk) in layout.locations(id) {
                if at == s {
                    let data = src.block(id).unwrap();
                    let head = msg::put_head(disk, id, &bs_dpss::block::digest(&data), "orphan");
                    b.send_parts(&head, &data).unwrap();
                }
            }
        }
        b.send(&msg::commit("orphan")).unwrap();
        let m = b.recv().unwrap().unwrap();
        assert!(matches!(msg::Message::parse(m.payload(), 0).unwrap(), msg::Message::Committed(_)));
        b.close();
    }
    assert!(lookup(&cl.master, "orphan", &opts).is_err(), "never published");
    // The next load of the name is refused before it sends a block, told what is left where
    // and how to remove it; removed, the name loads in full.
    let (_, rep) = cl.load("orphan", 512, 2, &opts);
    let e = rep.unwrap_err();
    assert!(matches!(&e, DpssError::Leftover { dataset, .. } if dataset == "orphan"), "{e:?}");
    assert!(e.to_string().contains("blobstream dpss drop orphan"), "{e}");
    let r = bs_dpss::loader::remove(&cl.master, "orphan", &opts).unwrap();
    assert!(!r.was_published && r.failed.is_empty() && !r.held.is_empty(), "{r:?}");
    // Removed again, nothing is left anywhere (the CLI says so as an error).
    let r = bs_dpss::loader::remove(&cl.master, "orphan", &opts).unwrap();
    assert!(!r.was_published && r.held.is_empty() && r.servers.len() == 2, "{r:?}");
    let (src, rep) = cl.load("orphan", 512, 2, &opts);
    rep.unwrap();
    let mut c = Client::open(&cl.master, "orphan", opts.clone()).unwrap();
    let ids = all(&c);
    let got = c.fetch(&ids, WAIT).unwrap();
    assert!(ids.iter().all(|id| got[id] == src.block(*id).unwrap()));
    // A published data set is still refused as a duplicate, and stays whole.
    let (_, again) = cl.load("orphan", 512, 2, &opts);
    assert!(matches!(again, Err(DpssError::DatasetExists(_))), "{again:?}");
    let got = c.fetch(&ids, WAIT).unwrap();
    assert!(ids.iter().all(|id| got[id] == src.block(*id).unwrap()));
}

#[test]
fn a_client_holds_no_more_than_the_server_gives() {
    let cl = Cluster::start_with(1, 1, None, |c| c.max_connections = 3);
    cl.load("img", 512, 1, &ClientOptions::default()).1.unwrap();
    let peer = Peer::new(cl.servers[0].as_ref().unwrap().addr().to_string(), None);
    let hello = |n: usize| msg::Hello {
        role: "requests".into(),
        session: format!("{n:032x}"),
        token: String::new(),
    };
    // Opened until three are served (the loader's connection may still be ending).
    let open = |n: usize| {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match peer.open(&hello(n)) {
                Ok((b, _)) => return b,
                Err(e) => assert!(std::time::Instant::now() < deadline, "never served: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut held: Vec<_> = (0..3).map(open).collect();
    // A fourth is told the server is busy.
    let e = peer.open(&hello(3)).unwrap_err();
    assert!(e.to_string().contains("3 connections are served already"), "{e}");

    // A session that asks and never reads its answers: each list of blocks the data set does
    // not have leaves a failure per block to send; past a few lists' worth, the next list
    // ends the session with the reason.
    let mut greedy = held.pop().unwrap();
    let unknown: Vec<_> = (0..bs_dpss::conn::MAX_LIST as u32)
        .map(|x| (BlockId::new(0, 1000 + x, 0), Priority::High))
        .collect();
    for seq in 1..=6 {
        let _ = greedy.send(&msg::list(seq, 0, "img", &unknown));
    }
    let e = DpssError::from(greedy.recv().unwrap_err()).to_string();
    assert!(e.contains("wait unread on this session's blocks connection"), "{e}");
    drop(greedy);
    // Its place is free again, and the server serves (once it has seen the others go:
    // asked again until then).
    drop(held);
    let _served = open(4);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let fetched =
            Client::open(&cl.master, "img", ClientOptions::default()).and_then(|mut c| {
                let all = all(&c);
                c.fetch(&all, WAIT).map(|got| (got.len(), all.len()))
            });
        match fetched {
            Ok((got, want)) => break assert_eq!(got, want),
            Err(e) => assert!(std::time::Instant::now() < deadline, "not served: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A data set of fewer blocks than servers: the servers given none hold it empty, so the load
/// publishes (it failed with "COMMIT before any PUT"), and it reads back.
#[test]
fn a_data_set_smaller_than_the_cluster_loads_and_reads_back() {
    let cl = Cluster::start(4, 1, None);
    let (src, rep) = cl.load("one-tile", 256, 1, &ClientOptions::default());
    assert_eq!(rep.unwrap().blocks, 1);
    assert!(cl.servers.iter().flatten().all(|s| s.stats().datasets == 1), "held everywhere");
    let mut c = Client::open(&cl.master, "one-tile", ClientOptions::default()).unwrap();
    let id = BlockId::new(0, 0, 0);
    assert_eq!(c.fetch(&[id], WAIT).unwrap()[&id], src.block(id).unwrap());
    drop(c);
    let r = bs_dpss::loader::remove(&cl.master, "one-tile", &ClientOptions::default()).unwrap();
    assert!(r.failed.is_empty(), "{r:?}");
    assert!(cl.servers.iter().flatten().all(|s| s.stats().datasets == 0));
}

/// A block server that comes back (restarted on its address and disks, as in a rolling
/// restart) is used again by a client that lost it: its blocks, lost while it was down,
/// arrive once it is back.
#[test]
fn a_server_that_comes_back_is_used_again() {
    let mut cl = Cluster::start(2, 1, None);
    let (src, rep) = cl.load("img", 1024, 1, &ClientOptions::default());
    rep.unwrap();
    let mut c = Client::open(&cl.master, "img", ClientOptions::default()).unwrap();
    let layout = c.layout().clone();
    let addr = cl.servers[1].as_ref().unwrap().addr().to_string();
    // The layout numbers servers its own way: the block held by the one stopped.
    let s = layout.servers.iter().position(|r| r.addr == addr).unwrap();
    let id = layout.all_blocks().find(|&id| layout.locations(id)[0].0 == s).unwrap();
    let disk = cl.servers[1].as_ref().unwrap().disk_dir(0);
    cl.servers[1] = None; // stopped: its sockets close
    while c.lost_servers().is_empty() {
        assert!(c.next(WAIT).is_some(), "the stopped server was never noticed");
    }
    let err = c.fetch(&[id], WAIT).unwrap_err();
    assert!(matches!(err, DpssError::Unavailable { .. }), "{err}");
    assert_eq!(c.lost_servers().len(), 1);
    let mut cfg = bs_dpss::ServerConfig::new(vec![disk]);
    cfg.name = "server-1".into();
    cl.servers[1] = Some(bs_dpss::BlockServer::start(&addr, cfg).unwrap());
    // The client tries a lost server again after a wait that grows: asked until a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let got = loop {
        match c.fetch(&[id], WAIT) {
            Ok(got) => break got,
            Err(e) => assert!(std::time::Instant::now() < deadline, "never used again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(got[&id], src.block(id).unwrap());
    assert!(c.lost_servers().is_empty(), "{:?}", c.lost_servers());
}
