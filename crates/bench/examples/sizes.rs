use bs_bench::*;
use std::time::Instant;
fn main() {
    let mode =
        if std::env::args().nth(1).as_deref() == Some("push") { Mode::Push } else { Mode::Pull };
    let mut a = start_runner(Path::Blobstream).unwrap();
    let mut b = start_runner(Path::RawTcp).unwrap();
    for size in [4096u64, 65536, 262144, 1 << 20] {
        let data = payload(size);
        a.prepare(mode, &data, 0).unwrap();
        let mut ta = vec![];
        let mut tb = vec![];
        for i in 0..400 {
            let t = Instant::now();
            a.transfer(mode, &data, 0).unwrap();
            let x = t.elapsed().as_secs_f64() * 1e6;
            let t = Instant::now();
            b.transfer(mode, &data, 0).unwrap();
            let y = t.elapsed().as_secs_f64() * 1e6;
            if i > 10 {
                ta.push(x);
                tb.push(y);
            }
        }
        a.cleanup(mode, &data, 0).unwrap();
        ta.sort_by(|x, y| x.partial_cmp(y).unwrap());
        tb.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let n = ta.len();
        println!(
            "{mode:?} {size}: ours p10 {:.0} p50 {:.0} | raw p10 {:.0} p50 {:.0} us (incl. bench overhead)",
            ta[n / 10],
            ta[n / 2],
            tb[n / 10],
            tb[n / 2]
        );
    }
}
