//! What the HTTP server holds each client to, against a real server on port 0: connections
//! that say nothing, or trickle a request's headers, are closed once the header timeout
//! passes, and the connection limit makes the next client wait for them rather than the
//! process run out of descriptors; an upload trickling under the minimum rate is dropped with
//! a clear error and stores nothing.

use std::sync::Arc;
use std::time::Duration;

use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::{MemStore, Store};
use bs_web::{WebConfig, WebServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start(cfg: WebConfig) -> (WebServer, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let index = Arc::new(ImageIndex::open_in_memory().unwrap());
    let web =
        WebServer::start(store.clone(), index, Arc::new(Registry::builtin()), cfg).await.unwrap();
    (web, store)
}

#[tokio::test]
async fn silent_and_trickling_connections_are_closed_and_the_next_client_is_served() {
    let http = bs_plane::HttpLimits {
        max_connections: 2,
        header_timeout: Duration::from_secs(1),
        ..bs_plane::HttpLimits::default()
    };
    let (web, _) = start(WebConfig { http, ..WebConfig::ephemeral() }).await;
    // Both connections the limit allows: one says nothing, one half a request line.
    let mut silent = tokio::net::TcpStream::connect(web.addr()).await.unwrap();
    let mut trickling = tokio::net::TcpStream::connect(web.addr()).await.unwrap();
    trickling.write_all(b"GET /api/health HT").await.unwrap();
    // A third client waits for one of them to be closed, then is served.
    let url = format!("{}api/health", web.url());
    let answer = tokio::time::timeout(Duration::from_secs(60), reqwest::get(url)).await;
    assert_eq!(answer.expect("served once a slot frees").unwrap().status(), 200);
    // The two were closed by the server (end of stream, no answer).
    for (what, conn) in [("silent", &mut silent), ("trickling", &mut trickling)] {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(60), conn.read(&mut buf)).await;
        assert_eq!(n.expect("closed").unwrap_or(0), 0, "{what}: closed without an answer");
    }
    web.shutdown().await;
}

#[tokio::test]
async fn an_upload_trickling_under_the_minimum_rate_is_dropped_and_stores_nothing() {
    let cfg = WebConfig {
        idle_timeout: Duration::from_secs(2),
        min_upload_rate: 1 << 20,
        ..WebConfig::ephemeral()
    };
    let (web, store) = start(cfg).await;
    // 64 bytes every 200 ms: never idle for the idle timeout, far under 1 MiB/s.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tokio::spawn(async move {
        for _ in 0..100 {
            if tx.send(Ok(vec![7u8; 64])).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let chunks = tokio_stream::wrappers::ReceiverStream::new(rx);
    let r = reqwest::Client::new()
        .put(format!("{}blobs/slow/upload.bin", web.url()))
        .header("content-length", "6400")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(text.contains("upload too slow"), "{text}");
    assert!(store.stat("slow/upload.bin").is_err(), "nothing stored");
    web.shutdown().await;
}
