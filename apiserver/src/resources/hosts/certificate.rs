//! `hosts/<name>/certificate`: signs the relay serving certificate of a Host's exec agent
//! (ADR 0011). Only that Host's agent may ask, only for the Host's names, and the
//! certificate carries the request's public key: the agent's private key never leaves it.

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use battery_api_machinery::status::ApiError;
use battery_types::agent_identity::{agent_host, agent_username};
use battery_types::validation::FieldError;
use battery_types::{
    GROUP, Host, HostCertificateRequest, HostCertificateRequestSpec, HostCertificateRequestStatus,
    ResourceInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
    SerialNumber,
};
use x509_parser::time::ASN1Time;

use super::ssh_certificate::SshUserCa;
use super::storage::HostStorage;
use crate::api::{RequestContext, Subresource};

const KIND: &str = "HostCertificateRequest";

/// The CA that signs agents' serving certificates, and how long they live.
pub struct AgentSigner {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, appended to every chain so the agent can serve it whole.
    ca_pem: String,
    /// No certificate outlives its CA.
    ca_not_after: i64,
    lifetime: Duration,
    /// Certifies agents' SSH keys beside their serving certificates (ADR 33).
    ssh_ca: Option<SshUserCa>,
}

impl fmt::Debug for AgentSigner {
    // The issuer holds the CA's private key: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentSigner")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl AgentSigner {
    /// A signer from the CA's PEM certificate and key.
    pub fn from_pem(cert_pem: &str, key_pem: &str, lifetime: Duration) -> anyhow::Result<Self> {
        let key = KeyPair::from_pem(key_pem).context("parsing the signing key")?;
        let (_, block) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .context("parsing the signing certificate's PEM")?;
        let ca = block
            .parse_x509()
            .context("parsing the signing certificate")?;
        if ca.public_key().raw != key.subject_public_key_info().as_slice() {
            anyhow::bail!("the signing key does not belong to the signing certificate");
        }
        let ca_not_after = ca.validity().not_after.timestamp();
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .context("reading the signing certificate as an issuer")?;
        Ok(Self {
            issuer,
            ca_pem: cert_pem.trim_end().to_owned() + "\n",
            ca_not_after,
            lifetime,
            ssh_ca: None,
        })
    }

    /// Also certifies the SSH keys agents send, with `ca`.
    pub fn with_ssh_ca(mut self, ca: SshUserCa) -> Self {
        self.ssh_ca = Some(ca);
        self
    }

