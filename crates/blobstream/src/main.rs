//! `blobstream`: the one binary — the store server (`serve`), the client commands (`put`,
//! `get`, `cat`, `ls`, `stat`, `rm`, `cp`), the image tools (`filters`, `filter`,
//! `image-info`) and the benchmarks (`bench`).

mod batch;
mod bench;
mod bind;
mod check;
mod cli;
mod commands;
mod distrib;
mod dpss;
mod imaging;
mod probe;
mod progress;
mod scrub;
mod security;
mod serve;
mod signals;
mod storage;
mod table;

use std::process::ExitCode;

fn main() -> ExitCode {
    tune_allocator();
    let cli = cli::Cli::parse_args();
    let server = cli.global.server.clone();
    let tls = cli.global.tls_ca.is_some();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that closed the pipe (`cat … | head`) is a normal end for a Unix filter.
        Err(e) if commands::stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let line = format!("{}{}", one_line(&e), hint(&e, &server, tls));
            eprintln!("blobstream: error: {}", commands::shown(&line));
            // A command line that cannot work is a usage error, as clap's own (exit 2).
            if e.downcast_ref::<commands::Usage>().is_some() {
                ExitCode::from(2)
            } else if e.downcast_ref::<commands::Interrupted>().is_some() {
                ExitCode::from(signals::INTERRUPTED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// What to add to a client's error that does not say where it went: a wait that timed out,
/// a peer that closed the connection without a word (as the data plane's port does to
/// control-plane calls, and a TLS server to a client without TLS), or TLS (`tls`: --tls-ca
/// given) met with bytes that are none.
fn hint(e: &anyhow::Error, server: &str, tls: bool) -> String {
    use bs_client::ClientError;
    // A local image over the pixel limit: the commands that read one take a higher limit.
    let image = e.chain().find_map(|c| c.downcast_ref::<bs_imageio::ImageIoError>());
    if let Some(bs_imageio::ImageIoError::TooLarge { .. }) = image {
        return " (--max-pixels raises the limit)".into();
    }
    let client = e.chain().find_map(|c| {
        c.downcast_ref::<ClientError>().or_else(|| match c.downcast_ref::<bs_blob::BlobError>() {
            Some(bs_blob::BlobError::Remote(c)) => Some(c),
            _ => None,
        })
    });
    let server = bs_client::with_default_port(server);
    if tls && e.chain().any(|c| bs_transport::peer_speaks_no_tls(&c.to_string())) {
        return format!(
            " (the server at {server} does not speak TLS: leave out --tls-ca, or check the \
             address)"
        );
    }
    match client {
        Some(ClientError::Timeout) => format!(" (waiting for the server at {server})"),
        Some(e) if e.is_transport_failure() && !tls && probe::speaks_tls(&server) => {
            format!(" (the server at {server} speaks TLS: give its CA certificate with --tls-ca)")
        }
        // A data connection lost under a transfer ("Broken pipe", "closed … before the next
        // frame"): the server stopped, or the network between went down.
        Some(e) if e.is_connection_lost() && !matches!(e, ClientError::Connect { .. }) => {
            format!(
                " (the connection to the server at {server} was lost mid-transfer: is it running?)"
            )
        }
        Some(e) if e.is_transport_failure() => {
            format!(
                " (is {server} a blobstream control plane? `serve` prints its ports: the data \
                 plane's takes no commands)"
            )
        }
        _ => String::new(),
    }
}

/// One clear line: the error and its causes, each said once (an error whose message already
/// holds its cause's, as many I/O errors do, would otherwise repeat it).
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.last().is_some_and(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}

fn run(cli: cli::Cli) -> anyhow::Result<()> {
    use cli::Command::*;
    let g = &cli.global;
    match cli.command {
        Serve(a) => serve::run(g, a),
        Put(a) => commands::put(g, a),
        Get(a) => commands::get(g, a),
        Cat { key } => commands::get(
            g,
            cli::GetArgs {
                key,
                file: "-".into(),
                no_resume: true,
                batch: Default::default(),
                transfer: Default::default(),
            },
        ),
        Ls(mut a) => {
            a.prefix = commands::blob_name(a.prefix)?;
            commands::ls(g, a)
        }
        Stat { key, json } => commands::stat(g, &commands::blob_name(key)?, json),
        Rm { keys, recursive } => {
            let keys =
                keys.into_iter().map(commands::blob_name).collect::<anyhow::Result<Vec<_>>>()?;
            commands::rm(g, &keys, recursive)
        }
        Cp(a) => commands::cp(g, a),
        Sync(a) => batch::sync(g, a),
        Filters(a) => imaging::filters(a),
        Filter(a) => imaging::filter(a),
        ImageInfo { file, json, max_pixels } => imaging::image_info(&file, json, max_pixels),
        Bench(b) => bench::run(b),
        Scrub(mut a) => {
            a.prefix = commands::blob_name(a.prefix)?;
            scrub::run(g, a)
        }
        Check(mut a) => {
            a.key = commands::blob_name(a.key)?;
            check::run(g, a)
        }
        Bind(a) => bind::run(g, a),
        Bindings { json } => bind::list(g, json),
        Distributer(a) => distrib::distributer(a),
        Send(a) => distrib::send(g, a),
        Receive(a) => distrib::receive(g, a),
        Dpss(c) => dpss::run(g, c),
    }
}

/// Keep freed memory for reuse instead of handing it back to the kernel at once. glibc trims
/// the heap as soon as more than 128 KiB is free at its top (its dynamic threshold only rises
/// to twice the largest mmapped block), so every image decode, filter output or transfer
/// buffer of a few hundred KiB comes back as fresh pages: about 230 page faults for one 512²
/// CT decode, three quarters of its time. With these settings up to 256 MiB of freed heap is
/// kept and blocks below 32 MiB come from it; larger ones are still mapped and unmapped.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation policy; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
