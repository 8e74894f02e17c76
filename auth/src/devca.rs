//! A development certificate authority and one certificate per role, for a local cluster, the
//! simulator and tests (`seqctl certs`).
//!
//! Every certificate carries its role as the URI SAN `urn:seqsvr:role:<role>`, the addresses its
//! servers are dialled at as IP or DNS SANs (the same list for every role: in a local cluster
//! every process runs on the same hosts), and both the server and client extended key usages,
//! since StoreSvrs and AllocSvrs are servers and clients at once.
//!
//! Deliberately left out: anything a production CA needs (protected keys, revocation, short
//! lifetimes with renewal). Private keys are written readable only by their owner.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::Role;

/// A generated CA, able to sign more certificates.
pub struct DevCa {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// One certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

/// What one certificate is for and how long it is valid.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Its common name (the subject logs and the audit trail show).
    pub name: String,
    /// The role it carries; `None` for a certificate without one (tests of the refusal).
    pub role: Option<Role>,
    /// Addresses it is valid for as a server: IPs or DNS names.
    pub hosts: Vec<String>,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
}

impl Spec {
    /// A certificate for `role`, named `name`, valid from a day ago for `days`.
    pub fn new(name: &str, role: Role, hosts: &[String], days: i64) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            name: name.into(),
            role: Some(role),
            hosts: hosts.to_vec(),
            not_before: now - Duration::days(1),
            not_after: now + Duration::days(days),
        }
    }
}

impl DevCa {
    /// A new self-signed CA named `name`, valid for `days`.
    pub fn new(name: &str, days: i64) -> Result<Self, String> {
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(days);
        let cert = params.self_signed(&key).map_err(err)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Signs a new certificate for `spec` with a fresh key.
    pub fn issue(&self, spec: &Spec) -> Result<Issued, String> {
        let key = KeyPair::generate().map_err(err)?;
        let mut sans = Vec::new();
        for h in &spec.hosts {
            sans.push(match h.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(h.clone().try_into().map_err(|e| format!("host {h:?}: {e}"))?),
            });
        }
        if let Some(role) = spec.role {
            sans.push(SanType::URI(role.uri().try_into().map_err(err)?));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(&spec.name);
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = spec.not_before;
        params.not_after = spec.not_after;
        let cert = params.signed_by(&key, &self.issuer).map_err(err)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn dn(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "seqsvr-rs development");
    dn
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The files [`write_local`] makes, by role: `<dir>/<role>.pem` and `<dir>/<role>.key`, and the CA
/// at `<dir>/ca.pem`.
pub fn paths(dir: &Path, role: Role) -> (PathBuf, PathBuf) {
    (dir.join(format!("{role}.pem")), dir.join(format!("{role}.key")))
}

/// Writes a new CA and one certificate per role into `dir` (created if missing), each valid for
/// `days` and for `hosts`. Returns the CA (to sign more, e.g. in tests) and the files written.
/// Refuses to overwrite an existing CA: certificates already handed out would stop matching it.
pub fn write_local(dir: &Path, hosts: &[String], days: i64) -> Result<(DevCa, Vec<PathBuf>), String> {
    let ca_path = dir.join("ca.pem");
    if ca_path.exists() {
        return Err(format!(
            "{} already exists; remove the directory to make a new CA",
            ca_path.display()
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let ca = DevCa::new("seqsvr-rs development CA", days)?;
    let mut written = vec![ca_path.clone()];
    write(&ca_path, &ca.cert_pem, false)?;
    for role in Role::ALL {
        let issued = ca.issue(&Spec::new(&format!("{role}.seqsvr.local"), role, hosts, days))?;
        let (cert, key) = write_issued(dir, role.name(), &issued)?;
        written.extend([cert, key]);
    }
    Ok((ca, written))
}

/// Writes `issued` as `<dir>/<name>.pem` and `<dir>/<name>.key`; returns both paths.
pub fn write_issued(dir: &Path, name: &str, issued: &Issued) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    write(&cert, &issued.cert_pem, false)?;
    write(&key, &issued.key_pem, true)?;
    Ok((cert, key))
}

fn write(path: &Path, body: &str, secret: bool) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    f.write_all(body.as_bytes())
        .map_err(|e| format!("write {}: {e}", path.display()))
}

/// The files [`write_local`] made in one directory, and what a process or client of a test
/// cluster (the simulator, the benchmarks, the end-to-end tests) needs from them.
#[derive(Clone, Debug)]
pub struct LocalCerts {
    /// Where `ca.pem` and the `<role>.pem`/`<role>.key` pairs are.
    pub dir: PathBuf,
}

impl LocalCerts {
    /// A new CA and one certificate per role in `dir`, for `hosts`, valid `days`.
    pub fn create(dir: &Path, hosts: &[String], days: i64) -> Result<(Self, DevCa), String> {
        let (ca, _) = write_local(dir, hosts, days)?;
        Ok((Self { dir: dir.to_owned() }, ca))
    }

    /// The options naming `role`'s files.
    pub fn args(&self, role: Role) -> crate::TlsArgs {
        let (cert, key) = paths(&self.dir, role);
        crate::TlsArgs {
            tls_ca: Some(self.dir.join("ca.pem")),
            tls_cert: Some(cert),
            tls_key: Some(key),
        }
    }

    /// The `--tls-*` flags of a process holding `role`'s certificate.
    pub fn flags(&self, role: Role) -> Vec<String> {
        let (cert, key) = paths(&self.dir, role);
        vec![
            format!("--tls-ca={}", self.dir.join("ca.pem").display()),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
        ]
    }

    /// `role`'s certificate, loaded and checked.
    pub fn load(&self, role: Role) -> Result<std::sync::Arc<crate::Tls>, String> {
        match self.args(role).load(Some(role)) {
            Ok(Some(tls)) => Ok(std::sync::Arc::new(tls)),
            Ok(None) => Err("no TLS files".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}
