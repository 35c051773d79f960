//! `blobstream bench …`: runs a benchmark, prints its table (or JSON), and for full runs
//! rewrites its section of BENCHMARKS.md.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use bs_bench::{BenchOptions, run_filters, run_http, run_transfer, write_benchmarks_md};

use crate::cli::{BenchArgs, BenchCommand};

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
    let (a, section) = match &cmd {
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
