//! The certificates `dev` makes for itself: one CA, a serving certificate for loopback,
//! and a client certificate for the dev user; and for its exec agents, an agent CA that
//! signs each agent's relay serving certificate (for its Host's name), a relay client CA
//! that signs the API server's relay client certificate (the only client the agents
//! accept), and each agent's Kubernetes identity (`system:battery-agent:<host>` in
//! `battery:agents`), signed by the first CA, which client-certificate authentication
//! trusts. Written as PEM files beside the kubeconfig that points at them; the keys are
//! readable by their owner only.

use std::io::Write;
use std::path::{Path, PathBuf};

use battery_types::agent_identity::{AGENT_GROUP, agent_username};
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
    /// Signs the agents' relay serving certificates (the server signs them at
    /// `hosts/<name>/certificate`): what the API server's relay client verifies an agent
    /// against.
    pub agent_ca_cert: PathBuf,
    pub agent_ca_key: PathBuf,
    /// Signs the API server's relay client certificate: what the agents accept.
    pub relay_client_ca_cert: PathBuf,
    /// The API server's relay client certificate and key, to present to the agents.
    pub relay_client_cert: PathBuf,
    pub relay_client_key: PathBuf,
    /// One per Host given to [`write_dev_pki_with_agents`].
    pub agents: Vec<AgentPki>,
}

/// One exec agent's files.
#[derive(Debug, Clone)]
pub struct AgentPki {
    pub host: String,
    /// The agent's client certificate towards the API server.
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

pub(crate) fn generate(what: &'static str) -> impl Fn(rcgen::Error) -> PkiError {
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

/// A CA's parameters: named `cn`, signing certificates and CRLs only.
pub(crate) fn ca_params(cn: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// A new CA: its certificate's and key's PEM, and the issuer that signs with it.
fn new_ca(cn: &str) -> Result<(String, String, Issuer<'static, KeyPair>), PkiError> {
    self_signed_ca(ca_params(cn))
}

/// A new CA of `params` (from [`ca_params`]), self-signed with a new key.
pub(crate) fn self_signed_ca(
    params: CertificateParams,
) -> Result<(String, String, Issuer<'static, KeyPair>), PkiError> {
    let key = KeyPair::generate().map_err(generate("CA key"))?;
    let cert = params
        .self_signed(&key)
        .map_err(generate("CA certificate"))?;
    Ok((cert.pem(), key.serialize_pem(), Issuer::new(params, key)))
}

/// Signs `params` with a new key; the certificate's and the key's PEM.
pub(crate) fn sign(
    what: &'static str,
    params: CertificateParams,
    ca: &Issuer<'_, KeyPair>,
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(generate(what))?;
    let cert = params.signed_by(&key, ca).map_err(generate(what))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Makes a new CA and the certificates it signs, and writes them into `dir`, with no
/// agent's.
pub fn write_dev_pki(dir: &Path) -> Result<DevPki, PkiError> {
    write_dev_pki_with_agents(dir, &[])
}

/// As [`write_dev_pki`], with the files of the agents of `hosts` in `dir/agents/<host>/`.
pub fn write_dev_pki_with_agents(dir: &Path, hosts: &[&str]) -> Result<DevPki, PkiError> {
    let (ca_cert, _, ca) = new_ca("battery-apiserver dev CA")?;

    let serving_key = KeyPair::generate().map_err(generate("serving key"))?;
    let serving_cert = loopback_serving_params("battery-apiserver")
        .map_err(generate("serving certificate"))?
        .signed_by(&serving_key, &ca)
        .map_err(generate("serving certificate"))?;

    let client_key = KeyPair::generate().map_err(generate("client key"))?;
    let client_cert = client_params(DEV_USER, DEV_GROUPS)?
        .signed_by(&client_key, &ca)
        .map_err(generate("client certificate"))?;

    // The server signs each agent's serving certificate with this at
    // `hosts/<name>/certificate`, as it does in a cluster.
    let (agent_ca_cert, agent_ca_key, _) = new_ca("battery-apiserver dev agent CA")?;
    let (relay_client_ca_cert, _, relay_client_ca) =
        new_ca("battery-apiserver dev relay client CA")?;
    let relay_client = sign(
        "relay client certificate",
        client_params("battery-apiserver", &[])?,
        &relay_client_ca,
    )?;

    let agents_dir = dir.join("agents");
    let mut agents = Vec::new();
    for host in hosts {
        let host_dir = agents_dir.join(host);
        std::fs::create_dir_all(&host_dir).map_err(|source| PkiError::Write {
            path: host_dir.clone(),
            source,
        })?;
        let identity = sign(
            "agent client certificate",
            client_params(&agent_username(host), &[AGENT_GROUP])?,
            &ca,
        )?;
        let agent = AgentPki {
            host: (*host).to_owned(),
            client_cert: host_dir.join("agent.crt"),
            client_key: host_dir.join("agent.key"),
        };
        write_file(&agent.client_cert, &identity.0, false)?;
        write_file(&agent.client_key, &identity.1, true)?;
        agents.push(agent);
    }

    let pki = DevPki {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("serving.crt"),
        serving_key: dir.join("serving.key"),
        client_cert: dir.join("dev.crt"),
        client_key: dir.join("dev.key"),
        agent_ca_cert: dir.join("agent-ca.crt"),
        agent_ca_key: dir.join("agent-ca.key"),
        relay_client_ca_cert: dir.join("relay-client-ca.crt"),
        relay_client_cert: dir.join("relay-client.crt"),
        relay_client_key: dir.join("relay-client.key"),
        agents,
    };
    write_file(&pki.agent_ca_cert, &agent_ca_cert, false)?;
    write_file(&pki.agent_ca_key, &agent_ca_key, true)?;
    write_file(&pki.relay_client_ca_cert, &relay_client_ca_cert, false)?;
    write_file(&pki.relay_client_cert, &relay_client.0, false)?;
    write_file(&pki.relay_client_key, &relay_client.1, true)?;
    write_file(&pki.ca_cert, &ca_cert, false)?;
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

    fn names(pem_path: &Path) -> (Vec<String>, Vec<String>, Vec<String>) {
        let pem = std::fs::read(pem_path).unwrap();
        let (_, pem) = parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let attr = |it: &mut dyn Iterator<Item = &AttributeTypeAndValue<'_>>| {
            it.map(|a| a.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let cn = attr(&mut cert.subject().iter_common_name());
        let orgs = attr(&mut cert.subject().iter_organization());
        let dns = cert
            .subject_alternative_name()
            .unwrap()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::DNSName(d) => Some((*d).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        (cn, orgs, dns)
    }

    #[test]
    fn each_agent_gets_an_identity_naming_its_host() {
        let dir = tempfile::tempdir().unwrap();
        let pki = write_dev_pki_with_agents(dir.path(), &["host-0", "host-1"]).unwrap();
        assert_eq!(pki.agents.len(), 2);
        let agent = &pki.agents[1];
        assert_eq!(agent.host, "host-1");
        let (cn, orgs, _) = names(&agent.client_cert);
        assert_eq!(cn, ["system:battery-agent:host-1"]);
        assert_eq!(orgs, [AGENT_GROUP]);
        let (cn, _, _) = names(&pki.relay_client_cert);
        assert_eq!(cn, ["battery-apiserver"]);
    }
}
