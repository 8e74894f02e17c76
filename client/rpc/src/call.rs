//! The two types every transport shares ([`crate::transport`] re-exports them), apart so that the
//! connections (`h2conn.rs`) and the transport that chooses among them do not import each other.

use std::future::Future;
use std::pin::Pin;

use tonic::body::Body;
use tonic::codegen::http;

/// Any error a transport reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request in flight over a transport.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>>;
