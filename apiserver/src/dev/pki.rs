//! The certificates `dev` makes for itself: one CA, a serving certificate for loopback,
//! and a client certificate for the dev user. Written as PEM files beside the kubeconfig
//! that points at them; the keys are readable by their owner only.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The dev user: a ServiceAccount, so the same person can claim with themself as Holder
/// and then exec (DESIGN §6).
pub const DEV_USER: &str = "system:serviceaccount:default:dev";
/// The groups Kubernetes gives that ServiceAccount, carried as the certificate's
/// organizations as client-certificate authentication reads them.
pub const DEV_GROUPS: &[&str] = &["system:serviceaccounts", "system:serviceaccounts:default"];

/// Where the PEM files went.
#[derive(Debug, Clone)]
pub struct DevPki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Why the certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating the {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("a client certificate carries at most two groups, not {0}")]
    Groups(usize),
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn generate(what: &'static str) -> impl Fn(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

/// A serving certificate's parameters for loopback: `localhost`, 127.0.0.1 and ::1.
pub fn loopback_serving_params(cn: &str) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params.subject_alt_names.extend([
        SanType::IpAddress([127, 0, 0, 1].into()),
        SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
    ]);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// A client certificate's parameters as Kubernetes reads one: CN the user, one O per
/// group. rcgen keeps one value per attribute type, so the second group goes in as the
/// same organizationName OID under another key, and a third has no key left: at most two.
pub fn client_params(user: &str, groups: &[&str]) -> Result<CertificateParams, PkiError> {
    if groups.len() > 2 {
        return Err(PkiError::Groups(groups.len()));
    }
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, user);
    for (i, group) in groups.iter().enumerate() {
        let attribute = if i == 0 {
            DnType::OrganizationName
        } else {
            DnType::CustomDnType(vec![2, 5, 4, 10])
        };
        params.distinguished_name.push(attribute, *group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}

/// Makes a new CA and the certificates it signs, and writes them into `dir`.
pub fn write_dev_pki(dir: &Path) -> Result<DevPki, PkiError> {
    let ca_key = KeyPair::generate().map_err(generate("CA key"))?;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "battery-apiserver dev CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(generate("CA certificate"))?;
    let ca = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate().map_err(generate("serving key"))?;
    let serving_cert = loopback_serving_params("battery-apiserver")
        .map_err(generate("serving certificate"))?
        .signed_by(&serving_key, &ca)
        .map_err(generate("serving certificate"))?;

    let client_key = KeyPair::generate().map_err(generate("client key"))?;
    let client_cert = client_params(DEV_USER, DEV_GROUPS)?
        .signed_by(&client_key, &ca)
        .map_err(generate("client certificate"))?;

    let pki = DevPki {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("serving.crt"),
        serving_key: dir.join("serving.key"),
        client_cert: dir.join("dev.crt"),
        client_key: dir.join("dev.key"),
    };
    write_file(&pki.ca_cert, &ca_cert.pem(), false)?;
    write_file(&pki.serving_cert, &serving_cert.pem(), false)?;
    write_file(&pki.serving_key, &serving_key.serialize_pem(), true)?;
    write_file(&pki.client_cert, &client_cert.pem(), false)?;
    write_file(&pki.client_key, &client_key.serialize_pem(), true)?;
    Ok(pki)
}

/// Writes `contents` to `path`, owner-only when `secret`, replacing what was there.
pub fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), PkiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| PkiError::Write {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 });
    let mut file = options.open(path).map_err(err)?;
    file.write_all(contents.as_bytes()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    #[test]
    fn the_client_certificate_names_the_dev_service_account_and_its_groups() {
        let dir = tempfile::tempdir().unwrap();
        let pki = write_dev_pki(dir.path()).unwrap();
        let pem = std::fs::read(&pki.client_cert).unwrap();
        let (_, pem) = parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(cn, [DEV_USER]);
        let orgs: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(orgs, DEV_GROUPS);
        let mode = std::fs::metadata(&pki.client_key).unwrap().permissions();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.mode() & 0o777, 0o600);
    }
}
