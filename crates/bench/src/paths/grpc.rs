//! The baseline "the same bytes through gRPC alone": the `GrpcBaseline` service of
//! `proto/blobstream.proto`, with the blob split into 1 MiB messages (the usual practice for
//! streaming bulk data over gRPC).
//!
//! The channel is kept between runs (one per socket buffer setting, connected by the first
//! run, a warm-up), as the other paths keep their connections. Both ends enable HTTP/2
//! adaptive flow-control windows (BDP probing, as gRPC's reference implementations do by
//! default).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bs_proto::grpc_baseline_client::GrpcBaselineClient;
use bs_proto::grpc_baseline_server::{GrpcBaseline, GrpcBaselineServer};
use bs_proto::{Chunk, PullRequest, PushAck};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;
use tokio::runtime::Runtime;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Endpoint, Uri};
use tonic::{Request, Response, Status, Streaming};

use super::IO_TIMEOUT;
use crate::error::BenchError;
use crate::measure::{PathRunner, Transfer};
use crate::model::{Mode, Path};
use crate::payload::gbit_per_s;

/// Bytes per gRPC message.
pub const CHUNK: usize = 1 << 20;
/// Largest message either end accepts (tonic's default, 4 MiB, is raised for headroom).
const MAX_MESSAGE: usize = 8 << 20;
/// Most concurrent pushes on one channel in [`GrpcRunner::concurrent_pushes`] (the usual
/// HTTP/2 server limit of concurrent streams).
pub const STREAMS_IN_FLIGHT: usize = 100;
/// Request metadata announcing a push's size, so the server can size its buffer once.
const SIZE_KEY: &str = "x-bench-size";

/// The baseline service: pushes land in a fresh buffer handed to the benchmark for checking;
/// pulls stream the benchmark's current payload.
struct Baseline {
    source: Arc<Mutex<Bytes>>,
    pushed: mpsc::Sender<Vec<u8>>,
}

#[tonic::async_trait]
impl GrpcBaseline for Baseline {
    async fn push(&self, request: Request<Streaming<Chunk>>) -> Result<Response<PushAck>, Status> {
        let size = request
            .metadata()
            .get(SIZE_KEY)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .unwrap_or(0);
        let mut stream = request.into_inner();
        let mut buf = bs_wire::alloc::zeroed(size);
        buf.clear(); // keep the capacity (and its huge-page advice), fill by appending
        while let Some(chunk) = stream.message().await? {
            buf.extend_from_slice(&chunk.data);
        }
        let received = buf.len() as u64;
        let _ = self.pushed.send(buf);
        Ok(Response::new(PushAck { received }))
    }

    async fn echo(&self, request: Request<Chunk>) -> Result<Response<Chunk>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    type PullStream = Pin<Box<dyn Stream<Item = Result<Chunk, Status>> + Send>>;

    async fn pull(
        &self,
        request: Request<PullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        let req = request.into_inner();
        let data = self.source.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let n = req.size as usize;
        if n > data.len() {
            return Err(Status::out_of_range(format!("pull of {n} bytes, {} held", data.len())));
        }
        let chunk = if req.chunk_size == 0 { CHUNK } else { req.chunk_size as usize };
        let chunks = tokio_stream::iter((0..n).step_by(chunk))
            .map(move |at| Ok(Chunk { data: data[at..(at + chunk).min(n)].to_vec() }));
        Ok(Response::new(Box::pin(chunks)))
    }
}

struct GrpcServer {
    addr: SocketAddr,
    pushed: mpsc::Receiver<Vec<u8>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

/// gRPC baseline servers on a runtime of their own, on 127.0.0.1 (port 0), one per socket
/// buffer setting; the client side runs on a second runtime.
pub struct GrpcRunner {
    source: Arc<Mutex<Bytes>>,
    servers: HashMap<u32, GrpcServer>,
    /// The client's channel per socket buffer setting, kept between runs.
    channels: HashMap<u32, tonic::transport::Channel>,
    server_rt: Runtime,
    client_rt: Runtime,
}

fn runtime(name: &str, workers: usize) -> Result<Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(BenchError::io("starting a tokio runtime"))
}

/// A tokio TCP socket with `SO_SNDBUF`/`SO_RCVBUF` set when `buffer` > 0.
fn socket(buffer: u32) -> std::io::Result<TcpSocket> {
    let s = TcpSocket::new_v4()?;
    if buffer > 0 {
        s.set_send_buffer_size(buffer)?;
        s.set_recv_buffer_size(buffer)?;
    }
    Ok(s)
}

