//! The SSH user certificates exec agents log in to MicroVMs with, through flintlock's SSH
//! proxy, for interactive exec (ADR 33). They are made beside the agent's serving
//! certificate at `hosts/<name>/certificate`, for the key the agent sent (its private
//! half never leaves the agent), and expire with it.

use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use russh::keys::ssh_key::certificate::{Builder, CertType};
use russh::keys::ssh_key::{LineEnding, PrivateKey, PublicKey};

/// The guest user an agent logs in as: flintlock's exec runs commands as root too.
pub const SSH_PRINCIPAL: &str = "root";
/// What a certificate lets its holder do; OpenSSH grants nothing a certificate does not
/// name.
const EXTENSIONS: [&str; 2] = ["permit-pty", "permit-port-forwarding"];

/// The CA guests trust for user certificates (their sshd's `TrustedUserCAKeys`).
pub struct SshUserCa {
    key: PrivateKey,
}

impl fmt::Debug for SshUserCa {
    // The CA's private key: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshUserCa")
            .field("public_key", &self.public_key())
            .finish_non_exhaustive()
    }
}

impl SshUserCa {
    /// A CA from its private key in OpenSSH's format (as `ssh-keygen` writes it).
    pub fn from_openssh(text: &str) -> anyhow::Result<Self> {
        let key = PrivateKey::from_openssh(text).context("not an OpenSSH private key")?;
        if key.is_encrypted() {
            anyhow::bail!(
                "the key is encrypted with a passphrase; the server needs it in the clear"
            );
        }
        Ok(Self { key })
    }

    /// The CA of `--agent-ssh-ca-key-file`.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --agent-ssh-ca-key-file {}", path.display()))?;
        Self::from_openssh(&text)
            .with_context(|| format!("--agent-ssh-ca-key-file {}", path.display()))
    }

    /// A new Ed25519 CA, for `dev`.
    pub fn generate() -> anyhow::Result<Self> {
        let key = PrivateKey::random(
            &mut russh::keys::key::safe_rng(),
            russh::keys::Algorithm::Ed25519,
        )
        .context("generating an SSH CA key")?;
        Ok(Self { key })
    }

    /// The private key in OpenSSH's format, for `dev` to keep beside its other keys.
    pub fn to_openssh(&self) -> anyhow::Result<String> {
        Ok(self
            .key
            .to_openssh(LineEnding::LF)
            .context("encoding the SSH CA key")?
            .to_string())
    }

    /// The public key, one line, as guests' `TrustedUserCAKeys` file holds it.
    pub fn public_key(&self) -> String {
        self.key
            .public_key()
            .to_openssh()
            .unwrap_or_else(|err| format!("<unencodable key: {err}>"))
    }

    /// Certifies `public_key` (OpenSSH's one-line form) for `host`'s agent, valid from a
    /// minute ago (for clocks a little behind) to `not_after` (Unix seconds). The error
    /// is for a person: the key is not one.
    pub fn certify(&self, host: &str, public_key: &str, not_after: u64) -> Result<String, String> {
        let subject = PublicKey::from_openssh(public_key.trim())
            .map_err(|err| format!("not an OpenSSH public key: {err}"))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|err| err.to_string())?
            .as_secs();
        let signed = (|| {
            let mut builder = Builder::new_with_random_nonce(
                &mut russh::keys::key::safe_rng(),
                subject.key_data().clone(),
                now.saturating_sub(60),
                not_after.max(now),
            )?;
            builder
                .cert_type(CertType::User)?
                .key_id(format!("battery-agent:{host}"))?
                .valid_principal(SSH_PRINCIPAL)?;
            for extension in EXTENSIONS {
                builder.extension(extension, "")?;
            }
            builder.sign(&self.key)?.to_openssh()
        })();
        signed.map_err(|err| format!("cannot be certified: {err}"))
    }
}

#[cfg(test)]
mod tests {
    use russh::keys::ssh_key::Certificate;

    use super::*;

    #[test]
    fn a_certificate_names_root_permits_a_pty_and_verifies_against_the_ca() {
        let ca = SshUserCa::generate().unwrap();
        let again = SshUserCa::from_openssh(&ca.to_openssh().unwrap()).unwrap();
        assert_eq!(again.public_key(), ca.public_key());
        let agent = SshUserCa::generate().unwrap();
        let not_after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let text = ca
            .certify("host-0", &agent.public_key(), not_after)
            .unwrap();
        let certificate = Certificate::from_openssh(&text).unwrap();
        let fingerprint = ca.key.public_key().fingerprint(Default::default());
        certificate.validate([&fingerprint]).unwrap();
        assert_eq!(certificate.cert_type(), CertType::User);
        assert_eq!(certificate.valid_principals(), [SSH_PRINCIPAL]);
        assert_eq!(certificate.key_id(), "battery-agent:host-0");
        assert_eq!(certificate.valid_before(), not_after);
        for extension in EXTENSIONS {
            assert!(
                certificate.extensions().contains_key(extension),
                "{extension}"
            );
        }
        assert!(format!("{ca:?}").contains("public_key"));
        assert!(!format!("{ca:?}").contains("PRIVATE"));
    }

    #[test]
    fn what_is_not_a_public_key_is_refused() {
        let ca = SshUserCa::generate().unwrap();
        let error = ca.certify("host-0", "ssh-ed25519 AAAA", 0).unwrap_err();
        assert!(error.starts_with("not an OpenSSH public key"), "{error}");
    }
}
