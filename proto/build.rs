//! Compiles the `.proto` files with protox (pure Rust, so no system `protoc`) and
//! generates tonic clients and servers. The encoded descriptor set is kept too, for
//! gRPC server reflection (`grpcurl list`).

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "poolmgr/v1alpha1/types.proto",
    "poolmgr/v1alpha1/lease.proto",
    "poolmgr/v1alpha1/pooladmin.proto",
    "poolmgr/v1alpha1/events.proto",
    "poolmgr/v1alpha1/hostadmin.proto",
    "types/microvm.proto",
    "services/microvm/v1alpha1/microvms.proto",
    "services/microvmexec/v1alpha1/microvmexec.proto",
    "services/microvmsshproxy/v1alpha1/microvmsshproxy.proto",
    "agent/v1alpha1/relay.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        // Exec output and input as `Bytes`: decoded as slices of the received buffer,
        // not copied out of it, at each hop a stream of output crosses.
        .bytes(".microvmexec.services.api.v1alpha1")
        .bytes(".battery.agent.v1alpha1")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
