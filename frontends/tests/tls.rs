//! Both front ends with mutual TLS, over real sockets on 127.0.0.1 and certificates from the
//! development CA: a `client` certificate takes numbers, a `storesvr` one is refused in each
//! protocol's words (`-NOPERM`, 403) and takes nothing, and a caller without a certificate gets no
//! TLS connection at all.

mod common;

use std::sync::Arc;

use common::Fake;
use seqsvr_auth::Role;
use seqsvr_auth::devca::{DevCa, Spec};
use seqsvr_frontends::{http, resp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

struct Certs {
    ca: DevCa,
}

impl Certs {
    fn issue(&self, role: Role) -> seqsvr_auth::devca::Issued {
        let hosts = ["127.0.0.1".to_string()];
        self.ca.issue(&Spec::new(role.name(), role, &hosts, 1)).unwrap()
    }

    fn server(&self) -> Arc<rustls::ServerConfig> {
        let s = self.issue(Role::AllocSvr);
        let tls = seqsvr_auth::Tls::from_pem(self.ca.cert_pem.as_bytes(), s.cert_pem.as_bytes(), s.key_pem.as_bytes())
            .unwrap();
        tls.rustls_server().unwrap()
    }

    /// A client that trusts the CA and shows a certificate of `role`, or none.
    fn client(&self, role: Option<Role>) -> tokio_rustls::TlsConnector {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.ca.cert_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match role {
            Some(role) => {
                let c = self.issue(role);
                let chain = vec![CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap()];
                let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            None => builder.with_no_client_auth(),
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// Connects with `client`, sends `request`, and returns what came back before the server closed
/// or `limit` bytes arrived; `None` when there was no TLS connection.
async fn talk(
    client: &tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
    request: &[u8],
    limit: usize,
) -> Option<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::IpAddress(addr.ip().into());
    let mut s = client.connect(name, tcp).await.ok()?;
    s.write_all(request).await.ok()?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < limit {
        match tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    // TLS 1.3 sends the verdict on a client certificate after the handshake: a refused one shows
    // as nothing read.
    (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn only_a_certificate_that_may_take_numbers_takes_them() {
    let certs = Certs {
        ca: DevCa::new("test-ca", 1).unwrap(),
    };
    let server = certs.server();
    let fake = Arc::new(Fake::default());
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);

    let resp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let resp_addr = resp_listener.local_addr().unwrap();
    let cfg = resp::RespConfig {
        tls: Some(server.clone()),
        ..resp::RespConfig::default()
    };
    tokio::spawn(resp::serve(resp_listener, fake.clone(), Arc::new(cfg), stop.clone()));
    let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http_listener.local_addr().unwrap();
    let cfg = http::HttpConfig {
        tls: Some(server),
        ..http::HttpConfig::default()
    };
    tokio::spawn(http::serve(http_listener, fake.clone(), cfg, stop));

    let incr = b"*2\r\n$4\r\nINCR\r\n$1\r\na\r\n*1\r\n$4\r\nQUIT\r\n";
    let post = b"POST /v1/counter/a/next HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

    let client = certs.client(Some(Role::Client));
    assert_eq!(
        talk(&client, resp_addr, incr, 1 << 16).await.as_deref(),
        Some(":1\r\n+OK\r\n")
    );
    let answer = talk(&client, http_addr, post, 1 << 16).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""value":"2""#), "{answer}");
    assert_eq!(fake.taken(), 2);

    let store = certs.client(Some(Role::StoreSvr));
    let answer = talk(&store, resp_addr, incr, 1 << 16).await.unwrap();
    assert!(
        answer.starts_with("-NOPERM ") && answer.contains("may not take numbers"),
        "{answer}"
    );
    let answer = talk(&store, http_addr, post, 1 << 16).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("may not take numbers"), "{answer}");

    let nobody = certs.client(None);
    assert_eq!(talk(&nobody, resp_addr, incr, 1 << 16).await, None);
    assert_eq!(talk(&nobody, http_addr, post, 1 << 16).await, None);
    assert_eq!(fake.taken(), 2, "a refused caller took nothing");
}
