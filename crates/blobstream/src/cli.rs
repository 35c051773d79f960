//! Command-line interface: the flags other tools script against.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "blobstream",
    version,
    about = "Move and store very large blobs at the speed of the hardware"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// The server client commands talk to unless told otherwise.
const DEFAULT_SERVER: &str = "127.0.0.1:7070";

/// Commands that are not clients of a blobstream server, and the global options each still
/// takes: their help leaves the others out (they are still accepted, and ignored).
const NOT_CLIENTS: &[(&str, &[&str])] = &[
    ("serve", &["auth_token_file"]),
    ("filters", &[]),
    ("filter", &[]),
    ("image-info", &[]),
    ("bench", &[]),
    ("distributer", &[]),
];

impl Cli {
    /// Parse the command line (exits with a usage message on errors).
    pub fn parse_args() -> Self {
        let mut cmd = Self::command();
        let globals: Vec<clap::Arg> =
            cmd.get_arguments().filter(|a| a.is_global_set()).cloned().collect();
        for &(name, keep) in NOT_CLIENTS {
            let hidden: Vec<clap::Arg> = globals
                .iter()
                .filter(|a| !keep.contains(&a.get_id().as_str()))
                .map(|a| a.clone().global(false).hide(true))
                .collect();
            cmd = cmd.mut_subcommand(name, |sub| with_hidden(sub, &hidden));
        }
        let matches = cmd.get_matches();
        let mut cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        // BLOBSTREAM_SERVER set but empty (`BLOBSTREAM_SERVER= cmd`) means "not set".
        if cli.global.server.trim().is_empty() {
            cli.global.server = DEFAULT_SERVER.into();
        }
        if let (Command::Serve(a), Some(m)) =
            (&mut cli.command, matches.subcommand_matches("serve"))
        {
            a.settle_sources(m).unwrap_or_else(|e| e.exit());
        }
        cli
    }
}

/// Was argument `id` given on the command line (not taken from the environment or a default)?
fn typed(m: &clap::ArgMatches, id: &str) -> bool {
    m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
}

impl ServeArgs {
    /// Settle arguments that only make sense together, by where each came from: a flag typed
    /// with one it cannot go with is a usage error, while a value from the environment (set
    /// for other commands, e.g. `BLOBSTREAM_DPSS_TOKEN` for `dpss`) that the typed flags make
    /// pointless is left unused. (Clap's own `requires`/`conflicts_with` count environment
    /// values as given, so `BLOBSTREAM_DATA` would refuse `serve --memory`.)
    pub fn settle_sources(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        let usage = |kind, msg: String| {
            let mut cmd = Cli::command();
            let serve = cmd.find_subcommand_mut("serve").expect("serve is a command");
            Err(serve.error(kind, msg))
        };
        if self.memory {
            if typed(m, "data") {
                return usage(
                    clap::error::ErrorKind::ArgumentConflict,
                    "--memory keeps blobs in this process: it takes no --data".into(),
                );
            }
            for (id, flag) in [("s3_bucket", "--s3-bucket"), ("catalogue", "--catalogue")] {
                if typed(m, id) {
                    return usage(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!("--memory keeps blobs in this process: it takes no {flag}"),
                    );
                }
            }
            self.data = None;
            self.s3_bucket = None;
            self.catalogue = None;
        }
        if self.dpss_master.is_none() {
            for (id, flag) in [("dpss_token", "--dpss-token"), ("dpss_ca", "--dpss-ca")] {
                if typed(m, id) {
                    return usage(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        format!(
                            "{flag} is for --dpss-master (the block store to serve tiles from)"
                        ),
                    );
                }
            }
            self.dpss_token = None;
            self.dpss_ca = None;
        }
        Ok(())
    }
}

/// `cmd` and every subcommand under it with `hidden` as arguments of their own: an argument a
/// command defines itself is not propagated to it from above, so these hidden copies take
/// the global ones' place in its help (and are still accepted).
fn with_hidden(mut cmd: clap::Command, hidden: &[clap::Arg]) -> clap::Command {
    for a in hidden {
        cmd = cmd.arg(a.clone());
    }
    let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for n in names {
        cmd = cmd.mut_subcommand(n, |sub| with_hidden(sub, hidden));
    }
    cmd
}

