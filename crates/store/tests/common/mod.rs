//! The real S3 server the store tests run against: one Garage node per test binary (each
//! store under a key prefix of its own), and a PostgreSQL server for shared catalogues.

#![allow(dead_code)] // each test binary uses some of these

use std::sync::OnceLock;

use bs_meta::Catalogue;
use bs_store::{ObjStore, S3Config};

pub fn garage() -> &'static bs_peers::Garage {
    static G: OnceLock<bs_peers::Garage> = OnceLock::new();
    G.get_or_init(|| bs_peers::Garage::start("blobstream-test").expect("Garage starts"))
}

pub fn postgres() -> &'static bs_peers::Postgres {
    static PG: OnceLock<bs_peers::Postgres> = OnceLock::new();
    PG.get_or_init(|| bs_peers::Postgres::start().expect("PostgreSQL starts"))
}

/// A fresh key prefix.
pub fn fresh_prefix() -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).unwrap();
    format!("t-{}", hex::encode(b))
}

/// The bucket under `prefix`.
pub fn s3_config(prefix: &str) -> S3Config {
    let e = garage().endpoint();
    S3Config {
        endpoint: Some(e.url.clone()),
        region: e.region.clone(),
        bucket: e.bucket.clone(),
        prefix: prefix.to_string(),
        access_key_id: e.key_id.clone(),
        secret_access_key: e.secret.clone(),
        timeout: None,
    }
}

/// A store of its own: a fresh prefix in the bucket, an in-memory catalogue.
pub fn s3_store() -> ObjStore {
    ObjStore::open_s3(&s3_config(&fresh_prefix()), Catalogue::open_in_memory().unwrap()).unwrap()
}

/// Every file under a filesystem store's `blobs` directory (`root` is the store's root).
pub fn blob_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.join("blobs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { dirs.push(p) } else { found.push(p) }
        }
    }
    found
}
