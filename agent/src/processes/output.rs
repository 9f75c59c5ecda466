//! The output a background process wrote, as the agent retains it for attaches: its
//! latest [`RETAINED_BYTES`], each byte at its offset from the start, so an attach reads
//! what is retained and then follows from where it is, and the process never waits for
//! an attach that reads slowly.

use std::collections::VecDeque;

use battery_proto::Bytes;

/// Output retained per process; older bytes are dropped first. With
/// [`super::MAX_PROCESSES`], the bound on what the process table holds per Host.
pub const RETAINED_BYTES: usize = 1024 * 1024;

/// Which of the process's streams a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

struct Chunk {
    /// Where its first byte is in everything the process wrote.
    offset: u64,
    stream: Stream,
    bytes: Bytes,
}

/// The retained output of one process.
#[derive(Default)]
pub struct Output {
    chunks: VecDeque<Chunk>,
    retained: usize,
    /// How many bytes the process wrote: the offset after the last.
    end: u64,
}

impl Output {
    /// Adds what the process wrote, dropping the oldest bytes beyond [`RETAINED_BYTES`].
    pub fn push(&mut self, stream: Stream, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        let len = bytes.len();
        self.chunks.push_back(Chunk {
            offset: self.end,
            stream,
            bytes,
        });
        self.end += len as u64;
        self.retained += len;
        while self.retained > RETAINED_BYTES {
            let excess = self.retained - RETAINED_BYTES;
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if front.bytes.len() <= excess {
                self.retained -= front.bytes.len();
                self.chunks.pop_front();
            } else {
                // A chunk longer than the excess keeps its tail.
                let _ = front.bytes.split_to(excess);
                front.offset += excess as u64;
                self.retained -= excess;
            }
        }
    }

    /// The retained output after `cursor` (an offset an earlier read returned, or 0),
    /// and the offset to read from next.
    pub fn after(&self, cursor: u64) -> (Vec<(Stream, Bytes)>, u64) {
        let chunks = self
            .chunks
            .iter()
            .filter(|chunk| chunk.offset + chunk.bytes.len() as u64 > cursor)
            .map(|chunk| {
                let skip = usize::try_from(cursor.saturating_sub(chunk.offset)).unwrap_or(0);
                (chunk.stream, chunk.bytes.slice(skip..))
            })
            .collect();
        (chunks, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(chunks: &[(Stream, Bytes)]) -> String {
        chunks
            .iter()
            .map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned())
            .collect()
    }

    #[test]
    fn reads_follow_from_their_cursor_and_keep_streams_apart() {
        let mut output = Output::default();
        output.push(Stream::Stdout, Bytes::from_static(b"one "));
        output.push(Stream::Stderr, Bytes::from_static(b"two "));
        let (all, cursor) = output.after(0);
        assert_eq!(text(&all), "one two ");
        assert_eq!(all[1].0, Stream::Stderr);
        output.push(Stream::Stdout, Bytes::new());
        output.push(Stream::Stdout, Bytes::from_static(b"three"));
        let (rest, end) = output.after(cursor);
        assert_eq!(text(&rest), "three");
        assert_eq!(end, 13);
        assert!(output.after(end).0.is_empty());
        // A cursor inside a chunk reads its tail.
        assert_eq!(text(&output.after(2).0), "e two three");
    }

    #[test]
    fn only_the_latest_retained_bytes_are_kept() {
        let mut output = Output::default();
        output.push(Stream::Stdout, Bytes::from(vec![b'a'; RETAINED_BYTES - 10]));
        output.push(Stream::Stdout, Bytes::from(vec![b'b'; 20]));
        assert_eq!(output.retained, RETAINED_BYTES);
        let (chunks, end) = output.after(0);
        let kept: usize = chunks.iter().map(|(_, bytes)| bytes.len()).sum();
        assert_eq!(kept, RETAINED_BYTES);
        assert_eq!(end, RETAINED_BYTES as u64 + 10);
        // The oldest ten are gone; a cursor before them reads from what is left.
        assert!(chunks[0].1.iter().all(|b| *b == b'a'));
        assert_eq!(chunks[0].1.len(), RETAINED_BYTES - 20);
        output.push(Stream::Stderr, Bytes::from(vec![b'c'; RETAINED_BYTES + 1]));
        let (chunks, _) = output.after(0);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].1.len(), RETAINED_BYTES);
    }
}
