//! `blobstream bench …`: runs a benchmark, prints its table (or JSON), and for full runs
//! rewrites its section of BENCHMARKS.md.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use bs_bench::{
    FilterBenchOptions, HttpBenchOptions, Progress, TransferBenchOptions, run_filters, run_http,
    run_transfer, write_benchmarks_md,
};

use crate::cli::{BenchArgs, BenchCommand};

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Transfer(a) => transfer(a),
        BenchCommand::Filters(a) => filters(a),
        BenchCommand::Http(a) => http(a),
    }
}

fn progress(a: &BenchArgs) -> Option<Progress> {
    (std::io::stderr().is_terminal() || !a.json)
        .then(|| Box::new(|line: &str| eprintln!("  {line}")) as Box<dyn Fn(&str) + Send + Sync>)
}

fn filters(a: BenchArgs) -> Result<()> {
    let opts = FilterBenchOptions { quick: a.quick, progress: progress(&a) };
    let report = run_filters(&opts).context("filter benchmark")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.print_table());
    }
    if !a.quick {
        write_benchmarks_md(&a.output, "filters", &report.to_markdown())
            .with_context(|| format!("writing {}", a.output.display()))?;
        eprintln!("wrote {}", a.output.display());
    }
    Ok(())
}

fn transfer(a: BenchArgs) -> Result<()> {
    let opts = TransferBenchOptions { quick: a.quick, progress: progress(&a) };
    let report = run_transfer(&opts).context("transfer benchmark")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.print_table());
    }
    if !a.quick {
        write_benchmarks_md(&a.output, "transfer", &report.to_markdown())
            .with_context(|| format!("writing {}", a.output.display()))?;
        eprintln!("wrote {}", a.output.display());
    }
    Ok(())
}

fn http(a: BenchArgs) -> Result<()> {
    let opts = HttpBenchOptions { quick: a.quick, progress: progress(&a) };
    let report = run_http(&opts).context("HTTP benchmark")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.print_table());
    }
    if !a.quick {
        // Without nginx or wrk nothing was compared: keep the section of an earlier full run.
        if !report.downloads_measured() {
            eprintln!("not writing {}: no download was measured", a.output.display());
            return Ok(());
        }
        write_benchmarks_md(&a.output, "http", &report.to_markdown())
            .with_context(|| format!("writing {}", a.output.display()))?;
        eprintln!("wrote {}", a.output.display());
    }
    Ok(())
}
