//! [`Suite`]: the battery under test (embedded or external) and what a test needs to
//! talk to it.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use battery_embedded::BatteryConfig;
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use battery_embedded::simhost::SimulatedHost;
use battery_proto::poolmgr::v1alpha1::events_client::EventsClient;
use battery_proto::poolmgr::v1alpha1::host_admin_client::HostAdminClient;
use battery_proto::poolmgr::v1alpha1::lease_client::LeaseClient;
use battery_proto::poolmgr::v1alpha1::pool_admin_client::PoolAdminClient;
use battery_telemetry::error_chain;
use tempfile::TempDir;
use tonic_health::pb::health_client::HealthClient;

use crate::battery_access::{BatteryAccess, BatteryChannel, BatteryPki};
use crate::env::{
    ADDRESS_VAR, CA_FILE_VAR, CLIENT_CERT_FILE_VAR, CLIENT_KEY_FILE_VAR, HOSTS_VAR, LOG_VAR,
    SERVER_NAME_VAR, SWEEP_VAR, TIMEOUT_VAR, TOKEN_FILE_VAR, WARNING_WINDOW_VAR, duration_var,
    parse_hosts, var,
};

/// The embedded battery's timing: fast, so the whole suite runs in well under a minute.
const EMBEDDED_SWEEP: Duration = Duration::from_millis(100);
const EMBEDDED_RECONCILE: Duration = Duration::from_millis(100);
const EMBEDDED_WARNING_WINDOW: Duration = Duration::from_secs(10);
const EMBEDDED_PROVISIONING_DELAY: Duration = Duration::from_millis(20);
const EMBEDDED_TIMEOUT: Duration = Duration::from_secs(20);
const EMBEDDED_HOSTS: usize = 2;
/// Still poolmgrd's polling, only faster: its 1 s would make every wait on an event
/// slower, and "nothing more happens" windows would have to outlast it.
const EMBEDDED_EVENT_POLL: Duration = Duration::from_millis(20);
/// poolmgrd's own interval, for tests of event delivery as poolmgrd does it.
const POOLMGRD_EVENT_POLL: Duration = Duration::from_secs(1);

/// poolmgrd's fixed reconcile tick, and its defaults for what it lets you configure.
const EXTERNAL_RECONCILE: Duration = Duration::from_secs(10);
const EXTERNAL_SWEEP: Duration = Duration::from_secs(10);
const EXTERNAL_WARNING_WINDOW: Duration = Duration::from_secs(30);
const EXTERNAL_TIMEOUT: Duration = Duration::from_secs(120);

/// The most a battery's sweep interval may be for tests that wait on expiry.
const FAST_SWEEP_LIMIT: Duration = Duration::from_secs(1);

/// A registered flintlock Host the suite may place pools on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRef {
    pub name: String,
    /// Its flintlock gRPC address (`host:port`), as registered with battery.
    pub address: String,
}

/// What the suite knows about the battery's clocks.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub sweep_interval: Duration,
    pub warning_window: Duration,
    pub reconcile_interval: Duration,
    /// The longest any one wait may take.
    pub timeout: Duration,
}

impl Timing {
    /// Long enough for the battery to have reacted to a change (two reconcile ticks and
    /// then some): how long "nothing happens" is observed.
    pub fn settle(&self) -> Duration {
        2 * self.reconcile_interval + Duration::from_millis(400)
    }
}

/// What a test needs from its battery. A test whose needs cannot be met against an
/// external battery is skipped with one line on stderr saying why.
#[derive(Debug, Clone, Default)]
pub struct Options {
    embedded_only: Option<&'static str>,
    hosts: Option<usize>,
    persistent: bool,
    sweep_interval: Option<Duration>,
    fast_sweep: bool,
    poolmgrd_events: bool,
    replay_batch_pause: Option<Duration>,
}

impl Options {
    pub fn new() -> Self {
        Self::default()
    }

    /// Only against the embedded battery, for `why` (fault injection, restarts, ...).
    pub fn embedded_only(mut self, why: &'static str) -> Self {
        self.embedded_only = Some(why);
        self
    }

