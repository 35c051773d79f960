//! `blobstream bench …`: runs a benchmark, prints its table (or JSON), and for full runs
//! rewrites its section of BENCHMARKS.md.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use bs_bench::{BenchOptions, run_filters, run_http, run_transfer, write_benchmarks_md};

use crate::cli::{BenchArgs, BenchCommand, DelayLineArgs};

/// What every benchmark hands back for printing and for BENCHMARKS.md.
struct Outcome {
    json: serde_json::Value,
    table: String,
    markdown: String,
    /// False when nothing was compared (a baseline tool is missing): a full run then keeps
    /// the section of an earlier run.
    worth_writing: bool,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    if let BenchCommand::DelayLine(d) = &cmd {
        return delay_line(d);
    }
    let (a, section) = match &cmd {
        BenchCommand::DelayLine(_) => unreachable!("handled above"),
        BenchCommand::Transfer(a) => (a, "transfer"),
        BenchCommand::Filters(a) => (a, "filters"),
        BenchCommand::Http(a) => (a, "http"),
        BenchCommand::Bindings(a) => (a, "bindings"),
        BenchCommand::Fanout(a) => (a, "fanout"),
        BenchCommand::Batch(a) => (a, "batch"),
        BenchCommand::Dpss(a) => (a, "dpss"),
        BenchCommand::S3(a) => (a, "s3"),
        BenchCommand::Dicom(a) => (a, "dicom"),
        BenchCommand::Dicomweb(a) => (a, "dicomweb"),
        BenchCommand::Lfn(a) => (a, "lfn"),
    };
    let opts = BenchOptions { quick: a.quick, progress: progress(a) };
    let outcome = match &cmd {
        BenchCommand::Transfer(_) => {
            let r = run_transfer(&opts).context("transfer benchmark")?;
            Outcome {
                json: r.to_json(),
                table: r.print_table(),
                markdown: r.to_markdown(),
                worth_writing: true,
            }
        }
        BenchCommand::Filters(_) => {
            let r = run_filters(&opts).context("filter benchmark")?;
            Outcome {
                json: r.to_json(),
                table: r.print_table(),
                markdown: r.to_markdown(),
                worth_writing: true,
            }
        }
        BenchCommand::Http(_) => {
            let r = run_http(&opts).context("HTTP benchmark")?;
            Outcome {
                json: r.to_json(),
                table: r.print_table(),
                markdown: r.to_markdown(),
                worth_writing: r.downloads_measured(),
            }
        }
        BenchCommand::Bindings(_) => {
            rows(bs_bench::run_bindings(&opts).context("bindings benchmark")?)
        }
        BenchCommand::Fanout(_) => rows(bs_bench::run_fanout(&opts).context("fan-out benchmark")?),
        BenchCommand::Dpss(_) => rows(bs_bench::run_dpss(&opts).context("block store benchmark")?),
        BenchCommand::S3(_) => rows(bs_bench::run_s3(&opts).context("shared storage benchmark")?),
        BenchCommand::Dicom(_) => rows(bs_bench::run_dicom(&opts).context("DICOM benchmark")?),
        BenchCommand::Dicomweb(_) => {
            rows(bs_bench::run_dicomweb(&opts).context("DICOMweb benchmark")?)
        }
        BenchCommand::DelayLine(_) => unreachable!("handled above"),
        BenchCommand::Lfn(_) => {
            rows(bs_bench::run_lfn(&opts).context("long fat network benchmark")?)
        }
        BenchCommand::Batch(_) => {
            let me = std::env::current_exe().context("finding the blobstream binary")?;
            rows(bs_bench::run_batch(&opts, &me).context("batch benchmark")?)
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&outcome.json)?);
    } else {
        print!("{}", outcome.table);
    }
    let missed = outcome.table.matches('✗').count();
    if missed > 0 {
        eprintln!(
            "{missed} target(s) missed (marked ✗): a benchmark reports, it does not fail; its \
             exit status says only whether it ran"
        );
    }
    if a.quick {
        return Ok(());
    }
    if !outcome.worth_writing {
        eprintln!("not writing {}: nothing was compared (see the notes)", a.output.display());
        return Ok(());
    }
    write_benchmarks_md(&a.output, section, &outcome.markdown)
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!("wrote {}", a.output.display());
    Ok(())
}

fn rows(r: bs_bench::RowsReport) -> Outcome {
    Outcome {
        json: r.to_json(),
        table: r.print_table(),
        markdown: r.to_markdown(),
        worth_writing: true,
    }
}

fn progress(a: &BenchArgs) -> Option<bs_bench::Progress> {
    (std::io::stderr().is_terminal() || !a.json)
        .then(|| Box::new(|line: &str| eprintln!("  {line}")) as bs_bench::Progress)
}

fn delay_line(d: &DelayLineArgs) -> Result<()> {
    let ms = |v: f64, what: &str| {
        anyhow::ensure!(v.is_finite() && (0.0..=10_000.0).contains(&v), "--{what} {v}: 0 to 10000");
        Ok(std::time::Duration::from_secs_f64(v / 1000.0))
    };
    let shape = bs_bench::delayline::LinkShape {
        delay: ms(d.delay_ms, "delay-ms")?,
        rate_bps: d.rate_mbit.saturating_mul(1_000_000),
        queue: ms(d.queue_ms, "queue-ms")?,
        loss_ppm: d.loss_ppm,
        seed: d.seed,
    };
    let back = bs_bench::delayline::LinkShape { seed: d.seed.wrapping_add(1), ..shape };
    bs_bench::delayline::run(&d.a, &d.b, shape, back, || println!("ready"))
        .with_context(|| format!("delay line between TUN devices {} and {}", d.a, d.b))
}
