//! A one-line description of the machine a benchmark ran on: kernel, CPU model and count,
//! memory. The model matters: a virtual machine of the same size may land on another host
//! CPU from one run to the next, and figures from different CPUs do not compare.

use std::process::Command;

/// `uname -srm`, the number and model of the CPUs and the installed memory, e.g.
/// "Linux 6.8.0 x86_64, 2 CPUs (AMD EPYC, family 26 model 2), 23.5 GiB RAM".
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

/// The first CPU's `model name` in /proc/cpuinfo (Linux), with its family and model
/// numbers: a virtual machine's model name may be as bare as "AMD EPYC", which covers CPUs
/// as different as Zen 4 (family 25) and Zen 5 (family 26).
fn cpu_model() -> Option<String> {
    cpu_model_in(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

/// [`cpu_model`] of the text of a /proc/cpuinfo.
fn cpu_model_in(info: &str) -> Option<String> {
    let first = info.split("\n\n").next()?;
    let field = |name: &str| {
        let line = first.lines().find(|l| l.split(':').next().map(str::trim) == Some(name))?;
        let value = line.split_once(':')?.1.split_whitespace().collect::<Vec<_>>().join(" ");
        (!value.is_empty()).then_some(value)
    };
    let mut model = field("model name")?;
    if let (Some(family), Some(number)) = (field("cpu family"), field("model")) {
        model.push_str(&format!(", family {family} model {number}"));
    }
    Some(model)
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
    fn names_the_cpu_with_its_family_and_model() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n\
                    model name\t: AMD  EPYC\nstepping\t: 1\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(super::cpu_model_in(info).as_deref(), Some("AMD EPYC, family 26 model 2"));
        let bare = "processor\t: 0\nmodel name\t: Some CPU\n";
        assert_eq!(super::cpu_model_in(bare).as_deref(), Some("Some CPU"));
        assert_eq!(super::cpu_model_in("processor\t: 0\n"), None);
    }

    #[test]
    fn names_cpus() {
        let d = super::machine_description();
        assert!(d.contains("CPUs"), "{d}");
        if let Some(model) = super::cpu_model() {
            assert!(d.contains(&format!("CPUs ({model})")), "{d}");
        }
    }
}
