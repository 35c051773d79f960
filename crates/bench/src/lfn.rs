//! Long fat network: a 1 GiB blob pulled over a 1 Gbit/s link with a 50 ms round trip and
//! 0.01 % loss (two network namespaces joined by the user-space delay line,
//! `scripts/lfn-hosts.py --bench`), with 1, 2, 4 and 8 connections (`get --connections N`),
//! against the link's rate and against iperf3 -R -P N over the same link.

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::median;

/// Run the benchmark; no rows (a note says why) when this process cannot build the link.
pub fn run_lfn(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    let runs = if opts.quick { 1 } else { 3 };
    let what = "1 GiB pulled over a 1 Gbit/s, 50 ms link with 1, 2, 4, 8 connections, and iperf3";
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    match crate::hosts::run_script(opts, "lfn-hosts.py", runs, what)? {
        None => notes.push(
            "not root, or no ip/tc: no long-fat-network rows (they need network namespaces)".into(),
        ),
        Some(v) => {
            let link = v["link_mbit"].as_f64().unwrap_or(1000.0);
            let rates = |who: &str, n: u32| -> Vec<f64> {
                v[who][n.to_string()]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_f64())
                    .collect()
            };
            for n in [1u32, 2, 4, 8] {
                let ours = rates("blobstream_mbit", n);
                if ours.is_empty() {
                    return Err(BenchError::Baseline(format!("no rates for {n} connections")));
                }
                let m = median(&ours);
                let link_what = format!(
                    "get of 1 GiB over {n} connection(s), 50 ms RTT, 0.01 % loss: against the link"
                );
                rows.push(Row {
                    group: "long fat network",
                    what: link_what,
                    ours: m,
                    baseline: link,
                    baseline_name: format!("the link, {link} Mbit/s"),
                    unit: "Mbit/s",
                    ratio: m / link,
                    ratio_means: "ours / link rate",
                    target: Some((0.9, true)),
                });
                let theirs = rates("iperf3_mbit", n);
                if theirs.is_empty() {
                    notes.push(format!("iperf3 is not installed or failed: no row for -P {n}"));
                    continue;
                }
                let i = median(&theirs);
                rows.push(Row {
                    group: "long fat network",
                    what: format!("get of 1 GiB over {n} connection(s): against iperf3 -R -P {n}"),
                    ours: m,
                    baseline: i,
                    baseline_name: format!("iperf3 -R -P {n}, 8 s"),
                    unit: "Mbit/s",
                    ratio: m / i,
                    ratio_means: "ours / iperf3",
                    target: Some((1.0, true)),
                });
            }
            notes.push(format!(
                "The link: two network namespaces joined by `blobstream bench delay-line` (TUN \
                 devices, MTU 9000; this kernel has no netem), {link} Mbit/s each way with a \
                 50 ms queue, 25 ms each way, 0.01 % random loss from a fixed seed. Our rate is \
                 the whole command's: process start, negotiation, slow start and the final \
                 digest check included; iperf3 runs 8 s."
            ));
        }
    }
    Ok(RowsReport {
        title: "Long fat network",
        command: "blobstream bench lfn",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}
