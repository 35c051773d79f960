//! The web server as a block-store client (IIIF) against a real master and block server on
//! port 0: the first requests of a data set, arriving together, start one client between them;
//! a data set dropped and loaded again is never served from the earlier load's tiles for long.

use std::sync::Arc;

use std::time::{Duration, Instant};

use bs_dpss::layout::Layout;
use bs_dpss::pyramid::{Synthetic, TileSource};
use bs_dpss::{BlockId, BlockServer, ClientOptions, ServerConfig, ServerRef, master};
use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::MemStore;
use bs_web::{WebConfig, WebServer};

/// A master and one block server on port 0, with the runtime the master runs on.
struct Store {
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    maddr: String,
    srv: BlockServer,
}

fn block_store() -> Store {
    let dir = tempfile::tempdir().unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let maddr = master::start(&rt, "127.0.0.1:0", &dir.path().join("names.db")).unwrap();
    let srv =
        BlockServer::start("127.0.0.1:0", ServerConfig::new(vec![dir.path().join("s0")])).unwrap();
    Store { _dir: dir, rt, maddr, srv }
}

impl Store {
    /// A web server on port 0 serving this block store's tiles.
    fn web(&self) -> WebServer {
        let cfg = WebConfig { dpss_master: Some(self.maddr.clone()), ..WebConfig::ephemeral() };
        self.rt
            .block_on(WebServer::start(
                Arc::new(MemStore::new()),
                Arc::new(ImageIndex::open_in_memory().unwrap()),
                Arc::new(Registry::builtin()),
                cfg,
            ))
            .unwrap()
    }
}

/// Load `src` as data set `name` (one server, one copy) through the master at `maddr`.
fn load(maddr: &str, srv: &BlockServer, name: &str, src: &Synthetic) {
    let servers =
        vec![ServerRef { name: srv.name().into(), addr: srv.addr().to_string(), disks: 1 }];
    let layout =
        Layout::plan(name, "image", (src.width, src.height), src.tile, servers, 1).unwrap();
    bs_dpss::loader::load(maddr, layout, src, &ClientOptions::default(), &mut |_, _| {}).unwrap();
}

#[test]
fn a_data_set_dropped_or_loaded_again_is_not_served_from_the_earlier_loads_tiles() {
    let store = block_store();
    let Store { rt, maddr, srv, .. } = &store;
    // Reporting to the master, which tells `remove` whom to ask to drop the blocks.
    let opts = ClientOptions::default();
    master::heartbeat(maddr.clone(), opts.clone(), Duration::from_millis(50), srv.stats_source())
        .unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    // (Until the first report the master answers "no live block server", an error.)
    while !bs_dpss::loader::live_servers(maddr, &opts).is_ok_and(|s| !s.is_empty()) {
        assert!(Instant::now() < give_up, "the block server never reported to the master");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (a, b) = (
        Synthetic { width: 1024, height: 768, tile: 256 },
        Synthetic { width: 2048, height: 1536, tile: 256 },
    );
    let first = BlockId::new(0, 0, 0);
    let (tile_a, tile_b) = (a.block(first).unwrap(), b.block(first).unwrap());
    assert_ne!(tile_a, tile_b, "the two loads differ in the tile asked for");
    load(maddr, srv, "re", &a);
    let web = store.web();
    let url = format!("{}iiif/re/0,0,256,256/256,256/0/default.png", web.url());
    let http = reqwest::Client::new();
    let get = |if_none_match: Option<&str>| {
        let mut r = http.get(&url);
        if let Some(t) = if_none_match {
            r = r.header("if-none-match", t);
        }
        rt.block_on(async {
            let r = r.send().await.unwrap();
            let h = r.headers().clone();
            (r.status().as_u16(), h, r.bytes().await.unwrap())
        })
    };

    let (status, h, body) = get(None);
    assert_eq!((status, &body[..]), (200, &tile_a[..]));
    let etag = h["etag"].to_str().unwrap().to_string();
    assert_eq!(h["cache-control"], "private, no-cache", "a browser asks again before reuse");
    let (status, h, body) = get(Some(&etag));
    assert_eq!((status, body.len(), h["etag"].to_str().unwrap()), (304, 0, etag.as_str()));

    // Dropped: within a few checks of the master, the kept tile is no longer served.
    bs_dpss::loader::remove(maddr, "re", &opts).unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = get(None);
        match status {
            404 => break,
            200 => assert_eq!(&body[..], &tile_a[..], "only the kept tile, until it is forgotten"),
            // A request that found the pump just as it ended: asked to retry.
            503 => {}
            s => panic!("a dropped data set's tile answered {s}"),
        }
        assert!(Instant::now() < give_up, "the dropped data set is still served");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Loaded again from other pixels while a pump holds the first load: the new load's tile
    // (and size) replace the old within a few checks, and the old never comes back.
    load(maddr, srv, "re", &a);
    assert_eq!(get(None).2[..], tile_a[..]);
    bs_dpss::loader::remove(maddr, "re", &opts).unwrap();
    load(maddr, srv, "re", &b);
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = get(None);
        if status == 200 && body[..] == tile_b[..] {
            break;
        }
        assert!(
            (status == 200 && body[..] == tile_a[..]) || status == 503,
            "while the change is noticed: the kept tile or a retry, got {status}"
        );
        assert!(Instant::now() < give_up, "the reloaded data set's old tile is still served");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, h, body) = get(Some(&etag));
    assert_eq!((status, &body[..]), (200, &tile_b[..]), "the old ETag no longer matches");
    assert_ne!(h["etag"].to_str().unwrap(), etag);
    let info: serde_json::Value = rt.block_on(async {
        let u = format!("{}iiif/re/info.json", web.url());
        http.get(u).send().await.unwrap().json().await.unwrap()
    });
    assert_eq!(info["width"], 2048, "the description is the new load's");
    rt.block_on(web.shutdown());
}

