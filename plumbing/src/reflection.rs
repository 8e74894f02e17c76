//! gRPC server reflection for one port: both protocol versions (`v1`, and `v1alpha`, which older
//! grpcurl and grpc_cli still ask), listing only the services that port really serves.
//!
//! Deliberately left out: serving reflection is best effort. A descriptor set that does not load
//! (it is compiled in, so this means a build problem) logs nothing here and returns `None`; the
//! port then serves without reflection rather than not at all.

use tonic_reflection::server::{Builder, v1, v1alpha};

/// The health service every port serves next to its own.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

fn builder(services: &[&str]) -> Builder<'static> {
    let with_names = services.iter().chain([&HEALTH_SERVICE]).fold(
        Builder::configure().register_encoded_file_descriptor_set(seqsvr_proto::FILE_DESCRIPTOR_SET),
        |b, name| b.with_service_name(*name),
    );
    with_names.register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// The v1 and v1alpha reflection services of a port that serves `services` (fully qualified
/// names, e.g. `seqsvr.v1.AllocService`) and gRPC health.
pub fn services(
    services: &[&str],
) -> (
    Option<v1::ServerReflectionServer<impl v1::ServerReflection>>,
    Option<v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>>,
) {
    (
        builder(services).build_v1().ok(),
        builder(services).build_v1alpha().ok(),
    )
}
