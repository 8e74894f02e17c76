//! Compiles the client halves of the two foreign protos the benchmarks speak: the small etcd KV
//! proto of `alloc-bench`'s etcd counter and ferroid's `IdGenerator` of `ids-bench`. protoc comes
//! from `protoc-bin-vendored` unless `PROTOC` is set, as in `proto/build.rs`, so a fresh machine
//! needs nothing but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let files = ["proto/etcd_kv.proto", "proto/ferroid.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    tonic_prost_build::configure()
        .build_server(false)
        // As ferroid's own client has it: the ids arrive as `Bytes`, not copied into a `Vec`, so that
        // the client (which shares the two cores with the server) pays no more than it must.
        .bytes(".ferroid.IdChunk.packed_ids")
        .compile_protos(&files, &["proto"])?;
    Ok(())
}
