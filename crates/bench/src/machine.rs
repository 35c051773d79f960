//! A one-line description of the machine a benchmark ran on: kernel, CPU model and count,
//! memory. The model matters: a virtual machine of the same size may land on another host
//! CPU from one run to the next, and figures from different CPUs do not compare.

use std::process::Command;

/// `uname -srm`, the number and model of the CPUs and the installed memory, e.g.
/// "Linux 6.8.0 x86_64, 2 CPUs (Intel(R) Xeon(R) Processor), 23.5 GiB RAM".
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
    if let Some(model) = cpu_model() {
        out.push_str(&format!(" ({model})"));
    }
    if let Some(kib) = mem_total_kib() {
        out.push_str(&format!(", {:.1} GiB RAM", kib as f64 / (1u64 << 20) as f64));
    }
    out
}

/// The first `model name` in /proc/cpuinfo (Linux).
fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    let model = line.split_once(':')?.1.split_whitespace().collect::<Vec<_>>().join(" ");
    (!model.is_empty()).then_some(model)
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
        let d = super::machine_description();
        assert!(d.contains("CPUs"), "{d}");
        if let Some(model) = super::cpu_model() {
            assert!(d.contains(&format!("CPUs ({model})")), "{d}");
        }
    }
}
