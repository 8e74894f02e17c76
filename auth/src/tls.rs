//! (being written)
/// The `--tls-*` flags.
#[derive(Clone, Debug, Default)]
pub struct TlsArgs;
/// A server's TLS.
#[derive(Clone, Debug)]
pub struct ServerTls;
/// A client's TLS.
#[derive(Clone, Debug)]
pub struct ClientTls;
