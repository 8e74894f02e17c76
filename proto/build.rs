//! Compiles the seqsvr.v1 protos. protoc comes from `protoc-bin-vendored` unless
//! `PROTOC` is set, so a fresh machine needs nothing but cargo.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let files = [
        "proto/seqsvr/v1/common.proto",
        "proto/seqsvr/v1/alloc.proto",
        "proto/seqsvr/v1/store.proto",
        "proto/seqsvr/v1/raft.proto",
        "proto/seqsvr/v1/admin.proto",
        "proto/seqsvr/v1/ledger.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("seqsvr_v1_descriptor.bin"))
        .compile_protos(&files, &["proto"])?;
    Ok(())
}
