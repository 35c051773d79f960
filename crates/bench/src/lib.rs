//! Benchmarks behind `blobstream bench`. [`run_transfer`] is the transfer benchmark (the Blob
//! Streaming paper's request/response test): the same blob pushed and pulled through
//! blobstream, raw TCP, gRPC alone and (when installed) iperf3, all on 127.0.0.1, reported
//! as median Gbit/s with the performance targets checked. [`run_http`] is the HTTP download
//! benchmark (blobstream's HTTP server against nginx, loaded by wrk, and the time to first
//! image in the browser). [`write_benchmarks_md`] keeps the results in BENCHMARKS.md, one
//! section per benchmark.

mod batch;
mod benchmarks_md;
pub mod bindings;
pub mod delayline;
mod dicom;
mod dicomweb;
mod dpss;
mod dpss_tiles;
mod error;
mod fanout;
pub mod filters;
mod hosts;
pub mod http;
mod lfn;
mod machine;
mod measure;
mod model;
mod options;
mod paths;
mod payload;
mod python;
mod report;
mod s3;
mod settle;
mod small;
mod transfer;

pub use batch::run_batch;
pub use benchmarks_md::{BENCHMARKS_MD_HEADER, write_benchmarks_md};
pub use bindings::{BindingsReport, Row, RowsReport, run_bindings};
pub use dicom::run_dicom;
pub use dicomweb::run_dicomweb;
pub use dpss::run_dpss;
pub use error::BenchError;
pub use fanout::run_fanout;
pub use filters::{FilterReport, run_filters};
pub use http::{HttpPlan, HttpReport, run_http};
pub use lfn::run_lfn;
pub use machine::machine_description;
pub use measure::{PathRunner, Transfer, measure, measure_interleaved, measure_with, start_runner};
pub use model::{Measurement, Mode, Path};
pub use options::{BenchOptions, Progress};
pub use paths::{BlobstreamRunner, GrpcRunner, Iperf3Runner, RawTcpRunner, find_on_path};
pub use payload::{MB, gbit_per_s, median, paired_ratio, payload};
pub use report::{
    TRANSFER_TARGETS, TargetCheck, TransferReport, TransferTarget, size_text, targets_text,
};
pub use s3::run_s3;
pub use transfer::{CHOSEN_SOCKET_BUFFER, TransferPlan, run_transfer};
