//! Binding with per-claim configuration: what env and a file from a Secret add to a
//! bind, beside the file's write alone through the agent's relay.

use anyhow::Result;
use serde_json::Value;

use super::binds::{LATENCY, bind, bind_claim};
use super::client;
use super::exec::Target;
use super::report::{Row, quantile};
use super::rig::Rig;
use battery_e2e::api::PoolRef;

/// `count` serial rounds of four binds on `pool`, interleaved so each kind sees the same
/// machine: a plain claim, one with env from a Secret (read after a SubjectAccessReview),
/// one with a file from it (written through the agent before the 201), and one with
/// both. What per-claim configuration adds to a bind, and which part adds it.
pub async fn with_config(rig: &Rig, pool: &PoolRef, count: usize) -> Result<Vec<Row>> {
    const SECRET: &str = "bench-config";
    rig.create_secret(SECRET, "TOKEN", "bench-token").await?;
    let client = rig.client().await?;
    let reference = serde_json::json!({"name": SECRET, "key": "TOKEN"});
    let env = serde_json::json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": reference}}]);
    let files = serde_json::json!([{"path": "/etc/bench/token", "secretKeyRef": reference}]);
    let kinds = [
        ("plain", Value::Null, Value::Null),
        ("env from a Secret", env.clone(), Value::Null),
        ("a file from a Secret", Value::Null, files.clone()),
        ("env and a file from a Secret", env, files),
    ];
    // The file's write alone, as the bind makes it (one `tar -x`, the archive on stdin),
    // straight to the agent's relay: what a file costs past the API server.
    let (_, bound) = bind(&client, "config-write", &pool.name).await?;
    let mut agent = Target::of(&client, &bound).await?.agent_exec(rig).await?;
    let archive = one_file_archive("etc/bench/token", b"bench-token")?;
    let mut written = Vec::with_capacity(count);
    let mut took = vec![Vec::with_capacity(count); kinds.len()];
    for i in 0..count {
        written.push(agent.until_exit(&EXTRACT, &archive).await?);
        for (k, (_, env, files)) in kinds.iter().enumerate() {
            let mut claim = client::claim(&format!("config-{k}-{i}"), &pool.name);
            if !env.is_null() {
                claim["spec"]["env"] = env.clone();
            }
            if !files.is_null() {
                claim["spec"]["files"] = files.clone();
            }
            took[k].push(bind_claim(&client, &claim).await?.0);
        }
    }
    let bare = quantile(&took[0], 0.5);
    let mut rows = vec![Row::millis(
        LATENCY,
        "plain, the same Pool, interleaved p50",
        bare,
    )];
    for ((kind, _, _), took) in kinds.iter().zip(&took).skip(1) {
        let with = quantile(took, 0.5);
        rows.push(Row::millis(LATENCY, format!("with {kind} p50"), with));
        rows.push(Row::millis(
            LATENCY,
            format!("added by {kind} p50"),
            with.saturating_sub(bare),
        ));
    }
    rows.push(Row::millis(
        LATENCY,
        "a file's tar -x alone, through the agent's relay p50",
        quantile(&written, 0.5),
    ));
    Ok(rows)
}

/// What the API server runs to write a claim's files.
const EXTRACT: [&str; 6] = ["tar", "-x", "-p", "-m", "-f", "-"];

/// A tar archive of one file, as the API server builds a claim's.
fn one_file_archive(path: &str, content: &[u8]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(content.len() as u64);
    builder.append_data(&mut header, path, content)?;
    Ok(builder.into_inner()?)
}
