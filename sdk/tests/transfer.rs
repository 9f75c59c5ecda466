//! The SDK's file streams against the real `battery-apiserver dev`: an upload from a
//! reader and a download as a reader, each verified by the guest's size and sha256.

use battery_e2e::apiserver::{ApiServer, Route};
use battery_sdk::{Client, Error};
use tokio::io::AsyncReadExt as _;

/// More than any pipe on the way holds, so both ends stream.
const SIZE: usize = 8 * 1024 * 1024;

async fn start() -> (ApiServer, Client) {
    let server = ApiServer::start(Route::Direct).await;
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    (server, Client::from_config(config).unwrap())
}

#[tokio::test]
async fn a_stream_goes_in_and_comes_back_verified() {
    let (_server, client) = start().await;
    let claim = client.claim("dev").holder("dev").send().await.unwrap();
    let content: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();

    // Relative to the guest's `/`: a simulated Host roots the session there.
    let made = claim.command(["mkdir", "-p", "data"]).working_dir("/");
    assert_eq!(made.output().await.unwrap().code, 0);
    let sent = claim
        .upload(content.as_slice(), "/data/blob", 0o640)
        .await
        .unwrap();
    assert_eq!(sent.bytes, SIZE as u64);
    let listed = claim
        .command(["stat", "-c", "%a %s", "blob"])
        .working_dir("/data")
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        format!("640 {SIZE}\n")
    );

    let mut download = claim.download("/data/blob").await.unwrap();
    assert_eq!((download.size(), download.mode()), (SIZE as u64, 0o640));
    let mut received = Vec::new();
    download.read_to_end(&mut received).await.unwrap();
    assert!(received == content, "what came back is what went in");

    // A directory is not a file's stream; a missing file says so.
    let directory = claim.download("/data").await.err().unwrap();
    assert!(
        matches!(&directory, Error::GuestFailed { message, .. } if message.contains("download_path")),
        "{directory:?}"
    );
    let missing = claim.download("/data/none").await.err().unwrap();
    assert_eq!(
        missing.to_string(),
        "copying /data/none failed in the MicroVM: /data/none: no such file or directory \
         (exit code 1)"
    );
    // Into a directory a stream has no name to take.
    let into_directory = claim.upload(&b"x"[..], "/data", 0o644).await.err().unwrap();
    assert!(
        into_directory.to_string().contains("/data is a directory"),
        "{into_directory}"
    );
    claim.release().await.unwrap();
}
