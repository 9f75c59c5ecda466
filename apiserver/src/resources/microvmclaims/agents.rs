//! Where the Bound claims' MicroVMs are: the Hosts whose exec agents hold their
//! background processes, which a list of processes asks (ADR 44).

use std::collections::BTreeSet;

use battery_api_machinery::status::ApiError;

use super::processes::index::Agent;
use super::record::{ClaimRecord, RESOURCE};
use super::storage::ClaimStorage;

impl ClaimStorage {
    /// The agents of the Hosts of the Bound claims (in `namespace`, if given), each
    /// once, and the uids of those claims.
    pub fn agents(
        &self,
        namespace: Option<&str>,
    ) -> Result<(BTreeSet<Agent>, BTreeSet<String>), ApiError> {
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, namespace)?;
        let mut agents = BTreeSet::new();
        let mut claims = BTreeSet::new();
        for record in records.into_iter().filter(|record| record.lease.is_some()) {
            let Some(host) = record.status.host else {
                continue;
            };
            let address = self
                .hosts
                .agent_address(&host.node_name)?
                .or(host.agent_address);
            if let Some(address) = address {
                agents.insert((host.node_name, address));
            }
            claims.extend(record.metadata.uid);
        }
        Ok((agents, claims))
    }
}
