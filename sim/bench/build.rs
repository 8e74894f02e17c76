//! Compiles the client half of the small etcd KV proto that `alloc-bench`'s etcd counter uses.
//! protoc comes from `protoc-bin-vendored` unless `PROTOC` is set, as in `proto/build.rs`, so a
//! fresh machine needs nothing but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let file = "proto/etcd_kv.proto";
    println!("cargo:rerun-if-changed={file}");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[file], &["proto"])?;
    Ok(())
}
