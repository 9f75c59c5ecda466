//! Where claims' guests reach kube-apiserver (`--guest-api-server`; ADR 45): what a Pod
//! learns from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, which client-go's
//! in-cluster config (and so kubectl) reads beside the ServiceAccount's files. The
//! operator gives it, because a MicroVM's guest is not a Pod: the reference Host keeps
//! guests off the Service and API server networks, so the `kubernetes` Service's
//! ClusterIP a Pod gets would not answer there.

use std::net::Ipv6Addr;
use std::str::FromStr;

/// The variables a Pod's containers get from the kubelet for the `kubernetes` Service.
pub const SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";
pub const SERVICE_PORT: &str = "KUBERNETES_SERVICE_PORT";

/// kube-apiserver's address as claims' guests reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestApiServer {
    /// A host name or an IP address; an IPv6 address bare, as the kubelet gives it.
    pub host: String,
    pub port: u16,
}

impl FromStr for GuestApiServer {
    type Err = String;

    /// `HOST:PORT`, an IPv6 address in brackets (`[fd00::1]:443`).
    fn from_str(value: &str) -> Result<Self, String> {
        let fix = "give HOST:PORT as guests reach kube-apiserver, such as 10.0.0.10:6443, \
                   api.example.com:443 or [fd00::1]:443";
        if value.contains("://") {
            return Err(format!("{value:?} is a URL; {fix}"));
        }
        let Some((host, port)) = value.rsplit_once(':') else {
            return Err(format!("{value:?} has no port; {fix}"));
        };
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) if v6.parse::<Ipv6Addr>().is_ok() => v6,
            Some(_) => return Err(format!("{value:?}: not an IPv6 address in brackets; {fix}")),
            None if host.contains(':') => {
                return Err(format!("{value:?}: put an IPv6 address in brackets; {fix}"));
            }
            None => host,
        };
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/[]@".contains(c)) {
            return Err(format!("{value:?}: {host:?} is not a host; {fix}"));
        }
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| format!("{value:?}: {port:?} is not a port from 1 to 65535; {fix}"))?;
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_host_and_port_with_ipv6_in_brackets() {
        let parsed = |value: &str| value.parse::<GuestApiServer>();
        let at = |host: &str, port| GuestApiServer {
            host: host.to_owned(),
            port,
        };
        assert_eq!(parsed("10.0.0.10:6443"), Ok(at("10.0.0.10", 6443)));
        assert_eq!(
            parsed("api.example.com:443"),
            Ok(at("api.example.com", 443))
        );
        assert_eq!(parsed("[fd00::1]:443"), Ok(at("fd00::1", 443)));
        for bad in [
            "https://api.example.com:443",
            "api.example.com",
            "fd00::1:443",
            "[nope]:443",
            ":443",
            "api.example.com:0",
            "api.example.com:https",
            "a b:443",
        ] {
            let error = parsed(bad).unwrap_err();
            assert!(
                error.contains("give HOST:PORT") && !error.contains('\n'),
                "{bad}: {error}"
            );
        }
    }
}
