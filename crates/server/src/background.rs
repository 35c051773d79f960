//! A server on a runtime of its own, for synchronous programs: tests, benchmarks, and
//! anyone embedding a store in a process that does not run tokio.

use std::net::SocketAddr;
use std::sync::Arc;

use bs_store::Store;

use crate::{Server, ServerConfig, ServerError};

/// A [`Server`] with its own runtime; shut down on drop.
pub struct BackgroundServer {
    rt: Option<tokio::runtime::Runtime>,
    server: Option<Server>,
}

impl BackgroundServer {
    /// Start serving `store`; both planes are listening when this returns.
    pub fn start(store: Arc<dyn Store>, cfg: ServerConfig) -> Result<Self, ServerError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("blobstream-server")
            .enable_all()
            .build()?;
        let server = rt.block_on(Server::start(store, cfg))?;
        Ok(Self { rt: Some(rt), server: Some(server) })
    }

    pub fn control_addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").control_addr()
    }

    pub fn data_addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").data_addr()
    }

    /// Stop both planes and drop the runtime.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Stop accepting, wait up to `grace` for running data transfers (see [`Server::drain`]),
    /// then drop the runtime. Returns how many transfers were still running.
    pub fn drain(mut self, grace: std::time::Duration) -> usize {
        let (Some(rt), Some(server)) = (self.rt.take(), self.server.take()) else { return 0 };
        let left = rt.block_on(server.drain(grace));
        rt.shutdown_background();
        left
    }

    fn shutdown(&mut self) {
        if let (Some(rt), Some(server)) = (self.rt.take(), self.server.take()) {
            rt.block_on(server.shutdown());
            rt.shutdown_background();
        }
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
