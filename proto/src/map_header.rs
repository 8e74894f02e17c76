//! The request header that carries a data-plane caller's cluster map version.
//!
//! It is a header and not a request field so that "not sent" (a caller that does not track the map:
//! it is never sent one) differs from "sent 0" (a caller that has no map yet: it gets one), and so
//! that callers built against the request messages without it keep compiling. Reading it is one
//! header lookup and one integer parse; the map itself is cloned only for a caller that is behind.

use tonic::metadata::{MetadataMap, MetadataValue};

/// Header name (lower case, as HTTP/2 requires).
pub const MAP_VERSION_HEADER: &str = "seqsvr-map-version";

/// [`MAP_VERSION_HEADER`] as a parsed name: a lookup by `&str` parses and validates the name on
/// every call (about 440 instructions of every data-plane call, callgrind), one by name does not.
static MAP_VERSION_NAME: tonic::codegen::http::HeaderName =
    tonic::codegen::http::HeaderName::from_static(MAP_VERSION_HEADER);

/// The caller's map version, or `None` when it sent none (or an unreadable one).
pub fn read(metadata: &MetadataMap) -> Option<u64> {
    metadata.as_ref().get(&MAP_VERSION_NAME)?.to_str().ok()?.parse().ok()
}

/// Puts `version` on a request.
pub fn write(metadata: &mut MetadataMap, version: u64) {
    metadata.insert(MAP_VERSION_HEADER, MetadataValue::from(version));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_version_reads_back_and_a_missing_or_bad_one_is_none() {
        let mut m = MetadataMap::new();
        assert_eq!(read(&m), None);
        write(&mut m, 42);
        assert_eq!(read(&m), Some(42));
        m.insert(MAP_VERSION_HEADER, MetadataValue::from_static("x"));
        assert_eq!(read(&m), None);
    }
}
