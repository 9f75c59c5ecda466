//! The WebSocket channel protocol of `pods/exec` and `pods/portforward`, which the claims'
//! `exec` and `portforward` subresources speak: every message is one frame on one channel,
//! the channel's number first (kubelet's `remotecommand` and `portforward` packages).
//!
//! Framing only, no I/O and no WebSocket type: the server, the SDK and the tests each run
//! their own socket (tungstenite's, kube-rs's) and send a [`frame`] (or, in a protocol
//! negotiated, an [`Encoded`]) as its message.
//! This sits in `battery-types`, not in `battery-api-machinery`, because the SDK speaks it
//! too and machinery would bring axum into every client.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

/// The command's stdin: the client writes it.
pub const STDIN: u8 = 0;
/// The command's stdout (a terminal's output, with `tty`).
pub const STDOUT: u8 = 1;
/// The command's stderr.
pub const STDERR: u8 = 2;
/// The `Status` the session ends with: `Success`, or why not (kubelet's exit code as
/// `NonZeroExitCode`).
pub const ERROR: u8 = 3;
/// The client's terminal size, a [`Resize`].
pub const RESIZE: u8 = 4;
/// v5: the payload's byte names a channel the client will write no more to.
pub const CLOSE: u8 = 255;

/// The versions of the protocol served, best first. v1 to v3 (and `base64.channel.k8s.io`)
/// are not: they cannot carry an exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// v4 with the close channel, so stdin can end before the session does.
    V5,
    /// Binary channels and a JSON `Status` on the error channel.
    V4,
    /// v4 in text frames, base64, for clients that cannot send binary (browsers).
    V4Base64,
}

impl Protocol {
    /// Every version, best first.
    pub const ALL: [Protocol; 3] = [Protocol::V5, Protocol::V4, Protocol::V4Base64];

    /// Its `Sec-WebSocket-Protocol` name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::V5 => "v5.channel.k8s.io",
            Protocol::V4 => "v4.channel.k8s.io",
            Protocol::V4Base64 => "v4.base64.channel.k8s.io",
        }
    }
}

/// A frame as its WebSocket message carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoded {
    /// A binary message: the channel's byte, then the payload.
    Binary(Vec<u8>),
    /// A text message (the base64 protocol): the channel's digit, then the payload in
    /// base64.
    Text(String),
}

/// The binary frame of `payload` on `channel`, as every protocol but the base64 one
/// sends it: what a client that speaks only binary (the SDK, kube-rs) writes.
pub fn frame(channel: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(payload);
    frame
}

/// The frame of the payload `parts` make one after the other, copied once: output that
/// arrived in pieces leaves in one frame.
pub fn encode_parts<P: AsRef<[u8]>>(protocol: Protocol, channel: u8, parts: &[P]) -> Encoded {
    if protocol == Protocol::V4Base64 {
        let mut text = char::from(b'0' + channel).to_string();
        let payload: Vec<u8> = parts
            .iter()
            .flat_map(|part| part.as_ref())
            .copied()
            .collect();
        BASE64.encode_string(payload, &mut text);
        return Encoded::Text(text);
    }
    let size = parts.iter().map(|part| part.as_ref().len()).sum::<usize>();
    let mut bytes = Vec::with_capacity(size + 1);
    bytes.push(channel);
    for part in parts {
        bytes.extend_from_slice(part.as_ref());
    }
    Encoded::Binary(bytes)
}

/// A binary frame's channel and payload; `None` for an empty message, which has neither.
pub fn decode_binary(frame: &[u8]) -> Option<(u8, &[u8])> {
    frame
        .split_first()
        .map(|(&channel, payload)| (channel, payload))
}

/// A base64 protocol's text frame as its channel and payload; `None` for what is not one.
pub fn decode_text(frame: &str) -> Option<(u8, Vec<u8>)> {
    let channel = frame.bytes().next()?.checked_sub(b'0')?;
    Some((channel, BASE64.decode(&frame[1..]).ok()?))
}

