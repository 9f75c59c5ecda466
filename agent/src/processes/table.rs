//! The process table of a Host: its processes by namespace and name, in memory with
//! what follows each, and in a file under `--state-dir` with what a list answers, so an
//! agent that restarts still lists every process, and reports those that were running
//! as lost (ADR 44). Written whole at each change, to a temporary file renamed over the
//! old: the table is small ([`MAX_PROCESSES`]) and changes at a process's start and end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use battery_proto::agent::v1alpha1::{self as pb, exit_status::Outcome};
use thiserror::Error;
use tokio_util::task::AbortOnDropHandle;
use tonic::Status;
use tracing::warn;

use super::live::Live;
use super::record::{Record, State, now};
use crate::flintlock::Flintlock;

/// Processes a Host keeps, running or ended; a start beyond is refused until one is
/// deleted. With [`super::output::RETAINED_BYTES`], what bounds the table's memory.
pub const MAX_PROCESSES: usize = 64;

/// The table's file in `--state-dir`.
const FILE: &str = "processes.json";

/// A process's namespace and name.
pub type Key = (String, String);

/// A process of the table.
pub struct Entry {
    /// Tells this process from a later one of the same name.
    pub id: u64,
    pub record: Record,
    pub live: Arc<Live>,
    /// Follows it to its end; dropping it closes its exec stream, which ends it.
    pub follower: Option<AbortOnDropHandle<()>>,
    /// A stop under way.
    pub stopper: Option<AbortOnDropHandle<()>>,
}

/// The table could not be read at start.
#[derive(Debug, Error)]
#[error("reading the process table {}", .path.display())]
pub struct LoadError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// The process table; cheap to clone.
#[derive(Clone)]
pub struct Processes(Arc<Inner>);

struct Inner {
    flintlock: Flintlock,
    file: PathBuf,
    entries: Mutex<BTreeMap<Key, Entry>>,
    ids: AtomicU64,
}

impl std::fmt::Debug for Processes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processes")
            .field("file", &self.0.file)
            .finish_non_exhaustive()
    }
}

/// How an ended record ends an attach.
fn outcome(state: &State) -> Option<Outcome> {
    match state {
        State::Running => None,
        State::Exited { code, .. } => Some(Outcome::Code(*code)),
        State::Failed { message, .. } | State::Lost { message, .. } => {
            Some(Outcome::Error(message.clone()))
        }
    }
}

impl Processes {
    /// The table `state_dir` holds, each process that was running marked lost.
    pub fn load(flintlock: Flintlock, state_dir: &Path) -> Result<Self, LoadError> {
        let file = state_dir.join(FILE);
        let records: Vec<Record> = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| LoadError {
                path: file.clone(),
                source: error.into(),
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(LoadError { path: file, source }),
        };
        let restarted = now();
        let processes = Self(Arc::new(Inner {
            flintlock,
            file,
            entries: Mutex::new(BTreeMap::new()),
            ids: AtomicU64::new(0),
        }));
        let changed = records.iter().any(Record::running);
        {
            let mut entries = processes.entries();
            // One a delete asked for, running at the restart, ended then: it goes.
            for record in records
                .into_iter()
                .filter(|r| !(r.running() && r.deleting()))
            {
                let record = record.after_restart(restarted);
                let ended = outcome(&record.state).unwrap_or(Outcome::Error(String::new()));
                let entry = Entry {
                    id: processes.next_id(),
                    live: Arc::new(Live::ended(ended)),
                    record,
                    follower: None,
                    stopper: None,
                };
                entries.insert(
                    (entry.record.namespace.clone(), entry.record.name.clone()),
                    entry,
                );
            }
            if changed {
                processes.save(&entries).map_err(|source| LoadError {
                    path: processes.0.file.clone(),
                    source,
                })?;
            }
        }
        Ok(processes)
    }

    pub fn flintlock(&self) -> &Flintlock {
        &self.0.flintlock
    }