    /// At least `n` Hosts (the embedded battery starts exactly `n`).
    pub fn hosts(mut self, n: usize) -> Self {
        self.hosts = Some(n);
        self
    }

    /// A data directory, so [`Suite::restart`] keeps state. Embedded only.
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self.embedded_only
            .get_or_insert("restarts the battery on its data directory");
        self
    }

    /// The embedded battery's sweep interval (a control of timing: embedded only).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = Some(interval);
        self.embedded_only.get_or_insert("sets the sweep interval");
        self
    }

    /// Waits on the sweeper (expiry): needs a sweep interval of at most 1 s, which an
    /// external battery has only if `BATTERY_CONFORMANCE_SWEEP_INTERVAL` says so.
    pub fn fast_sweep(mut self) -> Self {
        self.fast_sweep = true;
        self
    }

    /// Events delivered as poolmgrd delivers them: the outbox polled every second (the
    /// embedded battery otherwise polls faster). An external poolmgrd always does.
    pub fn poolmgrd_events(mut self) -> Self {
        self.poolmgrd_events = true;
        self
    }

    /// The embedded battery's test-only pause after each full batch of a Subscribe
    /// stream, so a replay stalls between its batches. Embedded only.
    pub fn replay_batch_pause(mut self, pause: Duration) -> Self {
        self.replay_batch_pause = Some(pause);
        self.embedded_only
            .get_or_insert("pauses the replay between batches");
        self
    }
}

enum Target {
    Embedded {
        local: Option<Box<LocalBattery>>,
        _data_dir: Option<TempDir>,
    },
    External,
}

/// A file an environment variable names, read whole; panics naming the variable.
fn file_var(name: &str) -> Option<String> {
    var(name)
        .map(|path| std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}={path}: {e}")))
}

/// One test's battery: embedded (started for this test alone) or external (shared, so
/// every test works in its own namespace and cleans up in [`Suite::finish`]).
pub struct Suite {
    target: Target,
    access: BatteryAccess,
    channel: BatteryChannel,
    namespace: String,
    timing: Timing,
    hosts: Vec<HostRef>,
    /// Hosts this test registered, removed again by `finish`.
    pub(crate) added_hosts: Mutex<Vec<String>>,
}

/// The running test's name (libtest names the thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unknown test>")
        .to_owned()
}

