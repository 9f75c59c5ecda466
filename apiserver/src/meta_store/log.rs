//! The metadata store's log (ADR 39): each commit is one record here, queued by the
//! commit and written, with the records queued beside it, by the sync that makes them
//! durable with one `fdatasync` (ADR 52). redb holds the same
//! commits without syncing and is made durable now and then (a checkpoint), after which
//! the log starts again from its first byte; at open, the records redb lacks are applied
//! to it again.
//!
//! The file's blocks are written once, with zeros, before any record (ADR 46): a record
//! then lands on blocks the file already has, and its `fdatasync` writes the data alone,
//! not the file's size or its extents as an append's does.
//!
//! A record is its body's length (u32), the body's CRC-32 (u32), then the body: its
//! sequence number, the resourceVersion after it, and its operations. Integers are
//! little-endian. Every write of a record also writes a zero header after it, which ends
//! the log there: what lies beyond is an older pass's. A record whose length or checksum
//! does not match, or whose sequence number does not follow the one before it, also ends
//! the log: a header that is neither zeros nor a record can only be the torn tail of a
//! write no caller was answered for.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

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

/// A record's header: its body's length and checksum.
const HEADER_BYTES: usize = 8;

/// The header that ends the log: no record has a body of length 0 (a body holds at
/// least its sequence number and resourceVersion).
const END: [u8; HEADER_BYTES] = [0; HEADER_BYTES];

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

/// What a log's bytes hold: its records, up to the end marker or the first that is torn
/// or out of sequence, and whether what follows them is a torn write.
pub struct Parsed {
    pub records: Vec<Record>,
    /// Whether the records end at a header that is neither the end marker, nor a whole
    /// record of an older pass, nor the end of the file.
    pub torn: bool,
}

/// The records of a log's bytes (see [`Parsed`]).
pub fn parse(mut rest: &[u8]) -> Parsed {
    let mut records: Vec<Record> = Vec::new();
    loop {
        let mut next = rest;
        let record = take_u32(&mut next)
            .zip(take_u32(&mut next))
            .and_then(|(len, crc)| {
                let body = take(&mut next, usize::try_from(len).ok()?)?;
                (crc32fast::hash(body) == crc).then_some(body)
            })
            .and_then(Record::decode);
        let follows = |r: &Record| records.last().is_none_or(|last| r.seq == last.seq + 1);
        match record {
            Some(record) if follows(&record) => {
                records.push(record);
                rest = next;
            }
            // A whole record out of sequence: an older pass's, whose end marker was not
            // yet on disk. Anything else but zeros or the file's end is a torn write.
            stale => {
                let header = &rest[..rest.len().min(HEADER_BYTES)];
                let torn = stale.is_none() && header.iter().any(|&b| b != 0);
                return Parsed { records, torn };
            }
        }
    }
}

/// The log file: records queued under the store's writer lock, written and synced by
/// whichever writer syncs for the group.
pub struct Log {
    file: File,
    /// Set when a write or sync failed and the file's tail cannot be vouched for: every
    /// later write and sync fails, so nothing is acknowledged on top of it. A restart
    /// replays what is whole.
    broken: AtomicBool,
    /// Held by a writer queueing its record and by the write of those queued, which
    /// orders that write with the log's rewind.
    tail: Mutex<Tail>,
}

/// The log's end and the records queued before it.
#[derive(Default)]
struct Tail {
    /// Where the next record goes: the bytes the log's records take since it last started
    /// again, those queued included.
    end: u64,
    /// The records queued and not yet written, in commit order: they end at `end`.
    queued: Vec<u8>,
}

impl Log {
    /// Opens the log at `path`, creating it with at least `preallocate` bytes written
    /// (and making its directory entry durable, so a record synced in it cannot vanish
    /// with the entry), and reads it. The next record goes at its start: the caller
    /// checkpoints whatever records it holds first.
    pub fn open(path: &Path, preallocate: u64) -> io::Result<(Self, Parsed)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let parsed = parse(&bytes);
        let written = bytes.len() as u64;
        if written < preallocate {
            // Zeros, not `fallocate`: blocks allocated but never written are converted
            // when first written, which costs each sync a change to the file's extents.
            let zeros = vec![0; usize::try_from(preallocate - written).unwrap_or(0)];
            file.write_all_at(&zeros, written)?;
        }
        file.sync_all()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        let log = Self {
            file,
            broken: AtomicBool::new(false),
            tail: Mutex::default(),
        };
        Ok((log, parsed))
    }

    /// Fails once a write or sync of the log has failed: a writer asks first, so that a
    /// broken log takes no commit it could not make durable.
    pub fn usable(&self) -> io::Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "an earlier write or sync of the log failed; restart to replay it",
            ));
        }
        Ok(())
    }

    /// Marks the log broken, as a failed write would.
    #[cfg(test)]
    pub fn break_it(&self) {
        self.broken.store(true, Ordering::Release);
    }

    fn lock_tail(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `record` at the log's end, for the next [`Log::write_queued`]: the caller
    /// holds the store's writer lock, so records queue in commit order.
    pub fn queue(&self, record: &[u8]) {
        let mut tail = self.lock_tail();
        tail.queued.extend_from_slice(record);
        tail.end += record.len() as u64;
    }

    /// Where the next record goes: how long the log is since it last started again.
    pub fn end(&self) -> u64 {
        self.lock_tail().end
    }

    /// Writes the records queued, with the end marker after them, in one write; returns
    /// whether there were any. A failed write breaks the log: its commits are in redb,
    /// and none after them may be acknowledged without them.
    pub fn write_queued(&self) -> io::Result<bool> {
        self.usable()?;
        let mut tail = self.lock_tail();
        if tail.queued.is_empty() {
            return Ok(false);
        }
        let at = tail.end - tail.queued.len() as u64;
        tail.queued.extend_from_slice(&END);
        self.file
            .write_all_at(&tail.queued, at)
            .inspect_err(|_| self.broken.store(true, Ordering::Release))?;
        tail.queued.clear();
        Ok(true)
    }

    /// Makes every record written so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.usable()?;
        // A failed fdatasync may have dropped the pages it could not write: a later one
        // that succeeds would not vouch for them (Linux marks them clean).
        self.file
            .sync_data()
            .inspect_err(|_| self.broken.store(true, Ordering::Release))
    }

    /// Starts the log again from its first byte, once redb holds every record durably,
    /// those still queued included: they are dropped. The end marker need not reach the
    /// disk before the next record: a crash before it leaves records that redb already
    /// holds, which replay skips.
    pub fn rewind(&self) -> io::Result<()> {
        self.usable()?;
        let mut tail = self.lock_tail();
        self.file.write_all_at(&END, 0)?;
        *tail = Tail::default();
        Ok(())
    }
}
