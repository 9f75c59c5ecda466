//! Following the agents, so watches see what changes there without the API server: a
//! process that ends (polled every second where one runs), and, every 30 s, every agent
//! of a Bound claim's Host, which also finds the processes of claims that ended while
//! their agent could not be told, and has it forget them (ADR 44).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tracing::debug;

use super::index::{Agent, Seen};
use super::storage::ProcessStorage;
use crate::relay::ClaimRef;

/// How often the agents with a process running are asked: how late a watch may see one
/// end.
const POLL: Duration = Duration::from_secs(1);
/// How often every agent of a Bound claim's Host is asked.
const FULL_PASS: u32 = 30;

impl ProcessStorage {
    /// Follows the agents until dropped.
    pub async fn follow(self: Arc<Self>) {
        let mut tick = 0u32;
        loop {
            let full = tick.is_multiple_of(FULL_PASS);
            tick = tick.wrapping_add(1);
            if full {
                // Read only here: it reads every claim's record.
                let asked_at = Timestamp::now();
                match self.claims.agents(None) {
                    Ok((agents, live)) => {
                        for agent in agents {
                            self.pass(&agent, Some((&live, asked_at))).await;
                        }
                    }
                    Err(error) => {
                        debug!(error = %error.message(), "reading the Bound claims' agents")
                    }
                }
            } else {
                for agent in self.index.busy_agents().await {
                    self.pass(&agent, None).await;
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Asks `agent` and publishes what changed; given the `live` claims read before
    /// `asked_at`, has it forget the processes of claims not among them.
    async fn pass(&self, agent: &Agent, live: Option<(&BTreeSet<String>, Timestamp)>) {
        let seen = match self.ask(agent, None).await {
            Ok(seen) => seen,
            Err(error) => {
                debug!(host = %agent.0, error = %error.message(), "asking an agent for its processes");
                return;
            }
        };
        let (kept, orphaned): (Vec<Seen>, Vec<Seen>) =
            seen.into_iter().partition(|seen| match live {
                Some((live, asked_at)) => {
                    live.contains(&seen.claim_uid) || started_after(seen, asked_at)
                }
                None => true,
            });
        for seen in &orphaned {
            let claim = ClaimRef {
                namespace: seen.object.metadata.namespace.clone().unwrap_or_default(),
                name: seen.object.spec.claim_name.clone(),
                uid: seen.claim_uid.clone(),
            };
            if let Err(error) = self
                .index
                .relay()
                .forget_claim_processes(&agent.0, &agent.1, claim)
                .await
            {
                debug!(host = %agent.0, error = %error.message(), "forgetting an ended claim's processes");
            }
        }
        if let Err(error) = self.index.observe(agent, None, kept).await {
            debug!(host = %agent.0, error = %error.message(), "publishing the processes' changes");
        }
    }
}

/// Whether it started within a second of `asked_at` or later: its claim may have been
/// bound after the claims were read.
fn started_after(seen: &Seen, asked_at: Timestamp) -> bool {
    let started = seen
        .object
        .status
        .as_ref()
        .and_then(|status| status.start_time.as_ref())
        .map_or(asked_at, |time| time.0);
    started.as_second() + 1 >= asked_at.as_second()
}
