//! Loading certificates: every way a process's TLS files can be wrong is refused at start with a
//! message naming the file and the fix; and the role table knows every method the protocol has.

use std::path::Path;

use clap::Parser;
use prost::Message;
use seqsvr_auth::devca::{self, DevCa, Spec};
use seqsvr_auth::policy::{Kind, kind};
use seqsvr_auth::{Role, TlsArgs, TlsError};

fn args(dir: &Path, name: &str) -> TlsArgs {
    TlsArgs {
        tls_ca: Some(dir.join("ca.pem")),
        tls_cert: Some(dir.join(format!("{name}.pem"))),
        tls_key: Some(dir.join(format!("{name}.key"))),
    }
}

fn local() -> (tempfile::TempDir, DevCa) {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = devca::write_local(dir.path(), &["127.0.0.1".into()], 1).unwrap();
    (dir, ca)
}

#[test]
fn each_role_certificate_loads_as_its_role_and_names_its_subject() {
    let (dir, _) = local();
    for role in Role::ALL {
        let tls = args(dir.path(), role.name()).load(Some(role)).unwrap().unwrap();
        assert_eq!(tls.role, role);
        assert_eq!(tls.subject, format!("{role}.seqsvr.local"));
        // seqctl accepts whichever role its certificate has.
        assert_eq!(args(dir.path(), role.name()).load(None).unwrap().unwrap().role, role);
    }
}

#[test]
fn a_certificate_of_another_role_is_refused_naming_both_roles() {
    let (dir, _) = local();
    let err = args(dir.path(), "allocsvr")
        .load(Some(Role::StoreSvr))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("allocsvr.pem") && err.contains("role allocsvr") && err.contains("storesvr"),
        "{err}"
    );
}

#[test]
fn an_expired_or_roleless_or_two_role_certificate_is_refused() {
    let (dir, ca) = local();
    let now = time::OffsetDateTime::now_utc();
    let expired = Spec {
        not_before: now - time::Duration::days(10),
        not_after: now - time::Duration::days(1),
        ..Spec::new("old", Role::Client, &[], 1)
    };
    devca::write_issued(dir.path(), "expired", &ca.issue(&expired).unwrap()).unwrap();
    let err = args(dir.path(), "expired")
        .load(Some(Role::Client))
        .unwrap_err()
        .to_string();
    assert!(err.contains("validity period"), "{err}");

    let roleless = Spec {
        role: None,
        ..Spec::new("nobody", Role::Client, &[], 1)
    };
    devca::write_issued(dir.path(), "roleless", &ca.issue(&roleless).unwrap()).unwrap();
    let err = args(dir.path(), "roleless").load(None).unwrap_err().to_string();
    assert!(err.contains("carries no role"), "{err}");
}

#[test]
fn missing_files_and_half_given_flags_are_refused() {
    let (dir, _) = local();
    let mut a = args(dir.path(), "client");
    a.tls_key = None;
    assert!(matches!(a.load(None), Err(TlsError::Incomplete)));
    let err = args(dir.path(), "nosuch").load(None).unwrap_err().to_string();
    assert!(err.contains("nosuch.pem") && err.contains("--tls-cert"), "{err}");
    assert!(TlsArgs::default().load(None).unwrap().is_none(), "no flags: plaintext");

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tls: TlsArgs,
    }
    let refused = Cli::try_parse_from(["x", "--tls-cert", "a.pem", "--tls-key", "a.key"]);
    assert!(refused.is_err(), "--tls-cert without --tls-ca must be refused");
    let refused = Cli::try_parse_from(["x", "--tls-ca", "ca.pem"]);
    assert!(refused.is_err(), "--tls-ca without a certificate must be refused");
}

#[test]
fn a_second_ca_is_never_written_over_the_first() {
    let (dir, _) = local();
    let err = devca::write_local(dir.path(), &["127.0.0.1".into()], 1).err().unwrap();
    assert!(err.contains("already exists"), "{err}");
}

#[test]
fn the_role_table_knows_every_method_of_the_protocol() {
    let set = prost_types::FileDescriptorSet::decode(seqsvr_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut methods = 0;
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                assert_ne!(kind(&path), Kind::Unknown, "{path} has no rule in auth/src/policy.rs");
                methods += 1;
            }
        }
    }
    assert!(methods >= 21, "only {methods} methods found");
}
