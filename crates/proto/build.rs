//! Compiles `proto/blobstream.proto` with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let file = format!("{proto_dir}/blobstream.proto");
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([&file], [proto_dir])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