#[test]
fn concurrent_first_requests_start_one_block_store_client() {
    let store = block_store();
    let Store { rt, maddr, srv, .. } = &store;
    let src = Synthetic { width: 1024, height: 768, tile: 256 };
    load(maddr, srv, "tiles", &src);
    assert_eq!(srv.stats().clients, 0, "the loader's connection is no client session");

    let web = store.web();
    let base = web.url().trim_end_matches('/').to_string();
    let http = reqwest::Client::new();
    let answers = rt.block_on(async {
        let asks: Vec<_> = (0..8)
            .map(|i| {
                let (http, base) = (http.clone(), base.clone());
                tokio::spawn(async move {
                    // Even: the data set's description; odd: tile (i / 2, 0) of level 0.
                    let path = if i % 2 == 0 {
                        "/iiif/tiles/info.json".to_string()
                    } else {
                        format!("/iiif/tiles/{},0,256,256/256,256/0/default.png", 256 * (i / 2))
                    };
                    let r = http.get(format!("{base}{path}")).send().await.unwrap();
                    (i, r.status(), r.bytes().await.unwrap())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for a in asks {
            answers.push(a.await);
        }
        answers
    });
    for a in answers {
        let (i, status, body) = a.unwrap();
        assert_eq!(status, reqwest::StatusCode::OK, "request {i}");
        if i % 2 == 0 {
            let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!((info["width"].as_u64(), info["height"].as_u64()), (Some(1024), Some(768)));
            // An absolute id (a viewer on another origin builds tile URLs from it), and what
            // full/max serves: the whole image at the first level that fits one tile.
            assert_eq!(info["id"], format!("{base}/iiif/tiles"));
            assert_eq!(
                (info["maxWidth"].as_u64(), info["maxHeight"].as_u64()),
                (Some(256), Some(192))
            );
        } else {
            let want = src.block(BlockId::new(0, (i / 2) as u32, 0)).unwrap();
            assert!(body[..] == want[..], "tile {} is the loaded tile's bytes", i / 2);
        }
    }
    // Each block-store client is a session on every server of the data set.
    assert_eq!(srv.stats().clients, 1, "one client for the data set");
    // The base URI sends a viewer to the description; full/max is the maxWidth × maxHeight.
    let no_follow = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    let (status, location, full) = rt.block_on(async {
        let r = no_follow.build().unwrap().get(format!("{base}/iiif/tiles")).send().await.unwrap();
        let full = http.get(format!("{base}/iiif/tiles/full/max/0/default.png")).send();
        let full = full.await.unwrap().bytes().await.unwrap();
        (r.status(), r.headers()["location"].to_str().unwrap().to_string(), full)
    });
    assert_eq!((status.as_u16(), location.as_str()), (303, "/iiif/tiles/info.json"));
    let shown = bs_imageio::decode(&full, None, &Default::default()).unwrap().image;
    assert_eq!((shown.width(), shown.height()), (256, 192));
    rt.block_on(web.shutdown());
}
