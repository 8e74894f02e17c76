//! Who a certificate names: its subject and the one role it carries.

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::Role;
use crate::policy::ROLE_URI_PREFIX;

/// What the checks need from a certificate.
#[derive(Clone, Debug)]
pub(crate) struct Who {
    /// The common name, or the whole subject when it has none.
    pub subject: String,
    /// The role, or why the certificate does not carry exactly one.
    pub role: Result<Role, String>,
    /// Whether now lies within its validity period.
    pub valid_now: bool,
}

/// The first certificate of a PEM file.
pub(crate) fn from_pem(pem: &[u8]) -> Result<Who, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("not a PEM certificate: {e}"))?;
    let cert = pem.parse_x509().map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(who(&cert))
}

/// A DER certificate, as a TLS handshake delivers it.
pub(crate) fn from_der(der: &[u8]) -> Result<Who, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(who(&cert))
}

fn who(cert: &X509Certificate<'_>) -> Who {
    let subject = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| cert.subject().to_string());
    Who {
        subject,
        role: role(cert),
        valid_now: cert.validity().is_valid(),
    }
}

fn role(cert: &X509Certificate<'_>) -> Result<Role, String> {
    let sans = cert
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subject alternative names: {e}"))?;
    let uris = sans
        .iter()
        .flat_map(|s| s.value.general_names.iter())
        .filter_map(|n| match n {
            GeneralName::URI(u) => u.strip_prefix(ROLE_URI_PREFIX),
            _ => None,
        });
    let roles: Vec<&str> = uris.collect();
    match roles.as_slice() {
        [one] => one.parse(),
        [] => Err(format!(
            "carries no role: no URI SAN {ROLE_URI_PREFIX}<client|allocsvr|storesvr|admin>"
        )),
        many => Err(format!(
            "carries {} roles ({}); a certificate must carry exactly one",
            many.len(),
            many.join(", ")
        )),
    }
}