/// A terminal's size as the resize channel carries it: kubelet's `TerminalSize`, as JSON
/// (`{"Width": 80, "Height": 24}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Resize {
    /// Columns.
    pub width: u16,
    /// Rows.
    pub height: u16,
}

impl Resize {
    /// The resize channel's payload.
    pub fn payload(self) -> Vec<u8> {
        serde_json::to_vec(&self).expect("two numbers always serialize")
    }

    /// A resize channel's payload; `None` for one that does not read, which kubelet drops.
    pub fn parse(payload: &[u8]) -> Option<Self> {
        serde_json::from_slice(payload).ok()
    }
}

/// Port-forward's channels: the i-th port of the query has its data on channel `2i` and
/// its errors on `2i+1`, and each channel's first frame is the port, two bytes
/// little-endian. Only v4 and its base64 variant: v5's close means nothing here.
pub mod port_forward {
    use super::Protocol;

    /// The versions port-forward serves, best first.
    pub const PROTOCOLS: [Protocol; 2] = [Protocol::V4, Protocol::V4Base64];

    /// The data channel of the `index`-th port (the last channel past the 127th, which
    /// the server's cap on ports never reaches).
    pub const fn data_channel(index: usize) -> u8 {
        if index > (u8::MAX / 2) as usize {
            u8::MAX
        } else {
            index as u8 * 2
        }
    }

    /// The error channel of the `index`-th port.
    pub const fn error_channel(index: usize) -> u8 {
        data_channel(index).saturating_add(1)
    }

    /// What each of a port's channels begins with.
    pub fn port_prefix(port: u16) -> [u8; 2] {
        port.to_le_bytes()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_frame_is_its_channel_then_its_payload() {
        assert_eq!(
            encode_parts(Protocol::V4, STDERR, &[b"x"]),
            Encoded::Binary(vec![2, b'x'])
        );
        assert_eq!(frame(STDERR, b"x"), vec![2, b'x']);
        assert_eq!(decode_binary(&[2, b'x']), Some((STDERR, &b"x"[..])));
        assert_eq!(
            encode_parts::<&[u8]>(Protocol::V5, STDOUT, &[]),
            Encoded::Binary(vec![1])
        );
        assert_eq!(
            encode_parts(Protocol::V4Base64, STDOUT, &[b"hi\n"]),
            Encoded::Text("1aGkK".into())
        );
        assert_eq!(decode_text("0aGkK"), Some((STDIN, b"hi\n".to_vec())));
        // Not base64, or no channel, is not a frame.
        assert_eq!(decode_text("0!!"), None);
        assert_eq!(decode_text(""), None);
        assert_eq!(decode_binary(&[]), None);
    }

    #[test]
    fn a_resize_reads_as_kubectl_writes_it() {
        let size = Resize {
            width: 120,
            height: 40,
        };
        assert_eq!(size.payload(), br#"{"Width":120,"Height":40}"#);
        assert_eq!(Resize::parse(&size.payload()), Some(size));
        assert_eq!(Resize::parse(b"120x40"), None);
        assert_eq!(Resize::parse(br#"{"Width":-1,"Height":40}"#), None);
    }

    #[test]
    fn each_port_has_a_data_and_an_error_channel() {
        use port_forward::*;
        assert_eq!((data_channel(0), error_channel(0)), (0, 1));
        assert_eq!((data_channel(3), error_channel(3)), (6, 7));
        assert_eq!(data_channel(200), u8::MAX);
        assert_eq!(port_prefix(8080), [0x90, 0x1f]);
    }

    proptest! {
        #[test]
        fn frames_decode_to_what_was_encoded(
            channel in 0u8..=9,
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..4),
        ) {
            let whole: Vec<u8> = parts.concat();
            for protocol in Protocol::ALL {
                match encode_parts(protocol, channel, &parts) {
                    Encoded::Binary(frame) => {
                        prop_assert_eq!(decode_binary(&frame), Some((channel, &whole[..])));
                    }
                    Encoded::Text(frame) => {
                        prop_assert_eq!(decode_text(&frame), Some((channel, whole.clone())));
                    }
                }
            }
        }
    }
}
