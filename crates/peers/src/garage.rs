//! A throwaway Garage cluster (the Rust S3-compatible distributed object store): N nodes on
//! loopback, each with its own directory, RPC, S3 and admin ports and one shared RPC secret;
//! connected, given a layout with the requested replication factor, one bucket and one
//! access key allowed on it. Driven through Garage's own CLI, as an operator would.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::error::PeerError;
use crate::guard::{Guarded, fresh_dir, wait_until};
use crate::setup::{free_port, garage_binary};

type Result<T> = std::result::Result<T, PeerError>;

/// What an S3 client needs to reach a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Endpoint {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub region: String,
    pub bucket: String,
    pub key_id: String,
    pub secret: String,
}

/// One node of the cluster.
pub struct GarageNode {
    dir: PathBuf,
    config: PathBuf,
    s3_port: u16,
    server: Option<Guarded>,
}

impl GarageNode {
    /// The node's S3 API, `http://127.0.0.1:PORT`.
    pub fn s3_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// Kill the node (its clients see connections refused).
    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }
}

/// A running cluster; every node stopped and its directory removed on drop.
pub struct Garage {
    bin: PathBuf,
    nodes: Vec<GarageNode>,
    endpoint: S3Endpoint,
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).expect("the OS random source works");
    hex::encode(b)
}

impl Garage {
    /// A single node with replication factor 1 and bucket `bucket`.
    pub fn start(bucket: &str) -> Result<Self> {
        Self::cluster(1, 1, bucket)
    }

    /// `n` nodes, each object stored `replication` times, bucket `bucket`.
    pub fn cluster(n: usize, replication: usize, bucket: &str) -> Result<Self> {
        let bin = garage_binary()?;
        let secret = random_hex(32);
        let mut nodes = Vec::new();
        for i in 0..n {
            let dir = fresh_dir(&format!("blobstream-garage{i}"), None)?;
            let (rpc_port, s3_port, admin_port) = (free_port(), free_port(), free_port());
            let config = dir.join("garage.toml");
            std::fs::write(
                &config,
                format!(
                    r#"metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "sqlite"
replication_factor = {replication}
rpc_bind_addr = "127.0.0.1:{rpc_port}"
rpc_public_addr = "127.0.0.1:{rpc_port}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{s3_port}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin_port}"
admin_token = "{admin}"
"#,
                    meta = dir.join("meta").display(),
                    data = dir.join("data").display(),
                    admin = random_hex(16),
                ),
            )
            .map_err(PeerError::io("writing the garage configuration"))?;
            // It holds the RPC secret: Garage refuses a configuration others can read.
            std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(PeerError::io("restricting the garage configuration"))?;
            let cmd: Vec<&OsStr> =
                vec![bin.as_os_str(), OsStr::new("-c"), config.as_os_str(), OsStr::new("server")];
            let server = Guarded::spawn("garage", &dir, &dir.join("server.log"), "TERM", &cmd)?;
            nodes.push(GarageNode { dir, config, s3_port, server: Some(server) });
        }
        let mut g = Self {
            bin,
            nodes,
            endpoint: S3Endpoint {
                url: String::new(),
                region: "garage".into(),
                bucket: bucket.into(),
                key_id: format!("GK{}", random_hex(12)),
                secret: random_hex(32),
            },
        };
        g.endpoint.url = g.nodes[0].s3_url();
        g.configure()?;
        Ok(g)
    }

    /// `garage -c <node 0's config> args...`, its standard output.
    fn cli(&self, node: usize, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.nodes[node].config)
            .args(args)
            .output()
            .map_err(PeerError::io("running the garage CLI"))?;
        if !out.status.success() {
            return Err(PeerError::Command {
                program: format!("garage {}", args.join(" ")),
                detail: format!("{}{}", String::from_utf8_lossy(&out.stderr), self.log_tail(node)),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn log_tail(&self, node: usize) -> String {
        let log =
            std::fs::read_to_string(self.nodes[node].dir.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        if tail.is_empty() {
            String::new()
        } else {
            format!(
                "\n(node {node} log, last lines)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        }
    }

    /// Node ids (`<hex>@<addr>`) once every node answers on its RPC port.
    fn node_ids(&self) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        for i in 0..self.nodes.len() {
            // `node id` reads the local key file; `status` needs the daemon's RPC.
            wait_until("garage node", Duration::from_secs(60), || {
                self.cli(i, &["status"]).is_ok()
            })?;
            ids.push(self.cli(i, &["node", "id", "-q"])?.trim().to_string());
        }
        Ok(ids)
    }

    fn configure(&mut self) -> Result<()> {
        let ids = self.node_ids()?;
        for id in &ids[1..] {
            self.cli(0, &["node", "connect", id])?;
        }
        for id in &ids {
            let short = id.split('@').next().unwrap_or(id);
            let short = &short[..16.min(short.len())];
            self.cli(0, &["layout", "assign", "-z", "dc1", "-c", "1G", short])?;
        }
        self.cli(0, &["layout", "apply", "--version", "1"])?;
        let e = self.endpoint.clone();
        self.cli(0, &["key", "import", "--yes", "-n", "blobstream", &e.key_id, &e.secret])?;
        // The layout reaches every node and the bucket table becomes writable.
        wait_until("garage bucket creation", Duration::from_secs(60), || {
            self.cli(0, &["bucket", "create", &e.bucket]).is_ok()
        })?;
        self.cli(
            0,
            &["bucket", "allow", "--read", "--write", "--owner", &e.bucket, "--key", &e.key_id],
        )?;
        Ok(())
    }

    /// Where the bucket is, and the key to it (S3 API of node 0).
    pub fn endpoint(&self) -> &S3Endpoint {
        &self.endpoint
    }

    /// The same bucket through node `i`'s S3 API.
    pub fn endpoint_of(&self, i: usize) -> S3Endpoint {
        S3Endpoint { url: self.nodes[i].s3_url(), ..self.endpoint.clone() }
    }

    pub fn nodes(&mut self) -> &mut [GarageNode] {
        &mut self.nodes
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
    }
}
