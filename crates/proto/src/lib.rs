//! The control-plane contract: Rust types and tonic stubs generated from
//! `proto/blobstream.proto` (the IDL is the source of truth; see that file for semantics).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("blobstream.v1");