impl GrpcRunner {
    /// Two workers serve, one drives the client: as a blobstream server and client do.
    pub fn start() -> Result<Self, BenchError> {
        Ok(Self {
            source: Arc::default(),
            servers: HashMap::new(),
            channels: HashMap::new(),
            server_rt: runtime("bench-grpc-server", 2)?,
            client_rt: runtime("bench-grpc-client", 1)?,
        })
    }

    fn server(&mut self, buffer: u32) -> Result<&GrpcServer, BenchError> {
        if !self.servers.contains_key(&buffer) {
            let server = self.start_server(buffer)?;
            self.servers.insert(buffer, server);
        }
        Ok(&self.servers[&buffer])
    }

    fn start_server(&self, buffer: u32) -> Result<GrpcServer, BenchError> {
        let _rt = self.server_rt.enter();
        let listener = (|| {
            // Buffers set on the listener are inherited by the sockets it accepts.
            let s = socket(buffer)?;
            s.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
            s.listen(64)
        })()
        .map_err(BenchError::io("starting the gRPC baseline server"))?;
        let addr = listener.local_addr().map_err(BenchError::io("gRPC baseline address"))?;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener)
            .map(|conn| conn.and_then(|s| s.set_nodelay(true).map(|()| s)));
        let (pushed_tx, pushed) = mpsc::channel();
        let svc =
            GrpcBaselineServer::new(Baseline { source: self.source.clone(), pushed: pushed_tx })
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let task = self.server_rt.spawn(
            tonic::transport::Server::builder()
                .http2_adaptive_window(Some(true))
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop.await;
                }),
        );
        Ok(GrpcServer { addr, pushed, shutdown: Some(shutdown), task: Some(task) })
    }
}

/// A channel to `addr` with default socket settings (`TCP_NODELAY` on).
async fn plain_channel(addr: SocketAddr) -> Result<tonic::transport::Channel, BenchError> {
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(BenchError::grpc)?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(BenchError::grpc)
}

impl GrpcRunner {
    /// Time `n` pushes of `size` bytes each, all started at once on one channel (gRPC
    /// multiplexes them, at most [`STREAMS_IN_FLIGHT`] at a time: a thousand at once break
    /// the connection now and then), until every one is acknowledged.
    pub fn concurrent_pushes(&mut self, size: usize, n: usize) -> Result<Duration, BenchError> {
        let addr = self.server(0)?.addr;
        let res = self.client_rt.block_on(async move {
            let channel = plain_channel(addr).await?;
            let data = Bytes::from(vec![5u8; size]);
            let t = Instant::now();
            let mut tasks = Vec::with_capacity(n);
            let streams = Arc::new(tokio::sync::Semaphore::new(STREAMS_IN_FLIGHT));
            for _ in 0..n {
                let mut client = GrpcBaselineClient::new(channel.clone());
                let data = data.clone();
                let streams = streams.clone();
                tasks.push(tokio::spawn(async move {
                    let _turn = streams.acquire_owned().await;
                    let chunk = Chunk { data: data.to_vec() };
                    let mut req = Request::new(tokio_stream::iter([chunk]));
                    req.metadata_mut().insert(SIZE_KEY, size.into());
                    client.push(req).await.map(|r| r.into_inner().received)
                }));
            }
            for task in tasks {
                let got = task
                    .await
                    .map_err(|e| BenchError::Grpc(e.to_string()))?
                    .map_err(BenchError::grpc)?;
                if got != size as u64 {
                    return Err(BenchError::Grpc(format!("acknowledged {got} of {size} bytes")));
                }
            }
            Ok(t.elapsed())
        });
        // The pushed bodies were handed over for checking; nobody checks them here.
        if let Some(s) = self.servers.get(&0) {
            while s.pushed.try_recv().is_ok() {}
        }
        res
    }