/// Reports (one line on stderr, which libtest does not capture) that the running test
/// is skipped and why. The test then returns.
pub fn skip(why: &str) {
    let line = format!(
        "SKIP {}: {why} (running against {})\n",
        test_name(),
        var(ADDRESS_VAR).unwrap_or_default()
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// With `BATTERY_CONFORMANCE_LOG` set (an env-filter such as `debug` or
/// `battery_embedded=debug`), the embedded battery's logs go to the test's output.
fn init_logging() {
    if let Some(filter) = var(LOG_VAR) {
        battery_telemetry::init_test_logging(&filter);
    }
}

fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

impl Suite {
    /// A battery with the default options (never skipped).
    pub async fn start() -> Suite {
        Self::start_with(Options::new())
            .await
            .expect("default options are always satisfiable")
    }

    /// A battery meeting `options`, or `None` (after printing why) when the external
    /// battery cannot meet them.
    pub async fn start_with(options: Options) -> Option<Suite> {
        init_logging();
        match var(ADDRESS_VAR) {
            Some(address) => Self::external(address, &options),
            None => Some(Self::embedded(&options).await),
        }
    }

    fn external(address: String, options: &Options) -> Option<Suite> {
        if let Some(why) = options.embedded_only {
            skip(&format!("{why}: runs only against the embedded battery"));
            return None;
        }
        let hosts: Vec<HostRef> = parse_hosts(&var(HOSTS_VAR).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{HOSTS_VAR}: {e}"))
            .into_iter()
            .map(|(name, address)| HostRef { name, address })
            .collect();
        assert!(
            !hosts.is_empty(),
            "{ADDRESS_VAR} is set, so {HOSTS_VAR} must name the registered Hosts (name=host:port,...)"
        );
        let needed = options.hosts.unwrap_or(1);
        if hosts.len() < needed {
            skip(&format!(
                "needs {needed} Hosts, {HOSTS_VAR} names {}",
                hosts.len()
            ));
            return None;
        }
        let timing = Timing {
            sweep_interval: duration_var(SWEEP_VAR).unwrap_or(EXTERNAL_SWEEP),
            warning_window: duration_var(WARNING_WINDOW_VAR).unwrap_or(EXTERNAL_WARNING_WINDOW),
            reconcile_interval: EXTERNAL_RECONCILE,
            timeout: duration_var(TIMEOUT_VAR).unwrap_or(EXTERNAL_TIMEOUT),
        };
        if options.fast_sweep && timing.sweep_interval > FAST_SWEEP_LIMIT {
            skip(&format!(
                "waits on the sweeper and needs a sweep interval of at most {FAST_SWEEP_LIMIT:?} \
                 ({SWEEP_VAR} says {:?})",
                timing.sweep_interval
            ));
            return None;
        }
        let address = address
            .split_once("://")
            .map_or(address.as_str(), |(_, rest)| rest)
            .to_owned();
        let identity = match (
            file_var(CLIENT_CERT_FILE_VAR),
            file_var(CLIENT_KEY_FILE_VAR),
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => panic!("{CLIENT_CERT_FILE_VAR} and {CLIENT_KEY_FILE_VAR} go together"),
        };
        let access = BatteryAccess {
            address,
            ca_pem: file_var(CA_FILE_VAR),
            identity,
            server_name: var(SERVER_NAME_VAR),
            token: file_var(TOKEN_FILE_VAR).map(|text| {
                battery_proto::poolmgr::basic_auth::token_in(&text)
                    .unwrap_or_else(|| panic!("{TOKEN_FILE_VAR} names a file with no token"))
                    .to_owned()
            }),
        };
        Some(Suite {
            target: Target::External,
            channel: access.channel(),
            access,
            namespace: format!("e2e-{}", short_id()),
            timing,
            hosts,
            added_hosts: Mutex::new(Vec::new()),
        })
    }

    async fn embedded(options: &Options) -> Suite {
        let data_dir = options.persistent.then(|| {
            tempfile::Builder::new()
                .prefix("battery-e2e-data-")
                .tempdir()
                .expect("create data directory")
        });
        // Secured as a production poolmgrd is: TLS, a client certificate and a token.
        let credentials = tempfile::Builder::new()
            .prefix("battery-e2e-pki-")
            .tempdir()
            .expect("create the credentials' directory");
        let pki = BatteryPki::write(credentials.path()).expect("write battery's credentials");
        let sweep_interval = options.sweep_interval.unwrap_or(EMBEDDED_SWEEP);
        let config = LocalBatteryConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.as_ref().map(|d| d.path().to_path_buf()),
            hosts: options.hosts.unwrap_or(EMBEDDED_HOSTS),
            provisioning_delay: EMBEDDED_PROVISIONING_DELAY,
            battery: BatteryConfig {
                data_dir: None,
                sweep_interval,
                warning_window: EMBEDDED_WARNING_WINDOW,
                reconcile_interval: EMBEDDED_RECONCILE,
                create_poll_interval: Duration::from_millis(20),
                create_timeout: Duration::from_secs(10),
                // Also each readiness probe's cap (min(interval, 5 s), §2.3): a probe is a
                // process spawn on the simulated Host, which can take longer than 20 ms on
                // a busy machine, so a shorter interval only makes probes time out.
                guest_agent_interval: Duration::from_millis(250),
                guest_agent_timeout: Duration::from_secs(10),
                exec_timeout: Duration::ZERO,
                event_poll_interval: if options.poolmgrd_events {
                    POOLMGRD_EVENT_POLL
                } else {
                    EMBEDDED_EVENT_POLL
                },
                extension_events_on_commit: false,
                replay_batch_pause: options.replay_batch_pause.unwrap_or_default(),
                api: pki.api_security().expect("read battery's credentials"),
            },
            // The conformance suite speaks to battery, which never reaches a guest's sshd.
            ssh_proxy: None,
        };
        let local = LocalBattery::start(config)
            .await
            .unwrap_or_else(|e| panic!("starting the embedded battery: {}", error_chain(&e)));
        let access = pki.access(&local.address().to_string());
        let hosts = local
            .hosts()
            .iter()
            .map(|h| HostRef {
                name: h.name().to_owned(),
                address: h.address().to_string(),
            })
            .collect();
        Suite {
            target: Target::Embedded {
                local: Some(Box::new(local)),
                _data_dir: data_dir,
            },
            channel: access.channel(),
            access,
            namespace: format!("e2e-{}", short_id()),
            timing: Timing {
                sweep_interval,
                warning_window: EMBEDDED_WARNING_WINDOW,
                reconcile_interval: EMBEDDED_RECONCILE,
                timeout: duration_var(TIMEOUT_VAR).unwrap_or(EMBEDDED_TIMEOUT),
            },
            hosts,
            added_hosts: Mutex::new(Vec::new()),
        }
    }

    pub fn is_embedded(&self) -> bool {
        matches!(self.target, Target::Embedded { .. })
    }

    /// This test's namespace: every pool it creates lives here (or in namespaces that
    /// start with it), so tests sharing an external battery never see each other.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The Hosts the battery had registered when the test started.
    pub fn hosts(&self) -> &[HostRef] {
        &self.hosts
    }

    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name.clone()).collect()
    }

    /// The embedded battery. Panics against an external one (the test should have asked
    /// for [`Options::embedded_only`]).
    pub fn local(&self) -> &LocalBattery {
        match &self.target {
            Target::Embedded {
                local: Some(local), ..
            } => local,
            _ => panic!("this test needs the embedded battery"),
        }
    }

    /// The embedded battery's simulated Host `name` (for fault injection).
    pub fn sim_host(&self, name: &str) -> &SimulatedHost {
        self.local()
            .host(name)
            .unwrap_or_else(|| panic!("no simulated host {name}"))
    }

    /// Restarts the embedded battery on its data directory (a poolmgrd restart).
    pub async fn restart(&mut self) {
        let Target::Embedded {
            local: Some(local), ..
        } = &mut self.target
        else {
            panic!("restart needs the embedded battery");
        };
        tokio::time::timeout(self.timing.timeout, local.restart_battery())
            .await
            .expect("restart_battery finished in time (does shutdown wait on in-flight RPCs?)")
            .unwrap_or_else(|e| panic!("restarting the embedded battery: {}", error_chain(&e)));
        self.channel = self.access.channel();
    }

    /// How this test reaches its battery: for a client of its own (one without a
    /// credential, to see it refused).
    pub fn access(&self) -> &BatteryAccess {
        &self.access
    }

    pub fn pool_admin(&self) -> PoolAdminClient<BatteryChannel> {
        PoolAdminClient::new(self.channel.clone())
    }

    pub fn lease_client(&self) -> LeaseClient<BatteryChannel> {
        LeaseClient::new(self.channel.clone())
    }

    pub fn events_client(&self) -> EventsClient<BatteryChannel> {
        EventsClient::new(self.channel.clone())
    }

    pub fn host_admin(&self) -> HostAdminClient<BatteryChannel> {
        HostAdminClient::new(self.channel.clone())
    }

    pub fn health(&self) -> HealthClient<BatteryChannel> {
        HealthClient::new(self.channel.clone())
    }

    /// Ends the test: the embedded battery is shut down; on an external one the test's
    /// pools are force-deleted and the Hosts it added are removed (best effort).
    pub async fn finish(mut self) {
        match &mut self.target {
            Target::Embedded { local, .. } => {
                if let Some(local) = local.take() {
                    tokio::time::timeout(self.timing.timeout, local.shutdown())
                        .await
                        .expect("LocalBattery::shutdown finished in time");
                }
            }
            Target::External => self.clean_up_external().await,
        }
    }
}
