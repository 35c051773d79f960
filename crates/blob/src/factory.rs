//! The factory: binds proxies to existing blobs and routes new ones, whatever their location.
//! It owns the process's memory store and one cached client per remote server.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bs_client::{Client, RouteRequest, Security, TransferSettings};
use bs_store::{MemStore, RouteSpec, Store};

use crate::error::BlobError;
use crate::key::{BlobKey, Location};
use crate::proxy::{BlobProxy, Held, Slot, open_part};

type Result<T> = std::result::Result<T, BlobError>;

/// What to reserve for a new blob.
#[derive(Debug, Clone, Default)]
pub struct NewBlob {
    /// Expected size; `None` for streams of unknown length.
    pub size: Option<u64>,
    pub content_type: String,
    pub metadata: BTreeMap<String, String>,
    /// Replace an existing blob (or local file).
    pub overwrite: bool,
    /// Non-empty: keep bytes an earlier interrupted write with the same tag left behind.
    pub resume_tag: String,
}

impl NewBlob {
    /// The server's routing request for this blob as `name`.
    pub(crate) fn route_request(&self, name: &str) -> RouteRequest {
        RouteRequest {
            name: name.to_string(),
            size: self.size,
            content_type: self.content_type.clone(),
            metadata: self.metadata.clone().into_iter().collect(),
            overwrite: self.overwrite,
            resume_tag: self.resume_tag.clone(),
        }
    }
}

/// Makes proxies. Cheap to clone; clones share the memory store and clients.
#[derive(Clone, Default)]
pub struct Factory {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    mem: MemStore,
    clients: Mutex<HashMap<String, Client>>,
    settings: TransferSettings,
    security: Security,
}

impl Factory {
    pub fn new() -> Self {
        Self::default()
    }

    /// A factory whose remote clients propose these transfer settings.
    pub fn with_settings(settings: TransferSettings) -> Self {
        Self::with_config(settings, Security::default())
    }

    /// A factory whose remote clients propose `settings` and connect with `security`
    /// (credentials, TLS).
    pub fn with_config(settings: TransferSettings, security: Security) -> Self {
        Self { inner: Arc::new(Inner { settings, security, ..Inner::default() }) }
    }

    /// The memory store behind `mem:` keys.
    pub fn memory(&self) -> &MemStore {
        &self.inner.mem
    }

    /// The (cached) client for a server.
    pub fn client(&self, server: &str) -> Result<Client> {
        if let Some(c) = self.inner.clients.lock().unwrap().get(server) {
            return Ok(c.clone());
        }
        // Connect without holding the lock: a slow server must not stall other servers' copies.
        let c = Client::connect_with(server, self.inner.security.clone())?
            .with_settings(self.inner.settings.clone());
        Ok(self.inner.clients.lock().unwrap().entry(server.to_string()).or_insert(c).clone())
    }

    /// A reader for an existing blob.
    pub fn bind(&self, key: &BlobKey) -> Result<BlobProxy> {
        let slot = match key.location() {
            Location::Memory => Slot::MemRead {
                store: self.inner.mem.clone(),
                src: self.inner.mem.open_read(key.name())?,
            },
            Location::File => {
                let path = key.path().expect("file key");
                let file = std::fs::File::open(&path).map_err(|e| BlobError::file(&path, e))?;
                let meta = file.metadata().map_err(|e| BlobError::file(&path, e))?;
                if meta.is_dir() {
                    // (In `get -r`: a blob named as a folder of other blobs is, `a/x` beside
                    // `a/x/y`, and the folder came first.)
                    let e = std::io::Error::new(
                        std::io::ErrorKind::IsADirectory,
                        "a folder is there, not a file",
                    );
                    return Err(BlobError::file(&path, e));
                }
                if !meta.is_file() {
                    return Err(BlobError::InvalidKey {
                        key: key.to_string(),
                        reason: "not a regular file".into(),
                    });
                }
                Slot::FileRead { file, size: meta.len() }
            }
            Location::Remote(server) => {
                let client = self.client(server)?;
                let info = client.stat(key.name())?;
                Slot::RemoteRead { client, info, pull: None }
            }
        };
        Ok(BlobProxy::new(key.clone(), slot))
    }

    /// A writer for a new blob. With a resume tag, bytes an interrupted writer left behind are
    /// kept (the transporter checks them before building on them).
    pub fn route(&self, key: &BlobKey, spec: &NewBlob) -> Result<BlobProxy> {
        let slot = match key.location() {
            Location::Memory => {
                let st = &self.inner.mem;
                let route = RouteSpec {
                    name: key.name().to_string(),
                    size: spec.size,
                    content_type: spec.content_type.clone(),
                    metadata: spec.metadata.clone(),
                    overwrite: spec.overwrite,
                    resume_tag: spec.resume_tag.clone(),
                    ..RouteSpec::default()
                };
                let routed = st.route(&route)?;
                let sink = bs_store::open_routed(st, &route, &routed)?;
                let held = Held { bytes: routed.received, digest: routed.received_digest };
                Slot::MemWrite { sink: Some(sink), content_type: spec.content_type.clone(), held }
            }
            Location::File => {
                let dest = key.path().expect("file key");
                if !spec.overwrite && dest.exists() {
                    return Err(BlobError::AlreadyExists(format!(
                        "{} already exists (overwrite it explicitly)",
                        dest.display()
                    )));
                }
                let (part, file) = open_part(&dest, !spec.resume_tag.is_empty())?;
                Slot::FileWrite { part, dest, file, content_type: spec.content_type.clone() }
            }
            Location::Remote(server) => {
                let client = self.client(server)?;
                let routed = client.route(spec.route_request(key.name()))?;
                let digest = match routed.received_digest.as_str() {
                    "" => None,
                    d => d.parse().ok(),
                };
                let held = Held { bytes: routed.received, digest };
                Slot::RemoteWrite {
                    client,
                    push: None,
                    upload_id: routed.upload_id,
                    size: spec.size,
                    content_type: spec.content_type.clone(),
                    held,
                }
            }
        };
        Ok(BlobProxy::new(key.clone(), slot))
    }

    /// Throw away what an interrupted writer left and route afresh.
    pub fn reroute(&self, key: &BlobKey, spec: &NewBlob) -> Result<BlobProxy> {
        self.discard(key)?;
        self.route(key, spec)
    }

    /// Throw away whatever an interrupted write to `key` left behind (its part file, pending
    /// upload or remote upload), so nothing unverified is kept for a later resume.
    pub(crate) fn discard(&self, key: &BlobKey) -> Result<()> {
        match key.location() {
            Location::Memory => {
                let _ = self.inner.mem.abort(key.name());
            }
            Location::File => {
                let dest = key.path().expect("file key");
                let _ = std::fs::remove_file(crate::proxy::part_path(&dest));
                let _ = std::fs::remove_file(crate::ranges::ranges_path(&dest));
            }
            Location::Remote(server) => {
                let _ = self.client(server)?.abort(key.name());
            }
        }
        Ok(())
    }
}
