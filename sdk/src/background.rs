//! Background processes: commands that run on in a claim's MicroVM after the client that
//! started them left (`microvmprocesses`, ADR 44). [`Claim::background`] (or
//! [`Client::background`]) builds one and starts it; a [`BackgroundProcess`] attaches to
//! it (its output from the start, then live), waits for its end, stops it and deletes it;
//! [`Client::processes`] lists them.

use std::collections::BTreeMap;
use std::time::Duration;

use battery_types::{
    MicroVMProcess, MicroVMProcessSpec, MicroVMProcessStatus, ProcessEnvVar, ProcessPhase,
};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};

use crate::claim::Claim;
use crate::client::Client;
use crate::error::Error;
use crate::exec::Process;

/// How long one watch of [`BackgroundProcess::wait`] lasts before it is made again.
const WATCH_SECONDS: u32 = 290;

/// A background process to start, built like [`crate::Command`]: the program and its
/// arguments (no shell), then its environment, working directory and stdin.
#[must_use = "a background process runs only by start()"]
pub struct BackgroundCommand {
    client: Client,
    name: Option<String>,
    labels: BTreeMap<String, String>,
    spec: MicroVMProcessSpec,
}

impl BackgroundCommand {
    fn new(client: Client, claim: String, argv: Vec<String>) -> Self {
        Self {
            client,
            name: None,
            labels: BTreeMap::new(),
            spec: MicroVMProcessSpec {
                claim_name: claim,
                command: argv,
                ..MicroVMProcessSpec::default()
            },
        }
    }

    /// Its name; unset, the server makes one from the claim's.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A label on it, for `kubectl get microvmprocesses -l`.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets an environment variable, over the claim's own `env`.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.spec.env.push(ProcessEnvVar {
            name: name.into(),
            value: value.into(),
        });
        self
    }

    /// Runs it in `dir` in the guest.
    pub fn working_dir(mut self, dir: impl Into<String>) -> Self {
        self.spec.working_dir = dir.into();
        self
    }

    /// Keeps its stdin open for [`BackgroundProcess::attach`] to write to.
    pub fn stdin(mut self, open: bool) -> Self {
        self.spec.stdin = open;
        self
    }

    /// How long a stop waits after SIGTERM before SIGKILL (30 s unless set).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.spec.termination_grace_period_seconds =
            Some(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX));
        self
    }

    /// Starts it; it runs once this returns, whatever the caller does next.
    pub async fn start(self) -> Result<BackgroundProcess, Error> {
        let mut object = MicroVMProcess::new("", self.spec);
        object.metadata = ObjectMeta {
            generate_name: self
                .name
                .is_none()
                .then(|| format!("{}-", object.spec.claim_name)),
            name: self.name,
            labels: (!self.labels.is_empty()).then_some(self.labels),
            ..ObjectMeta::default()
        };
        let created = self
            .client
            .processes_api()
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        Ok(BackgroundProcess {
            client: self.client,
            object: created,
        })
    }
}

/// A background process in a claim's MicroVM.
pub struct BackgroundProcess {
    client: Client,
    object: MicroVMProcess,
}

