//! How an exec agent's identity names its Host, as kubelet's `system:node:<name>` names
//! its Node: the user `system:battery-agent:<host>` in the group [`AGENT_GROUP`]. The API
//! server lets such a user write only that Host (its registration, its status report,
//! its serving certificate), and an agent is only ever sent that Host's sessions.

/// The group every exec agent's identity is in.
pub const AGENT_GROUP: &str = "battery:agents";

/// What an agent's user name starts with; the Host's name follows.
const AGENT_USER_PREFIX: &str = "system:battery-agent:";

/// The user name of the exec agent of Host `host`.
pub fn agent_username(host: &str) -> String {
    format!("{AGENT_USER_PREFIX}{host}")
}

/// The Host whose agent `username` (in `groups`) is, or `None` for anyone who is not an
/// agent. Both the name and the group are required, so neither alone makes an agent.
pub fn agent_host<'a, G: AsRef<str>>(username: &'a str, groups: &[G]) -> Option<&'a str> {
    let host = username.strip_prefix(AGENT_USER_PREFIX)?;
    let in_group = groups.iter().any(|g| g.as_ref() == AGENT_GROUP);
    (in_group && !host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_is_named_for_its_host_and_in_the_agent_group() {
        let user = agent_username("host-0");
        assert_eq!(user, "system:battery-agent:host-0");
        assert_eq!(agent_host(&user, &[AGENT_GROUP]), Some("host-0"));
        assert_eq!(agent_host(&user, &["system:authenticated"]), None);
        assert_eq!(
            agent_host("system:serviceaccount:ns:sa", &[AGENT_GROUP]),
            None
        );
        assert_eq!(agent_host("system:battery-agent:", &[AGENT_GROUP]), None);
    }
}