    /// Time `n` unary `Echo` calls of `size` bytes on one channel (after 10 untimed ones).
    pub fn echo_round_trips(&mut self, size: usize, n: usize) -> Result<Duration, BenchError> {
        let addr = self.server(0)?.addr;
        self.client_rt.block_on(async move {
            let channel = plain_channel(addr).await?;
            let mut client = GrpcBaselineClient::new(channel);
            let data = vec![7u8; size];
            let mut t = Instant::now();
            for i in 0..n + 10 {
                if i == 10 {
                    t = Instant::now();
                }
                let back = client
                    .echo(Chunk { data: data.clone() })
                    .await
                    .map_err(BenchError::grpc)?
                    .into_inner();
                if back.data.len() != size {
                    return Err(BenchError::Grpc("echo returned a different size".into()));
                }
            }
            Ok(t.elapsed())
        })
    }
}

impl Drop for GrpcRunner {
    fn drop(&mut self) {
        // Closed first, so the servers' graceful shutdown has no connection to wait for.
        self.channels.clear();
        for (_, mut s) in self.servers.drain() {
            if let Some(tx) = s.shutdown.take() {
                let _ = tx.send(());
            }
            if let Some(task) = s.task.take() {
                let _ = self
                    .server_rt
                    .block_on(async { tokio::time::timeout(Duration::from_secs(5), task).await });
            }
        }
    }
}

/// A channel to `addr` whose socket has `buffer`-byte buffers (0: autotuning).
async fn buffered_channel(
    addr: SocketAddr,
    buffer: u32,
) -> Result<tonic::transport::Channel, BenchError> {
    let connector = tower::service_fn(move |_: Uri| async move {
        let stream = socket(buffer)?.connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(TokioIo::new(stream))
    });
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(BenchError::grpc)?
        .http2_adaptive_window(true)
        .connect_with_connector(connector)
        .await
        .map_err(BenchError::grpc)
}

/// One transfer from the client's side: move the bytes, get the confirmation. Returns the
/// bytes a pull received.
async fn client_transfer(
    channel: tonic::transport::Channel,
    mode: Mode,
    data: Bytes,
) -> Result<Option<Vec<u8>>, BenchError> {
    let mut client = GrpcBaselineClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let n = data.len();
    match mode {
        Mode::Push => {
            let chunks = tokio_stream::iter((0..n).step_by(CHUNK))
                .map(move |at| Chunk { data: data[at..(at + CHUNK).min(n)].to_vec() });
            let mut req = Request::new(chunks);
            req.metadata_mut().insert(SIZE_KEY, n.into());
            let ack = client.push(req).await.map_err(BenchError::grpc)?.into_inner();
            if ack.received != n as u64 {
                return Err(BenchError::Grpc(format!(
                    "server acknowledged {} of {n} bytes",
                    ack.received
                )));
            }
            Ok(None)
        }
        Mode::Pull => {
            let req = PullRequest { size: n as u64, chunk_size: CHUNK as u32 };
            let mut stream = client.pull(req).await.map_err(BenchError::grpc)?.into_inner();
            let mut out = bs_wire::alloc::zeroed(n);
            out.clear(); // keep the capacity (and its huge-page advice), fill by appending
            while let Some(chunk) = stream.message().await.map_err(BenchError::grpc)? {
                out.extend_from_slice(&chunk.data);
            }
            Ok(Some(out))
        }
    }
}

impl PathRunner for GrpcRunner {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn transfer(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<Transfer, BenchError> {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = data.clone();
        let addr = self.server(buffer)?.addr;
        let server = &self.servers[&buffer];
        while server.pushed.try_recv().is_ok() {} // left over from a failed run
        let start = Instant::now();
        let kept = self.channels.get(&buffer).cloned();
        let pulled = self.client_rt.block_on(async {
            let channel = match kept {
                Some(c) => c,
                None => buffered_channel(addr, buffer).await?,
            };
            let pulled = client_transfer(channel.clone(), mode, data.clone()).await;
            Ok::<_, BenchError>((channel, pulled))
        });
        let elapsed = start.elapsed();
        let pulled = match pulled {
            Ok((channel, Ok(p))) => {
                self.channels.insert(buffer, channel);
                p
            }
            Ok((_, Err(e))) | Err(e) => {
                self.channels.remove(&buffer);
                return Err(e);
            }
        };
        let received = match pulled {
            Some(out) => out,
            None => server
                .pushed
                .recv_timeout(IO_TIMEOUT)
                .map_err(|e| BenchError::Grpc(format!("server handed over no push: {e}")))?,
        };
        Ok(Transfer {
            gbit_per_s: gbit_per_s(data.len() as u64, elapsed),
            received: Some(Bytes::from(received)),
        })
    }
}
