//! A command's terminal ([`Command::tty`]): its size, and the resizes the exec session
//! sends on the protocol's resize channel.
//!
//! [`Command::tty`]: crate::Command::tty

use std::io;

use battery_types::channel::{self, RESIZE, Resize};
use tokio::sync::watch;

use crate::error::session_ended;

/// A terminal's size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TerminalSize {
    /// Columns: characters per line.
    pub cols: u16,
    /// Rows: lines.
    pub rows: u16,
}

impl TerminalSize {
    /// `cols` columns by `rows` rows.
    pub const fn new(cols: u16, rows: u16) -> Self {
        Self { cols, rows }
    }

    /// The frame that gives the command this size: channel 4, then kubelet's
    /// `TerminalSize` as JSON.
    pub(crate) fn frame(self) -> Vec<u8> {
        let size = Resize {
            width: self.cols,
            height: self.rows,
        };
        channel::frame(RESIZE, &size.payload())
    }
}

/// Resizes the terminal of a command started with [`Command::tty`]: from
/// [`Process::resizer`], cloneable, to keep after [`Process::wait`] has taken the
/// process (to follow `SIGWINCH`, say). It does not keep the session open.
///
/// [`Command::tty`]: crate::Command::tty
/// [`Process::resizer`]: crate::Process::resizer
/// [`Process::wait`]: crate::Process::wait
#[derive(Clone, Debug)]
pub struct Resizer(watch::Sender<TerminalSize>);

impl Resizer {
    /// A resizer, and the sizes the session is to send, from `initial` on.
    pub(crate) fn new(initial: TerminalSize) -> (Self, Sizes) {
        let (sender, sizes) = watch::channel(initial);
        (Self(sender), Sizes(sizes))
    }

    /// Gives the command's terminal this size. It never waits: only the latest size
    /// matters, so sizes set faster than the session sends them are merged. Fails with
    /// `BrokenPipe` once the session has ended.
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        self.0.send(size).map_err(|_| session_ended())
    }
}

/// The session's end of a [`Resizer`].
pub(crate) struct Sizes(watch::Receiver<TerminalSize>);

impl Sizes {
    /// The frame of the size now, which [`Sizes::next_frame`] then waits past.
    pub(crate) fn current_frame(&mut self) -> Vec<u8> {
        self.0.borrow_and_update().frame()
    }

    /// The frame of the next size to send, or `None` once every [`Resizer`] is gone.
    pub(crate) async fn next_frame(&mut self) -> Option<Vec<u8>> {
        self.0.changed().await.ok()?;
        Some(self.0.borrow_and_update().frame())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_is_kubelets_json_on_channel_4() {
        let frame = TerminalSize::new(120, 40).frame();
        assert_eq!(frame[0], 4);
        assert_eq!(&frame[1..], br#"{"Width":120,"Height":40}"#);
        let json: serde_json::Value = serde_json::from_slice(&frame[1..]).unwrap();
        assert_eq!(json, serde_json::json!({"Width": 120, "Height": 40}));
        assert_eq!(
            &TerminalSize::new(u16::MAX, 0).frame()[1..],
            br#"{"Width":65535,"Height":0}"#
        );
    }

    #[tokio::test]
    async fn sizes_set_faster_than_sent_merge() {
        let (resizer, mut sizes) = Resizer::new(TerminalSize::new(80, 24));
        assert_eq!(sizes.current_frame(), TerminalSize::new(80, 24).frame());
        let handle = resizer.clone();
        resizer.resize(TerminalSize::new(100, 30)).unwrap();
        handle.resize(TerminalSize::new(132, 43)).unwrap();
        assert_eq!(
            sizes.next_frame().await,
            Some(TerminalSize::new(132, 43).frame())
        );
        // Every resizer gone: nothing more to send, and the session stops asking.
        drop((resizer, handle));
        assert_eq!(sizes.next_frame().await, None);
    }

    #[test]
    fn resizing_after_the_session_fails_as_a_closed_pipe() {
        let (resizer, sizes) = Resizer::new(TerminalSize::new(80, 24));
        drop(sizes);
        let error = resizer.resize(TerminalSize::new(1, 1)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }
}
