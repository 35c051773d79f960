//! A one-line description of the machine a benchmark ran on: kernel, CPUs, memory.

use std::process::Command;

/// `uname -srm`, the number of CPUs and the installed memory, e.g.
/// "Linux 6.8.0 x86_64, 2 CPUs, 23.5 GiB RAM".
pub fn machine_description() -> String {
    let uname = Command::new("uname")
        .arg("-srm")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| format!("{} {}", std::env::consts::OS, std::env::consts::ARCH));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = format!("{uname}, {cpus} CPUs");
    if let Some(kib) = mem_total_kib() {
        out.push_str(&format!(", {:.1} GiB RAM", kib as f64 / (1u64 << 20) as f64));
    }
    out
}

/// `MemTotal` from /proc/meminfo (Linux), in KiB.
fn mem_total_kib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_cpus() {
        assert!(super::machine_description().contains("CPUs"));
    }
}
