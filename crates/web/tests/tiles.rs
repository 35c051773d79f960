//! The web server as a block-store client (IIIF) against a real master and block server on
//! port 0: the first requests of a data set, arriving together, start one client between them.

use std::sync::Arc;

use bs_dpss::layout::Layout;
use bs_dpss::pyramid::{Synthetic, TileSource};
use bs_dpss::{BlockId, BlockServer, ClientOptions, ServerConfig, ServerRef, master};
use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::MemStore;
use bs_web::{WebConfig, WebServer};

#[test]
fn concurrent_first_requests_start_one_block_store_client() {
    let dir = tempfile::tempdir().unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let maddr = master::start(&rt, "127.0.0.1:0", &dir.path().join("names.db")).unwrap();
    let srv =
        BlockServer::start("127.0.0.1:0", ServerConfig::new(vec![dir.path().join("s0")])).unwrap();
    let servers =
        vec![ServerRef { name: srv.name().into(), addr: srv.addr().to_string(), disks: 1 }];
    let layout = Layout::plan("tiles", "image", (1024, 768), 256, servers, 1).unwrap();
    let src = Synthetic { width: 1024, height: 768, tile: 256 };
    bs_dpss::loader::load(&maddr, layout, &src, &ClientOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!(srv.stats().clients, 0, "the loader's connection is no client session");

    let web = rt
        .block_on(WebServer::start(
            Arc::new(MemStore::new()),
            Arc::new(ImageIndex::open_in_memory().unwrap()),
            Arc::new(Registry::builtin()),
            WebConfig { dpss_master: Some(maddr.clone()), ..WebConfig::ephemeral() },
        ))
        .unwrap();
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
        } else {
            let want = src.block(BlockId::new(0, (i / 2) as u32, 0)).unwrap();
            assert!(body[..] == want[..], "tile {} is the loaded tile's bytes", i / 2);
        }
    }
    // Each block-store client is a session on every server of the data set.
    assert_eq!(srv.stats().clients, 1, "one client for the data set");
    rt.block_on(web.shutdown());
}
