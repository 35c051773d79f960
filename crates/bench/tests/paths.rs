//! The real measurement code of every path on tiny blobs: the bytes arrive intact, the runs
//! are counted, a rate comes out. Timings are never asserted.

use bs_bench::{MB, Mode, Path, find_on_path, measure, payload, start_runner};

const PATHS: [Path; 3] = [Path::Blobstream, Path::RawTcp, Path::Grpc];

#[test]
fn every_path_measures_both_modes() {
    for path in PATHS {
        for mode in Mode::ALL {
            let m = measure(path, mode, 64 << 10, 0, 2).unwrap();
            assert_eq!((m.path, m.mode, m.size_bytes, m.socket_buffer), (path, mode, 64 << 10, 0));
            assert_eq!(m.runs, 2);
            assert!(m.gbit_per_s > 0.0 && m.gbit_per_s.is_finite(), "{m:?}");
        }
    }
}

#[test]
fn every_path_delivers_the_exact_bytes_with_and_without_socket_buffers() {
    for path in PATHS {
        let mut runner = start_runner(path).unwrap();
        assert_eq!(runner.path(), path);
        // Not a multiple of gRPC's 1 MiB messages, nor of any frame size.
        for size in [64 << 10, MB + 12_345] {
            let data = payload(size);
            for buffer in [0, 256 << 10] {
                for mode in Mode::ALL {
                    runner.prepare(mode, &data, buffer).unwrap();
                    for _ in 0..2 {
                        let t = runner.transfer(mode, &data, buffer).unwrap();
                        let got = t.received.expect("these paths hand over what arrived");
                        assert!(got == data, "{path} {mode} {size} buffer {buffer}: bytes differ");
                        assert!(t.gbit_per_s > 0.0);
                    }
                    runner.cleanup(mode, &data, buffer).unwrap();
                }
            }
        }
    }
}

#[test]
fn measure_with_socket_buffers_and_one_run() {
    let m = measure(Path::RawTcp, Mode::Pull, 100_000, 1 << 20, 1).unwrap();
    assert_eq!((m.runs, m.socket_buffer), (1, 1 << 20));
    assert!(measure(Path::RawTcp, Mode::Pull, 100, 0, 0).is_err(), "zero runs is refused");
}

#[test]
fn iperf3_when_installed() {
    if find_on_path("iperf3").is_none() {
        eprintln!("iperf3 not installed: skipped");
        return;
    }
    for mode in Mode::ALL {
        let m = measure(Path::Iperf3, mode, 8 * MB, 0, 1).unwrap();
        assert_eq!((m.path, m.runs), (Path::Iperf3, 1));
        assert!(m.gbit_per_s > 0.0, "{m:?}");
    }
}