    /// A signer from `--agent-signing-cert-file` and `--agent-signing-key-file`.
    pub fn from_files(cert: &Path, key: &Path, lifetime: Duration) -> anyhow::Result<Self> {
        let read = |flag: &str, path: &Path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("reading --{flag} {}", path.display()))
        };
        Self::from_pem(
            &read("agent-signing-cert-file", cert)?,
            &read("agent-signing-key-file", key)?,
            lifetime,
        )
        .context("--agent-signing-cert-file and --agent-signing-key-file")
    }

    /// Signs the request's CSR for the Host `host`, whose certificate may name only
    /// `names`, and certifies its SSH key if it sent one and there is an SSH CA; a dry run
    /// checks the request and signs nothing.
    fn sign(
        &self,
        host: &str,
        names: &[SanType],
        request: &HostCertificateRequestSpec,
        dry_run: bool,
    ) -> Result<Option<HostCertificateRequestStatus>, ApiError> {
        let csr_pem = request.request.as_str();
        let invalid = |value: &str, detail: String| {
            ApiError::invalid_kind(
                GROUP,
                KIND,
                host,
                &[FieldError::invalid("spec.request", value, detail)],
            )
        };
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|err| {
            invalid(
                "<certificate request>",
                format!("not a PEM certificate signing request with a valid signature: {err}"),
            )
        })?;
        if let Some(extra) = csr
            .params
            .subject_alt_names
            .iter()
            .find(|name| !names.contains(name))
        {
            let allowed: Vec<String> = names.iter().map(san_text).collect();
            return Err(invalid(
                &san_text(extra),
                format!(
                    "the certificate of Host {host:?} may name only {}",
                    allowed.join(", ")
                ),
            ));
        }
        let not_after = {
            let wanted = ASN1Time::now().to_datetime() + self.lifetime;
            wanted.unix_timestamp().min(self.ca_not_after)
        };
        let ssh_certificate = match (&self.ssh_ca, request.ssh_public_key.as_str()) {
            (Some(ca), key) if !key.is_empty() => ca
                .certify(host, key, u64::try_from(not_after).unwrap_or_default())
                .map_err(|detail| {
                    ApiError::invalid_kind(
                        GROUP,
                        KIND,
                        host,
                        &[FieldError::invalid("spec.sshPublicKey", key, detail)],
                    )
                })?,
            _ => String::new(),
        };
        if dry_run {
            return Ok(None);
        }
        let now = ASN1Time::now().to_datetime();
        let mut params = CertificateParams::default();
        // The requested subject is ignored: the certificate names its Host, as CT-007.
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.subject_alt_names = names.to_vec();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now;
        // No certificate outlives its CA.
        params.not_after = ASN1Time::from_timestamp(not_after).map_or(now, |t| t.to_datetime());
        let mut serial = uuid::Uuid::new_v4().into_bytes();
        // A positive serial of 16 random bytes (RFC 5280 §4.1.2.2).
        serial[0] &= 0x7f;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        csr.params = params;
        let certificate = csr
            .signed_by(&self.issuer)
            .map_err(|err| invalid("<certificate request>", format!("cannot be signed: {err}")))?;
        let expires = Timestamp::from_second(csr.params.not_after.unix_timestamp()).ok();
        tracing::info!(
            host,
            serial = %hex(&serial),
            expires = %expires.map(|t| t.to_string()).unwrap_or_default(),
            ssh_certificate = !ssh_certificate.is_empty(),
            "signed an exec agent's serving certificate"
        );
        Ok(Some(HostCertificateRequestStatus {
            certificate: certificate.pem() + &self.ca_pem,
            expiration_time: expires.map(Time),
            ssh_certificate,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn san_text(name: &SanType) -> String {
    match name {
        SanType::DnsName(dns) => dns.to_string(),
        SanType::IpAddress(ip) => ip.to_string(),
        SanType::URI(uri) => format!("URI {uri}"),
        SanType::Rfc822Name(email) => format!("email {email}"),
        other => format!("{other:?}"),
    }
}

/// The names a Host's agent certificate carries: the Host's name, and the host part of
/// its `agentAddress` (an IP, or a DNS name), which is what the API server dials.
fn host_names(host: &Host) -> Result<Vec<SanType>, ApiError> {
    let name = host.metadata.name.as_deref().unwrap_or_default();
    let dns = |value: &str| {
        value
            .try_into()
            .map(SanType::DnsName)
            .map_err(|err| ApiError::internal(err).with_specific_reason("InvalidHostName"))
    };
    let mut names = vec![dns(name)?];
    if let Some(address) = &host.spec.agent_address
        && let Some((authority, _port)) = address.rsplit_once(':')
    {
        let authority = authority
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
            .unwrap_or(authority);
        let san = match authority.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => dns(authority)?,
        };
        if !names.contains(&san) {
            names.push(san);
        }
    }
    Ok(names)
}

/// `hosts/<name>/certificate`.
pub struct HostCertificates {
    pub hosts: Arc<HostStorage>,
    /// `None` without `--agent-signing-cert-file`/`--agent-signing-key-file`.
    pub signer: Option<Arc<AgentSigner>>,
}

fn info() -> &'static ResourceInfo {
    super::info()
}

impl Subresource for HostCertificates {
    type Object = HostCertificateRequest;

    /// Never reached: the resource table serves only `create` here, and dispatch answers
    /// 405 for anything else before calling a subresource.
    async fn get(&self, _ctx: &RequestContext, _name: &str) -> Result<Self::Object, ApiError> {
        Err(ApiError::method_not_allowed(info(), "get"))
    }

    async fn update(
        &self,
        ctx: &RequestContext,
        name: &str,
        mut request: HostCertificateRequest,
        dry_run: bool,
        _field_manager: &str,
    ) -> Result<Self::Object, ApiError> {
        if agent_host(&ctx.user.name, &ctx.user.groups) != Some(name) {
            return Err(ApiError::forbidden_object(
                info(),
                name,
                format_args!(
                    "User {:?} may not get its certificate: only the Host's exec agent ({:?} in {:?}) may",
                    ctx.user.name,
                    agent_username(name),
                    battery_types::agent_identity::AGENT_GROUP,
                ),
            ));
        }
        let Some(signer) = &self.signer else {
            return Err(ApiError::service_unavailable(
                "agent certificate signing is not configured: start the API server with \
                 --agent-signing-cert-file and --agent-signing-key-file",
            ));
        };
        let host = self.hosts.read(name).await?;
        let errors = request.spec.validate();
        if !errors.is_empty() {
            return Err(ApiError::invalid_kind(GROUP, KIND, name, &errors));
        }
        let names = host_names(&host)?;
        request.status = signer.sign(name, &names, &request.spec, dry_run)?;
        request.metadata.name = Some(name.to_owned());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use battery_types::HostSpec;
    use rcgen::{BasicConstraints, KeyUsagePurpose};

    use super::*;

    fn ca(valid_for: Duration) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        params.not_after = ASN1Time::now().to_datetime() + valid_for;
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn csr() -> String {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["host-0".to_owned()]).unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn request() -> HostCertificateRequestSpec {
        HostCertificateRequestSpec {
            request: csr(),
            ..HostCertificateRequestSpec::default()
        }
    }

    #[test]
    fn an_ssh_key_is_certified_with_an_ssh_ca_and_only_then() {
        let (cert, key) = ca(Duration::from_secs(3600));
        let names = host_names(&host(None)).unwrap();
        let agent_key = SshUserCa::generate().unwrap().public_key();
        let with_key = HostCertificateRequestSpec {
            ssh_public_key: agent_key,
            ..request()
        };
        let without_ca = AgentSigner::from_pem(&cert, &key, Duration::from_secs(60)).unwrap();
        let status = without_ca.sign("host-0", &names, &with_key, false);
        assert_eq!(status.unwrap().unwrap().ssh_certificate, "");
        let signer = without_ca.with_ssh_ca(SshUserCa::generate().unwrap());
        let status = signer.sign("host-0", &names, &with_key, false).unwrap();
        let ssh = status.unwrap().ssh_certificate;
        assert!(
            ssh.starts_with("ssh-ed25519-cert-v01@openssh.com "),
            "{ssh}"
        );
        let status = signer.sign("host-0", &names, &request(), false).unwrap();
        assert_eq!(status.unwrap().ssh_certificate, "");
        let bad = HostCertificateRequestSpec {
            ssh_public_key: "not a key".to_owned(),
            ..request()
        };
        let error = signer.sign("host-0", &names, &bad, false).unwrap_err();
        assert!(
            format!("{error:?}").contains("spec.sshPublicKey"),
            "{error:?}"
        );
    }

    fn host(agent_address: Option<&str>) -> Host {
        Host::new(
            "host-0",
            HostSpec {
                agent_address: agent_address.map(str::to_owned),
                ..HostSpec::default()
            },
        )
    }

    #[test]
    fn no_certificate_outlives_its_ca() {
        let (cert, key) = ca(Duration::from_secs(3600));
        let signer = AgentSigner::from_pem(&cert, &key, Duration::from_secs(86400)).unwrap();
        let names = host_names(&host(None)).unwrap();
        let status = signer
            .sign("host-0", &names, &request(), false)
            .unwrap()
            .unwrap();
        let expires = status.expiration_time.unwrap().0.as_second();
        assert_eq!(expires, signer.ca_not_after);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let (cert, _) = ca(Duration::from_secs(3600));
        let (_, other_key) = ca(Duration::from_secs(3600));
        let error = AgentSigner::from_pem(&cert, &other_key, Duration::from_secs(60)).unwrap_err();
        assert!(error.to_string().contains("does not belong"), "{error}");
    }

    #[test]
    fn the_agent_address_adds_an_ip_or_a_dns_name() {
        let dns = |name: &str| SanType::DnsName(name.try_into().unwrap());
        let cases = [
            (None, vec![dns("host-0")]),
            (
                Some("10.0.0.5:10270"),
                vec![dns("host-0"), SanType::IpAddress([10, 0, 0, 5].into())],
            ),
            (
                Some("[2001:db8::5]:10270"),
                vec![
                    dns("host-0"),
                    SanType::IpAddress("2001:db8::5".parse().unwrap()),
                ],
            ),
            (
                Some("node-5.example:10270"),
                vec![dns("host-0"), dns("node-5.example")],
            ),
            (Some("host-0:10270"), vec![dns("host-0")]),
        ];
        for (address, want) in cases {
            assert_eq!(host_names(&host(address)).unwrap(), want, "{address:?}");
        }
    }
}