#[derive(Args)]
pub struct Global {
    /// Control-plane address of the blobstream server for client commands.
    #[arg(long, global = true, env = "BLOBSTREAM_SERVER", default_value = DEFAULT_SERVER)]
    pub server: String,
    /// No progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// File holding the bearer token for the control plane (serve: the token to require)
    /// [or the token itself in BLOBSTREAM_AUTH_TOKEN].
    #[arg(long, global = true, env = "BLOBSTREAM_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// CA certificate (PEM) to trust: speak TLS to the server on both planes.
    #[arg(long, global = true, env = "BLOBSTREAM_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Name to verify in the server's certificate [default: the host connected to].
    #[arg(long, global = true, env = "BLOBSTREAM_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per run; boxing would buy nothing")]
pub enum Command {
    /// Run a store server (control plane on --addr, data plane on its own port).
    Serve(ServeArgs),
    /// Upload a local file as blob KEY (resumes an interrupted upload of the same file).
    Put(PutArgs),
    /// Download blob KEY into FILE ('-' for stdout); resumes an interrupted download.
    Get(GetArgs),
    /// Write blob KEY to stdout.
    Cat {
        /// The blob to write out.
        key: String,
    },
    /// List blobs whose names start with PREFIX.
    #[command(disable_help_flag = true)]
    Ls(LsArgs),
    /// Show a blob's size, content type, digest, creation time and metadata.
    Stat {
        /// The blob to describe.
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete blobs (with -r: every blob under each PREFIX).
    Rm {
        /// The blobs to delete (with -r: prefixes, e.g. studies/ct-001/).
        #[arg(required = true, value_name = "KEY")]
        keys: Vec<String>,
        /// Delete every blob whose name starts with each KEY taken as a folder (KEY/...).
        #[arg(short, long)]
        recursive: bool,
    },
    /// Copy between local paths and remote blobs: remote operands are `bs:NAME` (on --server)
    /// or `blob://HOST:PORT/NAME`; anything else is a local path.
    Cp(CpArgs),
    /// Make a prefix match a local folder, or a folder match a prefix: copy what is missing or
    /// differs (by size and digest, read back now), leave what is the same; --delete also
    /// removes what the source lacks. Exit status 1 names every failure; re-run to finish.
    Sync(SyncArgs),
    /// List the image filters and chains (built-in, and loaded from --defs).
    Filters(FiltersArgs),
    /// Apply a filter or chain to an image file (PNG, JPEG, TIFF, GIF, PGM/PPM; DICOM in).
    Filter(FilterArgs),
    /// Show an image file's dimensions, pixel type and metadata (DICOM tags included).
    ImageInfo {
        /// The image file to read.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Refuse images with more pixels than this.
        #[arg(long, default_value_t = 100_000_000)]
        max_pixels: u64,
    },
    /// Have the server re-read blobs (under PREFIX) and check every chunk against its digest;
    /// names the corrupt ones (the server marks them, so readers are refused at once). Exits
    /// with status 1 if any blob is corrupt or unreadable.
    Scrub(ScrubArgs),
    /// Check local files against their blobs by size and digest (with -r: a folder against a
    /// prefix, both ways). Exits with status 1 if anything differs or is missing.
    Check(CheckArgs),
    /// Open a binding to the server's echo, sink or source endpoint with a QoS profile,
    /// print what was negotiated, run traffic over it with live counters, and optionally
    /// renegotiate halfway.
    Bind(BindArgs),
    /// List the server's live bindings and transfers with their counters.
    Bindings {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a distributer: each flow's one sender fanned out to all its receivers
    /// (docs/distributer.md); `distributer status` lists flows and receivers.
    Distributer(DistributerArgs),
    /// Send a file (or stdin) as one run of a distributer flow; reports every receiver.
    Send(SendArgs),
    /// Receive a distributer flow: each run into a file in --out, kept only when verified.
    Receive(ReceiveArgs),
    /// The parallel block store (docs/dpss.md): block servers, the master and name server,
    /// loading a data set, status, reading blocks.
    #[command(subcommand)]
    Dpss(DpssCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
pub enum DpssCommand {
    /// Run the master and name server: membership and statistics of the block servers, the
    /// catalogue of data sets (SQLite), request-list planning; gRPC and GET /metrics.
    Master {
        /// Address the master listens on (gRPC and GET /metrics).
        #[arg(long, default_value = "127.0.0.1:7090")]
        addr: String,
        /// The name server's catalogue.
        #[arg(long, default_value = "data/dpss/names.db")]
        catalog: PathBuf,
        /// Require this token on every call (gRPC and /metrics): the block store's token,
        /// the one its block servers require too.
        /// @FILE reads it from FILE (keeps it out of the process list).
        #[arg(long, env = "BLOBSTREAM_DPSS_TOKEN", value_parser = secret, hide_env_values = true)]
        token: Option<String>,
        /// Require this token instead on the calls that change what the store serves (block
        /// servers' reports, loading, dropping); the --token then only reads. @FILE as above.
        #[arg(long, env = "BLOBSTREAM_DPSS_ADMIN_TOKEN", value_parser = secret, hide_env_values = true)]
        admin_token: Option<String>,
        #[command(flatten)]
        tls: ServerTls,
    },
    /// Run a block server over one or more disk directories (one reader each), reporting to
    /// the master.
    Server(DpssServerArgs),
    /// Run a master and N block servers in this one process on loopback (the quick path).
    Local {
        /// Block servers to start.
        #[arg(long, default_value_t = 4)]
        servers: usize,
        /// Disk directories per server.
        #[arg(long, default_value_t = 1)]
        disks: usize,
        /// Where the catalogue and the servers' disks live.
        #[arg(long, default_value = "data/dpss")]
        dir: PathBuf,
        /// The master's address.
        #[arg(long, default_value = "127.0.0.1:7090")]
        master: String,
        /// The first server's port; the others follow it (0: any free ports).
        #[arg(long, default_value_t = 7091)]
        first_port: u16,
        /// Cache per server, MiB.
        #[arg(long, default_value_t = 256)]
        cache_mb: usize,
        /// Require this token on the master and every block server.
        /// @FILE reads it from FILE (keeps it out of the process list).
        #[arg(long, env = "BLOBSTREAM_DPSS_TOKEN", value_parser = secret, hide_env_values = true)]
        token: Option<String>,
        /// The master and the block servers speak TLS with this certificate and key (the
        /// servers trust the certificate itself when reporting to the master: self-signed,
        /// naming localhost).
        #[command(flatten)]
        tls: ServerTls,
    },
    /// Load a data set: an image (any format `image-info` reads) into a pyramid of tiles, a
    /// generated test image of any size, or a flat file into fixed-size blocks; spread over
    /// every live server, then published.
    Load(DpssLoadArgs),
    /// Every block server (up, disk and send MB/s, cache hits, queues) and every data set.
    Status {
        /// The master's address.
        #[arg(long, default_value = "127.0.0.1:7090")]
        master: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        auth: DpssAuth,
    },
    /// Fly the ISS paper's TerraVision path over an image data set: several request lists a
    /// second of about fifty tiles, with prediction; per list requested / read / cache hits /
    /// sent / flushed / lost and the latency of high-priority tiles.
    Simulate {
        /// The data set's name.
        #[arg(long)]
        dataset: String,
        /// The master's address.
        #[arg(long, default_value = "127.0.0.1:7090")]
        master: String,
        /// Request lists per second.
        #[arg(long, default_value_t = 5.0)]
        rate: f64,
        /// Lists to send.
        #[arg(long, default_value_t = 50)]
        lists: u32,
        /// Tiles per list (about).
        #[arg(long, default_value_t = 50)]
        tiles: usize,
        /// Pyramid level to fly at (0: full resolution).
        #[arg(long, default_value_t = 0)]
        level: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        auth: DpssAuth,
    },
    /// Remove a data set: unpublished from the name server, then its blocks from every live
    /// server (run again for servers that were down).
    Drop {
        /// The data set to remove.
        dataset: String,
        /// The master's address.
        #[arg(long, default_value = "127.0.0.1:7090")]
        master: String,
        #[command(flatten)]
        auth: DpssAuth,
    },
    /// Read blocks of a data set, verified, into files (`LEVEL/X_Y.png` for images).
    Get {
        /// The data set's name.
        #[arg(long)]
        dataset: String,
        /// The master's address.
        #[arg(long, default_value = "127.0.0.1:7090")]
        master: String,
        /// Only this level (default: every level).
        #[arg(long)]
        level: Option<u8>,
        /// Write the blocks under this directory (a flat file is written whole as DIR/NAME).
        #[arg(long)]
        out: PathBuf,
        /// Print JSON: blocks, bytes, and the seconds spent fetching (writing files not
        /// counted).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        auth: DpssAuth,
    },
}

#[derive(Args, Clone)]
pub struct DpssAuth {
    /// The token the master and the block servers require (their --token; to load or drop,
    /// their --admin-token when they have one).
    /// @FILE reads it from FILE (keeps it out of the process list).
    #[arg(long, env = "BLOBSTREAM_DPSS_TOKEN", value_parser = secret, hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) to trust: speak TLS to a master and block servers started with
    /// --tls-cert.
    #[arg(long, env = "BLOBSTREAM_DPSS_CA")]
    pub ca: Option<PathBuf>,
}

#[derive(Args)]
pub struct DpssServerArgs {
    /// A disk directory (repeat for more disks).
    #[arg(long = "disk", required = true)]
    pub disks: Vec<PathBuf>,
    /// Address clients and loaders connect to.
    #[arg(long, default_value = "127.0.0.1:7091")]
    pub addr: String,
    /// The master to report to.
    #[arg(long, default_value = "127.0.0.1:7090")]
    pub master: String,
    /// Name in status (default: the address).
    #[arg(long)]
    pub name: Option<String>,
    /// Block cache, MiB.
    #[arg(long, default_value_t = 256)]
    pub cache_mb: usize,
    /// Most client and loader connections served at once (each a thread); more are told
    /// the server is busy.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Require this token from clients and loaders (and present it to the master).
    /// @FILE reads it from FILE (keeps it out of the process list).
    #[arg(long, env = "BLOBSTREAM_DPSS_TOKEN", value_parser = secret, hide_env_values = true)]
    pub token: Option<String>,
    /// Require this token instead from loaders (loading, dropping), and present it to the
    /// master (the one its --admin-token names); the --token then only reads. @FILE as above.
    #[arg(long, env = "BLOBSTREAM_DPSS_ADMIN_TOKEN", value_parser = secret, hide_env_values = true)]
    pub admin_token: Option<String>,
    #[command(flatten)]
    pub tls: ServerTls,
    /// CA certificate (PEM) to trust when reporting to a master started with --tls-cert.
    #[arg(long, env = "BLOBSTREAM_DPSS_CA")]
    pub master_ca: Option<PathBuf>,
    /// The host name clients reach this server by (default: the --addr host); with TLS, the
    /// name its certificate gives.
    #[arg(long, value_name = "HOST")]
    pub advertise_host: Option<String>,
}

#[derive(Args)]
pub struct DpssLoadArgs {
    /// The image to load (or use --synthetic or --file).
    #[arg(required_unless_present_any = ["synthetic", "file"])]
    pub image: Option<PathBuf>,
    /// Generate a test image of WIDTHxHEIGHT pixels instead (made tile by tile).
    #[arg(long, conflicts_with_all = ["image", "file"], value_name = "WxH")]
    pub synthetic: Option<String>,
    /// Load a flat file in blocks of --block-size bytes instead.
    #[arg(long, conflicts_with = "image")]
    pub file: Option<PathBuf>,
    /// The data set's name (the one viewers and `dpss get` ask for).
    #[arg(long)]
    pub dataset: String,
    /// The master's address.
    #[arg(long, default_value = "127.0.0.1:7090")]
    pub master: String,
    /// Tile edge in pixels.
    #[arg(long, default_value_t = 256)]
    pub tile: u32,
    /// Block size for --file, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub block_size: u32,
    /// Copies of every block, on distinct servers [default: 2 when there are 2 servers or
    /// more].
    #[arg(long)]
    pub copies: Option<u32>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: DpssAuth,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DistributerArgs {
    #[command(subcommand)]
    pub command: Option<DistributerCommand>,
    /// The streams and their flows (TOML; see docs/distributer.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address senders and receivers connect to.
    #[arg(long, default_value = "127.0.0.1:7080")]
    pub addr: String,
    /// Address of the status service: the gRPC call `distributer status` makes, and
    /// GET /metrics.
    #[arg(long, default_value = "127.0.0.1:7081")]
    pub status_addr: String,
    #[command(flatten)]
    pub tls: ServerTls,
    /// Require this token on the status service (gRPC and /metrics); with --tls-cert it
    /// speaks TLS too.
    /// @FILE reads it from FILE (keeps it out of the process list).
    #[arg(long, env = "BLOBSTREAM_DISTRIBUTER_STATUS_TOKEN", value_parser = secret, hide_env_values = true)]
    pub status_token: Option<String>,
}

#[derive(Subcommand)]
pub enum DistributerCommand {
    /// List every flow with its sender and receivers (bytes delivered, rate, queue, last
    /// error).
    Status {
        /// The distributer's status address (its --status-addr).
        #[arg(long, default_value = "127.0.0.1:7081")]
        addr: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The status service's token (the distributer's --status-token).
        /// @FILE reads it from FILE (keeps it out of the process list).
        #[arg(long, env = "BLOBSTREAM_DISTRIBUTER_STATUS_TOKEN", value_parser = secret, hide_env_values = true)]
        token: Option<String>,
        /// CA certificate (PEM) to trust: the distributer was started with --tls-cert.
        #[arg(long, env = "BLOBSTREAM_DISTRIBUTER_CA", value_name = "FILE")]
        distributer_ca: Option<PathBuf>,
    },
}

/// Which flow of which distributer.
#[derive(Args)]
pub struct FlowArgs {
    /// The distributer's address.
    #[arg(long, default_value = "127.0.0.1:7080")]
    pub distributer: String,
    /// The stream, as the distributer's configuration names it.
    #[arg(long)]
    pub stream: String,
    /// The flow of that stream.
    #[arg(long)]
    pub flow: String,
    /// The stream's token, if its configuration sets one.
    /// @FILE reads it from FILE (keeps it out of the process list).
    #[arg(long, env = "BLOBSTREAM_STREAM_TOKEN", value_parser = secret, hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) to trust: speak TLS to the distributer (started with
    /// --tls-cert). Its certificate must name the host of --distributer.
    #[arg(long, env = "BLOBSTREAM_DISTRIBUTER_CA", value_name = "FILE")]
    pub distributer_ca: Option<PathBuf>,
}

#[derive(Args)]
pub struct SendArgs {
    /// File to send ('-' for stdin).
    pub file: String,
    #[command(flatten)]
    pub flow: FlowArgs,
    /// Start parameter, repeatable (numbers and true/false are sent as such, the rest as text).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub params: Vec<(String, String)>,
    /// Be the distributer too: serve the streams of this configuration (TOML, as
    /// `distributer --config`) on --distributer's address, and hand the run to the receivers
    /// from this process (no hop through a distributer of its own); --token and
    /// --distributer-ca, for joining another distributer, are not used.
    #[arg(long, value_name = "CONFIG")]
    pub serve: Option<PathBuf>,
    /// With --serve: also serve the status (the gRPC call `distributer status` makes, and
    /// GET /metrics) here, while the run lasts.
    #[arg(long, value_name = "ADDR", requires = "serve")]
    pub status_addr: Option<String>,
    /// With --status-addr: require this token on it (as `distributer --status-token`).
    /// @FILE reads it from FILE (keeps it out of the process list).
    #[arg(long, env = "BLOBSTREAM_DISTRIBUTER_STATUS_TOKEN", value_parser = secret, hide_env_values = true)]
    pub status_token: Option<String>,
    /// With --serve: wait until this many receivers have joined the flow before the run
    /// starts (a receiver joining later misses it).
    #[arg(long, default_value_t = 1, requires = "serve")]
    pub receivers: usize,
    /// With --serve: how long to wait for them (seconds).
    #[arg(long, default_value_t = 60, value_name = "SECONDS", requires = "serve")]
    pub wait: u64,
    /// With --serve: serve TLS to receivers (they connect with --distributer-ca).
    #[command(flatten)]
    pub tls: ServerTls,
}

#[derive(Args)]
pub struct ReceiveArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    /// This receiver's name (the sender's reports use it).
    #[arg(long)]
    pub name: String,
    /// Directory for the runs: each is written as NAME.part and renamed to NAME once its
    /// total and digest check out (NAME: the run's `name` parameter, else run-N).
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Stop after this many runs (0: until the distributer closes the connection).
    #[arg(long, default_value_t = 0)]
    pub runs: u64,
    /// The archive: write each run as a blob into the store at --server instead of a file,
    /// committed only when the run is verified (an aborted run leaves no blob).
    #[arg(long)]
    pub into_store: bool,
    /// With --into-store: prefix of the blob names (NAME as for files).
    #[arg(long, default_value = "", requires = "into_store")]
    pub prefix: String,
}

fn parse_policy(s: &str) -> Result<bs_binding::Policy, String> {
    s.parse()
}

/// An address to listen on: an IP and port, or a host name and port (`localhost:7070`),
/// resolved now to one of its addresses, IPv4 first.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let all: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?} is not HOST:PORT with a host this machine resolves ({e})"))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

fn parse_rate(s: &str) -> Result<u64, String> {
    bs_binding::qos::parse_size(s).ok_or_else(|| format!("{s:?} is not a number of bytes"))
}

#[derive(Args)]
pub struct BindArgs {
    /// echo (request/reply), sink (send) or source (receive).
    #[arg(default_value = "echo")]
    pub endpoint: String,
    /// A TOML file with the profile (fields of QosProfile; flags below override it).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Wanted throughput, bytes per second (k/m/g suffixes).
    #[arg(long, value_parser = parse_rate)]
    pub throughput: Option<u64>,
    /// Latency bound in milliseconds (the scheduling deadline).
    #[arg(long, value_name = "MS")]
    pub latency_ms: Option<f64>,
    /// Jitter bound in milliseconds.
    #[arg(long, value_name = "MS")]
    pub jitter_ms: Option<f64>,
    /// Tolerated loss, parts per million (> 0 allows udp).
    #[arg(long)]
    pub loss_ppm: Option<u32>,
    /// 0 (lowest) to 7.
    #[arg(long)]
    pub priority: Option<u8>,
    /// Share under fair scheduling.
    #[arg(long)]
    pub weight: Option<u32>,
    /// Protocol layer, top first, repeatable: null, checksum:xxh3|blake3,
    /// compress:zstd[:level]|lz4, encrypt, fragment:<bytes>, pace:<bytes/s>.
    #[arg(long = "layer", value_name = "LAYER")]
    pub layers: Vec<String>,
    /// Acceptable transport, preferred first, repeatable: tcp, udp, unix.
    #[arg(long = "transport", value_name = "T")]
    pub transports: Vec<String>,
    /// Bytes per message.
    #[arg(long, default_value = "64k", value_parser = parse_rate)]
    pub size: u64,
    /// Largest message to negotiate [default: --size].
    #[arg(long, value_parser = parse_rate)]
    pub max_message: Option<u64>,
    /// Messages to send or receive.
    #[arg(long, default_value_t = 1000)]
    pub messages: u64,
    /// Halfway, renegotiate to these layers (repeatable; "none" for no layers).
    #[arg(long = "then-layer", value_name = "LAYER")]
    pub then_layers: Vec<String>,
    /// Halfway, renegotiate to this throughput.
    #[arg(long, value_parser = parse_rate)]
    pub then_throughput: Option<u64>,
    /// Refuse an offer below this throughput (bytes per second).
    #[arg(long, value_parser = parse_rate)]
    pub min_throughput: Option<u64>,
    /// Fill messages with compressible bytes instead of random ones.
    #[arg(long)]
    pub compressible: bool,
    /// Print JSON (the negotiated profile and the final counters).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct FiltersArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Directory of filter definitions (*.toml: kernels and chains).
    #[arg(long, env = "BLOBSTREAM_FILTERS_DIR")]
    pub defs: Option<PathBuf>,
}

#[derive(Args)]
pub struct FilterArgs {
    /// Filter or chain name (see `blobstream filters`).
    pub name: String,
    /// The image file to filter.
    pub input: PathBuf,
    /// Output file; its extension picks the format.
    pub output: PathBuf,
    /// Filter parameter, repeatable.
    #[arg(long = "param", short = 'p', value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// Threads to use; 0 = all cores.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Directory of filter definitions (*.toml: kernels and chains).
    #[arg(long, env = "BLOBSTREAM_FILTERS_DIR")]
    pub defs: Option<PathBuf>,
    /// Refuse images with more pixels than this.
    #[arg(long, default_value_t = 100_000_000)]
    pub max_pixels: u64,
}

/// A server's TLS identity.
#[derive(Args)]
pub struct ServerTls {
    /// Certificate chain (PEM): serve TLS (with --tls-key). `serve`: on both planes and HTTP;
    /// `distributer`: to senders and receivers (and its status plane); `send --serve`: to its
    /// receivers; `dpss`: the master, the block servers.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Storage configuration file (TOML: data directory, bucket, catalogue, cache; see
    /// docs/configuration.md). Flags and environment variables win over it.
    #[arg(long, env = "BLOBSTREAM_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (blobs and the SQLite catalogue; with a bucket, the catalogue only)
    /// [default: data].
    #[arg(long, env = "BLOBSTREAM_DATA")]
    pub data: Option<PathBuf>,
    /// Keep blobs in memory instead (nothing survives a restart). Not with --data; a data
    /// directory, bucket or catalogue from the environment is left unused.
    #[arg(long)]
    pub memory: bool,
    /// With --memory: most bytes held (k/m/g/t suffixes) [default: half the machine's
    /// memory].
    #[arg(long, requires = "memory", value_parser = parse_rate, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// Keep blobs in this S3 bucket (AWS S3, Garage, MinIO, Ceph RGW, SeaweedFS). The secret
    /// key comes from BLOBSTREAM_S3_SECRET_ACCESS_KEY (or AWS_SECRET_ACCESS_KEY, or the
    /// configuration file), never from a flag.
    #[arg(long, env = "BLOBSTREAM_S3_BUCKET", value_name = "BUCKET")]
    pub s3_bucket: Option<String>,
    /// The S3 server, for anything but AWS (e.g. http://127.0.0.1:3900).
    #[arg(long, env = "BLOBSTREAM_S3_ENDPOINT", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The bucket's region [default: us-east-1].
    #[arg(long, env = "BLOBSTREAM_S3_REGION")]
    pub s3_region: Option<String>,
    /// Key prefix of the blobs in the bucket [default: blobs].
    #[arg(long, env = "BLOBSTREAM_S3_PREFIX")]
    pub s3_prefix: Option<String>,
    /// The S3 access key id (or AWS_ACCESS_KEY_ID).
    #[arg(long, env = "BLOBSTREAM_S3_ACCESS_KEY_ID", value_name = "ID")]
    pub s3_access_key_id: Option<String>,
    /// The catalogue in PostgreSQL, shared by every front end on the same bucket:
    /// postgres://user:password@host:port/database[?sslmode=require&sslrootcert=CA] (with a
    /// password, give it in this environment variable or the configuration file, not as a
    /// flag) [default: SQLite in the data directory].
    #[arg(long, env = "BLOBSTREAM_CATALOGUE", value_name = "URL", hide_env_values = true)]
    pub catalogue: Option<String>,
    /// Memory tier in front of the store: bytes of recently read blobs kept in memory
    /// (k/m/g suffixes) [default: none].
    #[arg(long, value_parser = parse_rate, value_name = "BYTES")]
    pub cache_memory: Option<u64>,
    /// Disk tier in front of the store (behind the memory tier): a directory on local disk
    /// holding copies of recently read blobs [default: none].
    #[arg(long, value_name = "DIR")]
    pub cache_disk: Option<PathBuf>,
    /// Most bytes the disk tier holds [default: 10g].
    #[arg(long, value_parser = parse_rate, value_name = "BYTES")]
    pub cache_disk_size: Option<u64>,
    /// Largest blob a tier holds [default: 64m].
    #[arg(long, value_parser = parse_rate, value_name = "BYTES")]
    pub cache_max_blob: Option<u64>,
    /// Control-plane (gRPC) address, HOST:PORT (a host name is resolved, IPv4 first).
    #[arg(long, default_value = "127.0.0.1:7070", value_parser = parse_listen)]
    pub addr: SocketAddr,
    /// Data-plane address [default: the control plane's IP, a port chosen by the OS].
    #[arg(long, value_parser = parse_listen)]
    pub data_addr: Option<SocketAddr>,
    /// Data endpoint to announce to clients instead of the bound one (behind NAT).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Seconds a negotiated data-connection token stays valid.
    #[arg(long, default_value_t = 60, value_parser = positive::<u64>)]
    pub token_ttl: u64,
    /// Seconds to wait for a silent peer on the data plane.
    #[arg(long, default_value_t = 30, value_parser = positive::<u64>)]
    pub io_timeout: u64,
    /// Most concurrent data transfers; more are told to retry (clients do, for a while).
    #[arg(long, default_value_t = 256, value_parser = positive::<usize>)]
    pub max_connections: usize,
    /// Most control-plane (gRPC) connections open at once; the next wait until one closes.
    /// Each must say something within 30 s of connecting.
    #[arg(long, default_value_t = 1024, value_parser = positive::<usize>)]
    pub max_control_connections: usize,
    /// Most bindings open at once (each a connection and a thread, often idle); they do not
    /// count among --max-connections. More are told to retry.
    #[arg(long, default_value_t = 1024, value_parser = positive::<usize>)]
    pub max_bindings: usize,
    /// A push of a known length over the data plane slower than this on average (after its
    /// first --io-timeout seconds, unless it asked to be paced) is ended, so a client
    /// trickling bytes cannot hold a transfer slot (k/m/g suffixes; 0: no floor).
    #[arg(long, default_value = "1k", value_parser = parse_rate, value_name = "BYTES_PER_SEC")]
    pub min_transfer_rate: u64,
    /// Seconds a data connection waits after a transfer for the client's next token (one
    /// more transfer without a new handshake); 0: one transfer per connection.
    #[arg(long, default_value_t = 3, value_name = "SECS")]
    pub data_keepalive: u64,
    /// Most data connections waiting so between transfers (each holds a thread).
    #[arg(long, default_value_t = 64)]
    pub max_idle_data_connections: usize,
    /// Seconds a new data connection has to present its token (TLS handshake included).
    #[arg(long, default_value_t = 10, value_name = "SECS", value_parser = positive::<u64>)]
    pub hello_timeout: u64,
    /// Seconds it has once more than half of either limit below is in use.
    #[arg(long, default_value_t = 2, value_name = "SECS", value_parser = positive::<u64>)]
    pub hello_timeout_under_pressure: u64,
    /// Most data connections still to present their token; at the limit the oldest is
    /// dropped to make room.
    #[arg(long, default_value_t = 4096, value_parser = positive::<usize>)]
    pub max_unauthenticated: usize,
    /// The same, from one source address (an IPv6 /64 counts as one).
    #[arg(long, default_value_t = 64, value_parser = positive::<usize>)]
    pub max_unauthenticated_per_ip: usize,
    /// Largest upload of unknown size, in bytes (k/m/g/t suffixes).
    #[arg(long, default_value = "1TiB", value_parser = parse_rate, value_name = "BYTES")]
    pub max_unsized_upload: u64,
    /// Wrong control-plane tokens one address may present at once...
    #[arg(long, default_value_t = 10, value_parser = positive::<u32>)]
    pub auth_failure_burst: u32,
    /// ...then one more per this many seconds; meanwhile its calls are refused.
    #[arg(long, default_value_t = 2, value_name = "SECS", value_parser = positive::<u64>)]
    pub auth_failure_interval: u64,
    /// Seconds a SIGTERM or SIGINT waits for running transfers before the server exits.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub shutdown_grace: u64,
    /// The block store's master (docs/dpss.md): serve its images' tiles over IIIF and the
    /// tiled viewer at /dpss.html.
    #[arg(long, value_name = "ADDR")]
    pub dpss_master: Option<String>,
    /// With --dpss-master: the token the block store (its master and servers) requires.
    /// @FILE reads it from FILE (keeps it out of the process list).
    #[arg(long, env = "BLOBSTREAM_DPSS_TOKEN", value_parser = secret, hide_env_values = true)]
    pub dpss_token: Option<String>,
    /// With --dpss-master: CA certificate (PEM) to trust: the block store speaks TLS (started
    /// with --tls-cert).
    #[arg(long, env = "BLOBSTREAM_DPSS_CA", value_name = "FILE")]
    pub dpss_ca: Option<PathBuf>,
    /// Unix domain socket for bindings and transfers from processes on this host.
    #[arg(long, value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,
    /// Order in which bindings' messages leave: priority, deadline, fair or fifo.
    #[arg(long, default_value = "priority", value_parser = parse_policy)]
    pub schedule: bs_binding::Policy,
    /// Most bytes per second one binding gets (k/m/g suffixes); 0: no limit.
    #[arg(long, default_value = "0", value_parser = parse_rate, value_name = "BYTES_PER_SEC")]
    pub max_binding_rate: u64,
    /// Do not offer UDP to bindings.
    #[arg(long)]
    pub no_udp: bool,
    #[command(flatten)]
    pub tls: ServerTls,
    /// HTTP address of the HTTP API and the browser client (HTTPS with --tls-cert).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    pub http: SocketAddr,
    /// Do not start the HTTP server.
    #[arg(long, conflicts_with = "http")]
    pub no_http: bool,
    /// Largest HTTP upload, in bytes (k/m/g/t suffixes).
    #[arg(long, default_value = "64GiB", value_parser = positive_size, value_name = "BYTES")]
    pub max_upload: u64,
    /// Most HTTP uploads in progress at once (more get 503).
    #[arg(long, default_value_t = 64, value_parser = positive::<usize>)]
    pub max_uploads: usize,
    /// An HTTP upload slower than this on average (after its first 30 s) is dropped, so a
    /// client trickling bytes cannot hold an upload slot (k/m/g suffixes; 0: no floor).
    #[arg(long, default_value = "1k", value_parser = parse_rate, value_name = "BYTES_PER_SEC")]
    pub min_upload_rate: u64,
    /// Most HTTP connections open at once (more wait until one closes); a connection must
    /// send each request's headers within 30 s.
    #[arg(long, default_value_t = 1024, value_parser = positive::<usize>)]
    pub max_http_connections: usize,
    /// Do not put the sample images into an empty store.
    #[arg(long)]
    pub no_samples: bool,
    /// Directory of filter definitions (TOML kernels and chains), reloaded when it changes.
    #[arg(long, value_name = "DIR")]
    pub filters: Option<PathBuf>,
    /// Hours between background scrubs, which re-read every blob and check it against its
    /// digests (the first starts 10 minutes after start-up); 0 turns them off.
    #[arg(long, default_value_t = 24, value_name = "HOURS")]
    pub scrub_every: u64,
    /// Most MiB per second a background scrub reads.
    #[arg(long, default_value_t = 64, value_name = "MIB", value_parser = positive::<u64>)]
    pub scrub_rate: u64,
}

#[derive(Args)]
pub struct ScrubArgs {
    /// Only blobs whose names start with this.
    #[arg(default_value = "")]
    pub prefix: String,
    /// Most MiB read per second on the server (0: as fast as its disk goes).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PutArgs {
    /// The local file to upload (with -r: the folder).
    pub file: PathBuf,
    /// The blob's name (with -r: the prefix the folder's files go under, e.g. studies/ct-001/).
    pub key: String,
    #[command(flatten)]
    pub batch: BatchFlags,
    /// Content type [default: guessed from the file extension].
    #[arg(long)]
    pub content_type: Option<String>,
    /// User metadata, repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub meta: Vec<(String, String)>,
    /// Replace an existing blob.
    #[arg(long)]
    pub overwrite: bool,
    /// Start over instead of resuming an interrupted upload.
    #[arg(long)]
    pub no_resume: bool,
    #[command(flatten)]
    pub transfer: TransferFlags,
}

#[derive(Args)]
pub struct CheckArgs {
    /// The local file (with -r: the folder).
    pub file: PathBuf,
    /// The blob (with -r: the prefix).
    pub key: String,
    /// A folder against a prefix.
    #[arg(short, long)]
    pub recursive: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// With -r: compare only files and blobs matching GLOB (as put -r's --include),
    /// repeatable.
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// With -r: leave out files and blobs matching GLOB, repeatable; wins over --include.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Compare only with the digests recorded when the blobs were stored: the server does not
    /// re-read its copies (faster, but a blob rotted on the server's disk since would pass).
    #[arg(long)]
    pub recorded_only: bool,
}

/// Many blobs at once.
#[derive(Args, Default, Clone)]
pub struct BatchFlags {
    /// A whole folder (put) or prefix (get): every file, N at a time, each checked end to end;
    /// a summary at the end, and a non-zero exit naming every failure. Re-running finishes
    /// what is missing and skips what is already there.
    #[arg(short, long)]
    pub recursive: bool,
    #[command(flatten)]
    pub many: ManyFlags,
}

/// How a folder or prefix is copied (put -r, get -r, sync).
#[derive(Args, Default, Clone)]
pub struct ManyFlags {
    /// Copies in flight at once [default: 8] (small files gain most: each waits on a round
    /// trip and an fsync on the server).
    #[arg(long, value_name = "N", value_parser = positive::<usize>)]
    pub jobs: Option<usize>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Only files matching GLOB, repeatable. Without '/', GLOB matches the file name
    /// ('*.dcm' anywhere); with '/', the path relative to the folder or prefix, where '*'
    /// stays within a folder and '**' spans folders ('se1/*.dcm', '**/scout/**').
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Leave out files matching GLOB (as --include), repeatable; wins over --include.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
}

impl ManyFlags {
    /// Whether any of these flags was given (they only mean something with many blobs).
    pub fn given(&self) -> bool {
        self.jobs.is_some() || self.json || !self.include.is_empty() || !self.exclude.is_empty()
    }
}

#[derive(Args)]
pub struct SyncArgs {
    /// From: a local folder, or a prefix as bs:PREFIX (on --server) or
    /// blob://HOST:PORT/PREFIX.
    pub src: String,
    /// To: a prefix (when SRC is a folder) or a local folder (when SRC is a prefix).
    pub dst: String,
    /// Also remove what the destination holds under it and the source does not (within
    /// --include/--exclude). Refused when the source could not be read in full.
    #[arg(long)]
    pub delete: bool,
    #[command(flatten)]
    pub many: ManyFlags,
    #[command(flatten)]
    pub transfer: TransferFlags,
}

/// How a transfer's bytes travel.
#[derive(Args, Default, Clone)]
pub struct TransferFlags {
    /// Message layer for the transfer's bytes, top first, repeatable: compress:zstd[:level]
    /// or compress:lz4 (slow links, compressible data), checksum:xxh3|blake3 (per frame),
    /// fragment:SIZE, pace:BYTES/S (the transfer's rate, shared by its connections), null.
    /// The end-to-end digest is checked either way.
    #[arg(long = "layer", value_name = "LAYER")]
    pub layers: Vec<String>,
    /// Data connections for one blob moved between a file and a server, each carrying a
    /// range of it (GridFTP's MODE E): 0 chooses, using 4 for blobs of 64 MiB or more with a
    /// server 5 ms or more away and 1 otherwise. A connection done with its range takes over
    /// the second half of what is left of the longest other one.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub connections: usize,
}

#[derive(Args)]
pub struct GetArgs {
    /// The blob to download (with -r: the prefix whose blobs to download).
    pub key: String,
    /// The local file, or '-' for stdout (with -r: the folder, created if missing).
    pub file: String,
    #[command(flatten)]
    pub batch: BatchFlags,
    /// Start over instead of resuming an interrupted download.
    #[arg(long)]
    pub no_resume: bool,
    #[command(flatten)]
    pub transfer: TransferFlags,
}

#[derive(Args)]
pub struct LsArgs {
    /// List only blobs whose names start with this.
    #[arg(default_value = "")]
    pub prefix: String,
    /// Sizes in KiB, MiB, GiB (as `ls -h`; help is --help).
    #[arg(short = 'h', long)]
    pub human: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CpArgs {
    /// From: bs:NAME, blob://HOST:PORT/NAME or a local path.
    pub src: String,
    /// To: bs:NAME, blob://HOST:PORT/NAME or a local path.
    pub dst: String,
    /// Replace an existing destination blob.
    #[arg(long)]
    pub overwrite: bool,
    /// Start over instead of resuming an interrupted copy.
    #[arg(long)]
    pub no_resume: bool,
    #[command(flatten)]
    pub transfer: TransferFlags,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Push and pull 1–256 MB blobs against raw TCP, gRPC alone and iperf3.
    Transfer(BenchArgs),
    /// A 50-file study through put -r and get -r against one raw TCP stream and against 50
    /// single puts.
    Batch(BenchArgs),
    /// Every filter on 512², 2048² and 4096² images against OpenCV and Pillow.
    Filters(BenchArgs),
    /// Download 1, 32 and 256 MB blobs over HTTP against nginx (loaded by wrk); time to first
    /// image in the browser.
    Http(BenchArgs),
    /// Bindings: round trips against raw TCP and tonic, bulk against raw TCP and iperf3 with
    /// 0–8 null layers, the buffer pool against malloc, priority latency under load per
    /// scheduling policy, compression on a paced link.
    Bindings(BenchArgs),
    /// The distributer: 1 → 1, 2, 4 receivers against ZeroMQ PUB/SUB, against point to point,
    /// and with a stalled receiver.
    Fanout(BenchArgs),
    /// The parallel block store: one server's cached blocks against raw TCP, K = 1..4 servers
    /// behind shaped links (network namespaces, as root) against K × B, and lattice
    /// declustering against disk modulo and the optimum.
    Dpss(BenchArgs),
    /// Shared storage: put/get of 1–256 MB through blobstream on S3 (Garage) against
    /// object_store alone, the memory tier against the filesystem store, and 1–3 front ends
    /// sharing one bucket and one PostgreSQL catalogue.
    S3(BenchArgs),
    /// DICOM decode throughput per transfer syntax against pydicom with its pylibjpeg,
    /// openjpeg, RLE and JPEG-LS plugins, on the same files.
    Dicom(BenchArgs),
    /// DICOMweb: STOW-RS and WADO-RS of a 200-slice CT series against Orthanc with its
    /// DICOMweb plugin on the same machine.
    Dicomweb(BenchArgs),
    /// A 1 GiB blob pulled and put over a 1 Gbit/s, 50 ms round-trip link (network
    /// namespaces, as root) with 1, 2, 4 and 8 connections, against the link and iperf3 -P N.
    Lfn(BenchArgs),
    /// Not a benchmark: the user-space delay line the namespace scripts put between two
    /// network namespaces (this kernel has no netem). Creates TUN devices A and B, prints
    /// "ready", and forwards packets both ways with the delay, rate, queue and loss given,
    /// until stopped.
    #[command(name = "delay-line")]
    DelayLine(DelayLineArgs),
}

#[derive(Args)]
pub struct DelayLineArgs {
    /// The TUN device on one side (created by this command).
    pub a: String,
    /// The TUN device on the other side.
    pub b: String,
    /// One-way delay, each way, in milliseconds (the RTT is twice this).
    #[arg(long, default_value_t = 25.0)]
    pub delay_ms: f64,
    /// Bottleneck rate each way, in Mbit/s; 0: unlimited.
    #[arg(long, default_value_t = 1000)]
    pub rate_mbit: u64,
    /// Longest a packet queues at the bottleneck before it is dropped, in milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub queue_ms: f64,
    /// Packets lost at random, in parts per million (100 = 0.01 %).
    #[arg(long, default_value_t = 0)]
    pub loss_ppm: u32,
    /// Seed of the loss pattern (the same seed loses the same packets).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Args)]
pub struct BenchArgs {
    /// A short run (seconds to a minute): prints the table only, does not rewrite
    /// BENCHMARKS.md.
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where the full run's report goes.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub output: PathBuf,
}

/// A token given on the command line or in its environment variable: `@FILE` reads it from
/// FILE (trimmed), which keeps it out of the process list (`ps` shows every argument).
fn secret(s: &str) -> Result<String, String> {
    let token = match s.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("reading the token file {path}: {e}"))?
            .trim()
            .to_string(),
        None => s.to_string(),
    };
    if token.is_empty() {
        return Err(format!("the token in {s:?} is empty"));
    }
    Ok(token)
}

/// A count, a number of seconds or a rate that 0 would make useless (every transfer refused,
/// every token expired at once, every wait over before it began): 1 or more.
fn positive<T: std::str::FromStr + PartialEq + From<u8>>(s: &str) -> Result<T, String> {
    match s.trim().parse::<T>() {
        Ok(n) if n == T::from(0) => Err("0 would refuse or end everything: give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// [`parse_rate`] of a size or rate that must not be 0.
fn positive_size(s: &str) -> Result<u64, String> {
    match parse_rate(s)? {
        0 => Err("0 would refuse everything: give 1 or more".into()),
        n => Ok(n),
    }
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::secret;

    /// Every command, flag and argument says what it is for in `--help` (none listed bare).
    #[test]
    fn every_command_flag_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, bare: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    bare.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    bare.push(here.clone());
                }
                walk(sub, &here, bare);
            }
        }
        let mut bare = Vec::new();
        walk(&<super::Cli as clap::CommandFactory>::command(), "blobstream", &mut bare);
        assert!(bare.is_empty(), "without help text: {bare:#?}");
    }

    #[test]
    fn a_token_is_taken_as_given_or_read_from_the_file_after_an_at_sign() {
        assert_eq!(secret("s3cret").unwrap(), "s3cret");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "from-file\n").unwrap();
        assert_eq!(secret(&format!("@{}", f.display())).unwrap(), "from-file");
        std::fs::write(&f, " \n").unwrap();
        assert!(secret(&format!("@{}", f.display())).unwrap_err().contains("empty"));
        let missing = secret(&format!("@{}", dir.path().join("nope").display())).unwrap_err();
        assert!(missing.contains("reading the token file"), "{missing}");
        assert!(secret("").is_err());
    }
}
