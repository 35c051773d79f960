use bs_bench::*;
use std::collections::BTreeMap;
fn cpu() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let name =
            std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim().to_string();
        let s = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
        let ns: u64 = s.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0);
        *m.entry(name).or_insert(0) += ns;
    }
    m
}
fn main() {
    let size: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let n: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let mode =
        if std::env::args().nth(3).as_deref() == Some("pull") { Mode::Pull } else { Mode::Push };
    let data = payload(size as u64);
    for p in [Path::Blobstream, Path::RawTcp, Path::Blobstream, Path::RawTcp] {
        let mut a = start_runner(p).unwrap();
        a.prepare(mode, &data, 0).unwrap();
        a.transfer(mode, &data, 0).unwrap();
        let mut g = vec![];
        let mut tot: BTreeMap<String, u64> = BTreeMap::new();
        for _ in 0..n {
            let c0 = cpu();
            let t = a.transfer(mode, &data, 0).unwrap();
            let c1 = cpu();
            for (k, v) in &c1 {
                *tot.entry(k.clone()).or_insert(0) += v - c0.get(k).copied().unwrap_or(0);
            }
            g.push(t.gbit_per_s);
        }
        g.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let per: Vec<String> = tot
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={:.0}us", *v as f64 / n as f64 / 1000.0))
            .collect();
        println!(
            "{p:?} {mode:?}: median {:.2} Gbit/s ({:.0} us), cpu per transfer: {}",
            g[n / 2],
            size as f64 * 8.0 / g[n / 2] / 1000.0,
            per.join(" ")
        );
    }
}
