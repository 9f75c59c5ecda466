//! Generated Rust for the gRPC APIs we speak: battery's `poolmgr.v1alpha1`, the
//! flintlock messages and MicroVM service it uses, flintlock's exec and SSH proxy
//! services, and our own relay between the API server and `battery-agent`. Generated code, and
//! the one rule of battery's wire format the protos do not carry (its basic-auth header);
//! the `.proto` files under `proto/` are the source.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// What the exec messages' `bytes` fields carry (flintlock's exec API and our relay):
/// decoded as slices of the received buffer, not copied out of it.
pub use prost::bytes::Bytes;

/// battery's API: pools, leases, events and hosts.
pub mod poolmgr {
    pub mod v1alpha1 {
        tonic::include_proto!("poolmgr.v1alpha1");
    }

    /// poolmgrd's basic-auth (`api_server.basic_auth_token`): when it has a token, every
    /// call, health included, must carry `authorization: Basic <base64 of the token>`;
    /// the scheme's case does not matter. One place for both sides of that wire format:
    /// the API server's client and the embedded battery's check.
    pub mod basic_auth {
        use base64::Engine as _;

        /// The gRPC metadata key the token travels in.
        pub const METADATA_KEY: &str = "authorization";

        /// The metadata value that carries `token`.
        pub fn header_value(token: &str) -> String {
            format!("Basic {}", encoded(token))
        }

        /// The token a file holds: its text without a trailing newline (files written
        /// by `echo` or an editor end with one), or `None` when nothing else is there.
        pub fn token_in(text: &str) -> Option<&str> {
            let token = text.trim_end_matches(['\r', '\n']);
            (!token.trim().is_empty()).then_some(token)
        }

        /// The token as the value carries it, after the scheme.
        pub fn encoded(token: &str) -> String {
            base64::engine::general_purpose::STANDARD.encode(token)
        }

        /// What follows the scheme in `value`, or `None` when it is not the Basic
        /// scheme: the caller compares it with [`encoded`], in constant time.
        pub fn credentials(value: &str) -> Option<&str> {
            const SCHEME: &str = "basic ";
            let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
            scheme.eq_ignore_ascii_case(SCHEME).then_some(rest)
        }
    }
}

/// flintlock's types (`flintlock.types`), imported by battery's `PoolSpec`.
pub mod flintlock {
    pub mod types {
        tonic::include_proto!("flintlock.types");
    }
}

/// flintlock's MicroVM service (`microvm.services.api.v1alpha1`).
pub mod microvm {
    pub mod services {
        pub mod api {
            pub mod v1alpha1 {
                tonic::include_proto!("microvm.services.api.v1alpha1");
            }
        }
    }
}

/// flintlock's exec service (`microvmexec.services.api.v1alpha1`).
pub mod microvmexec {
    pub mod services {
        pub mod api {
            pub mod v1alpha1 {
                tonic::include_proto!("microvmexec.services.api.v1alpha1");
            }
        }
    }
}

/// flintlock's SSH proxy service (`microvmsshproxy.services.api.v1alpha1`).
pub mod microvmsshproxy {
    pub mod services {
        pub mod api {
            pub mod v1alpha1 {
                tonic::include_proto!("microvmsshproxy.services.api.v1alpha1");
            }
        }
    }
}

/// Our relay API between battery-apiserver and `battery-agent` (`battery.agent.v1alpha1`).
pub mod agent {
    pub mod v1alpha1 {
        tonic::include_proto!("battery.agent.v1alpha1");
    }
}

/// The encoded `FileDescriptorSet` of every file above, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
