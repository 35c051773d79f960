//! The system under test: a blobstream server over a memory store and a blobstream client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bs_client::{Client, PushAck, RouteRequest, TransferSettings};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{MemStore, Store};
use bytes::Bytes;

use crate::error::BenchError;
use crate::measure::{PathRunner, Transfer};
use crate::model::{Mode, Path};
use crate::payload::gbit_per_s;

/// A blobstream server on 127.0.0.1 (port 0) and a client per socket buffer setting.
pub struct BlobstreamRunner {
    store: MemStore,
    client: Client,
    clients: HashMap<u32, Client>,
    // Dropped last: stops the server.
    _server: BackgroundServer,
}

impl BlobstreamRunner {
    pub fn start() -> Result<Self, BenchError> {
        let store = MemStore::new();
        let server = BackgroundServer::start(Arc::new(store.clone()), ServerConfig::ephemeral())?;
        let client = Client::connect(&server.control_addr().to_string())?;
        Ok(Self { store, client, clients: HashMap::new(), _server: server })
    }

    fn client(&mut self, buffer: u32) -> &Client {
        let base = &self.client;
        self.clients.entry(buffer).or_insert_with(|| {
            base.clone()
                .with_settings(TransferSettings { socket_buffer: buffer, ..Default::default() })
        })
    }

    /// The bytes the store now holds under `name` (read in place, not over the network).
    fn stored(&self, name: &str) -> Result<Bytes, BenchError> {
        Ok(self.store.open_read(name)?.all()?)
    }
}

fn blob_name(mode: Mode, size: usize) -> String {
    format!("bench/{mode}-{size}")
}

fn push(client: &Client, name: &str, data: &[u8]) -> Result<PushAck, BenchError> {
    let n = data.len() as u64;
    let route = RouteRequest { size: Some(n), overwrite: true, ..Default::default() };
    // A whole blob from memory: pipelined (one round trip) up to the server's bound.
    Ok(client.push_all(name, data, Some(route))?)
}

impl PathRunner for BlobstreamRunner {
    fn path(&self) -> Path {
        Path::Blobstream
    }

    fn prepare(&mut self, mode: Mode, data: &Bytes, _buffer: u32) -> Result<(), BenchError> {
        if mode == Mode::Pull {
            push(&self.client, &blob_name(mode, data.len()), data)?;
        }
        Ok(())
    }

    fn transfer(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<Transfer, BenchError> {
        let name = blob_name(mode, data.len());
        let client = self.client(buffer);
        match mode {
            Mode::Push => {
                let start = Instant::now();
                let ack = push(client, &name, data)?;
                let elapsed = start.elapsed();
                if ack.received != data.len() as u64 {
                    return Err(BenchError::Corrupt {
                        path: Path::Blobstream,
                        mode,
                        size: data.len() as u64,
                        detail: format!("server acknowledged {} bytes", ack.received),
                    });
                }
                let received = self.stored(&name)?;
                // The memory store keeps what a push commits: free it before the next run.
                self.client.delete(&name)?;
                Ok(Transfer {
                    gbit_per_s: gbit_per_s(data.len() as u64, elapsed),
                    received: Some(received),
                })
            }
            Mode::Pull => {
                let start = Instant::now();
                let mut p = client.open_pull_whole(&name, 0, None)?;
                let mut out = bs_wire::alloc::zeroed(data.len());
                p.read_exact_to_end(&mut out)?;
                let elapsed = start.elapsed();
                Ok(Transfer {
                    gbit_per_s: gbit_per_s(data.len() as u64, elapsed),
                    received: Some(Bytes::from(out)),
                })
            }
        }
    }

    fn cleanup(&mut self, mode: Mode, data: &Bytes, _buffer: u32) -> Result<(), BenchError> {
        if mode == Mode::Pull {
            self.client.delete(&blob_name(mode, data.len()))?;
        }
        Ok(())
    }
}