impl BackgroundProcess {
    /// Its name.
    pub fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or_default()
    }

    /// The object as last read.
    pub fn object(&self) -> &MicroVMProcess {
        &self.object
    }

    /// Its status as last read.
    pub fn status(&self) -> MicroVMProcessStatus {
        self.object.status.clone().unwrap_or_default()
    }

    /// Attaches to it: its output from its start (what its Host's agent retained, the
    /// latest 1 MiB), then live, and [`Process::wait`] gives its exit code; with `stdin`,
    /// a stdin to write to it (only when it was started with [`BackgroundCommand::stdin`]).
    /// Dropping the attach leaves it running.
    pub async fn attach(&self, stdin: bool) -> Result<Process, Error> {
        let mut query = form_urlencoded::Serializer::new(String::new());
        if stdin {
            query.append_pair("stdin", "true");
        }
        query.append_pair("stdout", "true");
        query.append_pair("stderr", "true");
        let url = format!(
            "{}/{}/attach?{}",
            self.client.processes_api().resource_url(),
            self.name(),
            query.finish()
        );
        let connection = self.client.connect_url(url, "").await?;
        Ok(Process::pumped(connection, stdin, None, String::new()))
    }

    /// Waits for it to end and gives its status: its exit code, or the signal that
    /// stopped it, or why it was lost.
    pub async fn wait(&mut self) -> Result<MicroVMProcessStatus, Error> {
        let api = self.client.processes_api();
        let name = self.name().to_owned();
        loop {
            self.object = api
                .get(&name)
                .await
                .map_err(|e| Error::from_claims(e, ""))?;
            if ended(&self.object) {
                return Ok(self.status());
            }
            let version = self
                .object
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(WATCH_SECONDS);
            let mut events = api
                .watch(&params, &version)
                .await
                .map_err(|e| Error::from_claims(e, ""))?
                .boxed();
            while let Some(event) = events
                .try_next()
                .await
                .map_err(|e| Error::from_claims(e, ""))?
            {
                match event {
                    WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                        self.object = object;
                        if ended(&self.object) {
                            return Ok(self.status());
                        }
                    }
                    // Gone: the get above says so (404).
                    WatchEvent::Deleted(_) => break,
                    // Too old, or a bookmark: read it again and watch on from there.
                    WatchEvent::Error(_) => break,
                    WatchEvent::Bookmark(_) => {}
                }
            }
        }
    }

    /// Stops it: SIGTERM, then SIGKILL after its grace period. It is kept, its end to be
    /// read ([`BackgroundProcess::wait`]).
    pub async fn kill(&mut self) -> Result<(), Error> {
        let url = format!(
            "{}/{}/stop",
            self.client.processes_api().resource_url(),
            self.name()
        );
        let request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(b"{}".to_vec())
            .map_err(|e| Error::Api(kube::Error::HttpError(e)))?;
        self.object = self
            .client
            .kube()
            .request(request)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        Ok(())
    }

    /// Deletes it, stopping it first if it runs.
    pub async fn delete(self) -> Result<(), Error> {
        self.client
            .processes_api()
            .delete(self.name(), &DeleteParams::default())
            .await
            .map(drop)
            .map_err(|e| Error::from_claims(e, ""))
    }
}

/// Whether it no longer runs.
fn ended(process: &MicroVMProcess) -> bool {
    process
        .status
        .as_ref()
        .and_then(|status| status.phase.as_ref())
        .is_some_and(|phase| *phase != ProcessPhase::Running)
}

impl Client {
    pub(crate) fn processes_api(&self) -> Api<MicroVMProcess> {
        Api::namespaced(self.kube.clone(), &self.namespace)
    }

    /// A background process running `command` (a program and its arguments) in the
    /// claim `claim` of this client's namespace, which this client's user holds.
    pub fn background<I, S>(&self, claim: impl Into<String>, command: I) -> BackgroundCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv = command.into_iter().map(Into::into).collect();
        BackgroundCommand::new(self.clone(), claim.into(), argv)
    }

    /// The background processes of this client's namespace, those matching
    /// `label_selector` when given.
    pub async fn processes(
        &self,
        label_selector: Option<&str>,
    ) -> Result<Vec<BackgroundProcess>, Error> {
        let mut params = ListParams::default();
        if let Some(selector) = label_selector {
            params = params.labels(selector);
        }
        let list = self
            .processes_api()
            .list(&params)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        Ok(list
            .items
            .into_iter()
            .map(|object| BackgroundProcess {
                client: self.clone(),
                object,
            })
            .collect())
    }

    /// The background process `name` of this client's namespace.
    pub async fn process(&self, name: &str) -> Result<BackgroundProcess, Error> {
        let object = self
            .processes_api()
            .get(name)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        Ok(BackgroundProcess {
            client: self.clone(),
            object,
        })
    }
}

impl Claim {
    /// A background process running `command` (a program and its arguments, no shell)
    /// in the claim's MicroVM, to set up and [`BackgroundCommand::start`].
    pub fn background<I, S>(&self, command: I) -> BackgroundCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv = command.into_iter().map(Into::into).collect();
        BackgroundCommand::new(self.client.clone(), self.name().to_owned(), argv)
    }
}