    pub fn entries(&self) -> MutexGuard<'_, BTreeMap<Key, Entry>> {
        // Each change leaves the map consistent, so a panic elsewhere harms nothing.
        self.0
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn next_id(&self) -> u64 {
        self.0.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// Writes the table's file. Under the table's lock, so writes land in order; it is
    /// a few KiB.
    pub fn save(&self, entries: &BTreeMap<Key, Entry>) -> std::io::Result<()> {
        let records: Vec<&Record> = entries.values().map(|entry| &entry.record).collect();
        let json = serde_json::to_vec(&records)?;
        if let Some(dir) = self.0.file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let temporary = self.0.file.with_extension("json.tmp");
        {
            use std::io::Write as _;
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(&json)?;
            file.sync_all()?;
        }
        std::fs::rename(&temporary, &self.0.file)
    }

    /// Saves, or says in the log why the file is behind the table: the change is made
    /// already, and the next save writes it.
    pub fn save_or_warn(&self, entries: &BTreeMap<Key, Entry>) {
        if let Err(error) = self.save(entries) {
            warn!(file = %self.0.file.display(), %error, "writing the process table");
        }
    }

    /// Adds a started process, with the follower `follow` spawns for its id, and saves;
    /// refused if the name is taken or the table is full, or the file cannot be written,
    /// which ends the process.
    pub fn insert(
        &self,
        record: Record,
        live: Arc<Live>,
        follow: impl FnOnce(u64) -> AbortOnDropHandle<()>,
    ) -> Result<pb::Process, Status> {
        let key = (record.namespace.clone(), record.name.clone());
        let mut entries = self.entries();
        room(&entries, &key)?;
        let id = self.next_id();
        let process = record.to_proto();
        entries.insert(
            key.clone(),
            Entry {
                id,
                record,
                live,
                follower: Some(follow(id)),
                stopper: None,
            },
        );
        if let Err(error) = self.save(&entries) {
            entries.remove(&key);
            return Err(Status::unavailable(format!(
                "the process could not be recorded in {}: {error}",
                self.0.file.display()
            )));
        }
        Ok(process)
    }

    /// Whether a process `key` could start now.
    pub fn check_room(&self, key: &Key) -> Result<(), Status> {
        room(&self.entries(), key)
    }

    /// Records the end of the process `id` (its follower's last act); one a delete
    /// asked for goes.
    pub fn finish(&self, key: &Key, id: u64, state: State) {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(key).filter(|entry| entry.id == id) else {
            return;
        };
        if entry.record.deleting() {
            // Drops its follower, which is returning.
            entries.remove(key);
        } else {
            entry.record.state = state;
        }
        self.save_or_warn(&entries);
    }

    /// Replaces the object the process `key` carries, and saves.
    pub fn replace_object(&self, key: &Key, object: String) -> Result<pb::Process, Status> {
        let mut entries = self.entries();
        let entry = entries.get_mut(key).ok_or_else(|| not_found(key))?;
        entry.record.object = object;
        let process = entry.record.to_proto();
        self.save(&entries).map_err(|error| {
            Status::unavailable(format!(
                "the process could not be recorded in {}: {error}",
                self.0.file.display()
            ))
        })?;
        Ok(process)
    }

    /// The processes of `namespace` (all when empty).
    pub fn list(&self, namespace: &str) -> Vec<pb::Process> {
        self.entries()
            .values()
            .filter(|entry| namespace.is_empty() || entry.record.namespace == namespace)
            .map(|entry| entry.record.to_proto())
            .collect()
    }

    /// Ends and forgets the processes of the claim `uid`: dropping their followers
    /// closes their exec streams, which makes flintlockd end them.
    pub fn forget_claim(&self, uid: &str) {
        let mut entries = self.entries();
        let before = entries.len();
        entries.retain(|_, entry| entry.record.claim.uid != uid);
        if entries.len() != before {
            self.save_or_warn(&entries);
        }
    }
}

fn room(entries: &BTreeMap<Key, Entry>, key: &Key) -> Result<(), Status> {
    if entries.contains_key(key) {
        return Err(Status::already_exists(format!(
            "process {}/{} exists",
            key.0, key.1
        )));
    }
    if entries.len() >= MAX_PROCESSES {
        return Err(Status::resource_exhausted(format!(
            "the Host keeps {MAX_PROCESSES} processes, running or ended; delete ended ones \
             to start more"
        )));
    }
    Ok(())
}

/// Looks the process up, for a request about it.
pub fn not_found(key: &Key) -> Status {
    Status::not_found(format!("process {}/{} not found", key.0, key.1))
}
