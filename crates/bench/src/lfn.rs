//! Long fat network: a 1 GiB blob pulled and put over a 1 Gbit/s link with a 50 ms round trip
//! and 0.01 % loss (two network namespaces joined by the user-space delay line,
//! `scripts/lfn-hosts.py --bench`), with 1, 2, 4 and 8 connections (`--connections N`),
//! against the link's rate and against iperf3 -P N over the same link, the same way.

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::median;

/// One direction's rows: (verb, our rates' key, iperf3's key, iperf3's flags, the key of
/// iperf3's rates with our send buffer).
const WAYS: [(&str, &str, &str, &str, &str); 2] = [
    ("get", "blobstream_mbit", "iperf3_mbit", "-R", "iperf3_w_mbit"),
    ("put", "put_mbit", "iperf3_up_mbit", "", "iperf3_up_w_mbit"),
];

/// Run the benchmark; no rows (a note says why) when this process cannot build the link.
pub fn run_lfn(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    let runs = if opts.quick { 1 } else { 3 };
    let what = "1 GiB pulled and put over a 1 Gbit/s, 50 ms link with 1, 2, 4, 8 connections, \
                and iperf3";
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let Some(v) = crate::hosts::run_script(opts, "lfn-hosts.py", runs, what)? else {
        notes.push(
            "not root, or no ip/tc: no long-fat-network rows (they need network namespaces, ss \
             and /dev/net/tun)"
                .into(),
        );
        return Ok(report(opts, runs, rows, notes));
    };
    let link = v["link_mbit"].as_f64().unwrap_or(1000.0);
    let rates = |key: &str, n: u32| -> Vec<f64> { crate::hosts::numbers(&v[key][n.to_string()]) };
    let window = v["iperf3_window"].as_u64().unwrap_or(0);
    // Each run's rate, so the spread behind a median shows.
    let mut each = Vec::new();
    // iperf3's own figures (its data phase), beside the rates timed as ours are.
    let mut own_figures = Vec::new();
    for (verb, ours_key, theirs_key, flags, windowed_key) in WAYS {
        for n in [1u32, 2, 4, 8] {
            let ours = rates(ours_key, n);
            if ours.is_empty() {
                return Err(BenchError::Baseline(format!("no {verb} rates for {n} connections")));
            }
            let listed: Vec<String> = ours.iter().map(|r| format!("{r:.0}")).collect();
            each.push(format!("{verb} × {n}: {}", listed.join(", ")));
            let m = median(&ours);
            rows.push(Row {
                group: "long fat network",
                what: format!(
                    "{verb} of 1 GiB over {n} connection(s), 50 ms RTT, 0.01 % loss: against the \
                     link"
                ),
                ours: m,
                baseline: link,
                baseline_name: format!("the link, {link} Mbit/s"),
                unit: "Mbit/s",
                ratio: m / link,
                ratio_means: "ours / link rate",
                target: Some((0.9, true)),
            });
            let theirs = rates(theirs_key, n);
            let iperf = format!("iperf3 {flags} -P {n}").replace("  ", " ");
            let own = rates(&format!("{theirs_key}_own"), n);
            if !own.is_empty() {
                own_figures.push(format!("{iperf}: {:.0}", median(&own)));
            }
            if theirs.is_empty() {
                notes.push(format!("iperf3 is not installed or failed: no row for {iperf}"));
                continue;
            }
            // Our rate against an iperf3 run's (median of its rates).
            let against = |iperf: String, theirs: &[f64], target| {
                let i = median(theirs);
                Row {
                    group: "long fat network",
                    what: format!("{verb} of 1 GiB over {n} connection(s): against {iperf}"),
                    ours: m,
                    baseline: i,
                    baseline_name: format!("{iperf} -n 1G"),
                    unit: "Mbit/s",
                    ratio: m / i,
                    ratio_means: "ours / iperf3",
                    target,
                }
            };
            rows.push(against(iperf, &theirs, Some((1.0, true))));
            // The same iperf3 with the send buffer our far connections ask for (informative).
            let windowed = rates(windowed_key, n);
            if !windowed.is_empty() {
                let iperf = format!("iperf3 {flags} -P {n} -w {}", mib(window)).replace("  ", " ");
                rows.push(against(iperf, &windowed, None));
            }
        }
    }
    notes.push(format!("Our rate in each run, Mbit/s: {}.", each.join("; ")));
    notes.push(format!(
        "The link: two network namespaces joined by `blobstream bench delay-line` (TUN devices, \
         MTU 9000; this kernel has no netem), {link} Mbit/s each way with a 50 ms queue, 25 ms \
         each way, 0.01 % random loss from a fixed seed. Both sides do the same work and are \
         timed the same way: 1 GiB moved by one command (iperf3 -n 1G), from the process's \
         start to its exit, so process start, connections, negotiation, slow start and the \
         end of the transfer count for both (iperf3 ends when its sender has written the \
         last byte, its receiver perhaps still reading). blobstream also digests and stores: a get \
         digests the file as it fills and fsyncs it; a put's server checks each chunk it wrote \
         against the client's chunk digests before it commits; iperf3 stores nothing. \
         iperf3's own figures, which count its data phase only (median, Mbit/s): {}. \
         Kernel autotuning caps a send buffer at net.ipv4.tcp_wmem's maximum, which bounds one \
         stream of this link to about 420 Mbit/s; blobstream's data connections to a far peer \
         (a shortest round trip of 5 ms or more) get a larger one: 64 MiB (the kernel doubles \
         it) where the process may go past net.core.wmem_max, as root may (SO_SNDBUFFORCE; \
         here both ends run as root), else net.core.wmem_max ({}), with TCP_NOTSENT_LOWAT {} \
         KiB so that the buffer holds data in flight, not a queue. iperf3 keeps autotuning \
         unless given -w, which cannot go past net.core.wmem_max (the rows with -w, shown for \
         one and two connections, where the buffer is what bounds iperf3's rate). Files are \
         written behind the transfer (each 32 MiB started to disk and fdatasynced as the \
         transfer goes on), so the final fsync has little left to do. With 2 or more \
         connections, a get cuts the blob into ranges of 16 MiB or more that the connections \
         take in order, each asked for in pieces of 1 MiB sent ahead on the same connection \
         (about four round trips of its rate, 4 MiB at least); a put cuts the file into one \
         range per connection. A connection out of work takes over the second half of the \
         longest rest another has not asked for (a get) or not sent (a put), in halves of \
         2 MiB at least, so a copy does not end on one connection that a loss slowed down.",
        own_figures.join("; "),
        mib(window),
        bs_transport::far::FAR_UNSENT >> 10,
    ));
    Ok(report(opts, runs, rows, notes))
}

/// `n` bytes as iperf3 reads a size: whole MiB as "4M", else bytes.
fn mib(n: u64) -> String {
    if n > 0 && n.is_multiple_of(1 << 20) { format!("{}M", n >> 20) } else { n.to_string() }
}

fn report(opts: &BenchOptions, runs: usize, rows: Vec<Row>, notes: Vec<String>) -> RowsReport {
    RowsReport {
        title: "Long fat network",
        command: "blobstream bench lfn",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    }
}
