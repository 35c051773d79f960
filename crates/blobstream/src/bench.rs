//! `blobstream bench …`: runs a benchmark, prints its table (or JSON), and for full runs
//! rewrites its section of BENCHMARKS.md.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use bs_bench::{TransferBenchOptions, run_transfer, write_benchmarks_md};

use crate::cli::{BenchArgs, BenchCommand};

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Transfer(a) => transfer(a),
    }
}

fn transfer(a: BenchArgs) -> Result<()> {
    let chatty = std::io::stderr().is_terminal() || !a.json;
    let opts = TransferBenchOptions {
        quick: a.quick,
        progress: chatty.then(|| {
            Box::new(|line: &str| eprintln!("  {line}")) as Box<dyn Fn(&str) + Send + Sync>
        }),
    };
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
