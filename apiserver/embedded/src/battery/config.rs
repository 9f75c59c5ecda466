//! The embedded battery's settings, with poolmgrd's values as defaults.

use std::path::PathBuf;
use std::time::Duration;

use super::security::ApiSecurity;

/// poolmgrd's DefaultEventsPollInterval, which a zero interval also selects there.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The embedded battery's settings. The defaults are poolmgrd's, whose internal timings
/// are not configurable there (§6); here they are, so tests can run fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatteryConfig {
    /// Where the store file lives; None keeps the store in memory.
    pub data_dir: Option<PathBuf>,
    /// How often the sweeper retries deletions, expires leases and warns (10 s).
    pub sweep_interval: Duration,
    /// How far ahead of expiry VM_EXPIRING_SOON is emitted (30 s).
    pub warning_window: Duration,
    /// Each pool reconciler's tick (10 s).
    pub reconcile_interval: Duration,
    /// How often a new MicroVM's state is polled until CREATED (2 s).
    pub create_poll_interval: Duration,
    /// How long a new MicroVM may take to reach CREATED (60 s).
    pub create_timeout: Duration,
    /// How often the guest agent is probed (1 s).
    pub guest_agent_interval: Duration,
    /// How long the guest agent may take to answer (30 s).
    pub guest_agent_timeout: Duration,
    /// The timeout given to each hook command; zero means none (0).
    pub exec_timeout: Duration,
    /// How long a Subscribe stream waits before reading the outbox again after a read
    /// that was not a full batch (1 s; zero also means 1 s, as in poolmgrd).
    pub event_poll_interval: Duration,
    /// Not poolmgrd's: an extension of the embedded battery that wakes Subscribe streams
    /// on each commit instead of polling, for speed where poolmgrd's latency is not what
    /// is under test (false: poll, as poolmgrd does).
    pub extension_events_on_commit: bool,
    /// For tests only, not poolmgrd's: a pause after each full batch of events a Subscribe
    /// stream sends, so a replay stalls between its batches of 100 (zero: none, as in
    /// poolmgrd).
    pub replay_batch_pause: Duration,
    /// How the gRPC port is secured (`api_server`); plaintext without a token by default.
    pub api: ApiSecurity,
}

impl Default for BatteryConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            sweep_interval: Duration::from_secs(10),
            warning_window: Duration::from_secs(30),
            reconcile_interval: Duration::from_secs(10),
            create_poll_interval: Duration::from_secs(2),
            create_timeout: Duration::from_secs(60),
            guest_agent_interval: Duration::from_secs(1),
            guest_agent_timeout: Duration::from_secs(30),
            exec_timeout: Duration::ZERO,
            event_poll_interval: DEFAULT_POLL_INTERVAL,
            extension_events_on_commit: false,
            replay_batch_pause: Duration::ZERO,
            api: ApiSecurity::default(),
        }
    }
}
