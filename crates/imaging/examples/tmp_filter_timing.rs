//! Throwaway timing of the xv filters (deleted after use).

use std::time::Instant;

use bs_imaging::filters::builtins;
use bs_imaging::{DynImage, Image, Params, Run};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map(String::as_str).unwrap_or("blur");
    let pix = args.get(2).map(String::as_str).unwrap_or("rgb8");
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let size: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let params = Params::parse(&args[5.min(args.len())..]).unwrap();
    let mut x = 12345u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let img = match pix {
        "rgb8" => DynImage::U8(
            Image::from_vec(size, size, 3, (0..size * size * 3).map(|_| rnd() as u8).collect())
                .unwrap(),
        ),
        "gray8" => DynImage::U8(
            Image::from_vec(size, size, 1, (0..size * size).map(|_| rnd() as u8).collect())
                .unwrap(),
        ),
        _ => DynImage::U16(
            Image::from_vec(size, size, 1, (0..size * size).map(|_| rnd() as u16).collect())
                .unwrap(),
        ),
    };
    let f = builtins().into_iter().find(|f| f.info().name == name).unwrap();
    let run = Run::with_threads(threads);
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let out = f.apply(&img, &params, &run).unwrap();
        times.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    let mut ct = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        std::hint::black_box(img.clone());
        ct.push(t.elapsed().as_secs_f64());
    }
    ct.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("clone: {:.2} ms", ct[3] * 1e3);
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = times[times.len() / 2];
    println!(
        "{name} {pix} {size}² threads {threads} {params:?}: {:.2} ms, {:.0} Mpix/s",
        med * 1e3,
        (size * size) as f64 / med / 1e6
    );
}
