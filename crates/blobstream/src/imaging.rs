//! The image commands: `filters` (list), `filter` (apply to a file) and `image-info`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use bs_imageio::{Format, Limits};
use bs_imaging::{Output, Params, Registry, Run};

use crate::cli::{FilterArgs, FiltersArgs};

fn registry(defs: &Option<PathBuf>) -> Result<Registry> {
    Ok(match defs {
        Some(dir) => Registry::with_dir(dir)
            .with_context(|| format!("loading filter definitions from {}", dir.display()))?,
        None => Registry::builtin(),
    })
}

pub fn filters(a: FiltersArgs) -> Result<()> {
    let list = registry(&a.defs)?.list();
    if a.json {
        let v: Vec<_> = list
            .iter()
            .map(|f| {
                serde_json::json!({
                    "name": f.name,
                    "kind": f.kind,
                    "summary": f.summary,
                    "source": f.source,
                    "params": f.params.iter().map(|p| serde_json::json!({
                        "name": p.name, "default": p.default, "range": p.range, "help": p.help,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for f in &list {
        let params: Vec<String> =
            f.params.iter().map(|p| format!("{}={}", p.name, p.default)).collect();
        println!("{:<16} {:<8} {}", f.name, f.kind, f.summary);
        if !params.is_empty() {
            println!("{:<16} {:<8} params: {}", "", "", params.join(" "));
        }
    }
    Ok(())
}

pub fn filter(a: FilterArgs) -> Result<()> {
    let reg = registry(&a.defs)?;
    // A malformed or repeated --param is a usage error (exit 2), as clap's own are.
    let params = Params::parse(&a.params).map_err(|e| match e {
        bs_imaging::ImagingError::BadParam { param, reason, .. } => {
            crate::commands::Usage(format!("--param {param}: {reason}")).into()
        }
        e => anyhow::Error::from(e),
    })?;
    // Check the filter and its parameters before reading a possibly large file.
    let f = reg.get(&a.name)?;
    f.info().check_known(&params)?;
    if a.threads > std::thread::available_parallelism().map_or(1, |n| n.get()) {
        anyhow::bail!("--threads {} is more than this machine's cores (0 = all)", a.threads);
    }
    let limits = Limits { max_pixels: a.max_pixels, ..Limits::default() };
    let input = bs_imageio::read(&a.input, &limits)?;
    // The window's center and width in modality units (HU for CT), as radiologists state them.
    let params = bs_imageio::in_modality_units(&input.meta, &*f, &params, Output::Values);
    let t = Instant::now();
    let out = f.apply(&input.image, &params, &Run::with_threads(a.threads))?;
    let took = t.elapsed();
    // The result is held to the input's limit too (a zoom can multiply the pixels), as the
    // HTTP API holds it.
    let pixels = (out.width() as u64).saturating_mul(out.height() as u64);
    if pixels > a.max_pixels {
        anyhow::bail!(
            "{} made an image of {}×{} pixels, over the limit of {} (--max-pixels)",
            a.name,
            out.width(),
            out.height(),
            a.max_pixels
        );
    }
    // JPEG and GIF hold 8 bits: the result windowed for display (see `to_eight_bits`).
    let ext = a.output.extension().and_then(|e| e.to_str()).unwrap_or_default();
    let out = match Format::from_extension(ext) {
        Some(fmt) if fmt.eight_bits_only() => {
            bs_imageio::to_eight_bits(out, input.format, &input.meta, f.output(&params))
        }
        _ => out,
    };
    bs_imageio::write(&a.output, &out)?;
    eprintln!(
        "{}: {}×{} {} in {:.1} ms -> {}",
        a.name,
        out.width(),
        out.height(),
        input.image.kind(),
        took.as_secs_f64() * 1e3,
        a.output.display()
    );
    Ok(())
}

pub fn image_info(file: &Path, json: bool, max_pixels: u64) -> Result<()> {
    // The header and the first frame tell everything shown; a cine's other frames are
    // counted, not decoded.
    let limits = Limits { max_frames_decoded: 1, max_pixels, ..Limits::default() };
    let d = bs_imageio::read(file, &limits)?;
    if json {
        let mut v = serde_json::to_value(&d.meta)?;
        v["format"] = serde_json::Value::from(d.format.name());
        v["file"] = serde_json::Value::from(file.display().to_string());
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("file:   {}", file.display());
    println!("format: {}", d.format.name());
    for (k, v) in d.meta.to_map() {
        println!("{k}: {v}");
    }
    Ok(())
}
