//! What the process table keeps of each process, in memory and in its file under
//! `--state-dir`: everything a list answers, but not the output, which lives only in
//! memory ([`super::output`]).

use std::time::{SystemTime, UNIX_EPOCH};

use battery_proto::agent::v1alpha1::{self as pb, ProcessState};
use serde::{Deserialize, Serialize};

/// The claim a process runs in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// How far a process got.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state")]
pub enum State {
    Running,
    /// It exited with `code`; `signal` when the agent's stop ended it.
    Exited {
        code: i32,
        signal: Option<String>,
        end_time: i64,
    },
    /// It could not be run or followed to its end.
    Failed {
        message: String,
        end_time: i64,
    },
    /// It was running when the agent stopped.
    Lost {
        message: String,
        end_time: i64,
    },
}

/// One process of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub namespace: String,
    pub name: String,
    pub claim: Claim,
    pub microvm_uid: String,
    /// The API object the API server gave, handed back as is.
    pub object: String,
    /// Its pid in the guest, which a stop signals.
    pub pid: u32,
    pub start_time: i64,
    pub state: State,
    /// When a delete asked for it: it goes once it ended.
    pub deletion_time: Option<i64>,
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

impl Record {
    pub fn running(&self) -> bool {
        self.state == State::Running
    }

    pub fn deleting(&self) -> bool {
        self.deletion_time.is_some()
    }

    /// As it was when the agent stopped, read back at start: one that was running was
    /// ended then by flintlockd, which ends a command with its exec stream.
    pub fn after_restart(mut self, restarted: i64) -> Self {
        if self.running() {
            self.state = State::Lost {
                message: "the exec agent restarted while it ran: flintlockd ends a command \
                          when the agent's exec stream to it closes, so it ended then, and \
                          its exit code and output were not kept"
                    .to_owned(),
                end_time: restarted,
            };
        }
        self
    }

    /// The relay's message for it.
    pub fn to_proto(&self) -> pb::Process {
        let (state, exit_code, signal, message, end_time) = match &self.state {
            State::Running => (ProcessState::Running, 0, String::new(), String::new(), 0),
            State::Exited {
                code,
                signal,
                end_time,
            } => (
                ProcessState::Exited,
                *code,
                signal.clone().unwrap_or_default(),
                String::new(),
                *end_time,
            ),
            State::Failed { message, end_time } => (
                ProcessState::Failed,
                0,
                String::new(),
                message.clone(),
                *end_time,
            ),
            State::Lost { message, end_time } => (
                ProcessState::Lost,
                0,
                String::new(),
                message.clone(),
                *end_time,
            ),
        };
        pb::Process {
            process: Some(pb::ProcessRef {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            }),
            claim: Some(pb::ClaimRef {
                namespace: self.claim.namespace.clone(),
                name: self.claim.name.clone(),
                uid: self.claim.uid.clone(),
            }),
            microvm_uid: self.microvm_uid.clone(),
            object: self.object.clone(),
            state: state.into(),
            exit_code,
            signal,
            message,
            start_time: self.start_time,
            end_time,
            deletion_time: self.deletion_time.unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: State) -> Record {
        Record {
            namespace: "ns".into(),
            name: "p".into(),
            claim: Claim {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "u".into(),
            },
            microvm_uid: "vm".into(),
            object: "{}".into(),
            pid: 7,
            start_time: 100,
            state,
            deletion_time: None,
        }
    }

    #[test]
    fn a_restart_loses_what_ran_and_keeps_what_ended() {
        let lost = record(State::Running).after_restart(200);
        let State::Lost { message, end_time } = &lost.state else {
            panic!("{lost:?}");
        };
        assert!(message.contains("the exec agent restarted"), "{message}");
        assert_eq!(*end_time, 200);
        let proto = lost.to_proto();
        assert_eq!(proto.state(), ProcessState::Lost);
        assert_eq!(
            (proto.message.as_str(), proto.end_time),
            (message.as_str(), 200)
        );

        let exited = State::Exited {
            code: 143,
            signal: Some("SIGTERM".into()),
            end_time: 150,
        };
        let kept = record(exited.clone()).after_restart(200);
        assert_eq!(kept.state, exited);
        let proto = kept.to_proto();
        assert_eq!((proto.exit_code, proto.signal.as_str()), (143, "SIGTERM"));
    }

    #[test]
    fn the_file_keeps_every_field() {
        let record = Record {
            deletion_time: Some(300),
            ..record(State::Failed {
                message: "flintlockd: gone".into(),
                end_time: 250,
            })
        };
        let json = serde_json::to_string(&[&record]).expect("encodes");
        let back: Vec<Record> = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, [record]);
    }
}
