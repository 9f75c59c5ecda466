//! The metadata store's log (ADR 39): each commit is one record appended here, made
//! durable by one `fdatasync` that the commits beside it share. redb holds the same
//! commits without syncing and is made durable now and then (a checkpoint), after which
//! the log starts empty; at open, the records redb lacks are applied to it again.
//!
//! A record is its body's length (u32), the body's CRC-32 (u32), then the body: its
//! sequence number, the resourceVersion after it, and its operations. Integers are
//! little-endian. A record whose length or checksum does not match ends the log: it can
//! only be the torn tail of a write no caller was answered for.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// One change a commit made, as replay applies it to redb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
    BatteryEventId(u64),
    ClearIntents,
}

const PUT: u8 = 1;
const DELETE: u8 = 2;
const BATTERY_EVENT_ID: u8 = 3;
const CLEAR_INTENTS: u8 = 4;

/// One commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub resource_version: u64,
    pub ops: Vec<Op>,
}

impl Record {
    /// The record framed as the log holds it.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        body.extend_from_slice(&self.seq.to_le_bytes());
        body.extend_from_slice(&self.resource_version.to_le_bytes());
        for op in &self.ops {
            match op {
                Op::Put { key, value } => {
                    body.push(PUT);
                    put_bytes(&mut body, key.as_bytes());
                    put_bytes(&mut body, value);
                }
                Op::Delete { key } => {
                    body.push(DELETE);
                    put_bytes(&mut body, key.as_bytes());
                }
                Op::BatteryEventId(id) => {
                    body.push(BATTERY_EVENT_ID);
                    body.extend_from_slice(&id.to_le_bytes());
                }
                Op::ClearIntents => body.push(CLEAR_INTENTS),
            }
        }
        let mut framed = Vec::with_capacity(body.len() + 8);
        framed.extend_from_slice(&len_u32(body.len()).to_le_bytes());
        framed.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        framed.extend_from_slice(&body);
        framed
    }

    /// The body's record, or `None` if it does not parse (the checksum matched, so only
    /// a writer of another format could make one).
    fn decode(mut body: &[u8]) -> Option<Self> {
        let seq = take_u64(&mut body)?;
        let resource_version = take_u64(&mut body)?;
        let mut ops = Vec::new();
        while let Some((&tag, rest)) = body.split_first() {
            body = rest;
            ops.push(match tag {
                PUT => Op::Put {
                    key: String::from_utf8(take_bytes(&mut body)?.to_vec()).ok()?,
                    value: take_bytes(&mut body)?.to_vec(),
                },
                DELETE => Op::Delete {
                    key: String::from_utf8(take_bytes(&mut body)?.to_vec()).ok()?,
                },
                BATTERY_EVENT_ID => Op::BatteryEventId(take_u64(&mut body)?),
                CLEAR_INTENTS => Op::ClearIntents,
                _ => return None,
            });
        }
        Some(Self {
            seq,
            resource_version,
            ops,
        })
    }
}

/// A length as the format stores it. Records are far below 4 GiB: an object is capped
/// well below that by the request size limits.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("a log record under 4 GiB")
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&len_u32(bytes.len()).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Some(head)
}

fn take_u32(input: &mut &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(take(input, 4)?.try_into().ok()?))
}

fn take_u64(input: &mut &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(take(input, 8)?.try_into().ok()?))
}

fn take_bytes<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = take_u32(input)?;
    take(input, usize::try_from(len).ok()?)
}

/// The records of a log's bytes, up to the first that is torn, and how many bytes that
/// valid prefix holds.
pub fn parse(mut bytes: &[u8]) -> (Vec<Record>, usize) {
    let total = bytes.len();
    let mut records = Vec::new();
    loop {
        let before = bytes.len();
        let Some(record) = take_u32(&mut bytes)
            .zip(take_u32(&mut bytes))
            .and_then(|(len, crc)| {
                let body = take(&mut bytes, usize::try_from(len).ok()?)?;
                (crc32fast::hash(body) == crc).then_some(body)
            })
            .and_then(Record::decode)
        else {
            return (records, total - before);
        };
        records.push(record);
    }
}

/// The log file, appended to under the store's writer lock and synced by whichever
/// writer syncs for the group.
pub struct Log {
    file: File,
    /// Set when a write or sync failed and the file's tail cannot be vouched for: every
    /// later append, sync and truncation fails, so nothing is acknowledged on top of it.
    /// A restart replays what is whole.
    broken: AtomicBool,
}

impl Log {
    /// Opens the log at `path`, creating it (and making its directory entry durable, so
    /// a record synced in it cannot vanish with the entry), and reads its records: those
    /// before a torn tail, and how many bytes the tail held.
    pub fn open(path: &Path) -> io::Result<(Self, Vec<Record>, usize)> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        file.sync_all()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, valid) = parse(&bytes);
        let log = Self {
            file,
            broken: AtomicBool::new(false),
        };
        Ok((log, records, bytes.len() - valid))
    }

    fn usable(&self) -> io::Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "an earlier write or sync of the log failed; restart to replay it",
            ));
        }
        Ok(())
    }

    /// Appends `record` to the log, `len` bytes long before it. A failed append is cut
    /// off again, so the next record follows a whole one.
    pub fn append(&self, record: &[u8], len: u64) -> io::Result<()> {
        self.usable()?;
        (&self.file)
            .write_all(record)
            .inspect_err(|_| self.cut(len))
    }

    /// Cuts the log back to `len` bytes: a record appended for a commit that failed.
    pub fn cut(&self, len: u64) {
        if self.file.set_len(len).is_err() {
            self.broken.store(true, Ordering::Release);
        }
    }

    /// Makes every record appended so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.usable()?;
        // A failed fdatasync may have dropped the pages it could not write: a later one
        // that succeeds would not vouch for them (Linux marks them clean).
        self.file
            .sync_data()
            .inspect_err(|_| self.broken.store(true, Ordering::Release))
    }

    /// Empties the log once redb holds every record durably. A failed truncation leaves
    /// whole records that replay skips, so the next checkpoint only tries again.
    pub fn truncate(&self) -> io::Result<()> {
        self.usable()?;
        self.file.set_len(0)
    }
}
